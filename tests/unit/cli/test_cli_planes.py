"""``planes`` in the cluster YAML: read and checked, and under ``unbroken run`` refused in one
line, before anything is made, where network namespaces cannot be (no root, no iproute2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.spec import SpecError, load_cluster, load_job

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "e2e"


def cluster(tmp_path: Path, planes: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"nodes: 3\ndevicesPerNode: 2\nplanes: {planes}\n")
    return path


def test_planes_are_read_in_order_of_preference(tmp_path: Path) -> None:
    assert load_cluster(cluster(tmp_path, "[a, plane-b]")).planes == ("a", "plane-b")
    assert load_cluster(None).planes == ()


@pytest.mark.parametrize(
    ("planes", "says"),
    [
        (
            "[a]",
            "planes: the nodes' network planes, in order of preference: got 1; allowed: 2 to 4",
        ),
        ("[a, a]", "a plane is a distinct name: got 'a'"),
        ("[a, B]", "a plane is a distinct name: got 'B'"),
        ("[a, b, c, d, e]", "got 5; allowed: 2 to 4 planes"),
        ("a", "expected a list"),
    ],
)
def test_bad_planes_are_one_line_naming_the_field(tmp_path: Path, planes: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        load_cluster(cluster(tmp_path, planes))
    assert says in str(err.value), str(err.value)


def test_planes_without_link_failover_are_warned_about(tmp_path: Path) -> None:
    job = load_job(FIXTURES / "job.yaml")
    warned = load_cluster(cluster(tmp_path, "[a, b]"), job).warnings
    assert any("link failover is off" in w for w in warned), warned
    on = load_cluster(cluster(tmp_path, "[a, b]"), load_job(FIXTURES / "plane-failover.yaml"))
    assert on.warnings == ()


def test_unbroken_run_refuses_planes_it_cannot_build_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "unbroken.cli.planes.unavailable", lambda: "`ip netns add` is not permitted: denied"
    )
    path = cluster(tmp_path, "[a, b]")
    run_dir = tmp_path / "run"
    job = FIXTURES / "plane-failover.yaml"
    rc = main(["run", str(job), "--cluster", str(path), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == (
        f"unbroken run: {path}: planes: network planes on one machine are network namespaces, "
        "and `ip netns add` is not permitted: denied (run as root with iproute2, or run the job "
        "across hosts: unbroken serve, and unbroken launch --join --plane NAME=IFNAME on each)\n"
    )
    assert not run_dir.exists()


def test_a_mindspore_job_across_hosts_is_refused_and_makes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its Scheduler runs beside node rank 0's ranks, and across hosts the ranks would be given
    the control plane's address for it."""
    job = Path(__file__).resolve().parents[3] / "examples" / "jobs" / "mindspore.yaml"
    run_dir = tmp_path / "run"
    assert main(["serve", str(job), "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"unbroken serve: {job}: metadata.labels.framework: mindspore: a MindSpore job runs on "
        "one host here (`unbroken run` without planes), not across the hosts of `unbroken "
        "serve`: its Scheduler runs beside node rank 0's ranks, and the ranks are given the "
        "control plane's address for it\n"
    )
    assert not run_dir.exists()
