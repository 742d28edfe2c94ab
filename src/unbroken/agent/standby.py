"""A zygote: a fork server with torch imported once, forking a process for each rank it is given.

Starting a Python process and importing torch takes seconds on a small machine (ANCHORS: about
3.5 s of torchrun's 7.75 s restart). An agent keeps one zygote (a spare agent too, for all its
rank slots). It imports torch and the modules a rank needs once (``torch.distributed``, its
checkpoint package, DDP, ``torch._dynamo``, which DDP's constructor imports, and the worker
library, :mod:`unbroken.worker.session`), then serves orders, one JSON line each on stdin,
``{"argv", "module", "env", "cwd", "log"}``, for as long as its stdin is open. For each order
it forks twice: the intermediate process forks the rank and exits at once, the zygote reaps it,
so the rank is reparented to the agent (a child subreaper), which waits for it as for a process
it started itself. Only then does the zygote write ``pid N`` (or ``error
...``) on its reply pipe (``--reply-fd``), one line per order in order, after a ``ready`` line
once its imports are done.

The rank gets a session of its own, the signal dispositions and priority the zygote started
with, stdin from ``/dev/null``, stdout and stderr to its log, the order's environment and
working directory, a fresh seed for Python's ``random`` and torch's default generator, and
runs the training script as ``__main__`` (``runpy``), exactly as ``python -u script args``
would, with these differences: what the interpreter reads from the environment at its start
(``PYTHONHASHSEED``, ``PYTHONPATH``, ...) and what torch reads at import stays the zygote's,
except the intra-op thread count, which follows the order's ``OMP_NUM_THREADS``; and what the
kernel shows as its command line and initial environment (``/proc/<pid>/cmdline``,
``/proc/<pid>/environ``, hence ``ps``) is the zygote's.

An order may come while the imports still run (a thread reads the first one); it is served once
they are done. End of input: the zygote exits, at once if it is still importing. It never has
children of its own for longer than a fork takes.

With ``--background`` the warm-up is background work (a spare agent's zygote, on a node the
job's ranks may share in the embedded cluster): where the process may raise its priority again
(``CAP_SYS_NICE``, e.g. as root), it imports at the lowest priority (nice 19, and its
scheduling autogroup's too) and returns to its parent's priority the moment its first order
comes, as do the ranks it forks; without that capability it could not come back, so it stays
at normal priority throughout.

Run as ``python -m unbroken.agent.standby --reply-fd N [--background]``. It imports torch, the
worker library and the standard library only.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Handler = Callable[[int, Any], Any] | int | signal.Handlers | None


def _start_warm(env: dict[str, str]) -> None:
    """A rank of a pod with a warm directory reads its predecessor's shardings from its first
    sharded operator on (``fully_shard`` included): :mod:`unbroken.worker.warmstart`."""
    from unbroken.worker import warmstart
    from unbroken.worker.env import WARM_DIR

    warm_dir, rank = env.get(WARM_DIR), env.get("RANK", "")
    if warm_dir and rank.isdigit():
        warmstart.start(warmstart.path_of(Path(warm_dir), int(rank)))


def _activate(order: dict[str, object]) -> None:
    argv = [str(a) for a in order["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in order["env"].items()}  # type: ignore[attr-defined]
    log = os.open(str(order["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(order["cwd"]))
    sys.argv = argv
    _start_warm(env)
    if order.get("module"):
        if not sys.flags.safe_path:
            sys.path[0] = os.getcwd()  # as ``python -m`` puts it
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        script_dir = os.path.dirname(os.path.abspath(argv[0]))
        if not sys.flags.safe_path:
            sys.path[0] = script_dir  # as ``python script`` puts it
        runpy.run_path(argv[0], run_name="__main__")


_CAP_SYS_NICE = 23


def _may_renice() -> bool:
    """Whether this process may lower its nice value again (``CAP_SYS_NICE`` is effective)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError):
        pass
    return False


_AUTOGROUP = "/proc/self/autogroup"


