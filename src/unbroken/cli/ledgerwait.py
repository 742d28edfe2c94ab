"""Waiting on a live run's ledger for the outcome of a request made through its control plane
(``link``, ``stress-test``): the control plane answers at once, and the outcome is a record the
job writes later, so the command polls the ledger for it, and stops early when the job ends,
since no record will come then."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from unbroken.ledger import Ledger, Record

POLL_S = 0.2


def wait_for_record(
    ledger: Ledger,
    command: str,
    kinds: Sequence[str],
    on_record: Callable[[Record], int | None],
    timeout_s: float,
    since_id: int = 0,
) -> int | None:
    """Hand each new record of ``kinds`` (after ``since_id``, oldest first) to ``on_record``
    until it returns an exit code, which is returned. When the job has ended first, say so as
    ``unbroken COMMAND: the job ended (PHASE)`` and return 1; when ``timeout_s`` passes, return
    None, so the command says what it was still waiting for."""
    deadline = time.monotonic() + timeout_s
    last = since_id
    while time.monotonic() < deadline:
        for rec in ledger.events(since_id=last, kinds=kinds):
            last = rec.id
            code = on_record(rec)
            if code is not None:
                return code
        st = ledger.status()
        if st is not None and st.phase.finished:
            print(f"unbroken {command}: the job ended ({st.phase})", file=sys.stderr)
            return 1
        time.sleep(POLL_S)
    return None
