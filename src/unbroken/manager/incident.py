"""The incident being recovered: the first fault since training last ran undisturbed."""

from __future__ import annotations

from dataclasses import dataclass, field

from unbroken.faults import Fault


@dataclass
class Incident:
    """``strategy``: the rung carrying it out now; ``awaiting_replacement``: the pods whose
    replacements (``recover``) the policy is told about once all their ranks started."""

    fault_id: str
    fault: Fault
    step_at_fault: int
    strategy: str = ""
    awaiting_replacement: set[str] = field(default_factory=set)
