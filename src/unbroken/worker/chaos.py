"""Faults a rank injects into itself at an exact step (``--chaos`` entries keyed by step).

The job manager hands each rank its entries in ``UNBROKEN_CHAOS`` (JSON) and a directory in
``UNBROKEN_CHAOS_DIR``. Before the rank starts step index ``at_step`` (that is, right after it
committed ``at_step`` steps) the entry fires: ``kill`` sends SIGKILL to the process itself,
``hang`` SIGSTOP, ``exception`` raises :class:`InjectedFault` from the training loop (with
``code: CUDA-<n>``, ``torch.AcceleratorError`` carrying that ``cudaError_t`` as its
``error_code``, as the CUDA runtime raises a device error: ``CUDA-710`` a device-side assert;
``CUDA-2``, an out-of-memory, fails the step in process where the rank recovers in process),
and
``memory`` simulates an uncorrectable device memory error (the seed's HBM UCE): a parameter of
this rank is corrupted and the step fails with :class:`DeviceMemoryError` before the rank
shares a gradient, so its state must be repaired from a replica; ``link`` has the kernel reset
the TCP connections between this rank and its peers (never those to the rendezvous store:
:mod:`unbroken.worker.linkfault`), so the step's collectives fail, or are re-executed by op
retry (:mod:`unbroken.worker.opretry`). Each entry
fires at most once per run, whatever the number of restarts that replay the step: the first
rank to fire creates ``fired-<index>`` in the chaos directory with O_EXCL.

In a managed rank, SIGUSR1 raises :class:`InjectedFault` in the main thread too, so
``unbroken inject exception`` produces a real Python exception with its traceback, and SIGUSR2
arms a device memory error for the next step (``unbroken inject memory``).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType

import torch
from torch.distributed.tensor import DTensor

from unbroken.protocol.kinds import StepFailure
from unbroken.worker import opretry
from unbroken.worker.chaosentries import ChaosEntry, claim, entries_from_env
from unbroken.worker.failure import DeviceMemoryError, failure_kind
from unbroken.worker.linkfault import reset_links

logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """A fault injected on purpose (``unbroken inject exception`` or a chaos entry)."""


#: The device fault code of an uncorrectable memory error (see unbroken/faults/codes.yaml).
MEMORY_ERROR_CODE = "80E01801"


class RankChaos:
    def __init__(self, rank: int, entries: tuple[ChaosEntry, ...], fired_dir: Path | None) -> None:
        self.rank = rank
        self.entries: dict[int, list[ChaosEntry]] = {}
        for e in entries:
            self.entries.setdefault(e.at_step, []).append(e)
        self.fired_dir = fired_dir
        self.memory_armed = False  # SIGUSR2: a memory error in the next step
        # A link that flaps: its fault's re-executions still to break (op retry), and the ports
        # they leave alone.
        self._flaps = 0
        self._store_ports: tuple[int, ...] = ()

    @staticmethod
    def from_env(rank: int, env: Mapping[str, str]) -> RankChaos | None:
        entries, fired_dir = entries_from_env(rank, env)
        return RankChaos(rank, entries, fired_dir)

    def before_step(
        self,
        step: int,
        model: torch.nn.Module,
        fail_step: Callable[[Exception], None] | None,
        store_ports: Iterable[int] = (),
    ) -> None:
        """Fire what is due before step ``step``; ``fail_step`` fails the step in process
        (None: the rank cannot recover in process); ``store_ports``: connections a link
        fault leaves alone (the rendezvous stores)."""
        if self.memory_armed:
            self.memory_armed = False
            _memory_error(self.rank, step, model, fail_step)
            return
        # Entries for the same step fire one per run of it, in file order: a fault that
        # strikes again when the step is redone after a recovery.
        entry = next((e for e in self.entries.get(step, ()) if self._claim(e)), None)
        if entry is None:
            return
        if entry.kind == "memory":
            _memory_error(self.rank, step, model, fail_step)
        if entry.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif entry.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif entry.kind == "exception" and entry.code:
            error = _device_error(entry.code, f"rank {self.rank} before step {step}")
            if fail_step is not None and failure_kind(error, StepFailure.NONE) is (
                StepFailure.OUT_OF_MEMORY
            ):
                # An allocation that failed before the step shared anything: in process, the
                # step fails (a step to redo); without in-process recovery, the process ends.
                fail_step(error)
                return
            raise error
        elif entry.kind == "exception":
            raise InjectedFault(f"injected exception in rank {self.rank} before step {step}")
        elif entry.kind == "link":
            self._flaps, self._store_ports = entry.times - 1, tuple(store_ports)
            links = reset_links(os.getpid(), exclude_ports=store_ports)
            logger.warning(
                "rank %d: link fault injected before step %d: %d connection(s) to peers reset (%s)",
                self.rank,
                step,
                len(links),
                ", ".join(c.describe() for c in links),
            )

    def flap(self) -> None:
        """A re-execution of the collective a flapping link broke is about to run: the link
        fails again, while flaps are left (:data:`unbroken.worker.opretry.before_attempt`)."""
        if self._flaps <= 0:
            return
        self._flaps -= 1
        links = reset_links(os.getpid(), exclude_ports=self._store_ports)
        logger.warning(
            "rank %d: the link flaps: %d connection(s) to peers reset again", self.rank, len(links)
        )

    def _claim(self, entry: ChaosEntry) -> bool:
        assert self.fired_dir is not None
        return claim(self.fired_dir, entry)


def _memory_error(
    rank: int,
    step: int,
    model: torch.nn.Module,
    fail_step: Callable[[Exception], None] | None,
) -> None:
    """Corrupt one element of a parameter, as a failed memory cell would, and surface the
    error the way a device does: on access, before this step shares anything. With in-process
    recovery the step fails without contributing a gradient (the rank leaves the group and
    its corrupt state is repaired from a replica); without it the process dies of it."""
    first = next(iter(model.parameters()))
    # A sharded parameter's memory is this rank's shard: writing through the DTensor would run
    # a collective of its own.
    local = first.to_local() if isinstance(first, DTensor) else first
    with torch.no_grad():
        local.view(-1)[0] = float("nan")
    error = DeviceMemoryError(
        f"uncorrectable device memory error {MEMORY_ERROR_CODE} in rank {rank} at step {step} "
        "(injected): parameter memory is corrupt"
    )
    if fail_step is None:
        raise error
    fail_step(error)


def _device_error(code: str, where: str) -> Exception:
    """The error the CUDA runtime's ``code`` (``CUDA-710``) reaches Python as. On a rank that
    trains on a GPU, a device-side assert (710) and an out-of-memory (2) are the real thing: an
    out-of-bounds index run on the device, an allocation larger than the device. Otherwise the
    exception torch raises for it: ``torch.OutOfMemoryError`` for 2, and for any other code a
    ``torch.AcceleratorError`` with that ``error_code`` (torch 2.8 on; before, a plain
    ``RuntimeError``, which carries no code)."""
    number = int(code.removeprefix("CUDA-"))
    if torch.cuda.is_initialized() and number in (710, 2):  # type: ignore[no-untyped-call]
        try:
            if number == 710:
                index = torch.tensor([1 << 20], device="cuda")
                torch.zeros(1, device="cuda")[index].item()  # an assert in the kernel
            else:
                free, _ = torch.cuda.mem_get_info()
                torch.empty(free * 2, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        except Exception as e:  # the runtime's own error, raised where the step runs
            return e
    message = f"CUDA error {number} (injected in {where})"
    if number == 2:
        return torch.OutOfMemoryError(f"CUDA out of memory (injected in {where})")
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is None:
        return RuntimeError(message)
    error: Exception = accelerator_error(message)
    error.error_code = number  # type: ignore[attr-defined]
    return error


def _raise_injected(signum: int, frame: FrameType | None) -> None:
    raise InjectedFault(f"injected exception (signal {signal.Signals(signum).name})")


def install_signal_fault(chaos: RankChaos) -> None:
    """SIGUSR1 raises :class:`InjectedFault` in the main thread; SIGUSR2 arms a device memory
    error for the next step (managed ranks only); a flapping link breaks op retry's
    re-executions (:meth:`RankChaos.flap`)."""
    signal.signal(signal.SIGUSR1, _raise_injected)
    opretry.before_attempt = chaos.flap

    def arm(signum: int, frame: FrameType | None) -> None:
        chaos.memory_armed = True

    signal.signal(signal.SIGUSR2, arm)
