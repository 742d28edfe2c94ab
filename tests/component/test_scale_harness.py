"""The control-plane load harness (bench/scale.py) at a small N: the real job manager in its own
process, 20 simulated node agents over real gRPC, a node's fault and a rack's burst recovered by
``recover`` (the pods moved to spare nodes, every other rank rejoining in process)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_load_harness_recovers_every_fault_and_prints_its_table(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--nodes",
            "20",
            "--faults",
            "1",
            "--window",
            "1",
            "--gap",
            "0.5",
            "--rack",
            "5",
            "--keep",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line[:28].strip(): line[28:].split() for line in out.stdout.splitlines()}
    assert rows["nodes"] == ["20", "growth"]
    # One node's fault, then five nodes at once: one incident, one decision moving five pods.
    assert rows["faults recovered"] == ["2/2"], out.stdout + out.stderr
    decisions = [
        json.loads(data)
        for (data,) in sqlite3.connect(tmp_path / "20" / "ledger.db").execute(
            "SELECT data FROM events WHERE kind = 'DecisionMade' ORDER BY id"
        )
    ]
    assert [d["strategy"] for d in decisions] == ["recover", "recover"], decisions
    assert [len(d["commands"]) for d in decisions] == [1, 5], decisions
    for name in (
        "decision p50 ms",
        "place ms",
        "pause orders to all ms",
        "orders to all ms",
        "manager RSS MiB",
    ):
        assert float(rows[name][0]) >= 0, name
    assert float(rows["heartbeats/s handled"][0]) > 0
    # A job this small keeps the agents' own 0.1 s heartbeat (the hello's answer says so).
    assert rows["heartbeat interval s"][0] == "0.10"
