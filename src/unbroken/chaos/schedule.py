"""The chaos file: faults to inject, each keyed by a training step or by seconds.

```yaml
faults:
  - {kind: kill, rank: 3, at_step: 110}         # SIGKILL rank 3 right after it commits step 110
  - {kind: exception, rank: 1, at_step: 40}     # a Python exception inside rank 1's step 40
  - {kind: hang, rank: 2, after_s: 12}          # SIGSTOP rank 2, 12 s after the job started
  - {kind: memory, rank: 0, at_step: 70}        # a device memory error corrupts rank 0's state
  - {kind: link, rank: 1, at_step: 30}          # the kernel resets rank 1's links to its peers
  - {kind: node, node: node-1, at_step: 60}     # every process of node-1 dies at once
  - {kind: device, node: node-0, device: 1, code: "80E01801", after_s: 5}
```

Rank faults keyed by step fire inside the rank itself, exactly at that step (keyed by
``(rank, step)``, each fault at most once per run even when the step is replayed; entries for
the same rank and step fire on successive runs of that step, in file order, as a fault that
strikes again when the step is redone after a recovery); everything
else is fired from outside by the control plane (signals by pid, ``ss -K`` on a rank's links to
its peers, device codes through the ``sim`` provider). A kind, rank, pod or node that the job
does not have is an error naming the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml


class InjectKind(StrEnum):
    KILL = "kill"  # SIGKILL a rank
    EXCEPTION = "exception"  # a Python exception raised in the rank's main thread
    HANG = "hang"  # SIGSTOP a rank
    MEMORY = "memory"  # an uncorrectable device memory error in a rank (state corrupt)
    LINK = "link"  # the kernel resets a rank's TCP links to its peers (ss -K)
    NODE = "node"  # SIGKILL every process of a node (agents and ranks)
    DEVICE = "device"  # a device health code through the sim provider


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

    @property
    def in_rank(self) -> bool:
        """Fired by the rank itself at an exact step."""
        return self.rank is not None and self.at_step is not None and self.kind in _RANK_KINDS

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in self.__dict__.items()}


_RANK_KINDS = (
    InjectKind.KILL,
    InjectKind.EXCEPTION,
    InjectKind.HANG,
    InjectKind.MEMORY,
    InjectKind.LINK,
)
_FIELDS = {"kind", "rank", "pod", "node", "device", "code", "at_step", "after_s"}


def load_chaos(
    path: Path, world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> tuple[ChaosFault, ...]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ChaosError(f"{path}: cannot read the chaos file: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ChaosError(f"{path}: not valid YAML: {exc}") from None
    return parse_chaos(doc, str(path), world_size, pods, nodes)


def parse_chaos(
    doc: object, where: str, world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> tuple[ChaosFault, ...]:
    if isinstance(doc, dict):
        doc = doc.get("faults")
    if not isinstance(doc, list) or not doc:
        raise ChaosError(f"{where}: expected a non-empty list under 'faults:'")
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
        except ValueError as exc:
            problems.append(f"{at}: {exc}")
    if problems:
        raise ChaosError("\n".join(problems))
    return tuple(out)


def _int(entry: dict[str, Any], key: str) -> int | None:
    v = entry.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key}: {v!r} is not an integer")
    return v


def _one(
    i: int, e: dict[str, Any], world_size: int, pods: Sequence[str], nodes: Sequence[str]
) -> ChaosFault:
    kinds = [k.value for k in InjectKind]
    if e.get("kind") not in kinds:
        raise ValueError(f"kind: {e.get('kind')!r} is not one of {kinds}")
    kind = InjectKind(e["kind"])
    rank, device, at_step = _int(e, "rank"), _int(e, "device"), _int(e, "at_step")
    after = e.get("after_s")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int | float)):
        raise ValueError(f"after_s: {after!r} is not a number of seconds")
    if (at_step is None) == (after is None):
        raise ValueError("give exactly one of at_step (a training step) or after_s (seconds)")
    if at_step is not None and at_step < 1:
        raise ValueError(f"at_step: {at_step} must be >= 1")
    if after is not None and after < 0:
        raise ValueError(f"after_s: {after} must be >= 0")
    pod, node, code = e.get("pod"), e.get("node"), e.get("code")
    if kind in _RANK_KINDS:
        if (rank is None) == (pod is None):
            raise ValueError(f"kind {kind}: give exactly one of rank or pod")
        if rank is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank: {rank} does not exist (the job has ranks 0-{world_size - 1})")
    if pod is not None and pod not in pods:
        raise ValueError(f"pod: {pod!r} does not exist (pods: {', '.join(pods)})")
    if kind in (InjectKind.NODE, InjectKind.DEVICE):
        if node is None:
            raise ValueError(f"kind {kind}: 'node' is required")
        if node not in nodes:
            raise ValueError(f"node: {node!r} does not exist (nodes: {', '.join(nodes)})")
    if kind is InjectKind.DEVICE:
        if device is None or code is None:
            raise ValueError("kind device: 'device' and 'code' are required")
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"code: {code!r} must be a non-empty string")
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
    )
