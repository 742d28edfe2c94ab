"""Recovery cost against model size: recover-in-place, recover and torchrun's restart, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_size.py --sizes 10M,50M,100M

For each size, ``examples/train_mlp.py`` with ``--width``/``--layers`` (an MLP of that many
parameters, AdamW, fp32, DDP on gloo, 2 "nodes" x 2 ranks) runs the same way as in
``bench/recovery.py`` (its harness, ``bench/recovery_bench``): rank 3 SIGKILLs itself right after
committing step ``--kill-step``; checkpoints every ``--ckpt-every`` steps. Configurations:
``unbroken-rip`` (recover-in-place: the dead rank alone gets a new process, which takes model,
optimizer and data position from a live replica), ``unbroken-recover`` (the faulty pod moves to
the spare node, both its ranks new processes fed from replicas) and ``torchrun-nss`` (torchrun
restarting every rank from the newest ``torch.distributed.checkpoint``, with the shared-store
workaround), plus each tool's fault-free run, whose final digest every faulted run must equal.

Printed per size: MTTR (fault -> every rank committed a step after it) and the ledger's phases;
the bytes the newcomer took from the replica, the transfer's time and rate and the digest check
after it (the receiving rank's own figures, logged by ``unbroken.worker.replica`` into the step
log); and, measured in the same run just before, the rate gloo reaches on this machine's loopback
broadcasting that many bytes between two processes: into memory already touched (the wire's
limit) and into fresh memory (what a new process must also pay: its pages are faulted in as the
bytes land). Then the growth with size as a line, seconds per GB of state, per configuration.

``--svg FILE`` draws MTTR against the state's size; ``--markdown FILE`` writes the README's
table; ``--out FILE`` every run as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recovery_bench.configs import BASELINES, CONFIGS, Config, Settings
from recovery_bench.report import run_line
from recovery_bench.runs import RunResult, run_one

#: name -> (hidden width, hidden layers) of examples/train_mlp.py
SIZES: dict[str, tuple[int, int]] = {
    "10M": (1024, 10),
    "50M": (2048, 13),
    "100M": (4096, 7),
    "200M": (4096, 13),
}
D_IN, N_CLASSES = 128, 16  # examples/train_mlp.py
STATE_BYTES_PER_PARAM = 12  # fp32 parameter and AdamW's two moments
CONFIG_KEYS = ("unbroken-rip", "unbroken-recover", "torchrun-nss")
LABELS = {
    "unbroken-rip": "recover-in-place",
    "unbroken-recover": "recover",
    "torchrun-nss": "torchrun restart",
}
REPAIR = re.compile(
    r"^(?P<at>[\d.]+) replica rank (?P<rank>\d+) took (?P<mb>[\d.]+) MB of step (?P<step>\d+) "
    r"from rank (?P<src>\d+): transfer (?P<transfer>[\d.]+) s \((?P<rate>\d+) MB/s\) after "
    r"(?P<setup>[\d.]+) s of group setup, checked (?P<check>[\d.]+) s later$"
)


def params_of(width: int, layers: int) -> int:
    hidden = (layers - 1) * (width * width + width)
    return D_IN * width + width + hidden + width * N_CLASSES + N_CLASSES


@dataclass
class Repair:
    rank: int
    mb: float
    transfer_s: float  # the header's broadcast to the last tensor's
    setup_s: float  # the transfer's process group made and ended
    check_s: float  # the transfer's end to every rank's digest compared

    @property
    def rate_mb_s(self) -> float:
        return self.mb / self.transfer_s if self.transfer_s > 0 else 0.0


@dataclass
class SizeResult:
    name: str
    params: int
    loopback: dict[str, float]
    runs: list[RunResult] = field(default_factory=list)
    repairs: dict[str, list[Repair]] = field(default_factory=dict)  # run dir -> its repairs

    @property
    def state_gb(self) -> float:
        return self.params * STATE_BYTES_PER_PARAM / 1e9


def read_repairs(run_dir: Path) -> list[Repair]:
    found = []
    for path in sorted((run_dir / "steplog").glob("rank*-*.log")):
        for line in path.read_text().splitlines():
            m = REPAIR.match(line)
            if m:
                found.append(
                    Repair(
                        int(m["rank"]),
                        float(m["mb"]),
                        float(m["transfer"]),
                        float(m["setup"]),
                        float(m["check"]),
                    )
                )
    return found


# -- the loopback rate ---------------------------------------------------------------------------


def _loopback_rank(rank: int, nbytes: int, port: int, out: str) -> None:
    import time

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    numel = nbytes // 4
    warm = torch.ones(numel)  # every page touched
    times: dict[str, list[float]] = {"warm": [], "fresh": []}
    for _ in range(3):
        for kind in ("warm", "fresh"):
            target = warm if kind == "warm" or rank == 0 else torch.empty(numel)
            dist.barrier()
            t = time.perf_counter()
            dist.broadcast(target, src=0)
            dist.barrier()
            times[kind].append(time.perf_counter() - t)
            del target
    if rank == 1:
        rates = {k: nbytes / 1e6 / statistics.median(v) for k, v in times.items()}
        Path(out).write_text(json.dumps(rates))
    dist.barrier()
    dist.destroy_process_group()


def loopback(nbytes: int) -> dict[str, float]:
    """MB/s of one gloo broadcast of ``nbytes`` between two processes on 127.0.0.1 (median of
    3): ``warm`` into touched memory, ``fresh`` into a new allocation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rates.json"
        subprocess.run(
            [sys.executable, __file__, "--loopback", str(nbytes), "--loopback-out", str(out)],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return {k: float(v) for k, v in json.loads(out.read_text()).items()}


def _loopback_main(nbytes: int, out: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_loopback_rank, args=(nbytes, port, out), nprocs=2)


# -- the report ---------------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _mttrs(size: SizeResult, key: str) -> list[float]:
    return [
        r.mttr_s
        for r in size.runs
        if r.config == key and r.faulted and r.recovered and r.mttr_s is not None
    ]


def _repairs(size: SizeResult, key: str) -> list[Repair]:
    return [p for r in size.runs if r.config == key for p in size.repairs.get(r.run_dir, [])]


def slope(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares line ``y = a + b x`` through ``points``: ``(a, b)``."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def lines(sizes: Sequence[SizeResult]) -> dict[str, tuple[float, float] | None]:
    return {
        key: slope([(s.state_gb, m) for s in sizes for m in _mttrs(s, key)]) for key in CONFIG_KEYS
    }


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _equal(size: SizeResult, key: str) -> str:
    runs = [r for r in size.runs if r.config == key and r.faulted]
    return f"{sum(1 for r in runs if r.equal)}/{len(runs)}"


def table(sizes: Sequence[SizeResult], load: tuple[float, float]) -> str:
    head = (
        "| model | state (GB) | step | gloo loopback, touched / fresh memory | newcomer's state: "
        "transfer, rate (of loopback), check | recover-in-place MTTR (state phase) | recover "
        "MTTR | torchrun restart MTTR | recover-in-place speed-up | equal to fault-free |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in sizes:
        rip = _repairs(s, "unbroken-rip")
        rate = _median([p.rate_mb_s for p in rip])
        rip_m = _median(_mttrs(s, "unbroken-rip"))
        tr_m = _median(_mttrs(s, "torchrun-nss"))
        state = _median(
            [
                r.ledger.get("phases_s", {}).get("state")
                for r in s.runs
                if r.config == "unbroken-rip" and r.faulted
            ]
        )
        step = _median([r.step_ms for r in s.runs if not r.faulted])
        share = f"{rate / s.loopback['warm']:.0%}" if rate else "-"
        out.append(
            f"| {s.name} ({s.params / 1e6:.1f}M params) | {s.state_gb:.2f} | "
            f"{_f(step, '{:.0f}')} ms | "
            f"{s.loopback['warm']:.0f} / {s.loopback['fresh']:.0f} MB/s | "
            f"{_f(_median([p.transfer_s for p in rip]))} s, {_f(rate, '{:.0f}')} MB/s ({share}), "
            f"{_f(_median([p.check_s for p in rip]), '{:.3f}')} s | "
            f"{_f(rip_m)} s ({_f(state)} s) | {_f(_median(_mttrs(s, 'unbroken-recover')))} s | "
            f"{_f(tr_m)} s | "
            f"{_f(tr_m / rip_m if tr_m and rip_m else None, '{:.1f}')}x | "
            + ", ".join(f"{LABELS[k]} {_equal(s, k)}" for k in CONFIG_KEYS)
            + " |"
        )
    growth = lines(sizes)
    out.append("")
    out.append(
        "Growth with the state's size, least squares over every run (MTTR = a + b x GB): "
        + "; ".join(
            f"{LABELS[k]} {g[0]:.2f} s + {g[1]:.2f} s/GB" if g else f"{LABELS[k]} -"
            for k, g in growth.items()
        )
        + f". Load average {load[0]:.1f} before, {load[1]:.1f} after; {os.cpu_count()} CPUs."
    )
    return "\n".join(out)


def svg(sizes: Sequence[SizeResult]) -> str:
    from svgplot import series, standalone

    lines = series(
        [
            (
                f"{LABELS[key]} MTTR (s)",
                [(s.state_gb, m) for s in sizes if (m := _median(_mttrs(s, key))) is not None],
            )
            for key in CONFIG_KEYS
        ]
    )
    return standalone(
        lines,
        css_class="model-size",
        x_label="training state per rank (GB: fp32 parameters and AdamW moments)",
        y_label="MTTR (s)",
    )


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10M,50M,100M", help=f"of {', '.join(SIZES)}")
    p.add_argument("--repeats", type=int, default=1, help="faulted runs per configuration")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kill-step", type=int, default=14)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--configs", default=",".join(CONFIG_KEYS))
    p.add_argument("--run-timeout", type=float, default=900.0, help="s per run at most")
    p.add_argument("--recovery-timeout", type=float, default=300.0, help="s after the fault")
    p.add_argument("--work-dir", type=Path, default=None, help="keep run directories here")
    p.add_argument("--out", type=Path, default=None, help="every run as JSON")
    p.add_argument("--markdown", type=Path, default=None, help="the README's table")
    p.add_argument("--svg", type=Path, default=None, help="MTTR against the state's size")
    p.add_argument("--loopback", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--loopback-out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = [s for s in a.sizes.split(",") if s not in SIZES]
    if unknown:
        p.error(f"unknown size(s) {', '.join(unknown)}; known: {', '.join(SIZES)}")
    a.configs = [k for k in a.configs.split(",") if k]
    bad = [k for k in a.configs if k not in CONFIG_KEYS]
    if bad:
        p.error(f"unknown configuration(s) {', '.join(bad)}; known: {', '.join(CONFIG_KEYS)}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.loopback:
        _loopback_main(a.loopback, a.loopback_out)
        return 0
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="unbroken-size-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    print(
        f"model-size benchmark: python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load {load0:.1f}; steps {a.steps}, checkpoint every {a.ckpt_every}, kill after step "
        f"{a.kill_step}, {a.repeats} repeat(s)",
        flush=True,
    )
    configs = {c.key: c for c in (*CONFIGS, *BASELINES)}
    sizes: list[SizeResult] = []
    try:
        for name in a.sizes.split(","):
            width, layers = SIZES[name]
            size = SizeResult(name, params_of(width, layers), {})
            sizes.append(size)
            size.loopback = loopback(size.params * STATE_BYTES_PER_PARAM)
            print(
                f"\n{name}: {size.params / 1e6:.1f}M parameters, {size.state_gb:.2f} GB of state "
                f"per rank; gloo loopback {size.loopback['warm']:.0f} MB/s into touched memory, "
                f"{size.loopback['fresh']:.0f} MB/s into fresh memory",
                flush=True,
            )
            s = Settings(
                repeats=a.repeats,
                steps=a.steps,
                kill_step=a.kill_step,
                ckpt_every=a.ckpt_every,
                step_sleep_s=0.0,
                recovery_timeout_s=a.recovery_timeout,
                run_timeout_s=a.run_timeout,
                model_args=(f"--width={width}", f"--layers={layers}"),
            )
            plan: list[tuple[Config, bool, int]] = [
                (configs[b], False, 0) for b in ("unbroken", "torchrun")
            ]
            for rep in range(a.repeats):
                plan += [(configs[k], True, rep) for k in a.configs]
            for config, faulted, rep in plan:
                run_dir = work / name / f"{config.key}-{'kill' if faulted else 'clean'}-{rep}"
                r = run_one(config, s, run_dir, faulted, rep)
                size.runs.append(r)
                size.repairs[r.run_dir] = read_repairs(run_dir)
                extra = "; ".join(
                    f"rank {p.rank} took {p.mb:.0f} MB in {p.transfer_s:.2f} s "
                    f"({p.rate_mb_s:.0f} MB/s) after {p.setup_s:.3f} s of group setup, checked "
                    f"{p.check_s:.3f} s later"
                    for p in size.repairs[r.run_dir]
                )
                print(run_line(r) + (f"\n    {extra}" if extra else ""), flush=True)
            digests = {
                r.config: r.digest for r in size.runs if not r.faulted and r.digest is not None
            }
            for r in size.runs:
                if r.faulted:
                    ref = digests.get(configs[r.config].reference)
                    r.equal = r.digest is not None and r.digest == ref
    except KeyboardInterrupt:
        print("interrupted; the run in progress was stopped", file=sys.stderr)
    load = (load0, os.getloadavg()[0])
    text = table(sizes, load)
    print("\n" + text)
    if a.markdown is not None:
        a.markdown.write_text(text + "\n")
    if a.svg is not None:
        a.svg.write_text(svg(sizes))
    if a.out is not None:
        doc = {
            "sizes": [
                {
                    "name": s.name,
                    "params": s.params,
                    "loopback_mb_s": s.loopback,
                    "runs": [asdict(r) for r in s.runs],
                    "repairs": {k: [asdict(p) for p in v] for k, v in s.repairs.items()},
                }
                for s in sizes
            ],
            "load": load,
        }
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    if a.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
