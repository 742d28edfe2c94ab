"""One call of a running job's control plane, for the commands that act on a live run
(``inject``, ``release``, ``stress-test``): find the run, call with its secret (and, a run of
``unbroken serve``, the admin's credentials in its directory), and say what went wrong in one
line naming the command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from unbroken.cli.credentials import admin_credentials
from unbroken.cli.rundir import RunDirError, control_of
from unbroken.rpc import ControlClient, RpcError
from unbroken.rpc.tls import CredentialsError


def call_run(
    command: str, run_dir: Path, method: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The control plane's reply to ``method`` with ``body`` when it says ok; None when it
    does not or cannot be reached, the reason printed as ``unbroken COMMAND: ...``."""
    try:
        control = control_of(run_dir)
        tls = admin_credentials(run_dir)  # a job across hosts (unbroken serve): mutual TLS
        client = ControlClient(
            str(control["address"]), str(control["secret"]), timeout_s=15.0, tls=tls
        )
        try:
            reply = client.call(method, body)
        finally:
            client.close()
    except (RunDirError, RpcError, CredentialsError) as exc:
        reason = str(exc)
    else:
        if reply.get("ok"):
            return reply
        reason = str(reply.get("error"))
    print(f"unbroken {command}: {reason}", file=sys.stderr)
    return None
