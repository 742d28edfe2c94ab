"""What every part of the job manager is given at its start: the job, the cluster, the options
and the run's sinks (ledger, console, order queues, clock). Held once, never copied: a part
reads ``ctx.fh``, and a change of configuration is a new manager, not an attribute set twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from unbroken.chaos import ChaosFault
from unbroken.faults import CodeTable
from unbroken.ledger import Ledger
from unbroken.manager.console import Console
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions
from unbroken.manager.service import CommandQueues
from unbroken.spec.knobs import FaultHandling


@dataclass(frozen=True)
class Context:
    """The job and its cluster as laid out, the manager's options, the code table, and where
    facts go: ``ledger`` (recorded), ``console`` (shown), ``commands`` (orders to agents).
    ``clock`` is the wall clock (``time.time``; a component test passes a fake one)."""

    job: JobLayout
    cluster: ClusterLayout
    options: ManagerOptions
    codes: CodeTable
    ledger: Ledger
    console: Console
    commands: CommandQueues
    run_dir: Path
    chaos: tuple[ChaosFault, ...]
    clock: Callable[[], float]

    @property
    def fh(self) -> FaultHandling:
        """The job's fault handling (the YAML's labels, annotations and env knobs)."""
        return self.job.fault_handling

    @property
    def sim_dir(self) -> Path:
        """Where the ``sim`` health provider keeps the devices' state."""
        return self.run_dir / "devices"
