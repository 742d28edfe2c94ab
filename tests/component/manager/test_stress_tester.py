"""The stress tester of the job manager (unbroken.manager.stress) against a fake job: the
orders it sends, the store it reads, what it records and what it hands to the ladder. Fake
time, a real in-memory store of results, a real ledger; no ranks, no torch in the tester."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.ledger import Ledger, StressTested, StressTestFinished
from unbroken.manager.console import Console
from unbroken.manager.layout import JobLayout, PodLayout
from unbroken.manager.rungs import RankSeen
from unbroken.manager.stress import TEST_TIMEOUT_S, StressTester
from unbroken.protocol.messages import PauseRanks, StressRanks
from unbroken.protocol.stress import (
    LinkMeasure,
    RankStressResult,
    StressCode,
    encode_result,
    link_rounds,
    result_key,
)
from unbroken.spec.knobs import FaultHandling

pytestmark = pytest.mark.component

GOOD, BAD = "d3d36d8681b93caf", "4b1185d51d034088"


class DictStore:
    """The two calls the tester makes of its store."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


@dataclass
class FakeJob:
    generation: int = 0
    finished: bool = False
    busy_with: str = ""
    can_recover: bool = True
    ranks: dict[int, RankSeen] = field(default_factory=dict)
    sent: list[tuple[str, Any]] = field(default_factory=list)
    stores: list[DictStore] = field(default_factory=list)
    rejoined_at: list[float] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def busy(self) -> str:
        return self.busy_with

    def ranks_seen(self) -> Mapping[int, RankSeen]:
        return self.ranks

    def recoverable(self) -> bool:
        return self.can_recover

    def committed(self) -> int:
        return min(v.committed for v in self.ranks.values())

    def pod_agents(self) -> Mapping[str, int]:
        return {"job-master-0": 100, "job-worker-0": 200}

    def send(self, pod: str, pid: int, order: PauseRanks | StressRanks) -> None:
        self.sent.append((pod, order))

    def open_store(self) -> tuple[Any, int]:
        self.stores.append(DictStore())
        return self.stores[-1], 29600 + len(self.stores)

    def where(self, rank: int) -> tuple[str, str, int | None]:
        pod = "job-master-0" if rank < 2 else "job-worker-0"
        return pod, f"node-{rank // 2}", rank % 2

    def rejoin_in_place(self, now: float) -> None:
        self.rejoined_at.append(now)

    def fault_detected(self, fault: Fault, now: float) -> None:
        self.faults.append(fault)


def layout() -> JobLayout:
    return JobLayout(
        job_id="job",
        pods=(
            PodLayout(name="job-master-0", node_rank=0, nproc=2),
            PodLayout(name="job-worker-0", node_rank=1, nproc=2),
        ),
        script="train.py",
        script_args=(),
        fault_handling=FaultHandling(),
        workdir=Path("."),
    )


def recorded(ledger: Ledger, kind: type[Any]) -> list[Any]:
    return [e for e in (r.event() for r in ledger.events()) if isinstance(e, kind)]


def seen(step: int, stopping: bool) -> dict[int, RankSeen]:
    return {
        r: RankSeen(
            rank=r,
            pod="job-master-0" if r < 2 else "job-worker-0",
            alive=True,
            pod_up=True,
            pod_known=True,
            stopping=stopping,
            committed=step,
        )
        for r in range(4)
    }


def publish(
    store: DictStore, round_: int, checksums: Mapping[int, str], slow_rank: int | None = None
) -> None:
    links: dict[int, list[LinkMeasure]] = {r: [] for r in range(4)}
    for pairs in link_rounds(4):
        for a, b in pairs:
            gbps = 0.1 if slow_rank in (a, b) else 1.0
            links[a].append(LinkMeasure(b, gbps, 0.01))
            links[b].append(LinkMeasure(a, gbps, 0.01))
    for r, checksum in checksums.items():
        res = RankStressResult(
            rank=r,
            device_code=StressCode.OK if checksum == GOOD else StressCode.FAULT,
            checksum=checksum,
            expected=GOOD,
            device_s=0.001,
            links=tuple(links[r]),
        )
        store.data[result_key(round_, r)] = encode_result(res)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


def make_tester(job: FakeJob, ledger: Ledger) -> StressTester:
    return StressTester(job, layout(), ledger, Console(quiet=True))


