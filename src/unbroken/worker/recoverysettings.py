"""How a rank recovers, read once from its environment by :func:`unbroken.worker.init`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.worker.decisionwait import decision_wait_from_environ
from unbroken.worker.mailbox import MAILBOX
from unbroken.worker.opretry import (
    OpRetrySettings,
    RetryConfig,
    op_retry_from_environ,
    retry_config_from_environ,
)
from unbroken.worker.stress import SimDevice

#: Set to ``1`` for a process started to take a lost rank's place.
JOIN = "UNBROKEN_JOIN"


@dataclass(frozen=True)
class RecoverySettings:
    """How this rank recovers; read once by ``unbroken.worker.init``."""

    mailbox: Path | None = None  # None: no agent to send commands (plain torchrun)
    join: bool = False  # a replacement process
    master_addr: str = ""  # the store this process's own init_process_group used
    master_port: int = 0
    command_timeout_s: float = 120.0
    decision_wait_s: float | None = None  # MINDIO_WAIT_MINDX_TIME (worker.decisionwait)
    comm_timeout_s: float = 30.0
    ckpt_timeout_s: float = 600.0
    poll_interval_s: float = 0.005  # the mailbox poll while stopped: one stat() each
    op_retry: OpRetrySettings | None = None  # HCCL_OP_RETRY_*: None when off for this group
    step_retry: RetryConfig | None = None  # HCCL_OP_RETRY_* for the step's other collectives
    device: SimDevice | None = None  # the simulated device the stress test's check runs on

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **values: Any) -> RecoverySettings:
        join_raw = environ.get(JOIN, "")
        if join_raw not in ("", "0", "1"):
            raise ValueError(f"environment variable {JOIN}={join_raw!r} is not 0 or 1")
        mailbox = environ.get(MAILBOX) or None
        join = join_raw == "1"
        if join and mailbox is None:
            raise ValueError(
                f"{JOIN}=1 but {MAILBOX} is not set: a replacement process takes its "
                "repair command from its mailbox"
            )
        port_raw = environ.get("MASTER_PORT", "")
        values.setdefault("device", SimDevice.from_environ(environ))
        values.setdefault("decision_wait_s", decision_wait_from_environ(environ))
        return cls(
            mailbox=Path(mailbox) if mailbox else None,
            join=join,
            master_addr=environ.get("MASTER_ADDR", ""),
            master_port=int(port_raw) if port_raw.isdigit() else 0,
            op_retry=op_retry_from_environ(environ),
            step_retry=retry_config_from_environ(environ),
            **values,
        )
