"""The GPU check: the example job (examples/job.yaml: the tiny GPT, 2 pods x 2 ranks) with its
model on CUDA, fault-free and with faults, on one machine's GPUs (4 ranks sharing one GPU over
gloo on a one-GPU machine), then NCCL's abort on a single-rank group and NVML's health poll.

Run it with ``scripts/gpu-check`` (which installs the project beside the machine's own torch);
``--device cpu`` runs the same matrix on the CPU, to check the harness anywhere.

For each case it prints the rung the ladder took, the incident's MTTR and phases from the
ledger, and whether every rank's final model, optimizer, scheduler and data position equal the
fault-free run's. The faults: a rank SIGKILLed (``recover-in-place``), a real device-side assert
inside a rank's step (CUDA error 710, sticky: the rank's process is replaced), a real
out-of-memory inside a rank's step (CUDA error 2), and a node lost (``recover``: its pod moves
to the spare node). Exit status 0 only when every run ended equal to the fault-free one and
the NCCL and NVML checks passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "job.yaml"
STEPS = 60
FAULT_STEP = 25


@dataclass(frozen=True)
class Case:
    name: str
    chaos: str  # one chaos entry (YAML flow mapping), "" for none
    strategy: str  # the job's recover-strategy


CASES = (
    Case("none", "", "retry,recover-in-place,recover"),
    Case("SIGKILL rank 3", f"{{kind: kill, rank: 3, at_step: {FAULT_STEP}}}", "recover-in-place"),
    Case(
        "device-side assert, rank 2",
        f"{{kind: exception, rank: 2, code: CUDA-710, at_step: {FAULT_STEP}}}",
        "recover-in-place",
    ),
    Case(
        "out of memory, rank 1",
        f"{{kind: exception, rank: 1, code: CUDA-2, at_step: {FAULT_STEP}}}",
        "retry,recover-in-place",
    ),
    Case("node-1 lost", f"{{kind: node, node: node-1, at_step: {FAULT_STEP}}}", "recover"),
)


@dataclass
class Outcome:
    case: str
    rc: int
    wall_s: float
    code: str = ""
    rung: str = ""
    mttr_s: float | None = None
    phases: str = ""
    equal: bool | None = None
    detail: str = ""


def job_yaml(device: str, strategy: str) -> str:
    text = JOB.read_text()
    text = text.replace("--steps=400", f"--steps={STEPS}").replace(
        "- --step-sleep=0.02", f"- --step-sleep=0.02\n                - --device={device}"
    )
    text = re.sub(r'recover-strategy: "[^"]*"', f'recover-strategy: "{strategy}"', text)
    # The scripts sit beside the job file in examples/; the run's copy points at them.
    return text.replace("- train_gpt.py", f"- {REPO / 'examples' / 'train_gpt.py'}")


def results(run_dir: Path) -> dict[int, dict[str, object]]:
    out = {}
    for path in run_dir.glob("result.json*"):
        if path.name.endswith(".tmp") or ".tmp" in path.suffixes:
            continue
        data = json.loads(path.read_text())
        out[int(data["rank"])] = {k: data[k] for k in ("digest", "optimizer", "scheduler", "data")}
    return out


def run_case(
    case: Case, device: str, work: Path, reference: dict[int, dict[str, object]] | None
) -> tuple[Outcome, dict[int, dict[str, object]]]:
    case_dir = work / re.sub(r"[^a-z0-9]+", "-", case.name.lower()).strip("-")
    case_dir.mkdir(parents=True)
    job = case_dir / "job.yaml"
    job.write_text(job_yaml(device, case.strategy))
    argv = [
        sys.executable,
        "-m",
        "unbroken",
        "run",
        str(job),
        "--run-dir",
        str(case_dir / "run"),
        "--quiet",
    ]
    if case.chaos:
        chaos = case_dir / "chaos.yaml"
        chaos.write_text(f"faults:\n  - {case.chaos}\n")
        argv += ["--chaos", str(chaos)]
    began = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    outcome = Outcome(case.name, proc.returncode, time.monotonic() - began)
    (case_dir / "stdout").write_text(proc.stdout)
    (case_dir / "stderr").write_text(proc.stderr)
    run_dir = case_dir / "run"
    got = results(run_dir) if proc.returncode == 0 else {}
    if proc.returncode != 0:
        outcome.detail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
    if reference is not None and got:
        outcome.equal = got == reference
    elif reference is None:
        outcome.equal = len(got) == 4
    incident = _incident(run_dir)
    if incident is not None:
        outcome.code, outcome.rung, outcome.mttr_s, outcome.phases = incident
    return outcome, got


def _incident(run_dir: Path) -> tuple[str, str, float | None, str] | None:
    from unbroken.ledger import Ledger, incidents

    path = run_dir / "ledger.db"
    if not path.exists():
        return None
    with Ledger(path, create=False) as ledger:
        found = incidents(ledger.events())
    if not found:
        return None
    first = found[0]
    phases = " ".join(
        f"{p.name} {p.duration_s:.2f}" for p in first.phases if p.duration_s is not None
    )
    return first.code, first.strategy or "", first.mttr_s, phases


NCCL_CHECK = r"""
import datetime, time, torch, torch.distributed as dist
from unbroken.worker import torchapi
torch.cuda.set_device(0)
timeout = datetime.timedelta(seconds=20)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1,
                        timeout=timeout)