def test_a_healthy_job_is_paused_tested_and_rejoined_and_the_pause_is_recorded(
    ledger: Ledger,
) -> None:
    job = FakeJob(ranks=seen(10, stopping=False))
    t = make_tester(job, ledger)
    assert t.request(100.0)[0] == 1
    assert [o for _, o in job.sent] == [PauseRanks(), PauseRanks()]
    assert t.under_way
    t.poll(100.1)  # not stopped yet: nothing more
    assert len(job.sent) == 2 and not job.stores
    job.ranks = seen(11, stopping=True)
    t.poll(100.3)
    (store,) = job.stores
    assert [o for _, o in job.sent[2:]] == [StressRanks(round=1, master_port=29601)] * 2
    publish(store, 1, {0: GOOD, 1: GOOD, 2: GOOD})
    t.poll(100.4)  # rank 3's result is missing: still testing
    assert not job.rejoined_at
    publish(store, 1, {3: GOOD})
    t.poll(100.6)
    assert job.rejoined_at == [100.6] and not job.faults
    assert not t.under_way  # resuming: the ranks are the rejoin's now
    (tested,) = recorded(ledger, StressTested)
    assert (tested.round, tested.step, tested.code, tested.faulty) == (1, 11, 0, ())
    assert tested.stop_s == pytest.approx(0.3) and tested.test_s == pytest.approx(0.3)
    assert [(x.a, x.b, x.gbps) for x in tested.links] == [
        (0, 1, 1.0),
        (2, 3, 1.0),
        (0, 3, 1.0),
        (1, 2, 1.0),
    ]
    t.resumed(generation=0, first_commit_at=101.0, step=12)  # an older generation: not yet
    assert t.run is not None
    t.resumed(generation=1, first_commit_at=101.5, step=12)
    (done,) = recorded(ledger, StressTestFinished)
    assert (done.round, done.generation, done.step, done.recovered) == (1, 1, 12, False)
    assert done.paused_s == pytest.approx(1.5) and done.resume_s == pytest.approx(0.9)
    assert t.run is None
    assert t.request(102.0)[0] == 2  # the next test may start


def test_a_device_found_wrong_becomes_a_stress_test_fault_of_its_pod(ledger: Ledger) -> None:
    job = FakeJob(ranks=seen(7, stopping=True))
    t = make_tester(job, ledger)
    t.request(10.0)
    t.poll(10.1)
    publish(job.stores[0], 1, {0: GOOD, 1: GOOD, 2: GOOD, 3: BAD})
    t.poll(10.2)
    assert not job.rejoined_at
    (fault,) = job.faults
    assert (fault.kind, fault.level, fault.pod, fault.node, fault.device, fault.ranks) == (
        FaultKind.STRESS_TEST,
        FaultLevel.SEPARATE_NPU,
        "job-worker-0",
        "node-1",
        1,
        (3,),
    )
    assert fault.step == 7 and "differs from d3d36d8681b93caf computed at start" in fault.detail
    t.resumed(generation=3, first_commit_at=14.0, step=8)
    (done,) = recorded(ledger, StressTestFinished)
    assert done.recovered and done.code == 2


def test_a_rank_whose_every_link_is_slow_takes_its_node_out(ledger: Ledger) -> None:
    job = FakeJob(ranks=seen(7, stopping=True))
    t = make_tester(job, ledger)
    t.request(10.0)
    t.poll(10.1)
    publish(job.stores[0], 1, dict.fromkeys(range(4), GOOD), slow_rank=2)
    t.poll(10.2)
    (fault,) = job.faults
    # No device named: the ladder isolates the node (the seed's code 2 for a node).
    assert (fault.pod, fault.node, fault.device, fault.ranks) == (
        "job-worker-0",
        "node-1",
        None,
        (2,),
    )
    assert "every link of the rank is slow or failed (2-3, 1-2)" in fault.detail


def test_a_rank_without_a_result_times_out_and_the_job_resumes(ledger: Ledger) -> None:
    job = FakeJob(ranks=seen(7, stopping=True))
    t = make_tester(job, ledger)
    t.request(10.0)
    t.poll(10.1)
    publish(job.stores[0], 1, {0: GOOD, 1: GOOD, 2: GOOD})
    t.poll(10.1 + TEST_TIMEOUT_S - 0.1)
    assert not job.rejoined_at
    t.poll(10.1 + TEST_TIMEOUT_S)
    assert job.rejoined_at and not job.faults
    (tested,) = recorded(ledger, StressTested)
    assert tested.code == 3 and tested.ranks[3].device_code == 3


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"busy_with": "recovery from f1 is under way"}, "recovery from f1 is under way"),
        ({"finished": True}, "the job has ended"),
        ({"can_recover": False}, "a rank cannot be repaired in process"),
    ],
)
def test_a_stress_test_is_refused_saying_why(
    ledger: Ledger, change: dict[str, Any], why: str
) -> None:
    job = replace(FakeJob(ranks=seen(3, stopping=False)), **change)
    with pytest.raises(ValueError, match=why):
        make_tester(job, ledger).request(1.0)
    assert job.sent == []


def test_a_fault_during_the_test_gives_it_up(ledger: Ledger) -> None:
    job = FakeJob(ranks=seen(3, stopping=False))
    t = make_tester(job, ledger)
    t.request(1.0)
    job.busy_with = "recovery from f1 is under way"
    t.poll(1.1)
    assert t.run is None and not job.stores and not job.rejoined_at
