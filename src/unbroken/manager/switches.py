"""The rungs a pod's own environment turns off: the reference's agent-side switches.

``PROCESS_RECOVER``, ``TASKD_PROCESS_ENABLE`` and ``ENABLE_RESTART_FAULT_PROCESS`` are read by
each pod's agent from the environment the pod runs with
(:func:`unbroken.spec.injected_env.switched_off`) and arrive in its hello. A rung one pod's
switches turn off is off for the whole job (the ladder's rungs repair the job, not one pod):
:func:`switched` gives the policy the rungs off and why (``Feasibility.switched_off``);
:meth:`Switches.heard` says so once per pod and setting, on the console and as a
``RungsSwitchedOff`` record, when it turns off a rung the job configures.
"""

from __future__ import annotations

from collections.abc import Iterable

from unbroken.ledger import RungsSwitchedOff
from unbroken.manager.context import Context
from unbroken.manager.pods import PodProcess
from unbroken.spec.knobs import STRATEGY_PRIORITY, Strategy

#: A rung by the name an agent's hello gives it.
_RUNGS = {str(s): s for s in STRATEGY_PRIORITY}


class Switches:
    """What the pods' agents said of their switches; each (pod, setting) said once per run."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._said: set[tuple[str, str, str]] = set()

    def heard(self, pod: PodProcess, off: tuple[tuple[str, str], ...]) -> None:
        """A pod's agent said which rungs its environment turns off: keep it on the pod, and
        say which rungs the job configures that takes from it."""
        pod.switched_off = off
        new = [
            (rung, why)
            for rung, why in off
            if rung in _RUNGS
            and _RUNGS[rung] in self.ctx.fh.strategies
            and (pod.pod, rung, why) not in self._said
        ]
        self._said.update((pod.pod, rung, why) for rung, why in new)
        for why in dict.fromkeys(why for _, why in new):
            rungs = tuple(r for r, w in new if w == why)
            line = (
                f"pod {pod.pod} runs with {why}: {', '.join(rungs)} off for the job (the "
                "reference's agent-side switch); faults fall to the rungs below"
            )
            ranks = tuple(self.ctx.job.ranks_of(pod.pod))
            self.ctx.ledger.record(
                RungsSwitchedOff(pod=pod.pod, ranks=ranks, rungs=rungs, setting=why)
            )
            self.ctx.console.line(line)


def switched(pods: Iterable[PodProcess]) -> tuple[tuple[Strategy, str], ...]:
    """The rungs the pods' environments turn off, each with the first pod and setting that
    does, in the ladder's order."""
    off: dict[Strategy, str] = {}
    for pod in pods:
        for rung, why in pod.switched_off:
            if rung in _RUNGS:
                off.setdefault(_RUNGS[rung], f"{why} in pod {pod.pod}")
    return tuple((s, off[s]) for s in STRATEGY_PRIORITY if s in off)
