"""A warm standby: a Python process with torch already imported, waiting to become a rank.

Starting a Python process and importing torch takes seconds on a small machine (ANCHORS: about
3.5 s of torchrun's 7.75 s restart). The agent keeps one standby per local rank slot; when a
rank must (re)start, a standby receives one JSON line on stdin, ``{"argv", "env", "cwd",
"log"}``, takes the rank's environment, working directory and log file, and runs the training
script as ``__main__`` (``runpy``), exactly as ``python -u script args`` would. A fresh standby
is started in the background for the next time.

With ``--background`` the warm-up is background work (a spare agent's standbys, on a node the
job's ranks may share in the embedded cluster): where the process may raise its priority again
(``CAP_SYS_NICE``, e.g. as root), it imports at the lowest priority (nice 19, and its
scheduling autogroup's too) and returns to its parent's priority the moment its order comes;
without that capability it could not come back, so it stays at normal priority throughout.

Run as ``python -m unbroken.agent.standby [--background]``. It imports torch and the standard
library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import threading
import time


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
    if order.get("module"):
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
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
    sessions first, and a standby is a session of its own, so a thread's nice value alone
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


def main() -> None:
    began = time.monotonic()
    base, base_group = os.getpriority(os.PRIO_PROCESS, 0), _autogroup_nice()
    low = "--background" in sys.argv[1:] and _may_renice()
    if low:
        _set_nice(19, None if base_group is None else 19)
    order: list[str] = []

    def wait_for_order() -> None:
        # The order may come while the imports still run: from then on they are the rank's
        # start, so they go on at the parent's priority.
        order.append(sys.stdin.readline())
        if low:
            _set_nice(base, base_group)

    waiter = threading.Thread(target=wait_for_order, name="standby-order", daemon=True)
    waiter.start()
    import torch
    import torch.distributed
    import torch.distributed.checkpoint
    import torch.nn.parallel  # noqa: F401

    print(
        f"{time.time():.3f} standby {os.getpid()} ready (imports took "
        f"{time.monotonic() - began:.2f} s)",
        flush=True,
    )
    waiter.join()
    if not order[0]:
        return  # the agent let the standby go
    sys.stdin.close()
    _activate(json.loads(order[0]))


if __name__ == "__main__":
    main()
