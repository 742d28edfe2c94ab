"""The torchrun-compatible command line of ``unbroken launch``."""

from __future__ import annotations

import pytest

from unbroken.agent.launcher import LaunchUsageError, parse_launch_args

pytestmark = pytest.mark.unit


def test_both_spellings_and_script_args_pass_through() -> None:
    a = parse_launch_args(
        [
            "--nproc-per-node",
            "2",
            "--nnodes=2",
            "--node_rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master_port=29501",
            "--max-restarts",
            "5",
            "--monitor_interval",
            "0.5",
            "train.py",
            "--steps",
            "10",
            "--nnodes",
            "7",
        ]
    )
    assert (a.nproc_per_node, a.nnodes, a.node_rank) == (2, 2, 1)
    assert (a.master_addr, a.master_port, a.max_restarts) == ("10.0.0.1", 29501, 5)
    assert a.monitor_interval_s == 0.5
    assert a.script == "train.py"
    assert a.script_args == ("--steps", "10", "--nnodes", "7")
    assert a.world_size == 4
    assert [a.global_rank(i) for i in range(2)] == [2, 3]


def test_defaults_follow_the_reference() -> None:
    a = parse_launch_args(["train.py"])
    assert a.max_restarts == 32767
    assert a.monitor_interval_s == 5.0
    assert a.nnodes == 1 and a.nproc_per_node == 1


def test_elastic_nnodes_takes_the_maximum() -> None:
    assert parse_launch_args(["--nnodes", "1:3", "--node_rank", "2", "x.py"]).nnodes == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node_rank", "2", "--nnodes", "2", "x.py"], "--node_rank: 2 must be in [0, 1]"),
        (["--nproc_per_node", "two", "x.py"], "--nproc_per_node: 'two' is not an integer"),
        (["--nproc_per_node", "0", "x.py"], "--nproc_per_node: 0 is out of range (1-1024)"),
        (
            ["--nproc_per_node", "100000000000000000000", "x.py"],
            "--nproc_per_node: 100000000000000000000 is out of range (1-1024)",
        ),
        (["--nnodes", "1:20000", "x.py"], "--nnodes: 20000 is out of range (1-10000)"),
        (["--master_port", "70000", "x.py"], "--master_port: 70000 is not a TCP port"),
        (["--monitor_interval", "0", "x.py"], "--monitor_interval: 0.0 must be positive"),
        (["--max_restarts", "-1", "x.py"], "--max_restarts: -1 is out of range (0-2147483647)"),
    ],
)
def test_bad_values_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(LaunchUsageError) as err:
        parse_launch_args(argv)
    assert str(err.value) == message
