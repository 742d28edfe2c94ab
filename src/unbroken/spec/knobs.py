"""The fault-handling knobs of a job, as values: the vocabulary every component shares.

The spec loader (``unbroken.spec``) produces a :class:`FaultHandling` from a job YAML (labels,
annotations, container env, launcher arguments) and validates every range; the policy
(``unbroken.policy``) and the executors consume it. Enum values are the seed's own spellings.
This module is pure: no I/O, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Strategy(StrEnum):
    """A rung of the process-level recovery ladder (``recover-strategy`` tokens)."""

    RETRY = "retry"
    RECOVER_IN_PLACE = "recover-in-place"
    RECOVER = "recover"
    ELASTIC_TRAINING = "elastic-training"
    DUMP = "dump"
    EXIT = "exit"


#: Fixed priority of the process-level rungs (highest first), as in the reference.
STRATEGY_PRIORITY: tuple[Strategy, ...] = (
    Strategy.RETRY,
    Strategy.RECOVER_IN_PLACE,
    Strategy.RECOVER,
    Strategy.ELASTIC_TRAINING,
    Strategy.DUMP,
    Strategy.EXIT,
)


class FaultScheduling(StrEnum):
    """``fault-scheduling`` label: how pods are stopped when a job or pod is rescheduled."""

    FORCE = "force"  # delete pods at once (SIGKILL)
    GRACE = "grace"  # SIGTERM, then SIGKILL after ``grace_s``
    OFF = "off"  # absent or "off": no rescheduling


class ProcessRecover(StrEnum):
    """``process-recover-enable`` label."""

    ON = "on"
    PAUSE = "pause"  # process rungs temporarily off: fall back to pod/job rescheduling
    OFF = "off"


class SubHealthyStrategy(StrEnum):
    """``subHealthyStrategy`` label: what a SubHealth fault triggers."""

    IGNORE = "ignore"
    GRACE_EXIT = "graceExit"  # dump, then reschedule (needs ``dump``)
    FORCE_EXIT = "forceExit"
    HOT_SWITCH = "hotSwitch"


class Framework(StrEnum):
    PYTORCH = "pytorch"
    MINDSPORE = "mindspore"


class RetryLevel(StrEnum):
    """Communication levels of operator-level retry (``HCCL_OP_RETRY_ENABLE``)."""

    L0 = "L0"  # inside a node
    L1 = "L1"  # between nodes
    L2 = "L2"  # between super-nodes


@dataclass(frozen=True)
class OpRetry:
    """Operator-level retry: ``HCCL_OP_RETRY_ENABLE`` and ``HCCL_OP_RETRY_PARAMS``.

    Ranges (reference): ``max_count`` 1-10, ``hold_s`` 0-60 (HoldTime 0-60000 ms, default 5000),
    ``interval_s`` 0-60 (IntervalTime 0-60000 ms, default 1000).
    """

    enabled: frozenset[RetryLevel] = frozenset()
    max_count: int = 1
    hold_s: float = 5.0
    interval_s: float = 1.0

    def applies_to(self, level: RetryLevel) -> bool:
        return level in self.enabled


#: Defaults and ranges from the reference implementation (DESIGN section 2).
GRACE_S_DEFAULT = 900.0
GRACE_S_RANGE = (2.0, 3600.0)
# Stragglers (unbroken.policy.straggler): a node whose ranks compute slower than
# ``threshold`` percent of the fastest rank's speed, over a median of ``window`` steps, for
# ``hold`` seconds is a sub-health fault.
STRAGGLER_THRESHOLD_PERCENT_RANGE = (1, 99)
STRAGGLER_THRESHOLD_PERCENT_DEFAULT = 75
STRAGGLER_WINDOW_RANGE = (1, 1000)
STRAGGLER_WINDOW_DEFAULT = 5
STRAGGLER_HOLD_S_RANGE = (0, 86400)
STRAGGLER_HOLD_S_DEFAULT = 10
WAIT_RESCHEDULE_S_DEFAULT = 270.0
WAIT_RESCHEDULE_S_RANGE = (30.0, 270.0)
DECISION_WAIT_S_DEFAULT = 30.0  # MINDIO_WAIT_MINDX_TIME
DECISION_WAIT_S_RANGE = (1.0, 3600.0)
MAX_RESTARTS_DEFAULT = 32767
#: Stopping faults in a row without a step committed beyond the previous one's, before the job
#: fails (annotation ``no-progress-restarts``; see ``unbroken.policy.stall``).
NO_PROGRESS_RESTARTS_DEFAULT = 8
NO_PROGRESS_RESTARTS_RANGE = (1, 1000)
MONITOR_INTERVAL_S_DEFAULT = 5.0
LIST_WATCH_PERIOD_S_DEFAULT = 5.0
LIST_WATCH_PERIOD_S_RANGE = (3.0, 1800.0)
OP_RETRY_MAX_COUNT_RANGE = (1, 10)
#: Upper bounds of sizes: beyond them a number is a typo (or hostile), not a job.
MAX_REPLICAS = 10_000  # pods of one replica type
MAX_NODES = 10_000  # nodes of a cluster
MAX_PROCS_PER_NODE = 1024  # --nproc_per_node
MAX_DEVICES_PER_NODE = 1024  # devices a container requests, devicesPerNode of a cluster
MAX_RESTARTS_LIMIT = 2**31 - 1  # --max_restarts
OP_RETRY_MS_RANGE = (0, 60000)


@dataclass(frozen=True)
class FaultHandling:
    """Everything the decision needs to know about how a job wants faults handled.

    ``strategies`` is the configured ``recover-strategy`` in fixed priority order with ``exit``
    always last (empty only when no ``recover-strategy`` is configured at all).
    """

    strategies: tuple[Strategy, ...] = ()
    fault_scheduling: FaultScheduling = FaultScheduling.OFF
    grace_s: float = GRACE_S_DEFAULT
    pod_rescheduling: bool = False
    fault_retry_times: int = 0  # 0: no unconditional reschedule retries
    process_recover: ProcessRecover = ProcessRecover.OFF
    sub_healthy: SubHealthyStrategy = SubHealthyStrategy.IGNORE
    straggler_threshold_percent: int = STRAGGLER_THRESHOLD_PERCENT_DEFAULT
    straggler_window: int = STRAGGLER_WINDOW_DEFAULT
    straggler_hold_s: float = STRAGGLER_HOLD_S_DEFAULT
    wait_reschedule_s: float = WAIT_RESCHEDULE_S_DEFAULT
    decision_wait_s: float = DECISION_WAIT_S_DEFAULT
    max_restarts: int = MAX_RESTARTS_DEFAULT
    no_progress_restarts: int = NO_PROGRESS_RESTARTS_DEFAULT
    monitor_interval_s: float = MONITOR_INTERVAL_S_DEFAULT
    op_retry: OpRetry = field(default_factory=OpRetry)
    framework: Framework = Framework.PYTORCH
    #: Switch the collectives to another network plane when theirs goes down, and back when
    #: it is healthy (:mod:`unbroken.policy.planes`): ``MS_ENABLE_TFT`` ``TSP:1``, or the
    #: seed's PyTorch configuration (``retry`` with ``HCCL_OP_RETRY_ENABLE`` on at ``L1``).
    link_failover: bool = False

    @property
    def process_level(self) -> bool:
        """Whether any process-level rung may run now (configured and not paused)."""
        return bool(self.strategies) and self.process_recover is ProcessRecover.ON
