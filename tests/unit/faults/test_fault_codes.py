"""The fault vocabulary and the code -> level table (shipped data and user overrides)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.faults import (
    DEFAULT_LEVELS,
    CodeTable,
    CodeTableError,
    Escalation,
    Fault,
    FaultKind,
    FaultLevel,
    worst,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def shipped() -> CodeTable:
    return CodeTable.load()


def test_levels_are_ordered_as_documented() -> None:
    ordered = sorted(FaultLevel, key=lambda level: level.severity)
    assert [level.value for level in ordered] == [
        "NotHandle",
        "SubHealth",
        "PreSeparateNPU",
        "RestartRequest",
        "RestartBusiness",
        "FreeRestartNPU",
        "RestartNPU",
        "SeparateNPU",
        "ManuallySeparate",
    ]
    assert worst(FaultLevel.RESTART_NPU, FaultLevel.SUB_HEALTH) is FaultLevel.RESTART_NPU
    assert worst() is FaultLevel.NOT_HANDLE


def test_which_levels_stop_training_and_isolate() -> None:
    stopping = {level for level in FaultLevel if level.stops_training}
    assert FaultLevel.NOT_HANDLE not in stopping
    assert FaultLevel.SUB_HEALTH not in stopping
    assert FaultLevel.PRE_SEPARATE_NPU not in stopping
    assert FaultLevel.RESTART_REQUEST in stopping
    isolating = {level for level in FaultLevel if level.isolates_device}
    assert isolating == {
        FaultLevel.PRE_SEPARATE_NPU,
        FaultLevel.SEPARATE_NPU,
        FaultLevel.MANUALLY_SEPARATE,
    }
    assert {level for level in FaultLevel if level.resets_device} == {
        FaultLevel.FREE_RESTART_NPU,
        FaultLevel.RESTART_NPU,
    }


def test_kinds_use_the_documented_spellings() -> None:
    assert {kind.value for kind in FaultKind} == {
        "process-exit",
        "exception",
        "hang",
        "node-lost",
        "device",
        "device-memory",
        "link",
        "stress-test",
        "sub-health",
    }
    assert {kind for kind in FaultKind if kind.retryable} == {
        FaultKind.DEVICE_MEMORY,
        FaultKind.LINK,
    }


def _fault(kind: FaultKind, level: FaultLevel) -> Fault:
    return Fault(kind, level, code="", at=0.0, node="n1", device=0)


@pytest.mark.parametrize(
    ("kind", "level", "retryable"),
    [
        (FaultKind.DEVICE_MEMORY, FaultLevel.RESTART_BUSINESS, True),
        (FaultKind.LINK, FaultLevel.RESTART_BUSINESS, True),
        (FaultKind.DEVICE_MEMORY, FaultLevel.MANUALLY_SEPARATE, False),
        (FaultKind.LINK, FaultLevel.RESTART_NPU, False),
        (FaultKind.PROCESS_EXIT, FaultLevel.RESTART_BUSINESS, False),
        (FaultKind.DEVICE, FaultLevel.RESTART_BUSINESS, False),
    ],
)
def test_retryable(kind: FaultKind, level: FaultLevel, retryable: bool) -> None:
    assert _fault(kind, level).retryable is retryable


def test_describe_names_the_place() -> None:
    fault = Fault(
        FaultKind.DEVICE_MEMORY,
        FaultLevel.RESTART_BUSINESS,
        "80E01801",
        at=5.0,
        node="n2",
        pod="worker-1",
        ranks=(4, 5),
        device=1,
    )
    assert fault.describe() == (
        "device-memory 80E01801 (RestartBusiness) on pod worker-1 node n2 device 1 rank 4,5"
    )


def test_shipped_table_has_the_reference_codes(shipped: CodeTable) -> None:
    uce = shipped.lookup("80E01801")
    assert uce is not None
    assert uce.level is FaultLevel.RESTART_BUSINESS
    assert uce.kind is FaultKind.DEVICE_MEMORY
    assert uce.escalation == Escalation(times=2, window_s=86400.0)
    assert shipped.kind_for("8c1f8608") is FaultKind.LINK  # case-insensitive
    assert shipped.kind_for("DEADBEEF") is FaultKind.DEVICE
    assert shipped.unknown_level is FaultLevel.RESTART_BUSINESS
    assert shipped.escalation == Escalation(times=3, window_s=86400.0)
    for code, info in shipped.codes.items():
        assert info.what, f"{code} has no description"


@pytest.mark.parametrize(
    ("kind", "code", "level"),
    [
        (FaultKind.DEVICE, "XID-79", FaultLevel.SEPARATE_NPU),
        (FaultKind.DEVICE, "xid-79", FaultLevel.SEPARATE_NPU),
        (FaultKind.DEVICE, "80E3A201", FaultLevel.SEPARATE_NPU),
        (FaultKind.DEVICE, "8C1F8608", FaultLevel.NOT_HANDLE),
        (FaultKind.DEVICE, "110001024", FaultLevel.PRE_SEPARATE_NPU),
        (FaultKind.DEVICE, "8f180220", FaultLevel.PRE_SEPARATE_NPU),
        (FaultKind.DEVICE, "80C98009", FaultLevel.RESTART_REQUEST),
        (FaultKind.DEVICE, "8C0E4E00", FaultLevel.FREE_RESTART_NPU),
        (FaultKind.DEVICE, "80E18005", FaultLevel.RESTART_NPU),
        (FaultKind.DEVICE, "80E20207", FaultLevel.SUB_HEALTH),
        (FaultKind.DEVICE, "0BADC0DE", FaultLevel.RESTART_BUSINESS),  # unknown code
        (FaultKind.DEVICE, "", FaultLevel.RESTART_BUSINESS),
        # seen by the training processes: at least RestartBusiness
        (FaultKind.LINK, "8C1F8608", FaultLevel.RESTART_BUSINESS),
        (FaultKind.DEVICE_MEMORY, "80E01801", FaultLevel.RESTART_BUSINESS),
        (FaultKind.DEVICE_MEMORY, "XID-95", FaultLevel.RESTART_NPU),
        # software codes are not device codes: the kind's default
        (FaultKind.PROCESS_EXIT, "exit:137", FaultLevel.RESTART_BUSINESS),
        (FaultKind.PROCESS_EXIT, "80E3A201", FaultLevel.RESTART_BUSINESS),
        (FaultKind.EXCEPTION, "", FaultLevel.RESTART_BUSINESS),
        (FaultKind.HANG, "", FaultLevel.RESTART_BUSINESS),
        (FaultKind.NODE_LOST, "", FaultLevel.SEPARATE_NPU),
        (FaultKind.STRESS_TEST, "", FaultLevel.SEPARATE_NPU),
        (FaultKind.STRESS_TEST, "XID-48", FaultLevel.RESTART_NPU),
        (FaultKind.SUB_HEALTH, "", FaultLevel.SUB_HEALTH),
        (FaultKind.SUB_HEALTH, "XID-92", FaultLevel.SUB_HEALTH),
    ],
)
def test_level_for(shipped: CodeTable, kind: FaultKind, code: str, level: FaultLevel) -> None:
    assert shipped.level_for(kind, code) is level


def test_every_level_has_a_shipped_code_but_manually_separate(shipped: CodeTable) -> None:
    """ManuallySeparate is reached by escalation or a user's code, as in the reference."""
    levels = {info.level for info in shipped.codes.values()}
    assert set(FaultLevel) - levels == {FaultLevel.MANUALLY_SEPARATE}
    assert shipped.escalation.times > 0


