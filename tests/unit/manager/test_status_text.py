"""The status snapshot made incrementally is the one made whole, byte for byte, as pods are
placed, start their ranks, move and lose them; a pod's row is encoded again only when it changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from unbroken.ledger import JobPhase
from unbroken.ledger.store import encode_status
from unbroken.manager.generations import Generations
from unbroken.manager.layout import JobLayout, PodLayout
from unbroken.manager.pods import PodProcess
from unbroken.manager.snapshot import StatusText, job_status
from unbroken.scheduler import Binding
from unbroken.spec.faulthandling import FaultHandling

pytestmark = pytest.mark.unit

JOB = JobLayout(
    job_id='a "quoted" job "pods":[]',  # what the snapshot's JSON must escape
    pods=tuple(PodLayout(name=f"p-{i}", node_rank=i, nproc=2) for i in range(4)),
    script="train.py",
    script_args=(),
    fault_handling=FaultHandling(),
    workdir=Path("."),
)


class _Proc:
    pid = 4242

    def poll(self) -> int | None:
        return None


def _pod(name: str, pids: dict[int, int]) -> PodProcess:
    proc: Any = _Proc()
    return PodProcess(pod=name, node="n", generation=0, proc=proc, started_at=0.0, rank_pids=pids)


def _both(
    text: StatusText, pods: dict[str, PodProcess], bindings: dict[str, Binding]
) -> tuple[str, str]:
    kw: dict[str, Any] = dict(
        ended=None,
        incident=None,
        pending_reason="",
        scaled_in="",
        world_size=8,
        generations=Generations(),
        step=7,
        started_at=1.0,
        now=2.0,
        faults=1,
        recoveries=0,
    )
    whole = job_status(JOB, pods=pods, bindings=bindings, **kw)
    bare = job_status(JOB, pods={}, bindings={}, with_pods=False, **kw)
    expected = json.dumps(encode_status(whole), separators=(",", ":"))
    return text.text(bare, JOB, pods, bindings), expected


def test_the_incremental_snapshot_is_the_whole_one_as_pods_change() -> None:
    text = StatusText()
    pods: dict[str, PodProcess] = {}
    bindings: dict[str, Binding] = {}
    got, want = _both(text, pods, bindings)  # nothing placed
    assert got == want
    for i in range(4):
        bindings[f"p-{i}"] = Binding(pod=f"p-{i}", node=f"node-{i}", devices=(0, 1))
        pods[f"p-{i}"] = _pod(f"p-{i}", {})
    got, want = _both(text, pods, bindings)
    assert got == want
    for i in range(4):
        pods[f"p-{i}"].rank_pids.update({2 * i + 1: 100 + 2 * i + 1, 2 * i: 100 + 2 * i})
    got, want = _both(text, pods, bindings)
    assert got == want
    assert json.loads(got)["pods"][1] == {
        "name": "p-1",
        "node": "node-1",
        "devices": [0, 1],
        "ranks": [2, 3],
        "pids": [102, 103],
    }
    bindings["p-2"] = Binding(pod="p-2", node="spare-0", devices=(1, 0))  # moved
    pods["p-2"] = _pod("p-2", {4: 900})  # one rank started so far
    del pods["p-3"]  # lost, not yet placed again
    del bindings["p-3"]
    got, want = _both(text, pods, bindings)
    assert got == want
    assert json.loads(got)["phase"] == JobPhase.PENDING.value


def test_an_unchanged_pods_row_is_not_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import unbroken.manager.snapshot as snapshot

    text = StatusText()
    pods = {f"p-{i}": _pod(f"p-{i}", {2 * i: 10 + i}) for i in range(4)}
    bindings = {f"p-{i}": Binding(pod=f"p-{i}", node="n", devices=(0,)) for i in range(4)}
    _both(text, pods, bindings)
    encoded: list[str] = []
    real = snapshot._row

    def counting(name: str, key: Any) -> Any:
        encoded.append(name)
        return real(name, key)

    monkeypatch.setattr(snapshot, "_row", counting)
    pods["p-1"].rank_pids[3] = 99
    got, want = _both(text, pods, bindings)
    assert got == want
    # job_status built every row for the expected text; StatusText encoded only p-1's again.
    assert encoded.count("p-1") == 2 and encoded.count("p-0") == 1
