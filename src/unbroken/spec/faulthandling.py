"""How a job wants faults handled: labels, annotations and env knobs -> ``FaultHandling``.

Every value is checked against DESIGN section 2; an unknown or out-of-range value is an error
(the reference silently drops unknown ``recover-strategy`` tokens and clamps
``wait-reschedule-timeout``; we say so, with the line). The combinations:

- Process-level strategies (``retry``, ``recover-in-place``, ``recover``, ``elastic-training``,
  ``dump``) need ``fault-scheduling: grace``: the healthy processes must get SIGTERM and time to
  save, not SIGKILL.
- ``pod-rescheduling: on`` and ``fault-retry-times`` > 0 need ``fault-scheduling`` (force or
  grace): without it nothing is rescheduled.
- ``fault-retry-times``: how many times a failed job (or pod, with ``pod-rescheduling``) is
  rescheduled *whatever the cause* before the job is marked failed. ``0`` or absent means no
  unconditional retry: a job whose process fails without a hardware fault behind it fails;
  faults of devices and nodes are still rescheduled under ``fault-scheduling``.
- ``subHealthyStrategy: graceExit`` saves last words before leaving, so it needs ``dump``.
- ``elastic-training`` is PyTorch only (the seed's Table 3 has no MindSpore column for it).
- ``TASKD_PROCESS_ENABLE=off`` next to a process-level ``recover-strategy`` (or ``hotSwitch``) is
  contradictory: the job would opt out of the very recovery it asks for.
- ``process-recover-enable`` is set to ``on`` by the operator when a process-level strategy is
  configured; a user's ``pause`` or ``off`` is honoured (process rungs skipped, pod/job
  rescheduling still apply) with a warning, and ``on`` without any strategy is an error.
- A collective watchdog that aborts the process on a failed collective
  (``HCCL_ASYNC_ERROR_HANDLING``/``TORCH_NCCL_ASYNC_ERROR_HANDLING`` other than 0) defeats
  process-level recovery, which needs the process to survive; with a strategy it is an error.
- ``--max_restarts 0`` under process-level recovery means 32767, as in the reference.
- ``no-progress-restarts`` (annotation, Unbroken's own, 1-1000, default 8): stopping faults in a
  row that find the job no further than the previous one did, before the job fails with that
  reason (the rungs for them back off exponentially; ``unbroken.policy.stall``).
- ``MINDIO_WAIT_MINDX_TIME`` below 60 s with ``elastic-training`` and no ``recover`` gets a
  warning (the seed advises at least 60).

Env knobs are job-wide: every training pod (Master and Worker) must set them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.spec.document import Map, Scalar, as_str
from unbroken.spec.envknobs import (
    KnobSyntaxError,
    TftSwitch,
    parse_int_in_range,
    parse_ms_enable_tft,
    parse_on_off,
    parse_op_retry_enable,
    parse_op_retry_params,
)
from unbroken.spec.injected_env import INJECTED_NAMES, injected_env, tft_switches
from unbroken.spec.knobs import (
    DECISION_WAIT_S_RANGE,
    GRACE_S_RANGE,
    MAX_RESTARTS_DEFAULT,
    NO_PROGRESS_RESTARTS_RANGE,
    STRAGGLER_HOLD_S_RANGE,
    STRAGGLER_THRESHOLD_PERCENT_RANGE,
    STRAGGLER_WINDOW_RANGE,
    STRATEGY_PRIORITY,
    WAIT_RESCHEDULE_S_RANGE,
    FaultHandling,
    FaultScheduling,
    Framework,
    OpRetry,
    ProcessRecover,
    RetryLevel,
    Strategy,
    SubHealthyStrategy,
)
from unbroken.spec.problems import Problems
from unbroken.spec.replicas import EnvValue, RawReplica, ReplicaType

PROCESS_RUNGS = frozenset(STRATEGY_PRIORITY) - {Strategy.EXIT}
_PER_POD = ("RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "NNODES", "MINDX_TASK_ID")
_WATCHDOGS = ("HCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
_ALL = ", ".join(s.value for s in STRATEGY_PRIORITY)


@dataclass(frozen=True)
class Located:
    value: str
    line: int
    field: str


def located_strings(block: Map | None, problems: Problems) -> dict[str, Located]:
    """A labels or annotations mapping as strings with their lines (non-strings are errors)."""
    found: dict[str, Located] = {}
    if block is None:
        return found
    for key, node in block.items.items():
        text = as_str(node, problems, quote_hint=True)
        if text is not None:
            line = node.text_line if isinstance(node, Scalar) else node.line
            found[key] = Located(text, line, node.path)
    return found


def _get(block: dict[str, Located], key: str, problems: Problems) -> Located | None:
    return block.get(key)


def _choice(item: Located | None, allowed: tuple[str, ...], problems: Problems) -> str | None:
    if item is None:
        return None
    if item.value not in allowed:
        problems.error(
            item.line, item.field, "unknown value", value=item.value, allowed=", ".join(allowed)
        )
        return None
    return item.value


def _number(
    item: Located | None, low: float, high: float | None, problems: Problems, unit: str = ""
) -> int | None:
    if item is None:
        return None
    try:
        return parse_int_in_range(
            item.value, item.field.rsplit(".", 1)[-1], int(low), None if high is None else int(high)
        )
    except KnobSyntaxError as exc:
        allowed = exc.allowed + (f" {unit}" if unit else "")
        problems.error(item.line, item.field, exc.message, value=item.value, allowed=allowed)
        return None


def parse_strategies(item: Located, problems: Problems) -> tuple[Strategy, ...]:
    """``recover-strategy`` tokens in fixed priority order (not yet with ``exit`` appended)."""
    tokens = [t.strip() for t in item.value.split(",")]
    if not item.value.strip():
        problems.error(item.line, item.field, "is empty", allowed=f"a comma list of {_ALL}")
        return ()
    chosen: set[Strategy] = set()
    for token in tokens:
        if not token:
            problems.error(
                item.line,
                item.field,
                "has an empty item (stray comma)",
                value=item.value,
                allowed=f"a comma list of {_ALL}",
            )
            continue
        if token not in {s.value for s in Strategy}:
            problems.error(
                item.line, item.field, "unknown recovery strategy", value=token, allowed=_ALL
            )
            continue
        strategy = Strategy(token)
        if strategy in chosen:
            problems.warn(item.line, item.field, f"{token!r} is listed more than once")
        chosen.add(strategy)
    return tuple(s for s in STRATEGY_PRIORITY if s in chosen)


def job_knobs(replicas: list[RawReplica], problems: Problems) -> dict[str, EnvValue]:
    """The env knobs of the job; every training pod must agree on each."""
    training = [r for r in replicas if r.type is not ReplicaType.SCHEDULER]
    knobs: dict[str, EnvValue] = {}
    owner: dict[str, RawReplica] = {}
    for replica in training:
        for name, value in replica.knobs.items():
            if name in knobs and knobs[name].value != value.value:
                problems.error(
                    value.line,
                    value.field,
                    f"{name} differs between {owner[name].name} ({knobs[name].value!r}) and "
                    f"{replica.name} ({value.value!r}); it is job-wide, set it alike in every pod",
                )
            elif name not in knobs:
                knobs[name] = value
                owner[name] = replica
    for name, value in knobs.items():
        missing = [r.name for r in training if name not in r.knobs]
        if missing:
            problems.error(
                value.line,
                value.field,
                f"{name} is set in {owner[name].name} but not in {', '.join(missing)}; "
                "it is job-wide, set it alike in every pod",
            )
    return knobs


def read_fault_handling(
    labels: dict[str, Located],
    annotations: dict[str, Located],
    replicas: list[RawReplica],
    framework: Framework,
    max_restarts: int | None,
    monitor_interval_s: float | None,
    problems: Problems,
) -> FaultHandling:
    scheduling_item = _get(labels, "fault-scheduling", problems)
    scheduling = FaultScheduling(
        _choice(scheduling_item, tuple(f.value for f in FaultScheduling), problems) or "off"
    )
    grace_item = _get(labels, "grace-over-time", problems)
    grace = _number(grace_item, *GRACE_S_RANGE, problems, "s")
    pod_item = _get(labels, "pod-rescheduling", problems)
    pod_rescheduling = _choice(pod_item, ("on", "off"), problems) == "on"
    retry_item = _get(labels, "fault-retry-times", problems)
    retry_times = _number(retry_item, 0, None, problems) or 0
    recover_item = _get(labels, "process-recover-enable", problems)
    recover_label = _choice(recover_item, tuple(p.value for p in ProcessRecover), problems)
    sub_item = _get(labels, "subHealthyStrategy", problems)
    sub = SubHealthyStrategy(
        _choice(sub_item, tuple(s.value for s in SubHealthyStrategy), problems) or "ignore"
    )
    straggler_pct = _number(
        _get(annotations, "straggler-threshold-percent", problems),
        *STRAGGLER_THRESHOLD_PERCENT_RANGE,
        problems,
        "%",
    )
    straggler_window = _number(
        _get(annotations, "straggler-window-steps", problems), *STRAGGLER_WINDOW_RANGE, problems
    )
    straggler_hold = _number(
        _get(annotations, "straggler-hold-seconds", problems),
        *STRAGGLER_HOLD_S_RANGE,
        problems,
        "s",
    )
    strategy_item = _get(annotations, "recover-strategy", problems)
    configured = parse_strategies(strategy_item, problems) if strategy_item else ()
    wait_item = _get(annotations, "wait-reschedule-timeout", problems)
    wait = _number(wait_item, *WAIT_RESCHEDULE_S_RANGE, problems, "s")
    stall_item = _get(annotations, "no-progress-restarts", problems)
    no_progress = _number(stall_item, *NO_PROGRESS_RESTARTS_RANGE, problems)

    rungs = tuple(s for s in configured if s in PROCESS_RUNGS)
    strategies = (*rungs, Strategy.EXIT) if configured else ()
    if configured and not rungs and strategy_item is not None:
        problems.warn(
            strategy_item.line,
            strategy_item.field,
            "'exit' alone configures no recovery (exit is always the last rung); "
            "add retry, recover-in-place, recover, elastic-training or dump",
        )

    # Combinations.
    if rungs and scheduling is not FaultScheduling.GRACE:
        where = scheduling_item or strategy_item
        assert where is not None
        problems.error(
            where.line,
            "metadata.labels.fault-scheduling",
            f"recover-strategy {','.join(s.value for s in rungs)} needs fault-scheduling "
            "'grace' (healthy processes must get SIGTERM and time to save)",
            value=scheduling.value if scheduling_item else None,
            allowed="grace",
        )
    if scheduling is FaultScheduling.OFF:
        for item, what in ((pod_item, "pod-rescheduling: on"), (retry_item, "fault-retry-times")):
            active = pod_rescheduling if item is pod_item else retry_times > 0
            if item is not None and active:
                problems.error(
                    item.line,
                    item.field,
                    f"{what} needs fault-scheduling 'force' or 'grace' (without it no pod is "
                    "rescheduled)",
                    allowed="set metadata.labels.fault-scheduling",
                )
    if grace_item is not None and scheduling is not FaultScheduling.GRACE:
        problems.warn(
            grace_item.line, grace_item.field, "has no effect without fault-scheduling 'grace'"
        )
    if scheduling is FaultScheduling.FORCE:
        for replica in replicas:
            if replica.host_network:
                problems.error(
                    replica.host_network_line,
                    f"{replica.path}.template.spec.hostNetwork",
                    "fault-scheduling 'force' cannot be used with hostNetwork: true (a pod "
                    "deleted at once leaves its host port held until the node notices); use "
                    "'grace' or drop hostNetwork",
                    value=True,
                )
    if sub is SubHealthyStrategy.GRACE_EXIT and Strategy.DUMP not in rungs:
        assert sub_item is not None
        problems.error(
            sub_item.line,
            sub_item.field,
            "graceExit saves last words before leaving, so recover-strategy must include 'dump'",
            value=sub.value,
        )
    if Strategy.ELASTIC_TRAINING in rungs and framework is not Framework.PYTORCH:
        assert strategy_item is not None
        problems.error(
            strategy_item.line,
            strategy_item.field,
            f"elastic-training is PyTorch only; this job's framework is {framework.value}",
            value=strategy_item.value,
        )
    if wait_item is not None and not ({Strategy.RECOVER, Strategy.ELASTIC_TRAINING} & set(rungs)):
        problems.warn(
            wait_item.line,
            wait_item.field,
            "has no effect without recover or elastic-training in recover-strategy",
        )

    process_recover = ProcessRecover.ON if rungs else ProcessRecover.OFF
    if recover_label is not None:
        assert recover_item is not None
        process_recover = ProcessRecover(recover_label)
        if process_recover is ProcessRecover.ON and not rungs:
            problems.error(
                recover_item.line,
                recover_item.field,
                "'on' needs a process-level recover-strategy annotation "
                "(the operator sets this label itself when one is present)",
                value="on",
            )
        elif process_recover is not ProcessRecover.ON and rungs:
            problems.warn(
                recover_item.line,
                recover_item.field,
                f"'{process_recover.value}' is honoured: the process-level strategies are "
                "skipped and faults go to pod/job rescheduling until it is set to 'on'",
            )

    knobs = job_knobs(replicas, problems)
    op_retry, decision_wait = _env_knobs(knobs, rungs, sub, framework, problems)
    if framework is Framework.MINDSPORE:
        _mindspore_limits(
            knobs, sub_item if sub is SubHealthyStrategy.HOT_SWITCH else None, problems
        )
    _injected_conflicts(knobs, configured, framework, pod_rescheduling, problems)

    effective_restarts = MAX_RESTARTS_DEFAULT if max_restarts is None else max_restarts
    if effective_restarts == 0 and rungs:
        effective_restarts = MAX_RESTARTS_DEFAULT
    return FaultHandling(
        strategies=strategies,
        fault_scheduling=scheduling,
        grace_s=float(grace) if grace is not None else FaultHandling.grace_s,
        pod_rescheduling=pod_rescheduling,
        fault_retry_times=retry_times,
        process_recover=process_recover,
        sub_healthy=sub,
        straggler_threshold_percent=(
            straggler_pct
            if straggler_pct is not None
            else FaultHandling.straggler_threshold_percent
        ),
        straggler_window=(
            straggler_window if straggler_window is not None else FaultHandling.straggler_window
        ),
        straggler_hold_s=(
            float(straggler_hold) if straggler_hold is not None else FaultHandling.straggler_hold_s
        ),
        wait_reschedule_s=float(wait) if wait is not None else FaultHandling.wait_reschedule_s,
        decision_wait_s=decision_wait,
        max_restarts=effective_restarts,
        no_progress_restarts=(
            no_progress if no_progress is not None else FaultHandling.no_progress_restarts
        ),
        monitor_interval_s=(
            monitor_interval_s
            if monitor_interval_s is not None
            else FaultHandling.monitor_interval_s
        ),
        op_retry=op_retry,
        framework=framework,
        link_failover=_link_failover(knobs, framework, strategies, op_retry),
    )


def _link_failover(
    knobs: dict[str, EnvValue],
    framework: Framework,
    strategies: tuple[Strategy, ...],
    op_retry: OpRetry,
) -> bool:
    """Link failover is on with ``MS_ENABLE_TFT``'s ``TSP:1`` (a malformed value is reported by
    ``_env_knobs``), or, for PyTorch, with the seed's configuration of "suspension and
    switchback for link failover communication": process-level online recovery (``retry``)
    and operator retry between nodes (``HCCL_OP_RETRY_ENABLE`` with ``L1:1``)."""
    if (
        framework is Framework.PYTORCH
        and Strategy.RETRY in strategies
        and op_retry.applies_to(RetryLevel.L1)
    ):
        return True
    item = knobs.get("MS_ENABLE_TFT")
    if item is None:
        return False
    try:
        return parse_ms_enable_tft(item.value).get(TftSwitch.TSP, False)
    except KnobSyntaxError:
        return False


def _env_knobs(
    knobs: dict[str, EnvValue],
    rungs: tuple[Strategy, ...],
    sub: SubHealthyStrategy,
    framework: Framework,
    problems: Problems,
) -> tuple[OpRetry, float]:
    def fail(item: EnvValue, exc: KnobSyntaxError) -> None:
        problems.error(item.line, item.field, exc.message, value=item.value, allowed=exc.allowed)

    enabled: frozenset[RetryLevel] = frozenset()
    op_retry = OpRetry()
    item = knobs.get("HCCL_OP_RETRY_ENABLE")
    if item is not None:
        try:
            enabled = parse_op_retry_enable(item.value)
        except KnobSyntaxError as exc:
            fail(item, exc)
    item = knobs.get("HCCL_OP_RETRY_PARAMS")
    levels = enabled
    try:
        op_retry = parse_op_retry_params(item.value, levels) if item else OpRetry(enabled=levels)
    except KnobSyntaxError as exc:
        assert item is not None
        fail(item, exc)
        op_retry = OpRetry(enabled=levels)
    decision_wait = FaultHandling.decision_wait_s
    item = knobs.get("MINDIO_WAIT_MINDX_TIME")
    if item is not None:
        low, high = DECISION_WAIT_S_RANGE
        try:
            decision_wait = float(
                parse_int_in_range(item.value, "MINDIO_WAIT_MINDX_TIME", int(low), int(high))
            )
        except KnobSyntaxError as exc:
            fail(item, KnobSyntaxError(exc.message, exc.allowed + " s"))
    if Strategy.ELASTIC_TRAINING in rungs and Strategy.RECOVER not in rungs and decision_wait < 60:
        where = knobs.get("MINDIO_WAIT_MINDX_TIME")
        problems.warn(
            where.line if where else None,
            where.field if where else "MINDIO_WAIT_MINDX_TIME",
            f"is {decision_wait:g} s; with elastic-training and no recover, set it to 60 or "
            "more so the fault center has time to decide the scale-in",
        )
    item = knobs.get("TASKD_PROCESS_ENABLE")
    if item is not None:
        try:
            taskd_on = parse_on_off(item.value, "TASKD_PROCESS_ENABLE")
        except KnobSyntaxError as exc:
            fail(item, exc)
        else:
            if not taskd_on and (rungs or sub is SubHealthyStrategy.HOT_SWITCH):
                why = "recover-strategy" if rungs else "subHealthyStrategy hotSwitch"
                problems.error(
                    item.line,
                    item.field,
                    f"TASKD_PROCESS_ENABLE=off contradicts {why}: the job would opt out of "
                    "the recovery it asks for; remove it or set it to on",
                    value=item.value,
                    allowed="on",
                )
    for name in _WATCHDOGS:
        item = knobs.get(name)
        if item is None:
            continue
        if item.value not in ("0", "1", "2", "3"):
            problems.error(
                item.line,
                item.field,
                f"{name} is not a mode",
                value=item.value,
                allowed="0, 1, 2, 3",
            )
        elif item.value != "0" and rungs:
            problems.error(
                item.line,
                item.field,
                f"{name}={item.value} makes the collective watchdog abort the process on a "
                "failed collective, which defeats process-level recovery; the operator sets 0 "
                "for jobs with a recover-strategy",
                value=item.value,
                allowed="0 or unset",
            )
    item = knobs.get("MS_ENABLE_TFT")
    if item is not None:
        try:
            switches = parse_ms_enable_tft(item.value)
        except KnobSyntaxError as exc:
            fail(item, exc)
        else:
            if framework is not Framework.MINDSPORE and set(switches) - {TftSwitch.TSP}:
                problems.warn(
                    item.line,
                    item.field,
                    "MS_ENABLE_TFT is read by MindSpore only; Unbroken reads its TSP switch "
                    "(link failover between network planes)",
                )
    for name in _PER_POD:
        item = knobs.get(name)
        if item is not None:
            problems.error(
                item.line,
                item.field,
                f"{name} is set per pod by the operator; remove it from the job",
                value=item.value,
            )
    item = knobs.get("MASTER_PORT")
    if item is not None:
        try:
            parse_int_in_range(item.value, "MASTER_PORT", 1, 65535)
        except KnobSyntaxError as exc:
            fail(item, exc)
    return op_retry, decision_wait


#: Why a MindSpore job's ranks do not get what needs their collectives regrouped in a live
#: process (unbroken.mindspore.session: MindSpore's communicator cannot be rebuilt there).
MINDSPORE_NO_REGROUP = (
    "MindSpore ranks cannot regroup their collectives in a live process (MindSpore's "
    "dynamic-cluster recovery runs on GPUs in graph mode only)"
)


def _mindspore_limits(
    knobs: dict[str, EnvValue], hot_switch: Located | None, problems: Problems
) -> None:
    """Warn of the settings a MindSpore job's ranks do not act on here, and why."""
    item = knobs.get("HCCL_OP_RETRY_ENABLE")
    if item is not None:
        problems.warn(
            item.line,
            item.field,
            "op retry is not run for MindSpore ranks: it re-executes a collective in "
            "Unbroken's torch collective layer, and MindSpore ranks use MindSpore's own; a "
            "MindSpore rank's failed collective is redone with its step (MS_ENABLE_TFT HCCE:1, "
            "recover-strategy retry)",
        )
    item = knobs.get("MS_ENABLE_TFT")
    try:
        tsp = item is not None and parse_ms_enable_tft(item.value).get(TftSwitch.TSP, False)
    except KnobSyntaxError:
        tsp = False
    if item is not None and tsp:
        problems.warn(
            item.line,
            item.field,
            "TSP (link failover, online stress tests) is not run for MindSpore ranks: both "
            f"pause the ranks and regroup them, and {MINDSPORE_NO_REGROUP}; a failed link "
            "fails the step (HCCE retry) or the ranks (a restart)",
        )
    if hot_switch is not None:
        problems.warn(
            hot_switch.line,
            hot_switch.field,
            "hotSwitch is not run for MindSpore ranks: the pod moved to the standby node "
            f"joins its peers in their live processes, and {MINDSPORE_NO_REGROUP}",
        )


