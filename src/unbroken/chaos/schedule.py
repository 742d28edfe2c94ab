"""The chaos file: faults to inject, each keyed by a training step or by seconds.

```yaml
faults:
  - {kind: kill, rank: 3, at_step: 110}         # SIGKILL rank 3 right after it commits step 110
  - {kind: exception, rank: 1, at_step: 40}     # a Python exception inside rank 1's step 40
  - {kind: exception, rank: 2, code: CUDA-710, at_step: 50}  # a device-side assert (sticky)
  - {kind: hang, rank: 2, after_s: 12}          # SIGSTOP rank 2, 12 s after the job started
  - {kind: memory, rank: 0, at_step: 70}        # a device memory error corrupts rank 0's state
  - {kind: link, rank: 1, at_step: 30}          # the kernel resets rank 1's links to its peers
  - {kind: link, rank: 1, at_step: 40, times: 2}  # ...and again on the first re-execution
  - {kind: node, node: node-1, at_step: 60}     # every process of node-1 dies at once
  - {kind: device, node: node-0, device: 1, code: "80E01801", after_s: 5}
  - {kind: sdc, node: node-1, device: 1, at_step: 80}  # device 1 of node-1 computes wrong
  - {kind: stress-test, at_step: 80}            # an online stress test, as unbroken stress-test
```

``sdc`` (silent data corruption) leaves the device's health good: only an online stress test
finds it. ``stress-test`` is no fault: it asks for an online stress test at that point, as
``unbroken stress-test`` does (refused, with the reason on the console, when one cannot run).

Rank faults keyed by step fire inside the rank itself, exactly at that step (keyed by
``(rank, step)``, each fault at most once per run even when the step is replayed; entries for
the same rank and step fire on successive runs of that step, in file order, as a fault that
strikes again when the step is redone after a recovery); everything
else is fired from outside by the control plane (signals by pid, ``ss -K`` on a rank's links to
its peers, device codes through the ``sim`` provider). A kind, rank, pod or node that the job
does not have is an error naming the entry; the file is read as strictly as the job file (one
bounded loader, ``unbroken.spec.document``; numbers finite and within int64), each problem one
line ``file:line: faults[i].field: problem``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from unbroken.spec import document
from unbroken.spec.document import Map, Scalar, Seq, YamlNode, kind_name
from unbroken.spec.problems import Problems


class InjectKind(StrEnum):
    KILL = "kill"  # SIGKILL a rank
    EXCEPTION = "exception"  # a Python exception raised in the rank's main thread
    HANG = "hang"  # SIGSTOP a rank
    MEMORY = "memory"  # an uncorrectable device memory error in a rank (state corrupt)
    LINK = "link"  # the kernel resets a rank's TCP links to its peers (ss -K)
    NODE = "node"  # SIGKILL every process of a node (agents and ranks)
    DEVICE = "device"  # a device health code through the sim provider
    SDC = "sdc"  # silent data corruption: a sim device computes wrong, its health stays good
    STRESS_TEST = "stress-test"  # no fault: an online stress test (unbroken stress-test)
    THROTTLE = "throttle"  # a node's processes held to ``cpu`` of one CPU (a cgroup quota)


class ChaosError(ValueError):
    """The chaos file is wrong; one line per problem, each naming the file and entry."""


@dataclass(frozen=True)
class ChaosFault:
    index: int
    kind: InjectKind
    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    device: int | None = None
    code: str | None = None
    at_step: int | None = None
    after_s: float | None = None
    clear: bool = False  # node: the lost node is back; device: the device is healthy again
    cpu: float | None = None  # throttle: the node's share of one CPU (0.01-1.0)
    #: link: how many times the link fails: the fault, then as many re-executions (op retry) of
    #: the collective it broke as there are more (a link that flaps).
    times: int | None = None

    @property
    def in_rank(self) -> bool:
        """Fired by the rank itself at an exact step."""
        return self.rank is not None and self.at_step is not None and self.kind in _RANK_KINDS

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in self.__dict__.items()}


#: The code of a device error a rank raises (``kind: exception``): a ``cudaError_t``, raised as
#: ``torch.AcceleratorError`` with that ``error_code``.
_CUDA_CODE = re.compile(r"CUDA-[0-9]{1,4}")
_RANK_KINDS = (
    InjectKind.KILL,
    InjectKind.EXCEPTION,
    InjectKind.HANG,
    InjectKind.MEMORY,
    InjectKind.LINK,
)
_FIELDS = {
    *("kind", "rank", "pod", "node", "device", "code", "at_step", "after_s", "clear", "cpu"),
    "times",
}
#: Bounds of the numbers of an entry: a step fits the ledger's int64, a device index the
#: largest node, and a fault is at most a week into the run.
MAX_STEP = 2**63 - 1
MAX_DEVICE = 1023
MAX_AFTER_S = 7 * 86400.0


class _Bad(ValueError):
    """One problem of an entry, naming its field ("" for the entry as a whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def load_chaos(
    path: Path, world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> tuple[ChaosFault, ...]:
    """The chaos file at ``path``, read as strictly as the job file (the same bounded loader:
    UTF-8, size, nesting, aliases); every problem is one line ``file:line: field: problem``."""
    problems = Problems(path)
    root = document.load(path, problems)
    out: list[ChaosFault] = []
    if root is not None:
        for i, entry in _entries(root, problems):
            values = _values(entry, problems)
            if values is None:
                continue
            try:
                out.append(_one(i, values, world_size, pods, nodes))
            except _Bad as exc:
                node = entry.get(exc.field) if exc.field else None
                where = node or entry
                problems.error(where.line, where.path, exc.message)
    if problems.problems:
        raise ChaosError("\n".join(p.render() for p in problems.problems))
    return tuple(out)


def _entries(root: YamlNode, problems: Problems) -> list[tuple[int, Map]]:
    faults: YamlNode | None = root
    if isinstance(root, Map):
        for key, node in root.items.items():
            if key != "faults":
                problems.error(node.line, key, "unknown field", allowed="faults")
        faults = root.get("faults")
        if faults is None and problems.problems:
            return []  # a misspelt 'faults:' is said once
    if not isinstance(faults, Seq) or not faults.items:
        where = faults or root
        problems.error(where.line, "faults", "expected a non-empty list of faults")
        return []
    out = []
    for i, entry in enumerate(faults.items):
        if isinstance(entry, Map):
            out.append((i, entry))
        else:
            problems.error(entry.line, entry.path, f"expected a mapping, got {kind_name(entry)}")
    return out


def _values(entry: Map, problems: Problems) -> dict[str, Any] | None:
    values: dict[str, Any] = {}
    ok = True
    for key, node in entry.items.items():
        if key not in _FIELDS:
            problems.error(
                node.line, node.path, "unknown field", allowed=", ".join(sorted(_FIELDS))
            )
            ok = False
        elif not isinstance(node, Scalar):
            problems.error(node.line, node.path, f"expected a single value, got {kind_name(node)}")
            ok = False
        else:
            values[key] = node.value
    return values if ok else None


def parse_chaos(
    doc: object, where: str, world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> tuple[ChaosFault, ...]:
    """A chaos schedule already read into Python values (no lines to name)."""
    if isinstance(doc, dict):
        doc = doc.get("faults")
    if not isinstance(doc, list) or not doc:
        raise ChaosError(f"{where}: faults: expected a non-empty list of faults")
    out: list[ChaosFault] = []
    problems: list[str] = []
    for i, entry in enumerate(doc):
        at = f"{where}: faults[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: expected a mapping, got {type(entry).__name__}")
            continue
        unknown = sorted(set(map(str, entry)) - _FIELDS)
        if unknown:
            problems.append(f"{at}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
            continue
        try:
            out.append(_one(i, entry, world_size, pods, nodes))
        except _Bad as exc:
            problems.append(f"{at}.{exc.field}: {exc.message}" if exc.field else f"{at}: {exc}")
    if problems:
        raise ChaosError("\n".join(problems))
    return tuple(out)


def _int(entry: dict[str, Any], key: str, low: int, high: int) -> int | None:
    v = entry.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(key, f"{v!r} is not an integer")
    if not low <= v <= high:
        raise _Bad(key, f"{v} is out of range ({low}-{high})")
    return v


def _str(entry: dict[str, Any], key: str) -> str | None:
    v = entry.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise _Bad(key, f"{v!r} is not a name (a non-empty string)")
    return v


def _one(
    i: int, e: dict[str, Any], world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> ChaosFault:
    kinds = [k.value for k in InjectKind]
    if e.get("kind") not in kinds:
        raise _Bad("kind", f"{e.get('kind')!r} is not one of {kinds}")
    kind = InjectKind(e["kind"])
    rank = _int(e, "rank", 0, MAX_STEP)
    device = _int(e, "device", 0, MAX_DEVICE)
    at_step = _int(e, "at_step", 1, MAX_STEP)
    times = _int(e, "times", 1, 10)
    if times is not None and kind is not InjectKind.LINK:
        raise _Bad("times", f"kind {kind}: times is for link entries (a link that flaps)")
    after = e.get("after_s")
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, int | float):
            raise _Bad("after_s", f"{after!r} is not a number of seconds")
        if not math.isfinite(after):
            raise _Bad("after_s", f"{after!r} is not a finite number of seconds")
        if not 0 <= after <= MAX_AFTER_S:
            raise _Bad("after_s", f"{after} is out of range (0-{MAX_AFTER_S:.0f} s)")
    if (at_step is None) == (after is None):
        raise _Bad("", "give exactly one of at_step (a training step) or after_s (seconds)")
    pod, node, code = _str(e, "pod"), _str(e, "node"), _str(e, "code")
    if kind in _RANK_KINDS:
        if (rank is None) == (pod is None):
            raise _Bad("", f"kind {kind}: give exactly one of rank or pod")
        if rank is not None and not 0 <= rank < world_size:
            raise _Bad("rank", f"{rank} does not exist (the job has ranks 0-{world_size - 1})")
    if pod is not None and pod not in pods:
        raise _Bad("pod", f"{pod!r} does not exist (pods: {', '.join(pods)})")
    if kind in (InjectKind.NODE, InjectKind.DEVICE, InjectKind.SDC, InjectKind.THROTTLE):
        if node is None:
            raise _Bad("", f"kind {kind}: 'node' is required")
        if node not in nodes:
            raise _Bad("node", f"{node!r} does not exist (nodes: {', '.join(nodes)})")
    clear = e.get("clear", False)
    if not isinstance(clear, bool):
        raise _Bad("clear", f"{clear!r} is not true or false")
    if clear and kind not in (InjectKind.NODE, InjectKind.DEVICE, InjectKind.THROTTLE):
        raise _Bad("clear", f"kind {kind}: clear is for node, device and throttle entries")
    cpu = e.get("cpu")
    if cpu is not None:
        if kind is not InjectKind.THROTTLE:
            raise _Bad("cpu", f"kind {kind}: cpu is for throttle entries")
        if isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0.01 <= cpu <= 1.0:
            raise _Bad("cpu", f"{cpu!r} is not a share of one CPU (0.01-1.0)")
    if kind is InjectKind.THROTTLE and (cpu is None) == (not clear):
        raise _Bad("", "kind throttle: give 'cpu' (a share of one CPU) or 'clear: true', not both")
    if kind is InjectKind.DEVICE and clear and code is not None:
        raise _Bad("", "kind device: give 'code' (a fault) or 'clear: true' (healthy), not both")
    if kind is InjectKind.DEVICE and (device is None or (code is None and not clear)):
        raise _Bad("", "kind device: 'device' and 'code' are required")
    if code is not None and kind is InjectKind.EXCEPTION and not _CUDA_CODE.fullmatch(code):
        raise _Bad("code", f"{code!r}: an exception's code is a CUDA error code (CUDA-710)")
    if code is not None and kind in _RANK_KINDS and kind is not InjectKind.EXCEPTION:
        raise _Bad("code", f"kind {kind}: code is for device, sdc and exception entries")
    if kind is InjectKind.SDC and device is None:
        raise _Bad("", "kind sdc: 'device' is required")
    if kind is InjectKind.STRESS_TEST and (rank, pod, node, device) != (None, None, None, None):
        raise _Bad("", "kind stress-test: tests every rank, give no rank, pod, node or device")
    return ChaosFault(
        index=i,
        kind=kind,
        rank=rank,
        pod=pod,
        node=node,
        device=device,
        code=code,
        at_step=at_step,
        after_s=None if after is None else float(after),
        clear=clear,
        cpu=None if cpu is None else float(cpu),
        times=times,
    )
