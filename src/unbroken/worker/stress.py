"""The online stress test inside a rank: a device check and a link check, while it is paused.

A rank runs it when its mailbox says ``stress`` (:class:`~unbroken.worker.mailbox.Stress`),
stopped at a step boundary and out of its training group (:mod:`unbroken.worker.recovery`):

1. **Device** (the seed's ``aic``): :func:`device_checksum`, a chain of fixed-seed float64
   matrix products on this rank's device, hashed bit for bit; compared with the checksum the
   rank computed at its start. On a simulated device with a *silent* fault
   (:func:`unbroken.devices.sim.silent_fault`, ``unbroken inject sdc``) the product really is
   computed wrong: one bit of one element of each product flips, as a faulty multiply unit
   would, and every later product carries the error into the checksum.
2. **Links** (``p2p``): the rank joins a gloo group of its own for the test (store prefix
   :func:`~unbroken.protocol.stress.group_prefix`, so nothing of the training's groups is
   touched), and for each round of :func:`~unbroken.protocol.stress.link_rounds` the two ranks
   of a pair send :data:`~unbroken.protocol.stress.LINK_BYTES` there and back, three times;
   the fastest round trip gives the link's GB/s as this end saw it (the slower ones were
   disturbed by something else than the link). A barrier separates the rounds.

The rank writes its :class:`~unbroken.protocol.stress.RankStressResult` to the test's store,
leaves the group and goes back to waiting for its rejoin. Nothing here touches the training
state or its random generators.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from unbroken.protocol.stress import (
    DEVICE_SEED,
    DEVICE_SIZE,
    LINK_BYTES,
    LinkMeasure,
    RankStressResult,
    StressCode,
    encode_result,
    group_prefix,
    link_rounds,
    result_key,
)
from unbroken.worker.mailbox import Stress
from unbroken.worker.torchapi import PrefixStore, Store

logger = logging.getLogger(__name__)

#: Products chained in the device check.
_PRODUCTS = 4
#: Timed round trips per link; the fastest counts.
_TRIPS = 3


@dataclass(frozen=True)
class SimDevice:
    """The simulated device a rank runs on: the ``sim`` state directory, node and index."""

    state_dir: Path
    node: str
    device: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SimDevice | None:
        """This rank's simulated device, from its agent's ``UNBROKEN_RUN_DIR``/
        ``UNBROKEN_NODE``/``UNBROKEN_DEVICES`` and ``LOCAL_RANK`` (None outside an embedded
        run)."""
        run_dir, node = environ.get("UNBROKEN_RUN_DIR"), environ.get("UNBROKEN_NODE")
        devices = [d for d in environ.get("UNBROKEN_DEVICES", "").split(",") if d.isdigit()]
        local = environ.get("LOCAL_RANK", "0")
        if not run_dir or not node or not local.isdigit() or int(local) >= len(devices):
            return None
        return cls(Path(run_dir) / "devices", node, int(devices[int(local)]))

    def silently_faulty(self) -> bool:
        from unbroken.devices.sim import silent_fault  # the sim's state file: stdlib only

        try:
            return silent_fault(self.state_dir, self.node, self.device) is not None
        except (OSError, ValueError) as e:
            logger.warning("cannot read the state of device %s: %s", self, e)
            return False


def device_checksum(device: SimDevice | None) -> str:
    """The device check's checksum on ``device`` (None: a device that computes right), computed
    on the rank's own device: its current GPU where it trains on one (its checksum is compared
    with the one it computed there at its start), else the CPU."""
    corrupt = device is not None and device.silently_faulty()
    g = torch.Generator().manual_seed(DEVICE_SEED)
    a = torch.randn(DEVICE_SIZE, DEVICE_SIZE, generator=g, dtype=torch.float64)
    x = torch.randn(DEVICE_SIZE, DEVICE_SIZE, generator=g, dtype=torch.float64)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        on = torch.device("cuda", torch.cuda.current_device())
        a, x = a.to(on), x.to(on)
    for i in range(_PRODUCTS):
        x = (a @ x) / DEVICE_SIZE**0.5
        if corrupt:
            bits = x.view(-1).view(torch.int64)
            k = (DEVICE_SEED + i) % bits.numel()
            bits[k] = bits[k] ^ (1 << 30)
    return hashlib.sha256(x.cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def run_stress(
    command: Stress, expected: str, device: SimDevice | None, timeout_s: float
) -> RankStressResult:
    """Run stress test ``command.round`` as rank ``command.rank`` and publish the result."""
    rank = command.rank
    began = time.monotonic()
    try:
        checksum = device_checksum(device)
        error = ""
    except RuntimeError as e:
        checksum, error = "", f"device check failed: {e}"
    device_s = time.monotonic() - began
    code = StressCode.OK if checksum == expected else StressCode.FAULT
    if not checksum:
        code = StressCode.FAILED
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        command.master_addr,
        command.master_port,
        world_size=command.world_size,
        is_master=False,
        timeout=timeout,
    )
    links: tuple[LinkMeasure, ...] = ()
    try:
        links = _link_check(command, store, timeout)
    except RuntimeError as e:
        error = "; ".join(x for x in (error, f"link check failed: {e}") if x)
    result = RankStressResult(
        rank=rank,
        device_code=code,
        checksum=checksum,
        expected=expected,
        device_s=device_s,
        links=links,
        error=error,
    )
    store.set(result_key(command.round, rank), encode_result(result).decode())
    logger.warning(
        "rank %d: stress test %d: device %s (%s), links %s",
        rank,
        command.round,
        code.name,
        checksum,
        ", ".join(f"{m.peer}: {m.gbps:.2f} GB/s" for m in links) or "none",
    )
    return result


def _link_check(command: Stress, store: Store, timeout: timedelta) -> tuple[LinkMeasure, ...]:
    excepthook = sys.excepthook  # init_process_group wraps it once more each time
    try:
        dist.init_process_group(
            "gloo",
            store=PrefixStore(group_prefix(command.round), store),
            rank=command.rank,
            world_size=command.world_size,
            timeout=timeout,
        )
    finally:
        sys.excepthook = excepthook
    try:
        out: list[LinkMeasure] = []
        buf = torch.zeros(LINK_BYTES, dtype=torch.uint8)
        for round_ in link_rounds(command.world_size):
            for a, b in round_:
                if command.rank in (a, b):
                    out.append(_measure(command.rank, b if command.rank == a else a, buf))
            dist.barrier()
        return tuple(out)
    finally:
        dist.destroy_process_group()


def _measure(me: int, peer: int, buf: torch.Tensor) -> LinkMeasure:
    """A round trip of ``buf`` with ``peer`` (the lower rank sends first), after a small one
    that opens the pair's connection."""
    try:
        small = torch.zeros(1, dtype=torch.uint8)
        _round_trip(me, peer, small)
        times = []
        for _ in range(_TRIPS):
            began = time.perf_counter()
            _round_trip(me, peer, buf)
            times.append(time.perf_counter() - began)
    except RuntimeError as e:
        return LinkMeasure(peer=peer, gbps=0.0, seconds=0.0, error=str(e).splitlines()[0])
    seconds = min(times)  # the link's capacity: the fastest trip, the others were disturbed
    return LinkMeasure(peer=peer, gbps=2 * buf.numel() / seconds / 1e9, seconds=seconds)


def _round_trip(me: int, peer: int, buf: torch.Tensor) -> None:
    if me < peer:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)