def _injected_conflicts(
    knobs: dict[str, EnvValue],
    configured: tuple[Strategy, ...],
    framework: Framework,
    pod_rescheduling: bool,
    problems: Problems,
) -> None:
    injected = injected_env(configured, framework, pod_rescheduling)
    item = knobs.get("ELASTIC_PROCESS_RECOVER_ENABLE")
    if item is not None:
        problems.warn(
            item.line,
            item.field,
            "ELASTIC_PROCESS_RECOVER_ENABLE belongs to the Elastic Agent, which is sunset "
            "(removed in the release of 2026-12-30); configure recover-strategy instead and "
            "let the operator inject PROCESS_RECOVER",
        )
    for name in INJECTED_NAMES:
        item = knobs.get(name)
        if item is None or name == "MS_ENABLE_TFT":
            continue
        expected = injected.get(name)
        if expected != item.value:
            what = f"sets {name}={expected}" if expected else f"does not set {name}"
            problems.error(
                item.line,
                item.field,
                f"contradicts the job's recover-strategy: for it the operator {what}; "
                "remove it and let the operator inject it",
                value=item.value,
                allowed=expected or "unset",
            )
    item = knobs.get("MS_ENABLE_TFT")
    if item is None or framework is not Framework.MINDSPORE:
        return
    try:
        user = parse_ms_enable_tft(item.value)
    except KnobSyntaxError:
        return
    needed = tft_switches(tuple(s for s in configured if s in PROCESS_RUNGS), pod_rescheduling)
    off = [s for s in needed if user.get(s) is False]
    if off:
        names = ", ".join(f"{s.value}:0" for s in off)
        problems.error(
            item.line,
            item.field,
            f"switches {names} off, but the job's strategies need them on",
            value=item.value,
            allowed="1 for " + ", ".join(s.value for s in off),
        )


__all__ = [
    "PROCESS_RUNGS",
    "Located",
    "TftSwitch",
    "located_strings",
    "parse_strategies",
    "read_fault_handling",
]
