"""Parsers and formatters for the string-valued environment knobs of a job.

``HCCL_OP_RETRY_ENABLE``
    ``"L0:0, L1:1, L2:1"``: operator-level retry per communication level (L0 inside a node, L1
    between nodes, L2 between super-nodes), each 0 (off) or 1 (on). Levels may come in any order,
    each at most once; a level not listed is off. Spaces around items are ignored.
``HCCL_OP_RETRY_PARAMS``
    ``"MaxCnt:3, HoldTime:5000, IntervalTime:1000"``: MaxCnt 1-10 (default 1), HoldTime 0-60000 ms
    before the first retry (default 5000), IntervalTime 0-60000 ms between retries (default 1000).
    Any subset may be given; integers only.
``MS_ENABLE_TFT``
    ``"{TTP:1,UCE:1,HCCE:1,ARF:1,RSC:1,TSP:1}"``: MindSpore's switches (TTP last words, UCE memory
    error repair, HCCE network error repair, ARF process-level rescheduling, RSC pod-level
    rescheduling, TSP online stress test / link failover), each 0 or 1, inside braces.

Each ``parse_*`` raises :class:`KnobSyntaxError` with a message saying what is wrong and what is
allowed; each ``format_*`` writes the canonical spelling, and ``parse(format(x)) == x``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from unbroken.spec.knobs import OP_RETRY_MAX_COUNT_RANGE, OP_RETRY_MS_RANGE, OpRetry, RetryLevel


class KnobSyntaxError(ValueError):
    """A knob's string is malformed; ``allowed`` describes the accepted form."""

    def __init__(self, message: str, allowed: str) -> None:
        super().__init__(message)
        self.message = message
        self.allowed = allowed


class TftSwitch(StrEnum):
    """The switches of ``MS_ENABLE_TFT`` (MindSpore's spelling of the fault-tolerance features)."""

    TTP = "TTP"  # last words (dump)
    UCE = "UCE"  # on-chip memory error repair (retry)
    HCCE = "HCCE"  # network/collective error repair (retry)
    ARF = "ARF"  # process-level rescheduling (recover, recover-in-place)
    RSC = "RSC"  # pod-level rescheduling
    TSP = "TSP"  # online stress test and link failover


OP_RETRY_ENABLE_FORM = "comma list of L0:<0|1>, L1:<0|1>, L2:<0|1>, e.g. 'L0:0, L1:1, L2:1'"
OP_RETRY_PARAMS_FORM = (
    "comma list of MaxCnt:<1-10>, HoldTime:<0-60000 ms>, IntervalTime:<0-60000 ms>, "
    "e.g. 'MaxCnt:3, HoldTime:5000, IntervalTime:1000'"
)
TFT_FORM = "{SWITCH:<0|1>,...} with SWITCH one of " + ", ".join(s.value for s in TftSwitch)

_INT = re.compile(r"[0-9]+")


