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
    ]
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
        ({"kind": "kill", "rank": 0, "at_step": 0}, "at_step: 0 must be >= 1"),
        ({"kind": "kill", "rank": 0, "at_step": 1, "when": 3}, "unknown field(s) ['when']"),
    ],
)
def test_each_problem_names_the_entry(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ChaosError) as err:
        parse_chaos({"faults": [entry]}, "c.yaml", 4, PODS, NODES)
    assert str(err.value).startswith("c.yaml: faults[0]: ")
    assert message in str(err.value)


def test_all_problems_come_together(tmp_path: Path) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text("faults:\n  - {kind: kill, rank: 9, at_step: 1}\n  - {kind: hang}\n")
    with pytest.raises(ChaosError) as err:
        load_chaos(path, 4, PODS, NODES)
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}: faults[0]: rank: 9 does not exist")
    assert lines[1] == (
        f"{path}: faults[1]: give exactly one of at_step (a training step) or after_s (seconds)"
    )


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [\n")
    with pytest.raises(ChaosError, match="not valid YAML"):
        load_chaos(bad, 4, PODS, NODES)
    with pytest.raises(ChaosError, match="cannot read the chaos file"):
        load_chaos(tmp_path / "none.yaml", 4, PODS, NODES)
