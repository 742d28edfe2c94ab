"""The run's ledger: typed events and a status snapshot in one SQLite file (WAL mode).

The control plane writes; ``unbroken status`` / ``unbroken events`` read it from other
processes. Event classes live in :mod:`unbroken.ledger.events`; the incident timeline (MTTR
per phase) in :mod:`unbroken.ledger.timeline`.
"""

from unbroken.ledger.codec import DecodeError, decode, encode
from unbroken.ledger.events import (
    EVENT_TYPES,
    RAW_KINDS,
    CheckpointSaved,
    CommunicationReady,
    DecisionMade,
    DeviceIsolated,
    DeviceReturned,
    Event,
    FaultDetected,
    FirstStepCommitted,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    NodeIsolated,
    PodHotSwitched,
    PodPlaced,
    PodsStopped,
    ProcessesStarted,
    RecoveryCompleted,
    StateLoaded,
    StateSource,
    StepProgress,
)
from unbroken.ledger.goodput import (
    CAUSE_LABELS,
    CAUSES,
    Goodput,
    format_goodput,
    goodput,
    goodput_line,
)
from unbroken.ledger.status import JobPhase, JobStatus, PodStatus
from unbroken.ledger.store import SCHEMA_VERSION, Ledger, LedgerError, Record
from unbroken.ledger.timeline import (
    PHASES,
    Incident,
    IncidentOutcome,
    Phase,
    format_incidents,
    incidents,
)

__all__ = [
    "CAUSES",
    "CAUSE_LABELS",
    "EVENT_TYPES",
    "PHASES",
    "RAW_KINDS",
    "SCHEMA_VERSION",
    "CheckpointSaved",
    "CommunicationReady",
    "DecisionMade",
    "DecodeError",
    "DeviceIsolated",
    "DeviceReturned",
    "Event",
    "FaultDetected",
    "FirstStepCommitted",
    "Goodput",
    "Incident",
    "IncidentOutcome",
    "JobFailed",
    "JobPhase",
    "JobStatus",
    "JobSubmitted",
    "JobSucceeded",
    "Ledger",
    "LedgerError",
    "NodeIsolated",
    "Phase",
    "PodHotSwitched",
    "PodPlaced",
    "PodStatus",
    "PodsStopped",
    "ProcessesStarted",
    "Record",
    "RecoveryCompleted",
    "StateLoaded",
    "StateSource",
    "StepProgress",
    "decode",
    "encode",
    "format_goodput",
    "format_incidents",
    "goodput",
    "goodput_line",
    "incidents",
]
