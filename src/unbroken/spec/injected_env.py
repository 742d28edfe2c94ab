"""The environment the operator injects for a job's strategies: the seed's Table 3.

This table lives in the spec package because validation needs it too: a user who sets one of
these variables by hand to a value the strategies contradict (``PROCESS_RECOVER=off`` next to
``recover-strategy: recover``) gets an error from ``unbroken validate``, not a surprise at run
time. ``unbroken.operator`` applies it to every pod.

Several strategies at once: the variables are the union of the columns; ``HIGH_AVAILABILITY``
(read by MindSpeed-LLM to turn on its own switches) lists the values of all configured strategies
in priority order, joined by commas (``retry,recover,dump``); ``MS_ENABLE_TFT`` gets the union of
the switches. ``exit`` injects nothing. Elastic training is PyTorch only (the MindSpore row is
empty in the seed).

``ELASTIC_PROCESS_RECOVER_ENABLE`` is injected as the seed says, for training code written
against the Elastic Agent; that agent is sunset (its material is removed in the release of
2026-12-30) and Unbroken's own agent does not read it.

The switches the reference's agent side reads, Unbroken's agent (``unbroken launch``) reads
from the environment its pod runs with (:func:`switched_off`), and the job manager honours what
they turn off for the whole job: ``PROCESS_RECOVER`` other than ``on`` and
``TASKD_PROCESS_ENABLE=off`` turn every process-level rung off, ``ENABLE_RESTART_FAULT_PROCESS``
other than ``on`` turns ``recover-in-place`` off. A variable that is not set turns nothing off:
the job's strategies decide.
"""

from __future__ import annotations

from collections.abc import Mapping

from unbroken.spec.envknobs import TftSwitch, format_ms_enable_tft
from unbroken.spec.knobs import Framework, Strategy

#: Variables this table may set; a user value for one of them must agree with the table.
INJECTED_NAMES = (
    "PROCESS_RECOVER",
    "ELASTIC_PROCESS_RECOVER_ENABLE",
    "ENABLE_RESTART_FAULT_PROCESS",
    "HIGH_AVAILABILITY",
    "MINDIO_FOR_MINDSPORE",
    "MS_ENABLE_TFT",
)

_HIGH_AVAILABILITY = {
    Strategy.RETRY: "retry",
    Strategy.RECOVER_IN_PLACE: "recover",
    Strategy.RECOVER: "recover",
    Strategy.ELASTIC_TRAINING: "elastic-training",
    Strategy.DUMP: "dump",
}
_TFT = {
    Strategy.RETRY: (TftSwitch.UCE, TftSwitch.HCCE),
    Strategy.RECOVER_IN_PLACE: (TftSwitch.ARF,),
    Strategy.RECOVER: (TftSwitch.ARF,),
    Strategy.DUMP: (TftSwitch.TTP,),
}
#: The rungs ``PROCESS_RECOVER`` and ``TASKD_PROCESS_ENABLE`` switch: every process-level one.
PROCESS_RUNGS = (
    Strategy.RETRY,
    Strategy.RECOVER_IN_PLACE,
    Strategy.RECOVER,
    Strategy.ELASTIC_TRAINING,
    Strategy.DUMP,
)
_ELASTIC_AGENT = frozenset(
    {Strategy.RETRY, Strategy.RECOVER_IN_PLACE, Strategy.RECOVER, Strategy.DUMP}
)


def tft_switches(strategies: tuple[Strategy, ...], pod_rescheduling: bool) -> dict[TftSwitch, bool]:
    """The ``MS_ENABLE_TFT`` switches the strategies (and pod-level rescheduling) need."""
    switches: dict[TftSwitch, bool] = {}
    for strategy in strategies:
        for switch in _TFT.get(strategy, ()):
            switches[switch] = True
    if pod_rescheduling:
        switches[TftSwitch.RSC] = True
    return switches


def injected_env(
    strategies: tuple[Strategy, ...], framework: Framework, pod_rescheduling: bool
) -> dict[str, str]:
    """Table 3: the variables the operator adds to every pod for these strategies.

    ``strategies`` are the configured ``recover-strategy`` tokens (``exit`` may be among them).
    """
    env: dict[str, str] = {}
    rungs = [s for s in strategies if s is not Strategy.EXIT]
    if framework is Framework.MINDSPORE:
        rungs = [s for s in rungs if s is not Strategy.ELASTIC_TRAINING]
    if rungs:
        env["PROCESS_RECOVER"] = "on"
    if any(s in _ELASTIC_AGENT for s in rungs):
        env["ELASTIC_PROCESS_RECOVER_ENABLE"] = "1"
    if Strategy.RECOVER_IN_PLACE in rungs:
        env["ENABLE_RESTART_FAULT_PROCESS"] = "on"
    if framework is Framework.PYTORCH:
        values: list[str] = []
        for strategy in rungs:
            value = _HIGH_AVAILABILITY[strategy]
            if value not in values:
                values.append(value)
        if values:
            env["HIGH_AVAILABILITY"] = ",".join(values)
    else:
        if rungs:
            env["MINDIO_FOR_MINDSPORE"] = "1"
        switches = tft_switches(tuple(rungs), pod_rescheduling)
        if switches:
            env["MS_ENABLE_TFT"] = format_ms_enable_tft(switches)
    return env


def switched_off(environ: Mapping[str, str]) -> dict[Strategy, str]:
    """The rungs a pod's own environment turns off, each with the setting that does (the
    first that applies, in the order ``TASKD_PROCESS_ENABLE``, ``PROCESS_RECOVER``,
    ``ENABLE_RESTART_FAULT_PROCESS``)."""
    off: dict[Strategy, str] = {}
    switches: tuple[tuple[str, tuple[Strategy, ...], str], ...] = (
        ("TASKD_PROCESS_ENABLE", PROCESS_RUNGS, "off"),  # off turns them off
        ("PROCESS_RECOVER", PROCESS_RUNGS, "on"),  # anything but on turns them off
        ("ENABLE_RESTART_FAULT_PROCESS", (Strategy.RECOVER_IN_PLACE,), "on"),
    )
    for name, rungs, word in switches:
        value = environ.get(name)
        if value is None:
            continue
        value = value.strip()
        if (value == "off") if word == "off" else (value != "on"):
            for rung in rungs:
                off.setdefault(rung, f"{name}={value}")
    return off
