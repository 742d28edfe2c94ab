"""Run ``examples/train_mlp.py`` unchanged, with a per-step progress log the benchmark reads.

With ``--parallel zero|fsdp|hsdp`` it runs ``examples/train_sharded.py`` (sharded state) instead.
With ``--virtual-ranks V`` it runs ``examples/train_elastic.py --virtual-ranks V`` instead: the
same MLP, batches and arguments, trained by ``V`` virtual data-parallel ranks that the
processes host between them, so a run that scaled in and out ends with the model of a run
that never changed its size (the elastic configuration's digest check).

``bench/recovery.py`` launches this file in place of the example under every launcher it
compares (``unbroken launch`` and plain ``torchrun``), so recovery is measured the same way for
all of them, from outside the launcher:

- each process appends ``<time.time()> begin 0`` when this file runs (torch imported),
  ``<time.time()> start <committed>`` when its training loop begins (state restored) and
  ``<time.time()> done <n>`` when the body of step ``n - 1`` returns (the step is committed right
  after), to ``steplog/rank<RANK>-<pid>.log`` under its working directory;
- with ``BENCH_KILL=RANK:STEP`` in the environment, rank ``RANK`` SIGKILLs itself right after
  committing ``STEP`` steps, once per run (the first to fire creates ``steplog/killed`` with
  O_EXCL, so the replayed step does not fire again). That is the spot where Unbroken's chaos
  entry ``{kind: kill, rank: R, at_step: STEP}`` fires; plain ``torchrun`` has no such hook.

The repair from a replica logs what it moved (:mod:`unbroken.worker.replica`, at INFO) to the
same file as ``<time.time()> replica <message>``.

It hooks :meth:`unbroken.worker.Session.steps` (the loop the example iterates) by wrapping the
generator; the step body, the commit and the checkpoints are the example's own. Each log line
costs one ``write`` per step.

    python bench/steplog.py --steps 200 --ckpt-dir ckpt --ckpt-every 20 --result result.json
    python bench/steplog.py --virtual-ranks 4 --steps 200 --result result.json
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE = EXAMPLES / "train_mlp.py"
ELASTIC_EXAMPLE = EXAMPLES / "train_elastic.py"
SHARDED_EXAMPLE = EXAMPLES / "train_sharded.py"  # --parallel zero|fsdp|hsdp
LOG_DIR = Path("steplog")
KILL = "BENCH_KILL"


def _kill_spec() -> tuple[int, int] | None:
    raw = os.environ.get(KILL, "")
    if not raw:
        return None
    rank, _, step = raw.partition(":")
    return int(rank), int(step)


def _claim(marker: Path) -> bool:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _install(log: TextIO, rank: int, kill: tuple[int, int] | None) -> None:
    from unbroken.worker.session import Session  # torch: only in the training process

    original = Session.steps

    def steps(self: Session, total: int) -> Iterator[int]:
        log.write(f"{time.time():.6f} start {self.committed}\n")
        for step in original(self, total):
            if kill is not None and kill == (rank, step) and _claim(LOG_DIR / "killed"):
                log.write(f"{time.time():.6f} kill {step}\n")
                log.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            yield step
            log.write(f"{time.time():.6f} done {step + 1}\n")

    Session.steps = steps  # type: ignore[method-assign]


def _log_repairs(log: TextIO) -> None:
    """The repair's figures (bytes taken, transfer and check time; logged at INFO by
    :mod:`unbroken.worker.replica`) go to the step log as ``<time> replica <message>``."""
    import logging

    class ToStepLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log.write(f"{record.created:.6f} replica {record.getMessage()}\n")

    logger = logging.getLogger("unbroken.worker.replica")
    logger.setLevel(logging.INFO)
    handler = ToStepLog(logging.INFO)
    handler.addFilter(lambda record: record.levelno == logging.INFO)
    logger.addHandler(handler)


def example(argv: list[str]) -> Path:
    """The example that ``argv`` (this script's arguments, passed through) runs."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--virtual-ranks", type=int, default=0)
    p.add_argument("--parallel", default=None)
    known, _ = p.parse_known_args(argv)
    if known.parallel is not None:
        return SHARDED_EXAMPLE
    return ELASTIC_EXAMPLE if known.virtual_ranks > 0 else EXAMPLE


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    LOG_DIR.mkdir(exist_ok=True)
    log = open(LOG_DIR / f"rank{rank}-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115
    log.write(f"{time.time():.6f} begin 0\n")
    _install(log, rank, _kill_spec())
    _log_repairs(log)
    script = example(sys.argv[1:])
    sys.argv = [str(script), *sys.argv[1:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
