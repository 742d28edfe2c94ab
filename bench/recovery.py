"""Recovery benchmark: one rank SIGKILLed mid-run, under Unbroken and under plain torchrun.

Every configuration trains the same job: ``examples/train_mlp.py`` (through ``bench/steplog.py``,
which adds a per-step progress log) on 2 "nodes" x 2 processes, DDP on gloo, ``--steps`` steps,
a checkpoint every ``--ckpt-every`` steps, a ``--step-sleep`` of extra compute per step. Rank 3
SIGKILLs itself right after committing step ``--kill-step``. Configurations:

=================  =========================================================================
unbroken-job       ``unbroken run bench/jobs/job-level.yaml`` (fault-scheduling force,
                   fault-retry-times 3): the whole job is rescheduled
unbroken-pod       ``bench/jobs/pod-level.yaml`` (+ pod-rescheduling on): the faulty pod only
unbroken-inpod     ``bench/jobs/in-pod.yaml`` (no fault-scheduling): the agents restart ranks
unbroken-rip       ``bench/jobs/recover-in-place.yaml`` (fault-scheduling grace,
                   recover-strategy recover-in-place): the dead rank alone gets a new process
                   (the agent's zygote forks it); the healthy ranks keep theirs, rejoin a new
                   rendezvous generation in process and redo the interrupted step
unbroken-recover   ``bench/jobs/recover.yaml`` (grace, pod-rescheduling on, recover-strategy
                   recover): the faulty pod is placed again, the other pod's ranks keep their
                   processes; which rung the policy took is read from the ledger
unbroken-retry     ``bench/jobs/retry.yaml`` (grace, recover-strategy retry), with a different
                   fault: a device memory error in rank 3 (``{kind: memory}``), the fault retry
                   is for (a SIGKILLed rank has no process to retry in); no process restarts
unbroken-dump      ``bench/jobs/dump.yaml`` (grace, pod-rescheduling on, recover-strategy
                   dump): a healthy replica writes the interrupted step's state as the job's
                   checkpoint (last words), then the faulty pod is rescheduled and every rank
                   resumes from it rather than from the newest periodic checkpoint
unbroken-hotswitch ``bench/jobs/hot-switch.yaml`` (grace, subHealthyStrategy hotSwitch) on
                   ``bench/jobs/cluster-fast-watch.yaml`` (device health polled every 3 s),
                   with a different fault: rank 3's device turns sub-healthy (a SubHealth
                   code through the sim provider) after step K; training goes on while the
                   backup pod is placed on the spare node, then the pod is switched at a step
                   boundary; the ledger's ``PodHotSwitched.switch_s`` (how long training stood
                   still) is reported beside the MTTR, which includes the poll's delay
unbroken-elastic   ``bench/jobs/elastic.yaml`` (grace, recover-strategy elastic-training, the
                   worker pod's minReplicas 0) on ``bench/jobs/cluster-no-spare.yaml``, with a
                   different fault: rank 3's node is lost after step K (chaos ``node``) and
                   comes back a few steps later (chaos ``node`` with ``clear``); the job scales
                   in to the master pod's 2 ranks, then out to 4 again. The script runs with
                   ``--virtual-ranks=4`` (``examples/train_elastic.py``), so the digest is
                   compared with its own fault-free baseline, ``unbroken-vranks``; its MTTR is
                   the scale-in (fault -> ranks 0 and 1 committed a step past K), and the
                   ledger's ``ScaledIn.took_s`` and ``ScaledOut.took_s`` and rank 0's median
                   step time while scaled in and at full size are reported beside it. The
                   node returns after step K + (steps - K) / 5; scaling out takes a few
                   seconds (a spare agent is started on the node first), so ``--quick``'s 60
                   steps end before it: give ``--quick --steps 150``
unbroken-stress    ``bench/jobs/recover.yaml`` with a different fault: after step K rank 3's
                   device computes wrong while its health stays good (chaos ``sdc``) and an
                   online stress test is asked for (chaos ``stress-test``); the test finds the
                   device, ``recover`` moves the pod to the spare node; the ledger's
                   ``StressTestFinished.paused_s`` (how long training stood still, test and
                   recovery together) is reported beside the MTTR
torchrun           two ``torchrun --max-restarts 3 --monitor-interval 1`` agents joined by a
                   c10d rendezvous on 127.0.0.1, torch's defaults
torchrun-nss       the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the workaround for
                   restarted ranks reading dead ranks' addresses from the shared store)
=================  =========================================================================

plus one fault-free baseline per tool (its final digest and step time), and one of the elastic
job when ``unbroken-elastic`` runs. Unbroken fires the kill
with its own chaos entry ``{kind: kill, rank: 3, at_step: K}``; under torchrun the step log's
``BENCH_KILL=3:K`` does the same at the same spot (torchrun has no such hook). The retry
configuration's ``{kind: memory, rank: 3, at_step: K}`` fires at the same spot too.

Measured per run, the same way for every tool, from the ranks' step logs and the launchers'
output lines (time-stamped on arrival here):

- *fault*: when rank 3 committed step K (it dies, or its memory is corrupted, microseconds
  later);
- *detection*: fault -> the launcher's first reaction (Unbroken: the ledger's ``FaultDetected``
  record; torchrun: the first agent line ``failed (exitcode ...)``, ``Worker group FAILED`` or
  ``Sending process ... closing signal``);
- *MTTR*: fault -> every one of the 4 ranks committed a step after the fault (a rank given a
  new process: that process's first step; a rank that kept its process: its first step past K);
- *steps recomputed*: K minus the step the new processes resumed from (with none: the step the
  surviving ones went back to and redid);
- *equal*: the final model digest equals the same tool's fault-free digest.

For Unbroken the ledger's own figures (``unbroken.ledger.incidents``: detection
``FaultDetected.at - occurred_at``, MTTR, recomputed steps, phases) are reported beside them,
with the policy's decision (``DecisionMade``), where a replacement pod was placed
(``PodPlaced``), and which ranks kept their process: the pid of each rank in the final status
snapshot against the one its generation-0 ``ProcessesStarted`` record gave, cross-checked with
the step logs (a process that started before the fault and committed steps after it).

A faulted run that has not recovered ``--recovery-timeout`` seconds after the fault is stopped
and counted as not recovered. Every process a run starts is killed by pid at its end.

    OMP_NUM_THREADS=1 .venv/bin/python bench/recovery.py [--repeats 3] [--steps 200]
        [--kill-step 110] [--ckpt-every 20] [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from recovery_bench.configs import BASELINES, CONFIGS, Config, Settings, baselines_for
from recovery_bench.report import markdown, run_line, table
from recovery_bench.runs import RunResult, run_one

# -- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(
        description="Kill a rank mid-run under Unbroken and torchrun; compare recovery."
    )
    p.add_argument("--repeats", type=int, default=None, help="runs per configuration (3)")
    p.add_argument("--steps", type=int, default=None, help="training steps (200)")
    p.add_argument("--kill-step", type=int, default=None, help="rank 3 dies after it (110)")
    p.add_argument("--ckpt-every", type=int, default=None, help="checkpoint interval (20)")
    p.add_argument("--step-sleep", type=float, default=0.03, help="extra s of compute per step")
    p.add_argument("--quick", action="store_true", help="1 repeat, 60 steps, kill after 35")
    p.add_argument("--baseline-repeats", type=int, default=1, help="fault-free runs per tool")
    p.add_argument("--configs", default="", help="comma list of configuration keys (all)")
    p.add_argument("--recovery-timeout", type=float, default=60.0, help="s after the fault")
    p.add_argument("--run-timeout", type=float, default=300.0, help="s per run at most")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    p.add_argument("--work-dir", type=Path, default=None, help="keep run directories here")
    p.add_argument(
        "--markdown", type=Path, default=None, help="write the README's table here (Markdown)"
    )
    a = p.parse_args(argv)
    quick = {"repeats": 1, "steps": 60, "kill_step": 35, "ckpt_every": 10}
    full = {"repeats": 3, "steps": 200, "kill_step": 110, "ckpt_every": 20}
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    s = Settings(
        repeats=a.repeats,
        steps=a.steps,
        kill_step=a.kill_step,
        ckpt_every=a.ckpt_every,
        step_sleep_s=a.step_sleep,
        recovery_timeout_s=a.recovery_timeout,
        run_timeout_s=a.run_timeout,
    )
    if not 0 < s.kill_step < s.steps:
        p.error(f"--kill-step must be between 1 and --steps - 1, got {s.kill_step}")
    if s.ckpt_every <= 0 or s.repeats <= 0:
        p.error("--ckpt-every and --repeats must be > 0")
    keys = [c.key for c in CONFIGS]
    chosen = [k for k in a.configs.split(",") if k] or keys
    unknown = [k for k in chosen if k not in keys]
    if unknown:
        p.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(keys)}")
    a.configs = chosen
    return a, s


def main(argv: Sequence[str] | None = None) -> int:
    a, s = parse_args(argv)
    torch_version = importlib.metadata.version("torch")
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="unbroken-recovery-"))
    work.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone()
    load0 = os.getloadavg()[0]
    print(
        f"recovery benchmark {started:%Y-%m-%d %H:%M %Z}: torch {torch_version}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load {load0:.1f}; steps {s.steps}, checkpoint every {s.ckpt_every}, "
        f"kill after step {s.kill_step}, step sleep {s.step_sleep_s} s, "
        f"{s.repeats} repeat(s)",
        flush=True,
    )
    plan: list[tuple[Config, bool, int]] = []
    baselines = baselines_for(a.configs)
    for rep in range(max(s.repeats, a.baseline_repeats)):
        if rep < a.baseline_repeats:
            plan += [(b, False, rep) for b in baselines]
        if rep < s.repeats:
            plan += [(c, True, rep) for c in CONFIGS if c.key in a.configs]
    results: list[RunResult] = []
    try:
        for config, faulted, rep in plan:
            name = f"{config.key}-{'kill' if faulted else 'clean'}-{rep}"
            r = run_one(config, s, work / name, faulted, rep)
            results.append(r)
            print(run_line(r), flush=True)
    except KeyboardInterrupt:
        print("interrupted; the run in progress was stopped", file=sys.stderr)
    reference = {
        b.key: next((r.digest for r in results if r.config == b.key and not r.faulted), None)
        for b in BASELINES
    }
    reference_of = {c.key: c.reference for c in CONFIGS} | {b.key: b.key for b in BASELINES}
    for r in results:
        ref = reference.get(reference_of.get(r.config, r.config))
        if r.digest is not None and ref is not None:
            r.equal = r.digest == ref
        elif r.faulted:
            r.equal = False if r.digest is None else None
    load = (load0, os.getloadavg()[0])
    print()
    print(table(results, s))
    if a.markdown is not None:
        a.markdown.write_text(markdown(results, s, load) + "\n")
        print(f"\nthe README's table: {a.markdown}")
    if a.out is not None:
        doc = {
            "started_at": started.isoformat(),
            "settings": asdict(s),
            "machine": {
                "cpus": os.cpu_count(),
                "torch": torch_version,
                "python": platform.python_version(),
            },
            "reference_digests": reference,
            "runs": [asdict(r) for r in results],
        }
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nresults: {a.out}")
    if a.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