def test_the_reference_spellings_of_levels_are_accepted(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "codes:\n  8C1F8608: {level: NotHandleFault}\n  80E18005: {level: ManuallySeparateNPU}\n",
    )
    table = CodeTable.load(path)
    assert table.level_for(FaultKind.DEVICE, "8C1F8608") is FaultLevel.NOT_HANDLE
    assert table.level_for(FaultKind.DEVICE, "80E18005") is FaultLevel.MANUALLY_SEPARATE


def test_every_kind_has_a_default_level() -> None:
    assert set(DEFAULT_LEVELS) == set(FaultKind)


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        ("80E01801", Escalation(2, 86400.0)),  # its own rule
        ("81078603", Escalation(5, 86400.0)),  # NotHandle with its own rule
        ("8C1F8608", None),  # NotHandle without a rule: never
        ("80E21007", None),
        ("XID-79", Escalation(3, 86400.0)),  # the default rule
        ("0BADC0DE", Escalation(3, 86400.0)),  # unknown codes stop training: default rule
        ("", None),
    ],
)
def test_escalation_for(shipped: CodeTable, code: str, rule: Escalation | None) -> None:
    assert shipped.escalation_for(code) == rule


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "codes.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_override_merges_over_the_shipped_table(tmp_path: Path, shipped: CodeTable) -> None:
    path = _write(
        tmp_path,
        """\
unknown: SeparateNPU
escalation: {times: 4, window_s: 3600}
codes:
  80E01801: {level: SeparateNPU, what: our HBM is bad}
  80818200: {level: RestartNPU}
  XID-63: {level: FreeRestartNPU, escalate: {times: 0, window_s: 1}}
""",
    )
    table = CodeTable.load(path)
    assert table.level_for(FaultKind.DEVICE, "80E01801") is FaultLevel.SEPARATE_NPU
    info = table.lookup("80E01801")
    assert info is not None and info.kind is FaultKind.DEVICE and info.what == "our HBM is bad"
    # an unquoted all-digit code stays a code
    assert table.level_for(FaultKind.DEVICE, "80818200") is FaultLevel.RESTART_NPU
    assert table.level_for(FaultKind.DEVICE, "0BADC0DE") is FaultLevel.SEPARATE_NPU
    assert table.escalation == Escalation(4, 3600.0)
    assert table.escalation_for("XID-63") is None
    # untouched shipped codes are kept
    assert table.lookup("XID-79") == shipped.lookup("XID-79")
    assert len(table.codes) == len(shipped.codes) + 1


