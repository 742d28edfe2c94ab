"""A warm standby: a Python process with torch already imported, waiting to become a rank.

Starting a Python process and importing torch takes seconds on a small machine (ANCHORS: about
3.5 s of torchrun's 7.75 s restart). The agent keeps one standby per local rank slot; when a
rank must (re)start, a standby receives one JSON line on stdin, ``{"argv", "env", "cwd",
"log"}``, takes the rank's environment, working directory and log file, and runs the training
script as ``__main__`` (``runpy``), exactly as ``python -u script args`` would. A fresh standby
is started in the background for the next time.

Run as ``python -m unbroken.agent.standby``. It imports torch and the standard library only.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
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


def main() -> None:
    began = time.monotonic()
    import torch
    import torch.distributed
    import torch.distributed.checkpoint
    import torch.nn.parallel  # noqa: F401

    print(
        f"{time.time():.3f} standby {os.getpid()} ready (imports took "
        f"{time.monotonic() - began:.2f} s)",
        flush=True,
    )
    line = sys.stdin.readline()
    if not line:
        return  # the agent let the standby go
    sys.stdin.close()
    _activate(json.loads(line))


if __name__ == "__main__":
    main()
