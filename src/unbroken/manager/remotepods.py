"""The control plane's handle on a pod's agent process on a joined host, and on the host itself.

A host's agent (``unbroken launch --join``, :mod:`unbroken.agent.remote`) starts and signals
the processes of the pods placed on its node when the control plane orders it to
(:mod:`unbroken.protocol.hosts`); :class:`RemoteChild` gives the control plane such a process
as it would a child of its own, through the registry of joined nodes
(:class:`unbroken.manager.service.NodeRegistry`). Its start order carries the environment of
:func:`order_env` alone: the pod's planned environment and what its agent needs, never this
host's environment or the run's secret (the host has credentials of its own). A pid in these
handles is the host's, never one of this host: it is signalled only through the host's agent.

:class:`JoinedHost` carries out a fault injected into a joined host's node (``unbroken inject
node``, ``throttle``, ``link``) through that host's agent, which answers what it did.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from unbroken.agent.children import OwnChild
from unbroken.manager.service import NodeRegistry
from unbroken.protocol.hosts import (
    AGENT_VARS,
    DOWN,
    KILL,
    LINK,
    PYTHON,
    SIGNAL,
    START,
    THROTTLE,
    host_decides,
)

#: How long a fault injected into a joined host waits for its agent's answer.
ANSWER_S = 10.0


def order_env(planned: Mapping[str, str], agent: Mapping[str, str]) -> dict[str, str]:
    """The environment a start order carries: the pod's ``planned`` environment (the job's and
    the operator's variables for it) and, of ``agent``, the variables the control plane
    decides for the pod's agent (:data:`~unbroken.protocol.hosts.AGENT_VARS`); never a
    variable the host decides (paths, the loader, the control channel and its secret)."""
    env = {k: str(v) for k, v in planned.items() if not host_decides(k)}
    env.update({k: str(v) for k, v in agent.items() if k in AGENT_VARS})
    return env


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
                "env": {k: v for k, v in env.items() if not host_decides(k)},
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

    def kill_tree(self) -> None:
        """SIGKILL the agent and every process under it (its ranks), on its host."""
        if self.poll() is None:
            self._registry.order(self.node, {"kind": KILL, "pid": self.pid})


class JoinedHost:
    """A joined host's node as fault injection acts on it: through the host's agent, which
    answers how many processes it acted on, or why it could not (a :class:`ValueError` here,
    the one line ``unbroken inject`` prints)."""

    def __init__(self, registry: NodeRegistry, node: str, timeout_s: float = ANSWER_S) -> None:
        self.registry = registry
        self.node = node
        self.timeout_s = timeout_s

    def _ask(self, order: dict[str, object]) -> int:
        try:
            answer = self.registry.ask(self.node, order, self.timeout_s)
        except OSError as exc:
            raise ValueError(str(exc)) from None
        if not answer.get("ok"):
            raise ValueError(f"node {self.node}: {answer.get('error') or 'refused'}")
        count = answer.get("count")
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def down(self) -> int:
        """Every process of the node's pods (and its spare) SIGKILLed by its host's agent."""
        return self._ask({"kind": DOWN})

    def throttle(self, cpu: float | None) -> int:
        """The node's pods' processes held to ``cpu`` of one CPU (None: freed again)."""
        return self._ask({"kind": THROTTLE, "cpu": cpu})

    def reset_links(
        self, pid: int, exclude_ports: Sequence[int], peer_pids: Sequence[int] | None
    ) -> int:
        """The TCP links of the rank ``pid`` reset by its host (``ss -K``)."""
        return self._ask(
            {
                "kind": LINK,
                "pid": pid,
                "exclude_ports": [int(p) for p in exclude_ports if p],
                "peer_pids": None if peer_pids is None else [int(p) for p in peer_pids],
            }
        )
