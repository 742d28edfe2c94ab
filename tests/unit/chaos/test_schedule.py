"""The chaos file: what is accepted, and the message for what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.chaos import ChaosError, InjectKind, load_chaos, parse_chaos

pytestmark = pytest.mark.unit

PODS = ["job-master-0", "job-worker-0"]
NODES = ["node-0", "node-1", "node-2"]


def test_a_schedule_of_every_kind() -> None:
    faults = parse_chaos(
        {
            "faults": [
                {"kind": "kill", "rank": 3, "at_step": 110},
                {"kind": "hang", "pod": "job-worker-0", "after_s": 2.5},
                {"kind": "node", "node": "node-1", "at_step": 60},
                {"kind": "device", "node": "node-0", "device": 1, "code": "80E3A201", "after_s": 5},
                {"kind": "exception", "rank": 0, "at_step": 7},
                {"kind": "sdc", "node": "node-1", "device": 1, "at_step": 9},
                {"kind": "stress-test", "at_step": 9},
            ]
        },
        "c.yaml",
        4,
        PODS,
        NODES,
    )
    assert [f.kind for f in faults] == [
        InjectKind.KILL,
        InjectKind.HANG,
        InjectKind.NODE,
        InjectKind.DEVICE,
        InjectKind.EXCEPTION,
        InjectKind.SDC,
        InjectKind.STRESS_TEST,
    ]
    assert not faults[5].in_rank and not faults[6].in_rank
    assert faults[0].in_rank and not faults[1].in_rank and not faults[2].in_rank


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"kind": "kill", "rank": 4, "at_step": 1},
            "rank: 4 does not exist (the job has ranks 0-3)",
        ),
        ({"kind": "zap", "rank": 0, "at_step": 1}, "kind: 'zap' is not one of"),
        ({"kind": "kill", "rank": 0}, "give exactly one of at_step"),
        ({"kind": "node", "node": "node-9", "after_s": 1}, "node: 'node-9' does not exist"),
        ({"kind": "device", "node": "node-0", "after_s": 1}, "'device' and 'code' are required"),
        ({"kind": "kill", "rank": 0, "at_step": 0}, "at_step: 0 is out of range (1-"),
        (
            {"kind": "kill", "rank": 0, "at_step": 2**63},
            f"at_step: {2**63} is out of range (1-{2**63 - 1})",
        ),
        ({"kind": "hang", "rank": 0, "after_s": float("nan")}, "after_s: nan is not a finite"),
        ({"kind": "hang", "rank": True, "after_s": 1}, "rank: True is not an integer"),
        ({"kind": "hang", "pod": 5, "after_s": 1}, "pod: 5 is not a name"),
        ({"kind": "kill", "rank": 0, "at_step": 1, "when": 3}, "unknown field(s) ['when']"),
        ({"kind": "sdc", "node": "node-1", "after_s": 1}, "kind sdc: 'device' is required"),
        ({"kind": "stress-test", "rank": 1, "at_step": 3}, "give no rank, pod, node or device"),
    ],
)
def test_each_problem_names_the_entry(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ChaosError) as err:
        parse_chaos({"faults": [entry]}, "c.yaml", 4, PODS, NODES)
    assert str(err.value).startswith("c.yaml: faults[0]")
    assert message in str(err.value)


def test_all_problems_come_together(tmp_path: Path) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text("faults:\n  - {kind: kill, rank: 9, at_step: 1}\n  - {kind: hang}\n")
    with pytest.raises(ChaosError) as err:
        load_chaos(path, 4, PODS, NODES)
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}:2: faults[0].rank: 9 does not exist")
    assert lines[1] == (
        f"{path}:3: faults[1]: give exactly one of at_step (a training step) or after_s (seconds)"
    )


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [\n")
    with pytest.raises(ChaosError, match="not valid YAML"):
        load_chaos(bad, 4, PODS, NODES)
    with pytest.raises(ChaosError) as err:
        load_chaos(tmp_path / "none.yaml", 4, PODS, NODES)
    assert str(err.value) == f"{tmp_path / 'none.yaml'}: no such file"


BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"faults:\n  - {kind: kill, rank: 1, at_step: 10}  # \xff\n", ":2: not UTF-8 text"),
        (
            b"faults:\n  - {kind: hang, rank: 1, after_s: .nan}\n",
            ":2: faults[0].after_s: nan is not a finite number of seconds",
        ),
        (
            b"faults:\n  - {kind: hang, rank: 1, after_s: .inf}\n",
            ":2: faults[0].after_s: inf is not a finite number of seconds",
        ),
        (
            b"faults:\n  - {kind: kill, rank: 1, at_step: 99999999999999999999}\n",
            ":2: faults[0].at_step: 99999999999999999999 is out of range",
        ),
        (
            b"faults:\n  - {kind: kill, rank: 1, at_step: 1, rank: 2}\n",
            ":2: faults[0].rank: duplicate key 'rank'",
        ),
        (b"fault: [{kind: kill, rank: 1, at_step: 1}]\n", ":1: fault: unknown field"),
        (b"faults:\n  - {kind: kill, rank: [1], at_step: 1}\n", "expected a single value"),
        (b"faults: " + b"[" * 200 + b"]" * 200 + b"\n", ":1: nested deeper than 64 levels"),
        (
            b"a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + BOMB.encode() + b"faults: *i\n",
            "aliases expand the file to more than 100000 values",
        ),
    ],
)
def test_hostile_or_loose_input_is_one_line_with_file_and_line(
    tmp_path: Path, text: bytes, message: str
) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_bytes(text)
    with pytest.raises(ChaosError) as err:
        load_chaos(path, 4, PODS, NODES)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{path}:"), line
    assert message in line, line
