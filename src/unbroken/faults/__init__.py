"""Faults as values: kinds, the seed's levels, the code table and escalation of repeats.

Pure (no torch, no I/O beyond reading a code table file on request).
"""

from unbroken.faults.codes import (
    DEFAULT_LEVELS,
    CodeInfo,
    CodeTable,
    CodeTableError,
    Escalation,
)
from unbroken.faults.escalation import escalate, repeats
from unbroken.faults.fault import Fault, FaultLevel, worst
from unbroken.protocol.kinds import FaultKind

__all__ = [
    "DEFAULT_LEVELS",
    "CodeInfo",
    "CodeTable",
    "CodeTableError",
    "Escalation",
    "Fault",
    "FaultKind",
    "FaultLevel",
    "escalate",
    "repeats",
    "worst",
]