def _pairs(text: str, what: str, form: str) -> list[tuple[str, str]]:
    if not text.strip():
        raise KnobSyntaxError(f"{what} is empty", form)
    pairs: list[tuple[str, str]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise KnobSyntaxError(f"{what} has an empty item in {text!r}", form)
        key, sep, value = item.partition(":")
        if not sep:
            raise KnobSyntaxError(f"{what} item {item!r} is not KEY:VALUE", form)
        pairs.append((key.strip(), value.strip()))
    return pairs


def parse_op_retry_enable(text: str) -> frozenset[RetryLevel]:
    """The levels on which operator-level retry is enabled."""
    what = "HCCL_OP_RETRY_ENABLE"
    enabled: set[RetryLevel] = set()
    seen: set[str] = set()
    for key, value in _pairs(text, what, OP_RETRY_ENABLE_FORM):
        if key not in {level.value for level in RetryLevel}:
            raise KnobSyntaxError(f"{what} has unknown level {key!r}", OP_RETRY_ENABLE_FORM)
        if key in seen:
            raise KnobSyntaxError(f"{what} gives level {key} twice", OP_RETRY_ENABLE_FORM)
        seen.add(key)
        if value not in ("0", "1"):
            raise KnobSyntaxError(f"{what} level {key} has value {value!r}", OP_RETRY_ENABLE_FORM)
        if value == "1":
            enabled.add(RetryLevel(key))
    return frozenset(enabled)


def format_op_retry_enable(enabled: frozenset[RetryLevel]) -> str:
    return ", ".join(f"{level.value}:{int(level in enabled)}" for level in RetryLevel)


_PARAM_KEYS = ("MaxCnt", "HoldTime", "IntervalTime")


def parse_op_retry_params(text: str, enabled: frozenset[RetryLevel] = frozenset()) -> OpRetry:
    """An :class:`OpRetry` with the given parameters (others at their defaults)."""
    what = "HCCL_OP_RETRY_PARAMS"
    values: dict[str, int] = {}
    for key, value in _pairs(text, what, OP_RETRY_PARAMS_FORM):
        if key not in _PARAM_KEYS:
            raise KnobSyntaxError(f"{what} has unknown parameter {key!r}", OP_RETRY_PARAMS_FORM)
        if key in values:
            raise KnobSyntaxError(f"{what} gives {key} twice", OP_RETRY_PARAMS_FORM)
        if not _INT.fullmatch(value):
            raise KnobSyntaxError(
                f"{what} {key} must be a whole number, got {value!r}", OP_RETRY_PARAMS_FORM
            )
        number = int(value)
        low, high = OP_RETRY_MAX_COUNT_RANGE if key == "MaxCnt" else OP_RETRY_MS_RANGE
        if not low <= number <= high:
            unit = "" if key == "MaxCnt" else " ms"
            raise KnobSyntaxError(
                f"{what} {key} is {number}{unit}, out of range", f"{key} {low}-{high}{unit}"
            )
        values[key] = number
    default = OpRetry()
    return OpRetry(
        enabled=enabled,
        max_count=values.get("MaxCnt", default.max_count),
        hold_s=values["HoldTime"] / 1000.0 if "HoldTime" in values else default.hold_s,
        interval_s=(
            values["IntervalTime"] / 1000.0 if "IntervalTime" in values else default.interval_s
        ),
    )


def format_op_retry_params(op_retry: OpRetry) -> str:
    return (
        f"MaxCnt:{op_retry.max_count}, HoldTime:{round(op_retry.hold_s * 1000)}, "
        f"IntervalTime:{round(op_retry.interval_s * 1000)}"
    )


def parse_ms_enable_tft(text: str) -> dict[TftSwitch, bool]:
    """The switches given, in the order written, each True (1) or False (0)."""
    what = "MS_ENABLE_TFT"
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise KnobSyntaxError(f"{what} must be enclosed in braces, got {text!r}", TFT_FORM)
    inner = body[1:-1]
    switches: dict[TftSwitch, bool] = {}
    for key, value in _pairs(inner, what, TFT_FORM):
        if key not in {s.value for s in TftSwitch}:
            raise KnobSyntaxError(f"{what} has unknown switch {key!r}", TFT_FORM)
        switch = TftSwitch(key)
        if switch in switches:
            raise KnobSyntaxError(f"{what} gives {key} twice", TFT_FORM)
        if value not in ("0", "1"):
            raise KnobSyntaxError(f"{what} switch {key} has value {value!r}", TFT_FORM)
        switches[switch] = value == "1"
    return switches


#: MindSpore's CPU collectives give up on a silent peer after ``MS_CPU_COMM_OP_TIMEOUT``
#: seconds, this many when it is not set.
MS_COMM_OP_TIMEOUT_DEFAULT_S = 30.0


def ms_comm_op_timeout_s(env: Mapping[str, str]) -> float:
    """``MS_CPU_COMM_OP_TIMEOUT`` (seconds) as MindSpore reads it; its default when unset or
    not a positive whole number."""
    raw = env.get("MS_CPU_COMM_OP_TIMEOUT", "").strip()
    return float(raw) if _INT.fullmatch(raw) and int(raw) > 0 else MS_COMM_OP_TIMEOUT_DEFAULT_S


def ms_last_words_on(env: Mapping[str, str]) -> bool:
    """Whether ``MS_ENABLE_TFT`` turns on last words (``TTP:1``); False when malformed (the
    rank says so when its session starts)."""
    tft = env.get("MS_ENABLE_TFT", "").strip()
    try:
        return bool(tft) and parse_ms_enable_tft(tft).get(TftSwitch.TTP, False)
    except KnobSyntaxError:
        return False


def format_ms_enable_tft(switches: Mapping[TftSwitch, bool]) -> str:
    """Canonical order (as :class:`TftSwitch` lists them), no spaces: ``{TTP:1,ARF:1}``."""
    items = [f"{s.value}:{int(switches[s])}" for s in TftSwitch if s in switches]
    return "{" + ",".join(items) + "}"


ON_OFF = ("on", "off")


def parse_on_off(text: str, what: str) -> bool:
    value = text.strip()
    if value not in ON_OFF:
        raise KnobSyntaxError(f"{what} must be on or off", "on, off")
    return value == "on"


def parse_int_in_range(text: str, what: str, low: int, high: int | None, unit: str = "") -> int:
    value = text.strip()
    allowed = f"a whole number {low}-{high}{unit}" if high is not None else f">= {low}{unit}"
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise KnobSyntaxError(f"{what} must be a whole number", allowed)
    number = int(value)
    if number < low or (high is not None and number > high):
        raise KnobSyntaxError(f"{what} is out of range", allowed)
    return number
