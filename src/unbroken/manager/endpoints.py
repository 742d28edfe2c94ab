"""What a run shows outside its process: the metrics and dashboard endpoint over the ledger,
and the control file that tells ``unbroken inject``, ``status`` and the rest where the control
plane listens and with which secret."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from unbroken.ledger import Ledger
from unbroken.manager.metrics import LedgerCollector, registry_for
from unbroken.manager.web import WebEndpoint
from unbroken.report import render


def dashboard(ledger: Ledger, secret: str, clock: Callable[[], float], port: int) -> WebEndpoint:
    """Prometheus metrics and the live dashboard, computed from the ledger per request.
    Raises :class:`~unbroken.manager.web.WebError` when ``port`` is taken."""
    collector = LedgerCollector(ledger)

    def page() -> str:
        st = ledger.status()
        live = st is None or not st.phase.finished
        return render(collector.records(), st, now=clock() if live else None, refresh_s=5)

    return WebEndpoint(secret, registry_for(collector), page, port)


def write_control_file(path: Path, *, address: str, metrics: str, secret: str, job_id: str) -> None:
    """The control file at ``path``: a new file of ours, 0600 from its creation, never a path
    planted before us (O_EXCL, O_NOFOLLOW); the rename replaces whatever stands at ``path``,
    a link included."""
    tmp = path.parent / f".control-{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "address": address,
                "metrics": metrics,
                "secret": secret,
                "pid": os.getpid(),
                "job": job_id,
            },
            f,
        )
    os.replace(tmp, path)