def test_empty_override_changes_nothing(tmp_path: Path, shipped: CodeTable) -> None:
    assert CodeTable.load(_write(tmp_path, "# nothing\n")) == shipped


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "codes:\n  80E01801:\n    level: Restart\n",
            ":3: level: 'Restart' is not valid; expected one of NotHandle, SubHealth,",
        ),
        (
            "unknown: Sometimes\n",
            ":1: level: 'Sometimes' is not valid; expected one of NotHandle",
        ),
        (
            "codes:\n  80E01801: {level: SeparateNPU, kind: crash}\n",
            ":2: kind: 'crash' is not valid; expected one of device, device-memory, link,",
        ),
        (
            "codes:\n  80E01801: {levle: SeparateNPU}\n",
            ":2: key in code 80E01801: 'levle' is not valid; expected one of action, escalate,",
        ),
        (
            "codes:\n  80E01801: {what: no level}\n",
            ":2: code 80E01801: a mapping is not valid; expected a mapping with a 'level' key",
        ),
        (
            "codes:\n  'bad code': {level: SeparateNPU}\n",
            ":2: code: 'bad code' is not valid; expected a device fault code",
        ),
        (
            "codes:\n  80E01801: {level: NotHandle}\n  80e01801: {level: SeparateNPU}\n",
            ":3: duplicate code: '80e01801' is not valid; expected each code listed once",
        ),
        (
            "escalation: {times: three, window_s: 60}\n",
            ":1: times: 'three' is not valid; expected an integer >= 0",
        ),
        (
            "escalation: {times: 3, window_s: 0}\n",
            ":1: window_s: '0' is not valid; expected a number of seconds > 0",
        ),
        (
            "escalation: {times: 3}\n",
            ":1: escalation rule: a mapping is not valid; expected both 'times' and 'window_s'",
        ),
        ("codes: [80E01801]\n", ":1: codes: a list is not valid; expected a mapping"),
        ("- 1\n", ":1: the file: a list is not valid; expected a mapping"),
        ("colour: blue\n", ":1: key in the file: 'colour' is not valid"),
        ("codes:\n  80E01801: {level: [\n", ": not valid YAML:"),
    ],
)
def test_malformed_override_names_file_line_and_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CodeTableError) as caught:
        CodeTable.load(path)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)


def test_missing_override_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(CodeTableError, match=r"absent\.yaml: cannot read fault code table"):
        CodeTable.load(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"codes: " + b"[" * 5000 + b"]" * 5000 + b"\n", ":1: nested deeper than 64 levels"),
        (
            b"a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + b"".join(
                f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n".encode()
                for p, n in zip("abcdef", "bcdefg", strict=True)
            )
            + b"".join(f"k{i}: *g\n".encode() for i in range(100)),
            ": more than 100 aliases",
        ),
        (b"codes:\n  80E01801: {level: \xff}\n", ":2: cannot read fault code table: not UTF-8"),
    ],
)
def test_hostile_override_is_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "codes.yaml"
    path.write_bytes(data)
    with pytest.raises(CodeTableError) as caught:
        CodeTable.load(path)
    (line,) = str(caught.value).splitlines()
    assert line.startswith(str(path)) and message in line, line


def test_every_nvidia_row_says_its_action_and_source_and_its_level_carries_the_action() -> None:
    """NVIDIA's immediate action -> the seed's level that carries it out (codes.yaml's rule)."""
    carries = {
        "RESTART_APP": {FaultLevel.RESTART_BUSINESS},
        "RESET_GPU": {FaultLevel.RESTART_NPU, FaultLevel.FREE_RESTART_NPU, FaultLevel.SEPARATE_NPU},
        "WORKFLOW_XID_48": {FaultLevel.RESTART_NPU},
        "WORKFLOW_NVLINK_ERR": {FaultLevel.RESTART_NPU, FaultLevel.SUB_HEALTH},
        "WORKFLOW_NVLINK5_ERR": {FaultLevel.RESTART_NPU},
        "RESTART_BM": {FaultLevel.SEPARATE_NPU},
        "RESTART_VM": {FaultLevel.SEPARATE_NPU},
        "IGNORE": {
            FaultLevel.NOT_HANDLE,
            FaultLevel.SUB_HEALTH,
            FaultLevel.FREE_RESTART_NPU,
            FaultLevel.PRE_SEPARATE_NPU,
        },
        "WORKFLOW_XID_45": {FaultLevel.NOT_HANDLE},
        "XID_154": {FaultLevel.NOT_HANDLE},
        "CHECK_MECHANICALS": {FaultLevel.SUB_HEALTH},
        "CHECK_THERMALS": {FaultLevel.SUB_HEALTH},
    }
    table = CodeTable.load()
    nvidia = {c: i for c, i in table.codes.items() if c.startswith(("XID-", "GPU-"))}
    assert len([c for c in nvidia if c.startswith("XID-")]) >= 40
    for code, info in nvidia.items():
        assert info.source in ("NVIDIA Xid catalog", "NVML"), code
        assert info.level in carries[info.action], (code, info.action, info.level)
