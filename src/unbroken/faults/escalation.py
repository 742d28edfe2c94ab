"""Repeated faults escalate: the same code on the same device too often -> ManuallySeparate.

Pure: the fault history and the time are arguments. The rule for a code comes from the code
table (:meth:`CodeTable.escalation_for`): by default 3 times within 24 h (the reference's
window) for codes whose level stops training, per-code rules where the table has them. Only
faults attributed to a device (``node`` and ``device`` set) with a code are counted; software
faults (exit statuses, exceptions) never escalate a device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from unbroken.faults.codes import CodeTable
from unbroken.faults.fault import Fault, FaultLevel


def repeats(fault: Fault, history: Iterable[Fault], now: float, window_s: float) -> int:
    """How many times ``fault``'s code hit its device within ``window_s`` before ``now``,
    counting ``fault`` itself once (also when ``history`` already contains it)."""
    since = now - window_s
    earlier = sum(
        1
        for past in history
        if past is not fault
        and past != fault
        and past.code.upper() == fault.code.upper()
        and past.node == fault.node
        and past.device == fault.device
        and since <= past.at <= now
    )
    return earlier + 1


def escalate(fault: Fault, history: Iterable[Fault], now: float, table: CodeTable) -> Fault:
    """``fault``, raised to ``ManuallySeparate`` when its code repeats too often on its device.

    The returned fault's ``detail`` says why it was escalated; a fault that does not escalate
    is returned unchanged.
    """
    if fault.node is None or fault.device is None or not fault.code:
        return fault
    if fault.level.severity >= FaultLevel.MANUALLY_SEPARATE.severity:
        return fault
    rule = table.escalation_for(fault.code)
    if rule is None:
        return fault
    count = repeats(fault, history, now, rule.window_s)
    if count < rule.times:
        return fault
    why = (
        f"escalated from {fault.level} to {FaultLevel.MANUALLY_SEPARATE}: code {fault.code} "
        f"{count} times on device {fault.device} of node {fault.node} within {rule.window_s:g} s "
        f"(limit {rule.times})"
    )
    detail = f"{fault.detail}\n{why}" if fault.detail else why
    return dataclasses.replace(fault, level=FaultLevel.MANUALLY_SEPARATE, detail=detail)
