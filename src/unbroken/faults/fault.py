"""What a fault is: its kind, its level and the ranks, pod, node and device it touches.

The kinds (:class:`~unbroken.protocol.kinds.FaultKind`) are the vocabulary the training side
shares with the control plane, so they live in :mod:`unbroken.protocol`.

Detectors (agents, device health providers, workers) emit :class:`Fault` values; nothing here
raises. The level is the seed's vocabulary (``NotHandle`` ... ``ManuallySeparate``), ordered by
:attr:`FaultLevel.severity`:

==  ==================  ==============================================================  ========
 #  level               meaning here                                                     isolates
==  ==================  ==============================================================  ========
 0  ``NotHandle``       recorded only                                                    no
 1  ``SubHealth``       training goes on; ``subHealthyStrategy`` decides                 no
 2  ``PreSeparateNPU``  training goes on; no new work is placed on the device            yes
 3  ``RestartRequest``  the current request/step must be re-run                          no
 4  ``RestartBusiness`` the training processes must redo or restart                      no
 5  ``FreeRestartNPU``  as above, and the device is reset once idle                      no
 6  ``RestartNPU``      as above, and the device is reset at once                        no
 7  ``SeparateNPU``     the device is isolated (returns when healthy: autoStowing)       yes
 8  ``ManuallySeparate`` the device is isolated until an operator releases it            yes
==  ==================  ==============================================================  ========

``SubHealth`` and ``PreSeparateNPU`` rank low because neither stops training (the reference
groups both as "sub-healthy"); every level from ``RestartRequest`` up stops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from unbroken.protocol.kinds import FaultKind


class FaultLevel(StrEnum):
    """How severe a fault is: the seed's level names. Compare with :attr:`severity`."""

    NOT_HANDLE = "NotHandle"
    SUB_HEALTH = "SubHealth"
    PRE_SEPARATE_NPU = "PreSeparateNPU"
    RESTART_REQUEST = "RestartRequest"
    RESTART_BUSINESS = "RestartBusiness"
    FREE_RESTART_NPU = "FreeRestartNPU"
    RESTART_NPU = "RestartNPU"
    SEPARATE_NPU = "SeparateNPU"
    MANUALLY_SEPARATE = "ManuallySeparate"

    @property
    def severity(self) -> int:
        """Position in the documented order (module docstring): higher is worse."""
        return _SEVERITY[self]

    @property
    def stops_training(self) -> bool:
        """Whether the job's processes must stop, redo or restart."""
        return self.severity >= _SEVERITY[FaultLevel.RESTART_REQUEST]

    @property
    def isolates_device(self) -> bool:
        """Whether the device must not receive new work (until healthy or released)."""
        return self in _ISOLATING

    @property
    def resets_device(self) -> bool:
        """Whether the device is reset before it is used again."""
        return self in (FaultLevel.FREE_RESTART_NPU, FaultLevel.RESTART_NPU)


_SEVERITY: dict[FaultLevel, int] = {level: i for i, level in enumerate(FaultLevel)}
_ISOLATING = frozenset(
    {FaultLevel.PRE_SEPARATE_NPU, FaultLevel.SEPARATE_NPU, FaultLevel.MANUALLY_SEPARATE}
)


def worst(*levels: FaultLevel) -> FaultLevel:
    """The most severe of ``levels`` (``NotHandle`` for none)."""
    return max(levels, key=_SEVERITY.__getitem__, default=FaultLevel.NOT_HANDLE)


@dataclass(frozen=True)
class Fault:
    """One observed fault.

    ``at`` is the wall-clock time it happened (``time.time()`` units). ``code`` is the device
    fault code for device faults (see ``codes.yaml``) and a detector's short tag otherwise (for
    example ``"exit:137"`` or ``"signal:SIGKILL"``); it may be empty. ``device`` is the device
    index on ``node``.
    """

    kind: FaultKind
    level: FaultLevel
    code: str
    at: float
    node: str | None = None
    pod: str | None = None
    ranks: tuple[int, ...] = ()
    device: int | None = None
    detail: str = ""
    step: int | None = None  # the step it failed, where a rank said so (a failed step)

    @property
    def retryable(self) -> bool:
        """Online retry can handle it: a retryable kind whose device needs no reset or
        isolation (an escalated memory error is not retryable any more)."""
        return self.kind.retryable and self.level.severity <= FaultLevel.RESTART_BUSINESS.severity

    @property
    def isolates_device(self) -> bool:
        return self.device is not None and self.node is not None and self.level.isolates_device

    def describe(self) -> str:
        """A short human-readable summary for decisions' reasons and logs."""
        where = []
        if self.pod is not None:
            where.append(f"pod {self.pod}")
        if self.node is not None:
            where.append(f"node {self.node}")
        if self.device is not None:
            where.append(f"device {self.device}")
        if self.ranks:
            where.append("rank " + ",".join(str(r) for r in self.ranks))
        code = f" {self.code}" if self.code else ""
        place = f" on {' '.join(where)}" if where else ""
        return f"{self.kind}{code} ({self.level}){place}"
