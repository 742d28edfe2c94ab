"""Control-plane load harness: the real job manager against N simulated node agents.

    .venv/bin/python bench/scale.py --nodes 1000,2000,5000,10000

For each N: the job manager (src/unbroken/manager, unchanged code behind one seam: pods whose
agents are external) runs in its own process; N simulated agents of 8 ranks each register over
the real gRPC control channel, heartbeat at the agent's real rate (every 0.1 s) and obey their
orders. After a steady window, node faults are injected one incident at a time (a node's agent
falls silent), then a rack burst (32 nodes at once); spare nodes hold the replacements.

Printed per N, and how each figure grows with N (the exponent k of figure ~ N^k between the
smallest and largest N): decision latency from fault detection to orders sent (p50, p99), time
to place the replacement, time until every agent has its orders, heartbeats handled per second
and the manager's inbox backlog, control-plane CPU and memory, ledger writes per second, and
the generator's own lag.

Fault rate: Llama 3 405B pre-training saw 419 unexpected interruptions in 54 days on 16,384
GPUs (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4), that is 4.4e-8 per
8-GPU node per second. Faults here arrive as a Poisson process at that rate times N, sped up by
the factor printed (so that a run takes seconds, not weeks), one incident at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_harness.agents import Fleet

HERE = Path(__file__).resolve().parent
#: Llama 3: 419 interruptions / 54 days / 16,384 GPUs, per 8-GPU node per second.
NODE_FAULT_RATE = 419 / (54 * 86400) / (16384 / 8)
RACK = 32
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Result:
    n: int
    decision: list[float] = field(default_factory=list)
    mttr: list[float] = field(default_factory=list)
    place: list[float] = field(default_factory=list)
    orders_all: list[float] = field(default_factory=list)
    orders_spread: list[float] = field(default_factory=list)
    ready_after: list[float] = field(default_factory=list)
    pause_all: list[float] = field(default_factory=list)
    detect: list[float] = field(default_factory=list)
    hb_rate: float = 0.0
    hb_offered: float = 0.0
    interval_s: float = 0.0
    backlog_max: int = 0
    cpu_pct: float = 0.0
    rss_mib: float = 0.0
    ledger_rate: float = 0.0
    lag_p99: float = 0.0
    lag_faults_p99: float = 0.0
    recovered: int = 0
    faults: int = 0
    speedup: float = 0.0
    outcome: str = ""


class ControlPlane:
    """The manager's process and what it says on stdout."""

    def __init__(self, n: int, spares: int, run_dir: Path, strategy: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "scale_harness" / "control_plane.py"),
                "--nodes",
                str(n),
                "--spares",
                str(spares),
                "--run-dir",
                str(run_dir),
                "--strategy",
                strategy,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            stderr=(run_dir / "control_plane.log").open("w"),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.hello: dict[str, Any] = {}
        self.ready = threading.Event()
        self.placed: list[dict[str, Any]] = []
        self.inbox: list[tuple[float, int]] = []
        self.done: dict[str, Any] = {}
        self.new: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.lock:
                if "address" in msg:
                    self.hello = msg
                    self.ready.set()
                elif "placed" in msg:
                    self.placed.append(msg)
                    self.new.append(msg)
                elif "inbox" in msg:
                    self.inbox.append((msg["t"], msg["inbox"]))
                elif "done" in msg:
                    self.done = msg
        self.ready.set()

    def take_new(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.new = self.new, []
        return out

    def stop(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ledger_rows(db: Path, kinds: tuple[str, ...]) -> list[tuple[float, str, dict[str, Any]]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(kinds))
        rows = con.execute(
            f"SELECT at, kind, data FROM events WHERE kind IN ({marks}) ORDER BY id", kinds
        ).fetchall()
    finally:
        con.close()
    return [(at, kind, json.loads(data)) for at, kind, data in rows]


def ledger_count(db: Path, t0: float, t1: float) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (n,) = con.execute(
            "SELECT COUNT(*) FROM events WHERE at BETWEEN ? AND ?", (t0, t1)
        ).fetchone()
    finally:
        con.close()
    return int(n)


async def pump(cp: ControlPlane, fleet: Fleet, rank_of: dict[str, int]) -> None:
    """Start a simulated agent for every pod the manager places."""
    while True:
        for msg in cp.take_new():
            fleet.start(msg["placed"], rank_of[msg["placed"]], int(msg["pid"]))
        await asyncio.sleep(0.01)


async def wait_for(cond: Any, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return False


async def one_run(
    n: int, faults: int, window_s: float, gap_s: float, channels: int, run_dir: Path, strategy: str
) -> Result:
    res = Result(n=n)
    spares = faults + RACK + 8
    cp = ControlPlane(n, spares, run_dir, strategy)
    db = run_dir / "ledger.db"
    rank_of = {f"pod-{i}": i for i in range(n)}
    await asyncio.get_running_loop().run_in_executor(None, cp.ready.wait, 120)
    if not cp.hello:
        raise SystemExit(f"the control plane for {n} nodes did not start (exit {cp.proc.poll()})")
    pid = int(cp.hello["pid"])
    # An HTTP/2 connection carries at most 100 concurrent streams by default, and every agent
    # holds one open (its orders): 50 agents a connection leave room for their calls.
    conns = channels or max(8, math.ceil(n / 50))
    fleet = Fleet(cp.hello["address"], cp.hello["secret"], conns, heartbeat_s=0.1, world=n)
    pumper = asyncio.get_running_loop().create_task(pump(cp, fleet, rank_of))
    lag = asyncio.get_running_loop().create_task(fleet.watch_lag())
    try:
        started = await wait_for(
            lambda: (
                len(fleet.agents) == n and all(a.registered.is_set() for a in fleet.agents.values())
            ),
            60 + n / 50,
        )
        if not started:
            up = sum(a.registered.is_set() for a in fleet.agents.values())
            res.outcome = f"only {up}/{n} agents registered"
            return res
        # The ranks' first records and commits are told (a heartbeat each, 2N in all) and
        # the manager has caught up before the steady window.
        await wait_for(
            lambda: (
                all(a.settled.is_set() for a in fleet.agents.values())
                and bool(cp.inbox)
                and cp.inbox[-1][1] < 10
            ),
            30 + n / 100,
        )
        await asyncio.sleep(2.0)
        # Steady state: heartbeats at the real rate, no fault.
        fleet.stats.lags.clear()
        fleet.measuring = True
        beats0, cpu0, t0 = fleet.stats.beats, cpu_s(pid), time.time()
        inbox0 = len(cp.inbox)
        await asyncio.sleep(window_s)
        t1 = time.time()
        fleet.measuring = False
        res.hb_rate = (fleet.stats.beats - beats0) / (t1 - t0)
        res.hb_offered = n / fleet.interval_s
        res.interval_s = fleet.interval_s
        res.cpu_pct = 100 * (cpu_s(pid) - cpu0) / (t1 - t0)
        res.rss_mib = rss_mib(pid)
        res.backlog_max = max((d for _, d in cp.inbox[inbox0:]), default=0)
        res.lag_p99 = pct(fleet.stats.lags, 0.99)
        # Faults, one incident at a time: single nodes, then a rack.
        res.speedup = 1.0 / (NODE_FAULT_RATE * n * gap_s)
        rng = random.Random(n)
        live = [f"pod-{i}" for i in range(n)]
        rack = min(RACK, n // 2)
        rounds = [[p] for p in rng.sample(live[rack:], min(faults, n - rack))]
        rounds += [live[:rack]] if rack else []
        faults_t0 = time.time()
        fleet.stats.lags.clear()
        fleet.measuring = True
        for victims in rounds:
            await asyncio.sleep(min(3 * gap_s, rng.expovariate(1.0 / gap_s)))
            before = len(ledger_rows(db, ("RecoveryCompleted",)))
            at = time.time()
            for p in victims:
                fleet.agents[p].silence()
            res.faults += 1
            ok = await wait_for(
                lambda b=before: len(ledger_rows(db, ("RecoveryCompleted",))) > b, 30 + n / 100
            )
            if not ok:
                res.outcome = f"no recovery within {30 + n / 100:.0f} s of fault {res.faults}"
                break
            res.recovered += 1
            rows = ledger_rows(
                db, ("FaultDetected", "DecisionMade", "PodPlaced", "RecoveryCompleted")
            )
            rows = [r for r in rows if r[0] >= at]
            detected = next(r[0] for r in rows if r[1] == "FaultDetected")
            # The fault's time is when it was injected: the ledger's own MTTR counts from
            # the node's last heartbeat, up to an interval (20 s at 10k nodes) before it.
            res.mttr.append(next(r[0] for r in rows if r[1] == "RecoveryCompleted") - at)
            decided = next(r[0] for r in rows if r[1] == "DecisionMade")
            res.detect.append(detected - at)
            res.decision.append(decided - detected)
            placed = [m["t"] for m in cp.placed if m["t"] >= detected]
            if placed:
                res.place.append(max(placed) - decided)
            # Every agent has its orders: the last first order of the new generation to arrive.
            gen = (
                max(
                    g
                    for a, o, g in (x for log in fleet.stats.orders.values() for x in log)
                    if a >= at
                )
                if any(x[0] >= at for log in fleet.stats.orders.values() for x in log)
                else -1
            )
            firsts = [
                min(a for a, _, g in log if a >= at and g == gen)
                for log in fleet.stats.orders.values()
                if any(a >= at and g == gen for a, _, g in log)
            ]
            if firsts:
                res.orders_all.append(max(firsts) - detected)
                res.orders_spread.append(max(firsts) - min(firsts))
            started = ledger_rows(db, ("ProcessesStarted",))
            started = [r[0] for r in started if r[0] >= at]
            if placed and started:
                res.ready_after.append(max(started) - max(placed))
            # Under recover every agent is first told to pause its ranks at a step boundary.
            paused = [
                min(a for a, o, _ in log if a >= at and o == "PauseRanks")
                for log in fleet.stats.orders.values()
                if any(a >= at and o == "PauseRanks" for a, o, _ in log)
            ]
            if paused:
                res.pause_all.append(max(paused) - decided)
        # What the ledger takes while faults are handled (in steady state it records nothing).
        faults_t1 = time.time()
        fleet.measuring = False
        res.lag_faults_p99 = pct(fleet.stats.lags, 0.99)
        res.ledger_rate = ledger_count(db, faults_t0, faults_t1) / (faults_t1 - faults_t0)
        res.outcome = res.outcome or "ok"
    finally:
        pumper.cancel()
        lag.cancel()
        cp.stop()
        await fleet.close()
    return res


def growth(xs: list[tuple[int, float]]) -> str:
    pts = [(n, v) for n, v in xs if v == v and v > 0]
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return "-"
    (n0, v0), (n1, v1) = pts[0], pts[-1]
    return f"N^{math.log(v1 / v0) / math.log(n1 / n0):.2f}"


def table(results: list[Result]) -> str:
    def ms(x: float) -> str:
        return "-" if x != x else f"{x * 1000:.0f}"

    cols: list[tuple[str, Any]] = [
        ("decision p50 ms", lambda r: pct(r.decision, 0.5)),
        ("decision p99 ms", lambda r: pct(r.decision, 0.99)),
        ("place ms", lambda r: pct(r.place, 0.5)),
        ("pause orders to all ms", lambda r: pct(r.pause_all, 0.99)),
        ("orders to all ms", lambda r: pct(r.orders_all, 0.99)),
        ("orders first to last ms", lambda r: pct(r.orders_spread, 0.99)),
        ("replacement placed to started ms", lambda r: pct(r.ready_after, 0.5)),
        ("MTTR p50 ms", lambda r: pct(r.mttr, 0.5)),
        ("MTTR max ms", lambda r: max(r.mttr, default=float("nan"))),
        ("detect ms", lambda r: pct(r.detect, 0.5)),
    ]
    other: list[tuple[str, Any, str]] = [
        ("heartbeats/s handled", lambda r: r.hb_rate, "{:.0f}"),
        ("heartbeats/s offered", lambda r: r.hb_offered, "{:.0f}"),
        ("heartbeat interval s", lambda r: r.interval_s, "{:.2f}"),
        ("inbox backlog max", lambda r: float(r.backlog_max), "{:.0f}"),
        ("manager CPU %", lambda r: r.cpu_pct, "{:.0f}"),
        ("manager RSS MiB", lambda r: r.rss_mib, "{:.0f}"),
        ("ledger rows/s, faults", lambda r: r.ledger_rate, "{:.1f}"),
        ("generator lag p99 ms", lambda r: r.lag_p99 * 1000, "{:.0f}"),
        ("generator lag p99 ms, faults", lambda r: r.lag_faults_p99 * 1000, "{:.0f}"),
    ]
    head = f"{'nodes':<28}" + "".join(f"{r.n:>10}" for r in results) + f"{'growth':>10}"
    lines = [head, "-" * len(head)]
    for name, f in cols:
        vals = [f(r) for r in results]
        lines.append(
            f"{name:<28}"
            + "".join(f"{ms(v):>10}" for v in vals)
            + f"{growth(list(zip([r.n for r in results], vals, strict=True))):>10}"
        )
    for name, f, fmt in other:
        vals = [f(r) for r in results]
        lines.append(
            f"{name:<28}"
            + "".join(f"{fmt.format(v):>10}" for v in vals)
            + f"{growth(list(zip([r.n for r in results], vals, strict=True))):>10}"
        )
    lines.append(
        f"{'faults recovered':<28}" + "".join(f"{f'{r.recovered}/{r.faults}':>10}" for r in results)
    )
    lines.append(f"{'fault speed-up':<28}" + "".join(f"{r.speedup:>10.1e}" for r in results))
    for r in results:
        if r.outcome != "ok":
            lines.append(f"{r.n} nodes: {r.outcome}")
    return "\n".join(lines)


async def run_all(
    ns: list[int],
    faults: int,
    window_s: float,
    gap_s: float,
    channels: int,
    keep: Path | None,
    strategy: str,
) -> list[Result]:
    """Every N in one event loop (gRPC's asyncio poller stays bound to its first loop)."""
    results = []
    for n in ns:
        if keep is not None:  # the run's ledger and the control plane's log stay there
            (keep / str(n)).mkdir(parents=True, exist_ok=True)
            r = await one_run(n, faults, window_s, gap_s, channels, keep / str(n), strategy)
        else:
            with tempfile.TemporaryDirectory(prefix="unbroken-scale-") as d:
                r = await one_run(n, faults, window_s, gap_s, channels, Path(d), strategy)
        results.append(r)
        print(f"{n} nodes: {r.outcome}", file=sys.stderr, flush=True)
    return results


def svg(results: list[Result]) -> str:
    """MTTR (p50, max) and the rejoin's delivery against the job's nodes."""
    from svgplot import series, standalone

    def line(of: Any) -> list[tuple[float, float]]:
        return [(r.n, v) for r in results if not math.isnan(v := of(r))]

    lines = series(
        [
            ("MTTR p50 (s)", line(lambda r: pct(r.mttr, 0.5))),
            ("MTTR max (s)", line(lambda r: max(r.mttr, default=math.nan))),
            ("every agent has its orders (s)", line(lambda r: pct(r.orders_all, 0.99))),
            ("rejoin first to last (s)", line(lambda r: pct(r.orders_spread, 0.99))),
        ]
    )
    return standalone(
        lines,
        css_class="scale",
        x_label="nodes of 8 ranks (recover: a node lost, its pod moved to a spare)",
        y_label="seconds",
        width=900,
        key_step=200,
    )


def main(argv: list[str] | None = None) -> int:
    global RACK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,2000,5000,10000", help="comma-separated node counts")
    ap.add_argument("--faults", type=int, default=4, help="single-node faults per N (then a rack)")
    ap.add_argument(
        "--rack", type=int, default=RACK, help="nodes of the rack burst (at most N/2; 0: none)"
    )
    ap.add_argument("--window", type=float, default=5.0, help="steady-state window, s")
    ap.add_argument("--gap", type=float, default=2.0, help="mean time between faults, s")
    ap.add_argument(
        "--channels", type=int, default=0, help="gRPC channels the agents share (0: one per 50)"
    )
    ap.add_argument("--keep", type=Path, help="keep each N's ledger and log under this folder")
    ap.add_argument(
        "--strategy",
        choices=("recover", "reschedule"),
        default="recover",
        help="recover: a lost node's pod moves to a spare and every other rank rejoins in "
        "process (pod-level rescheduling below it); reschedule: pod-level rescheduling only",
    )
    ap.add_argument("--svg", type=Path, help="MTTR and the rejoin's delivery against N (a file)")
    a = ap.parse_args(argv)
    try:
        ns = [int(x) for x in a.nodes.split(",")]
    except ValueError:
        print(f"--nodes: not a comma-separated list of integers: {a.nodes!r}", file=sys.stderr)
        return 2
    RACK = max(0, a.rack)
    results = asyncio.run(run_all(ns, a.faults, a.window, a.gap, a.channels, a.keep, a.strategy))
    print(table(results))
    print(f"load: {Path('/proc/loadavg').read_text().strip()} ({os.cpu_count()} cores)")
    if a.svg is not None:
        a.svg.write_text(svg(results))
    return 0 if all(r.outcome == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
