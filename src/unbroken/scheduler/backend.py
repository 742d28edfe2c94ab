"""Where a job's pods run, behind one interface: the policy's rescheduling commands
(:mod:`unbroken.policy.commands`) become a :class:`Replacement`, carried out by a
:class:`PodBackend` that stops pods and starts them again.

:func:`replacement` is the one reading of the commands; :func:`carry_out` the one order of the
steps (stop, then start off the isolated nodes). Behind the interface:

- Kubernetes: :class:`unbroken.operator.kube.KubePods` (stop: mark the pods and delete them with
  the grace period; start: create them from the plan with a node affinity off the isolated
  nodes; a pod still terminating is created when its deletion is seen).
- The local engine: :class:`unbroken.manager.engine.LocalPods` (stop: order each pod's agent
  to stop, kill what is left, free its devices; start: place the pods on the embedded cluster,
  whose state already keeps them off isolated nodes, start their agents, and have the other
  pods' ranks restart in place into the new generation).

Pure apart from the backend's calls; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from unbroken.policy.commands import (
    Command,
    FailJob,
    IsolateNode,
    RescheduleJob,
    ReschedulePods,
)


class PodBackend(Protocol):
    def stop_pods(self, pods: tuple[str, ...], grace_s: float | None) -> None:
        """Stop ``pods`` (``grace_s`` seconds after SIGTERM; None or 0: at once)."""

    def start_pods(self, pods: tuple[str, ...], avoid_nodes: tuple[str, ...]) -> None:
        """Place and start ``pods`` again from the plan, on none of ``avoid_nodes``."""


@dataclass(frozen=True)
class Replacement:
    """Pods to stop and start again: ``job_level`` when every pod of the job is replaced."""

    job_level: bool
    pods: tuple[str, ...]
    grace_s: float | None
    avoid_nodes: tuple[str, ...]  # every node isolated so far, these commands' included


def replacement(
    commands: Sequence[Command], all_pods: tuple[str, ...], avoided: tuple[str, ...]
) -> Replacement | FailJob | None:
    """What ``commands`` ask of the pods: a replacement, the job's end, or nothing (the
    commands that are not about placing pods are the caller's)."""
    nodes = set(avoided)
    out: Replacement | FailJob | None = None
    for command in commands:
        match command:
            case IsolateNode(node=node):
                nodes.add(node)
            case ReschedulePods(pods=pods, isolate_nodes=isolate, grace_s=grace):
                nodes.update(isolate)
                out = Replacement(False, pods, grace, ())
            case RescheduleJob(isolate_nodes=isolate, grace_s=grace):
                nodes.update(isolate)
                out = Replacement(True, all_pods, grace, ())
            case FailJob():
                out = command
    if isinstance(out, Replacement):
        out = Replacement(out.job_level, out.pods, out.grace_s, tuple(sorted(nodes)))
    return out


def carry_out(backend: PodBackend, r: Replacement) -> None:
    """Stop the replaced pods, then start them again off the isolated nodes."""
    backend.stop_pods(r.pods, r.grace_s)
    backend.start_pods(r.pods, r.avoid_nodes)