t = torch.ones(4, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
began = time.monotonic()
aborted = torchapi.abort_group(dist.group.WORLD)
aborted_s = time.monotonic() - began
try:
    dist.all_reduce(t); torch.cuda.synchronize(); after = "no error"
except Exception as e:
    after = type(e).__name__
try:
    dist.destroy_process_group()
except Exception as e:
    print(f"destroy after abort: {type(e).__name__}: {e}")
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29534", rank=0, world_size=1,
                        timeout=timeout)
t = torch.ones(4, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
print(f"nccl: aborted {aborted} in {aborted_s:.2f} s; a collective after it: {after}; "
      f"a new group's all-reduce: {t.tolist()}")
ok = aborted and after != "no error" and t.tolist() == [1.0] * 4
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
"""


def nccl_check() -> tuple[bool, str]:
    """A single-rank NCCL group: an all-reduce, the abort Unbroken uses when it lets a group
    go, a collective that must fail after it, and a new group that works (the watchdog off, as
    the plan sets it for jobs with a rung)."""
    env = {**os.environ, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", NCCL_CHECK], capture_output=True, text=True, timeout=120, env=env
    )
    line = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
    return proc.returncode == 0, line


def nvml_check(polls: int = 50) -> tuple[bool, str]:
    """The nvml provider on this machine's GPUs: a poll of each, timed, and nothing reported as
    a fault on a healthy machine."""
    from unbroken.devices.nvml import NvmlProvider, load_nvml, machine_gpus, slots_on_gpus
    from unbroken.faults import CodeTable

    nvml = load_nvml()
    gpus = machine_gpus(os.environ, int(nvml.nvmlDeviceGetCount()))
    provider = NvmlProvider(
        slots_on_gpus(("node-0",), len(gpus), gpus), CodeTable.load().judge, nvml
    )
    seen = []
    took = []
    for _ in range(polls):
        began = time.perf_counter()
        seen.extend(h for h in provider.poll() if not h.healthy)
        took.append(time.perf_counter() - began)
    provider.close()
    median_ms = statistics.median(took) * 1000
    faults = ", ".join(sorted({f"{h.code} ({h.detail})" for h in seen})) or "none"
    return (
        not seen,
        f"nvml: {len(gpus)} GPU(s), poll {median_ms:.1f} ms (median of {polls}); faults: {faults}",
    )


def table(outcomes: Sequence[Outcome]) -> str:
    rows = [
        "| fault | fault code | rung | MTTR | phases (s) | equal to fault-free | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        mttr = f"{o.mttr_s:.2f} s" if o.mttr_s is not None else "-"
        equal = {True: "yes", False: "NO", None: "-"}[o.equal]
        rows.append(
            f"| {o.case} | {o.code or '-'} | {o.rung or '-'} | {mttr} | {o.phases or '-'} | {equal}"
            f"{' (' + o.detail + ')' if o.detail else ''} | {o.wall_s:.0f} s |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    p.add_argument("--keep", action="store_true", help="keep the runs' directories")
    args = p.parse_args(argv)
    import torch

    what = (
        f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        if args.device == "cuda"
        else platform.processor() or "cpu"
    )
    print(f"gpu check: torch {torch.__version__}, {what}, {time.strftime('%Y-%m-%d')}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="unbroken-gpu-check-"))
    outcomes: list[Outcome] = []
    reference = None
    for case in CASES:
        outcome, got = run_case(case, args.device, work, reference)
        if case.chaos == "":
            reference = got or None
        outcomes.append(outcome)
        print(
            f"  {case.name}: rc {outcome.rc}, {outcome.rung or '-'}, equal {outcome.equal}",
            flush=True,
        )
    lines = [table(outcomes)]
    ok = all(o.rc == 0 and o.equal for o in outcomes)
    if args.device == "cuda":
        for check in (nccl_check, nvml_check):
            try:
                passed, line = check()
            except Exception as exc:
                passed, line = False, f"{check.__name__}: {type(exc).__name__}: {exc}"
            lines.append(line + ("" if passed else "  <- FAILED"))
            ok = ok and passed
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    else:
        print(f"runs kept in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
