"""The control plane's handle on a pod's agent process on a joined host.

A host's agent (``unbroken launch --join``, :mod:`unbroken.agent.remote`) starts and signals
the processes of the pods placed on its node when the control plane orders it to
(:mod:`unbroken.protocol.hosts`); :class:`RemoteChild` gives the control plane such a process
as it would a child of its own, through the registry of joined nodes
(:class:`unbroken.manager.service.NodeRegistry`).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from unbroken.agent.children import OwnChild
from unbroken.manager.service import NodeRegistry
from unbroken.protocol.hosts import PYTHON, SIGNAL, START


class RemoteChild(OwnChild):
    """A pod's agent process on a joined host, with the part of ``Popen``'s interface the
    control plane uses: started, signalled and reaped through the host's agent."""

    poll_s = 0.02  # an exit is known when the host's agent reports it

    def __init__(
        self,
        registry: NodeRegistry,
        node: str,
        pod: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        timeout_s: float = 60.0,
    ) -> None:
        self._registry = registry
        self.node = node
        python = sys.executable
        registry.order(
            node,
            {
                "kind": START,
                "pod": pod,
                "argv": [PYTHON if a == python else a for a in argv],
                "env": dict(env),
                "cwd": str(cwd),
                "log": str(log_path),
            },
            wait_s=timeout_s,
        )
        pid = registry.started_pid(node, pod, timeout_s)
        if pid is None:
            raise OSError(f"node {node} did not start pod {pod} in {timeout_s:g} s")
        super().__init__(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._registry.exit_code(self.node, self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._registry.order(self.node, {"kind": SIGNAL, "pid": self.pid, "sig": int(sig)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
