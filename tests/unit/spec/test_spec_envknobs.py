"""Parsers of HCCL_OP_RETRY_ENABLE, HCCL_OP_RETRY_PARAMS and MS_ENABLE_TFT: round trips of valid
strings, clear messages for invalid ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unbroken.spec.envknobs import (
    KnobSyntaxError,
    TftSwitch,
    format_ms_enable_tft,
    format_op_retry_enable,
    format_op_retry_params,
    parse_ms_enable_tft,
    parse_op_retry_enable,
    parse_op_retry_params,
)
from unbroken.spec.knobs import RetryLevel

pytestmark = pytest.mark.unit

_space = st.sampled_from(["", " ", "  "])


@st.composite
def op_retry_enable_strings(draw: st.DrawFn) -> str:
    levels = draw(st.permutations(list(RetryLevel)))
    count = draw(st.integers(1, 3))
    items = [
        f"{draw(_space)}{level.value}{draw(_space)}:{draw(_space)}{draw(st.sampled_from('01'))}"
        f"{draw(_space)}"
        for level in levels[:count]
    ]
    return ",".join(items)


@st.composite
def op_retry_params_strings(draw: st.DrawFn) -> str:
    keys = draw(st.permutations(["MaxCnt", "HoldTime", "IntervalTime"]))
    count = draw(st.integers(1, 3))
    items = []
    for key in keys[:count]:
        value = draw(st.integers(1, 10) if key == "MaxCnt" else st.integers(0, 60000))
        items.append(f"{draw(_space)}{key}:{value}{draw(_space)}")
    return ",".join(items)


@st.composite
def tft_strings(draw: st.DrawFn) -> str:
    switches = draw(st.permutations(list(TftSwitch)))
    count = draw(st.integers(1, len(switches)))
    items = [f"{draw(_space)}{s.value}:{draw(st.sampled_from('01'))}" for s in switches[:count]]
    return "{" + ",".join(items) + "}"


@given(op_retry_enable_strings())
def test_op_retry_enable_round_trips(text: str) -> None:
    parsed = parse_op_retry_enable(text)
    assert parse_op_retry_enable(format_op_retry_enable(parsed)) == parsed


@given(op_retry_params_strings())
def test_op_retry_params_round_trips(text: str) -> None:
    parsed = parse_op_retry_params(text)
    assert parse_op_retry_params(format_op_retry_params(parsed)) == parsed


@given(tft_strings())
def test_ms_enable_tft_round_trips(text: str) -> None:
    parsed = parse_ms_enable_tft(text)
    assert parse_ms_enable_tft(format_ms_enable_tft(parsed)) == parsed


def test_seed_spellings_parse_to_their_meaning() -> None:
    assert parse_op_retry_enable("L0:0, L1:1, L2:1") == {RetryLevel.L1, RetryLevel.L2}
    params = parse_op_retry_params("MaxCnt:3, HoldTime:5000, IntervalTime:1000")
    assert (params.max_count, params.hold_s, params.interval_s) == (3, 5.0, 1.0)
    assert parse_ms_enable_tft("{TTP:1,TSP:1}") == {TftSwitch.TTP: True, TftSwitch.TSP: True}
    assert parse_ms_enable_tft("{ ARF:1}") == {TftSwitch.ARF: True}
    assert parse_ms_enable_tft("{ UCE:1, HCCE:1}") == {TftSwitch.UCE: True, TftSwitch.HCCE: True}


def test_missing_params_keep_the_defaults() -> None:
    params = parse_op_retry_params("MaxCnt:7")
    assert (params.max_count, params.hold_s, params.interval_s) == (7, 5.0, 1.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "HCCL_OP_RETRY_ENABLE is empty"),
        ("L0:0,,L1:1", "has an empty item"),
        ("L3:1", "unknown level 'L3'"),
        ("L0:2", "level L0 has value '2'"),
        ("L0:1, L0:0", "gives level L0 twice"),
        ("L0=1", "item 'L0=1' is not KEY:VALUE"),
    ],
)
def test_op_retry_enable_rejects(text: str, message: str) -> None:
    with pytest.raises(KnobSyntaxError) as err:
        parse_op_retry_enable(text)
    assert message in err.value.message
    assert "L0:<0|1>" in err.value.allowed


@pytest.mark.parametrize(
    ("text", "message", "allowed"),
    [
        ("MaxCnt:0", "MaxCnt is 0, out of range", "MaxCnt 1-10"),
        ("MaxCnt:11", "MaxCnt is 11, out of range", "MaxCnt 1-10"),
        ("HoldTime:60001", "HoldTime is 60001 ms, out of range", "HoldTime 0-60000 ms"),
        ("IntervalTime:-1", "IntervalTime must be a whole number, got '-1'", "MaxCnt:<1-10>"),
        ("MaxCnt:3.5", "MaxCnt must be a whole number, got '3.5'", "MaxCnt:<1-10>"),
        ("Retries:3", "unknown parameter 'Retries'", "MaxCnt:<1-10>"),
        ("MaxCnt:3, MaxCnt:4", "gives MaxCnt twice", "MaxCnt:<1-10>"),
        ("MaxCnt 3", "item 'MaxCnt 3' is not KEY:VALUE", "MaxCnt:<1-10>"),
    ],
)
def test_op_retry_params_rejects(text: str, message: str, allowed: str) -> None:
    with pytest.raises(KnobSyntaxError) as err:
        parse_op_retry_params(text)
    assert message in err.value.message
    assert allowed in err.value.allowed


@given(st.text(max_size=30))
def test_arbitrary_text_parses_or_fails_with_a_message(text: str) -> None:
    for parse in (parse_op_retry_enable, parse_op_retry_params, parse_ms_enable_tft):
        try:
            parse(text)
        except KnobSyntaxError as err:
            assert err.message and err.allowed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TTP:1", "must be enclosed in braces"),
        ("{}", "MS_ENABLE_TFT is empty"),
        ("{TTP:1,XYZ:1}", "unknown switch 'XYZ'"),
        ("{TTP:on}", "switch TTP has value 'on'"),
        ("{TTP:1,TTP:0}", "gives TTP twice"),
    ],
)
def test_ms_enable_tft_rejects(text: str, message: str) -> None:
    with pytest.raises(KnobSyntaxError) as err:
        parse_ms_enable_tft(text)
    assert message in err.value.message
    assert "TTP, UCE, HCCE, ARF, RSC, TSP" in err.value.allowed
