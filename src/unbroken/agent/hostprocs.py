"""The processes a host's agent (``unbroken launch --join``) started for pods, and what it does to
them on the control plane's orders.

:class:`OwnProcesses` knows the processes the agent started (each pod's agent) and finds their
descendants (the pods' zygotes and ranks) through ``/proc``. An order may act on those alone: a
signal to one of them, a process tree killed, every tree killed at once (the node going down),
throttled to a share of one CPU, or a rank's TCP links reset. A pid that is not one of them
(``-1``, ``0``, the host's own processes, another user's) is refused, whatever the order says:
what the control plane names is checked here again, on the host that acts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from unbroken.chaos import throttle
from unbroken.worker.linkfault import LinkFaultError, reset_links

#: The deepest a process tree is searched for a pid's started ancestor.
_DEPTH = 64


class OrderRefused(ValueError):
    """An order names something this host did not start, or cannot be carried out; the
    message is the one line answered to the control plane."""


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _parent(int(entry))) is not None:
            out[int(entry)] = ppid
    return out


def descendants(roots: Collection[int]) -> list[int]:
    """``roots`` that still exist and every process under them, parents first."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = [r for r in roots if r in parents]
    seen: set[int] = set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo += children.get(pid, [])
    return out


def as_pid(value: object) -> int | None:
    """``value`` when it can name one process (an int above 0; never a group or everyone)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


class OwnProcesses:
    """The processes this host's agent started (the roots), and their descendants."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._roots: set[int] = set()
        self._lock = threading.Lock()
        #: The throttle's cgroup while the node is throttled.
        self.throttled: throttle.Throttled | None = None

    def add(self, pid: int) -> None:
        with self._lock:
            self._roots.add(pid)

    def discard(self, pid: int) -> bool:
        """``pid`` ended; whether no started process runs any more."""
        with self._lock:
            self._roots.discard(pid)
            return not self._roots

    def roots(self) -> set[int]:
        with self._lock:
            return set(self._roots)

    def owns(self, pid: object) -> bool:
        """Whether ``pid`` is a process this agent started, or a descendant of one."""
        roots = self.roots()
        at = as_pid(pid)
        for _ in range(_DEPTH):
            if at is None or at <= 1:
                return False
            if at in roots:
                return True
            at = _parent(at)
        return False

    def _check(self, pid: object, what: str) -> int:
        checked = as_pid(pid)
        if checked is None or not self.owns(checked):
            raise OrderRefused(f"{what}: pid {pid!r} is no process this host started for a pod")
        return checked

    def signal(self, pid: object, sig: object) -> None:
        """Send ``sig`` to ``pid``, one of this host's pods' processes."""
        target = self._check(pid, "signal")
        if not isinstance(sig, int) or isinstance(sig, bool) or not 0 < sig < signal.NSIG:
            raise OrderRefused(f"signal: {sig!r} is not a signal")
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)

    def kill_tree(self, pid: object) -> int:
        """SIGKILL ``pid``, a process this agent started, and every process under it."""
        checked = as_pid(pid)
        if checked is None or checked not in self.roots():
            raise OrderRefused(f"kill: pid {pid!r} is no process this host started for a pod")
        return _kill_trees([checked])

    def kill_all(self, extra: Iterable[int] = ()) -> int:
        """SIGKILL every process this agent started, ``extra`` ones (its warm spare) and every
        process under them: the node going down. How many."""
        return _kill_trees(self.roots() | set(extra))

    def throttle(self, cpu: object) -> int:
        """Hold every process of the pods to ``cpu`` of one CPU (None: free them)."""
        if cpu is None:
            held, self.throttled = self.throttled, None
            if held is None:
                raise OrderRefused(f"node {self.node} is not throttled")
            throttle.release(held)
            return len(held.origins)
        if not isinstance(cpu, (int, float)) or isinstance(cpu, bool):
            raise OrderRefused(f"throttle: cpu {cpu!r} is not a number")
        pids = descendants(self.roots())
        if not pids:
            raise OrderRefused(f"node {self.node} runs no process of the job now")
        try:
            self.throttled = throttle.throttle(self.node, pids, float(cpu))
        except (throttle.ThrottleError, ValueError) as exc:
            raise OrderRefused(f"cannot throttle node {self.node}: {exc}") from None
        return len(pids)

    def release(self) -> None:
        """Free a throttle still held (the processes go back, its cgroup is removed)."""
        held, self.throttled = self.throttled, None
        if held is not None:
            throttle.release(held)

    def reset_links(
        self, pid: object, exclude_ports: Sequence[object], peer_pids: Sequence[object] | None
    ) -> int:
        """Reset the TCP links of the rank ``pid`` (to ``peer_pids``, processes of this host's
        pods too, or, None, every link but those of ``exclude_ports``)."""
        rank = self._check(pid, "link")
        peers = None if peer_pids is None else [self._check(p, "link peer") for p in peer_pids]
        ports = [int(p) for p in exclude_ports if isinstance(p, int) and not isinstance(p, bool)]
        try:
            return len(reset_links(rank, exclude_ports=ports, peer_pids=peers))
        except LinkFaultError as exc:
            raise OrderRefused(f"link fault on pid {rank}: {exc}") from None


def _kill_trees(roots: Collection[int]) -> int:
    """SIGKILL ``roots`` and every process under them; how many. The trees are stopped first
    (SIGSTOP, until a search finds no process it has not stopped), so that no process forked
    meanwhile escapes as an orphan."""
    stopped: list[int] = []
    for _ in range(8):
        new = [p for p in descendants(roots) if p not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
    killed = 0
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