def _autogroup_nice() -> int | None:
    """The nice value of this process's scheduling autogroup (None: no autogroups)."""
    try:
        with open(_AUTOGROUP, encoding="ascii") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_nice(value: int, group: int | None) -> None:
    """``value`` for every thread of the process (Linux keeps a nice value per thread), and
    ``group`` for its autogroup: with autogroups on, the scheduler shares the CPU between
    sessions first, and a zygote is a session of its own, so a thread's nice value alone
    would not yield the CPU to the ranks' sessions."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PROCESS, tid, value)
    if group is not None:
        with contextlib.suppress(OSError), open(_AUTOGROUP, "w", encoding="ascii") as f:
            f.write(str(group))


class _Lines:
    """Lines from a file descriptor, read unbuffered by Python's own stdin (a forked rank
    must not find the zygote's next orders in its ``sys.stdin``). One reader at a time."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""

    def next(self) -> bytes:
        """The next line, or b"" at end of input."""
        while b"\n" not in self._buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                line, self._buf = self._buf, b""
                return line
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line + b"\n"


def _fork_rank() -> int | None:
    """Fork a rank that is not this process's child: the rank's pid in the zygote (once the
    intermediate process is reaped, so the rank has its final parent), None in the rank."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    mid = os.fork()
    if mid == 0:  # the intermediate: fork the rank, tell its pid, exit
        mid, pid = os.getpid(), -1
        with contextlib.suppress(BaseException):
            os.close(r)
            pid = os.fork()
        if pid == 0:
            os.close(w)
            while os.getppid() == mid:  # until reparented: its parent is the agent from the start
                time.sleep(0.0002)
            return None
        with contextlib.suppress(BaseException):
            if pid > 0:
                os.write(w, str(pid).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(mid, 0)
    if not data:
        raise OSError("the intermediate process could not fork the rank")
    return int(data)


def startup_signals() -> dict[int, Handler]:
    """Every signal's disposition as the interpreter set it up (a cold rank gets the same)."""
    out: dict[int, Handler] = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            if handler is not None:
                out[int(sig)] = handler
    return out


