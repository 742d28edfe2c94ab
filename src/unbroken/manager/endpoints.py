"""What a run shows outside its process, opened at its start and closed at its end: the control
server the agents and ``unbroken inject``/``status``/... call, the metrics and dashboard endpoint
over the ledger, the device watcher that posts health events to the loop, and the control file
that says where the control plane listens and with which secret."""

from __future__ import annotations

import json
import os
import queue
import secrets
from collections.abc import Callable
from pathlib import Path

from unbroken.devices import DeviceStateError, DeviceWatcher, HealthProvider, SimProvider
from unbroken.devices.gpureset import GpuResetter
from unbroken.devices.nvml import NvmlProvider, gpu_of_slot, load_nvml, slots_on_gpus
from unbroken.devices.sim import Reset
from unbroken.ledger import Ledger
from unbroken.manager.context import Context
from unbroken.manager.engine import Engine, ManagerError
from unbroken.manager.metrics import LedgerCollector, registry_for
from unbroken.manager.service import Inbound, build_server
from unbroken.manager.web import WebEndpoint, WebError
from unbroken.report import render
from unbroken.rpc import ControlServer


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


class Endpoints:
    """The run's control server (``server``), metrics and dashboard (``web``), device watcher
    and control file (``control_file``)."""

    def __init__(self, ctx: Context, inbox: queue.Queue[Inbound]) -> None:
        self.ctx = ctx
        self.inbox = inbox
        self.control_file = ctx.run_dir / "control.json"
        self.server: ControlServer | None = None
        self.web: WebEndpoint | None = None
        self.watcher: DeviceWatcher | None = None
        self.nvml: NvmlProvider | None = None
        self.resetter: GpuResetter | None = None

    def open(self, secret: str, engine: Engine) -> str:
        """Open them all, the server where the engine listens (its joined hosts' registry
        beside it); returns the server's address. Raises :class:`ManagerError` when the
        metrics port is taken."""
        ctx = self.ctx
        server = build_server(
            secret,
            self.inbox,
            ctx.commands,
            answer_timeout_s=10.0,
            nodes=engine.remote_nodes,
            host=engine.listen[0],
            port=engine.listen[1],
            clock=ctx.clock,
        )
        self.server = server
        server.start()
        address = str(server.address)
        try:
            self.web = dashboard(ctx.ledger, secret, ctx.clock, ctx.options.metrics_port)
        except WebError as exc:
            raise ManagerError(str(exc)) from None
        ctx.console.line(
            f"metrics http://{self.web.address}/metrics, dashboard http://{self.web.address}/ "
            f"(token: the secret in {self.control_file.name})"
        )
        write_control_file(
            self.control_file,
            address=address,
            metrics=self.web.address,
            secret=secret,
            job_id=ctx.job.job_id,
        )
        cl = ctx.cluster
        provider: HealthProvider
        if cl.device_provider == "nvml":
            try:
                nvml = load_nvml()
                slots = slots_on_gpus(cl.nodes, cl.devices_per_node, cl.gpus)
                self.nvml = NvmlProvider(slots, ctx.codes.judge, nvml)
                if cl.reset_command:
                    self.resetter = GpuResetter(cl.reset_command, self._gpu_reset, ctx.console.line)
            except (DeviceStateError, ValueError) as exc:
                raise ManagerError(f"devicePlugin.provider nvml: {exc}") from None
            provider = self.nvml
            ctx.console.line(
                f"device health: NVML, {len(cl.gpus)} GPU(s) under {len(cl.nodes)} node(s) x "
                f"{cl.devices_per_node} device(s)"
            )
        else:
            provider = SimProvider(ctx.sim_dir, {n: cl.devices_per_node for n in cl.nodes})
        self.watcher = DeviceWatcher(
            provider,
            cl.list_watch_period_s,
            lambda ev: self.inbox.put(Inbound("Device", {"event": ev})),
        )
        self.watcher.start()
        if self.nvml is not None:
            self.nvml.listen(self.watcher.wake)
        return address

    def _gpu_reset(self, gpu: int) -> None:
        """A GPU was reset: its latched fault is gone, and the watcher looks at once."""
        if self.nvml is not None:
            self.nvml.reset(gpu)
        if self.watcher is not None:
            self.watcher.wake()

    def reset_gpu(self, node: str, device: int, code: str, now: float) -> Reset | None:
        """``hotReset: 2`` on NVIDIA GPUs: reset the GPU device ``device`` of ``node`` runs on
        with the configured command (None: this run resets no GPU)."""
        if self.resetter is None:
            return None
        cl = self.ctx.cluster
        gpu = gpu_of_slot(cl.nodes.index(node), device, cl.devices_per_node, cl.gpus)
        return self.resetter.reset(gpu, code, now)

    def close(self) -> None:
        if self.resetter is not None:
            self.resetter.wait(10.0)  # a reset started at the job's end (FreeRestartNPU)
        if self.nvml is not None:
            self.nvml.close()
        if self.watcher is not None:
            self.watcher.stop()
        if self.server is not None:
            # Long enough for the hosts' order streams to see the run's end and close: cut,
            # a host's agent reads the stream's cancellation as a lost control plane.
            self.server.stop(2.0)
        if self.web is not None:
            self.web.stop()
        self.control_file.unlink(missing_ok=True)
