"""``minReplicas`` beside ``replicas``: the fewest pods an elastic job scales in to, validated
with one line naming the file, the field and the problem; what validate says of the rung."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.spec import SpecError, parse_job

pytestmark = pytest.mark.unit

ELASTIC = Path(__file__).resolve().parents[2] / "fixtures" / "e2e" / "elastic.yaml"
SOURCE = Path("job.yaml")
MASTER = "    Master:\n      replicas: 1\n"
#: The fixture's line of the Worker's minReplicas.
LINE = ELASTIC.read_text().splitlines().index("      minReplicas: 0") + 1


def text(replace: dict[str, str]) -> str:
    out = ELASTIC.read_text()
    for old, new in replace.items():
        assert old in out
        out = out.replace(old, new)
    return out


def test_min_replicas_is_read_into_the_minimum_size() -> None:
    job = parse_job(text({}), SOURCE)
    assert (job.nodes, job.min_nodes) == (2, 1)
    assert not job.warnings
    three = parse_job(
        text({"    Worker:\n      replicas: 1": "    Worker:\n      replicas: 3"}), SOURCE
    )
    assert (three.nodes, three.min_nodes) == (4, 1)


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (
            {"minReplicas: 0": "minReplicas: 2"},
            f"job.yaml:{LINE}: spec.replicaSpecs.Worker.minReplicas: minReplicas 2 is more than "
            "replicas 1",
        ),
        (
            {"minReplicas: 0": "minReplicas: -1"},
            f"job.yaml:{LINE}: spec.replicaSpecs.Worker.minReplicas: out of range",
        ),
        (
            {"minReplicas: 0": "minReplicas: many"},
            f"job.yaml:{LINE}: spec.replicaSpecs.Worker.minReplicas: expected a whole number",
        ),
        (
            {MASTER: MASTER + "      minReplicas: 0\n"},
            "spec.replicaSpecs.Master.minReplicas: minReplicas 0 is below replicas 1, but the "
            "Master pod holds rank 0",
        ),
    ],
)
def test_a_bad_min_replicas_is_one_clear_line(replace: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job(text(replace), SOURCE)
    assert message in str(e.value), str(e.value)
    assert len(str(e.value).strip().splitlines()) == 1, str(e.value)


def test_validate_says_when_the_elastic_rung_can_drop_nothing() -> None:
    job = parse_job(text({"minReplicas: 0": "minReplicas: 1"}), SOURCE)
    assert job.min_nodes == job.nodes
    assert any("elastic-training can drop no pod" in w for w in job.warnings), job.warnings


def test_min_replicas_without_elastic_training_is_said_to_do_nothing() -> None:
    job = parse_job(text({'"recover-in-place,elastic-training"': '"recover-in-place"'}), SOURCE)
    assert any(
        "Worker.minReplicas: has no effect without elastic-training" in w for w in job.warnings
    ), job.warnings


def test_without_min_replicas_every_worker_pod_may_go_as_in_the_seed() -> None:
    job = parse_job(text({"      minReplicas: 0\n": ""}), SOURCE)
    assert (job.nodes, job.min_nodes) == (2, 1)
    assert not job.warnings
    no_elastic = {'"recover-in-place,elastic-training"': '"recover-in-place"'}
    fixed = parse_job(text({"      minReplicas: 0\n": "", **no_elastic}), SOURCE)
    assert fixed.min_nodes == fixed.nodes