def _become_rank(
    order: dict[str, object],
    reply_fd: int,
    signals: dict[int, Handler],
    nice: tuple[int, int | None] | None,
) -> None:
    """In the forked rank: shed what is the zygote's, then run the training script."""
    os.setsid()
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig, handler in signals.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(sig, handler)
    os.close(reply_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if nice is not None:
        _set_nice(*nice)
    import torch

    random.seed()
    torch.seed()
    env = order["env"]
    threads = env.get("OMP_NUM_THREADS", "") if isinstance(env, dict) else ""
    if str(threads).isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    _activate(order)


def _reply(fd: int, text: str) -> bool:
    try:
        os.write(fd, (text + "\n").encode())
        return True
    except OSError:  # the agent is gone
        return False


#: The functions of ``torch.cuda`` that reach the CUDA driver (initialise it, or count or pick
#: devices through it). None may run in a zygote or an image: a process forked after the driver
#: started cannot use the GPU ("Cannot re-initialize CUDA in forked subprocess").
CUDA_DRIVER_CALLS = frozenset(
    {"init", "_lazy_init", "is_available", "device_count", "current_device", "set_device"}
)


def warm_imports() -> None:
    """Import what every rank needs, then freeze the result (see :func:`main`). CUDA stays
    untouched (:data:`CUDA_DRIVER_CALLS`): were it started, every rank forked from here could
    not use its GPU, so the zygote refuses to go on (:func:`cuda_untouched`)."""
    # torch's availability check through NVML, not the driver, should any import ask it.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch
    import torch._dynamo  # DDP's constructor imports it: 1-1.5 s of a new rank's start here
    import torch.distributed
    import torch.distributed.checkpoint
    import torch.distributed.optim  # ZeroRedundancyOptimizer: 0.2 s of a new rank's start here
    import torch.nn.parallel  # noqa: F401

    import unbroken.worker.session  # noqa: F401  # the worker library: 0.1-0.13 s here

    cuda_untouched()
    # The imports' objects go to the collector's permanent generation: a forked rank never
    # traverses them in a collection (shorter pauses, no copy-on-write of their pages), and
    # its interpreter's exit skips them (1-2 s of CPU per rank with torch imported).
    gc.freeze()


def cuda_untouched() -> None:
    """Exit with the reason if CUDA was initialised in this process: its forks could not use
    the GPU."""
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        print(
            f"{time.time():.3f} standby {os.getpid()}: CUDA was initialised before the ranks "
            "were forked; a forked rank cannot use the GPU (initialise CUDA in the rank, "
            "after it starts, never at import)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(3)


def _announce_ready(reply_fd: int, began: float) -> None:
    print(
        f"{time.time():.3f} standby {os.getpid()} ready: a zygote (imports took "
        f"{time.monotonic() - began:.2f} s)",
        flush=True,
    )
    if not _reply(reply_fd, "ready"):
        os._exit(0)  # the agent is gone


def main() -> None:
    began = time.monotonic()
    args = sys.argv[1:]
    reply_fd = int(args[args.index("--reply-fd") + 1])
    signals = startup_signals()
    base, base_group = os.getpriority(os.PRIO_PROCESS, 0), _autogroup_nice()
    low = "--background" in args and _may_renice()
    if low:
        _set_nice(19, None if base_group is None else 19)
    lines = _Lines(0)
    first: list[bytes] = []

    def wait_for_order() -> None:
        # The order may come while the imports still run: from then on they are the rank's
        # start, so they go on at the parent's priority.
        line = lines.next()
        if not line:
            os._exit(0)  # let go before any order: the imports are not needed
        first.append(line)
        if low:
            _set_nice(base, base_group)

    waiter = threading.Thread(target=wait_for_order, name="zygote-order", daemon=True)
    waiter.start()
    warm_imports()
    _announce_ready(reply_fd, began)
    waiter.join()  # single-threaded from here on: the zygote forks
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        print(f"{time.time():.3f} standby {os.getpid()}: {threads} threads at fork", flush=True)
    _serve(lines, first[0], reply_fd, signals, (base, base_group) if low else None)


def serve_forked(reply_fd: int, signals: dict[int, Handler]) -> None:
    """Be a zygote in a process forked from one that ran :func:`warm_imports` (an agent forked
    from the node's image, :mod:`unbroken.agent.image`): orders on stdin, replies on
    ``reply_fd``, exactly as :func:`main` but with the imports already done. Returns only in
    a rank, once its training script has run."""
    _announce_ready(reply_fd, time.monotonic())
    lines = _Lines(0)
    _serve(lines, lines.next(), reply_fd, signals, None)


def _serve(
    lines: _Lines,
    line: bytes,
    reply_fd: int,
    signals: dict[int, Handler],
    nice: tuple[int, int | None] | None,
) -> None:
    """Fork a rank for each order until end of input, then exit; returns only in a rank."""
    pid = os.getpid()
    while line:
        try:
            order = json.loads(line)
            if not isinstance(order, dict):
                raise ValueError(f"the order is {type(order).__name__}, not a JSON object")
            rank = _fork_rank()
        except (ValueError, OSError) as exc:
            print(f"{time.time():.3f} standby {pid}: order refused: {exc}", flush=True)
            if not _reply(reply_fd, f"error {exc}"):
                os._exit(0)
            line = lines.next()
            continue
        if rank is None:  # this is the rank now
            _become_rank(order, reply_fd, signals, nice)
            return
        print(f"{time.time():.3f} standby {pid} forked rank process {rank}", flush=True)
        if not _reply(reply_fd, f"pid {rank}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)  # no agent waits for it
            os._exit(0)
        line = lines.next()
    # End of input: the agent let the zygote go. Nothing to tear down (the interpreter's own
    # teardown, with torch imported, takes long on a loaded machine).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
