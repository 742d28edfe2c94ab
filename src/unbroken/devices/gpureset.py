"""``-hotReset=2`` on NVIDIA GPUs: the reset command the operator configures, run for one GPU.

No GPU can be reset from a library call on every machine (``nvidia-smi --gpu-reset`` needs the
GPU idle and root; a GPU under a hypervisor or a fabric manager is reset elsewhere), so the
command is a setting: ``devicePlugin.resetCommand``, with ``{gpu}`` standing for the GPU's NVML
index (``nvidia-smi --gpu-reset -i {gpu}``). It runs on a thread of its own, once per GPU at a
time, bounded by :data:`RESET_TIMEOUT_S`. When it exits 0 the ``nvml`` provider drops the fault
it latched for that GPU (:meth:`NvmlProvider.reset`), so the next poll sees the GPU as it now
is: healthy, and the device returns to the pool as after any fault; otherwise the GPU stays out,
and the run says why.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
from collections.abc import Callable

from unbroken.devices.sim import Reset

log = logging.getLogger(__name__)

#: The longest a reset command may run before it counts as failed.
RESET_TIMEOUT_S = 120.0


def reset_argv(command: str, gpu: int) -> list[str]:
    """The reset command for ``gpu``: ``command`` split as a shell would, ``{gpu}`` replaced."""
    return [part.replace("{gpu}", str(gpu)) for part in shlex.split(command)]


class GpuResetter:
    """Runs ``command`` for a GPU on a thread; ``on_done(gpu)`` when it succeeded (the provider
    drops its latched fault), ``say(line)`` for what the run's console shows."""

    def __init__(
        self,
        command: str,
        on_done: Callable[[int], None],
        say: Callable[[str], None],
        timeout_s: float = RESET_TIMEOUT_S,
    ) -> None:
        self.command = command
        self._on_done = on_done
        self._say = say
        self._timeout_s = timeout_s
        self._running: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def reset(self, gpu: int, code: str, now: float) -> Reset:
        """Start resetting ``gpu`` (unless a reset of it runs already); the GPU is out of
        service until it reports healthy, at the latest until the command's bound."""
        with self._lock:
            running = self._running.get(gpu)
            if running is None or not running.is_alive():
                thread = threading.Thread(
                    target=self._run, args=(gpu,), name=f"gpu-reset-{gpu}", daemon=True
                )
                self._running[gpu] = thread
                thread.start()
        return Reset(code=code, at=now, until=now + self._timeout_s)

    def wait(self, timeout_s: float) -> None:
        """Wait for the resets under way (at most ``timeout_s`` each)."""
        for thread in list(self._running.values()):
            thread.join(timeout_s)

    def _run(self, gpu: int) -> None:
        argv = reset_argv(self.command, gpu)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self._timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._say(f"GPU {gpu} not reset: {' '.join(argv)}: {exc}; it stays out of the pool")
            return
        if done.returncode != 0:
            why = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            self._say(
                f"GPU {gpu} not reset: {' '.join(argv)} exited {done.returncode} ({why[0]}); "
                "it stays out of the pool"
            )
            return
        log.info("GPU %d reset by %s", gpu, " ".join(argv))
        self._on_done(gpu)
