"""Prometheus metrics of a run, read from its ledger at each scrape.

Every value is derived from the same records ``unbroken events`` and ``unbroken status`` show
(the goodput and incident timelines of :mod:`unbroken.ledger`), so a scrape and the ledger
never disagree. The collector reads only the records written since its previous scrape.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from unbroken.ledger import (
    PHASES,
    DeviceIsolated,
    DeviceReturned,
    FaultDetected,
    JobFailed,
    JobStopped,
    JobSucceeded,
    Ledger,
    Record,
    RecoveryCompleted,
    StepProgress,
    goodput,
    incidents,
)

#: Upper bounds (s) of the MTTR and recovery phase histograms.
BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _histogram(values: Sequence[float]) -> list[tuple[str, float]]:
    # repr of a float is Prometheus' spelling of a bound ("5.0", "0.25")
    buckets = [(repr(b), float(sum(1 for v in values if v <= b))) for b in BUCKETS_S]
    return [*buckets, ("+Inf", float(len(values)))]


class LedgerCollector(Collector):
    """The run's metrics (see the module doc); ``clock`` ends a live run's wall time."""

    def __init__(self, ledger: Ledger, clock: Callable[[], float] = time.time) -> None:
        self._ledger = ledger
        self._clock = clock
        self._lock = threading.Lock()
        self._records: list[Record] = []

    def records(self) -> list[Record]:
        """Every record so far (read incrementally)."""
        with self._lock:
            last = self._records[-1].id if self._records else 0
            self._records.extend(self._ledger.events(since_id=last))
            return list(self._records)

    def collect(self) -> Iterator[Metric]:
        recs = self.records()
        status = self._ledger.status()
        finished = any(r.kind in (JobSucceeded.kind, JobFailed.kind, JobStopped.kind) for r in recs)
        gp = goodput(recs, now=None if finished else self._clock())
        found = incidents(recs)

        step = GaugeMetricFamily("unbroken_step", "Last optimizer step committed by every rank.")
        step.add_metric([], float(max(gp.step, status.step if status else 0)))
        yield step
        gen = GaugeMetricFamily("unbroken_generation", "Rendezvous generation (+1 per rebuild).")
        gen.add_metric([], float(status.generation if status else 0))
        yield gen
        times = [r.data.get("step_time_s") for r in recs if r.kind == StepProgress.kind]
        last_time = next((t for t in reversed(times) if isinstance(t, int | float)), math.nan)
        st = GaugeMetricFamily("unbroken_step_time_seconds", "Median step time of the ranks.")
        st.add_metric([], float(last_time))
        yield st

        faults = CounterMetricFamily(
            "unbroken_faults", "Faults detected, by kind and level.", labels=["kind", "level"]
        )
        counts: dict[tuple[str, str], int] = {}
        for r in recs:
            if r.kind == FaultDetected.kind:
                key = (str(r.data.get("source", "")), str(r.data.get("level", "")))
                counts[key] = counts.get(key, 0) + 1
        for (kind, level), n in sorted(counts.items()):
            faults.add_metric([kind, level], float(n))
        yield faults

        recoveries = CounterMetricFamily(
            "unbroken_recoveries", "Recoveries completed, by rung of the ladder.", labels=["rung"]
        )
        rungs: dict[str, int] = {}
        for r in recs:
            if r.kind == RecoveryCompleted.kind:
                rung = str(r.data.get("strategy", ""))
                rungs[rung] = rungs.get(rung, 0) + 1
        for rung, n in sorted(rungs.items()):
            recoveries.add_metric([rung], float(n))
        yield recoveries

        mttrs = [i.mttr_s for i in found if i.mttr_s is not None]
        mttr = HistogramMetricFamily(
            "unbroken_mttr_seconds", "Fault occurred -> first step committed after it."
        )
        mttr.add_metric([], _histogram(mttrs), sum_value=sum(mttrs))
        yield mttr
        phase = HistogramMetricFamily(
            "unbroken_recovery_phase_seconds",
            "Duration of each phase of the recoveries.",
            labels=["phase"],
        )
        for name in PHASES:
            took = [d for i in found for d in [i.duration_s(name)] if d is not None]
            phase.add_metric([name], _histogram(took), sum_value=sum(took))
        yield phase

        ratio = GaugeMetricFamily(
            "unbroken_goodput_ratio", "Productive training time over wall time (ETTR)."
        )
        ratio.add_metric([], math.nan if gp.ettr is None else gp.ettr)
        yield ratio
        productive = GaugeMetricFamily(
            "unbroken_productive_seconds", "Wall time spent in productive training."
        )
        productive.add_metric([], gp.productive_s)
        yield productive
        badput = GaugeMetricFamily(
            "unbroken_badput_seconds", "Wall time lost, by cause.", labels=["cause"]
        )
        for cause, seconds in gp.badput_s.items():
            badput.add_metric([cause], seconds)
        yield badput

        isolated: set[tuple[str, str]] = set()
        for r in recs:
            device = (str(r.data.get("node", "")), str(r.data.get("device", "")))
            if r.kind == DeviceIsolated.kind:
                isolated.add(device)
            elif r.kind == DeviceReturned.kind:
                isolated.discard(device)
        dev = GaugeMetricFamily("unbroken_devices_isolated", "Devices out of the pool now.")
        dev.add_metric([], float(len(isolated)))
        yield dev
        pending = GaugeMetricFamily("unbroken_pods_pending", "Pods of the job not placed now.")
        pending.add_metric([], float(sum(1 for p in status.pods if not p.node) if status else 0))
        yield pending


def registry_for(collector: LedgerCollector) -> CollectorRegistry:
    """A registry of the run's metrics alone (not the process's default metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
