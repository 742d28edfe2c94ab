"""The metrics and dashboard endpoint over a real socket, fed by a ledger written here."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.flood import IdleConnections

from unbroken.ledger import (
    DecisionMade,
    DeviceIsolated,
    FaultDetected,
    FirstStepCommitted,
    JobPhase,
    JobStatus,
    JobSubmitted,
    Ledger,
    PodStatus,
    RecoveryCompleted,
    StateLoaded,
    StateSource,
    StepProgress,
)
from unbroken.manager import web
from unbroken.manager.metrics import LedgerCollector, registry_for
from unbroken.manager.web import MAX_CONNECTIONS, WebEndpoint, WebError

pytestmark = pytest.mark.component

SECRET = "s3cret-of-the-run"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "ledger.db") as led:
        led.record(JobSubmitted(job="j", pods=("w-0", "w-1"), world_size=2), at=100.0)
        led.record(FirstStepCommitted(generation=0, step=1), at=110.0)
        for fault_id, level, at in (("f1", "RestartBusiness", 150.0), ("f2", "SeparateNPU", 170.0)):
            led.record(
                FaultDetected(fault_id, "device", "80E3A201", level, occurred_at=at, step=40),
                at=at + 1.0,
            )
            led.record(DecisionMade(fault_id, "recover", (), "spare"), at=at + 2.0)
            led.record(StateLoaded(1, 40, StateSource.REPLICA), at=at + 4.0)
            led.record(FirstStepCommitted(generation=1, step=41), at=at + 5.0)
            led.record(RecoveryCompleted(fault_id, "recover", 1, 41), at=at + 5.0)
        led.record(DeviceIsolated(node="node-1", device=0, code="80E3A201", reason="fault"))
        led.record(StepProgress(generation=1, step=60, step_time_s=0.25), at=180.0)
        led.set_status(
            JobStatus(
                "j",
                JobPhase.RUNNING,
                1,
                60,
                100,
                (PodStatus("w-0", node="node-0"), PodStatus("w-1")),
                100.0,
                180.0,
            )
        )
        yield led


@pytest.fixture
def endpoint(ledger: Ledger) -> Iterator[WebEndpoint]:
    collector = LedgerCollector(ledger, clock=lambda: 200.0)
    web = WebEndpoint(SECRET, registry_for(collector), lambda: "<html>dashboard</html>")
    yield web
    web.stop()


def _get(
    web: WebEndpoint, path: str, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    host, port = web.address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def _scrape(web: WebEndpoint) -> dict[str, float]:
    host, port = web.address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {SECRET}"})
    resp = conn.getresponse()
    assert resp.status == 200
    text = resp.read().decode()
    conn.close()
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}"] = s.value
    return values


def test_metrics_agree_with_the_ledger(endpoint: WebEndpoint) -> None:
    m = _scrape(endpoint)
    assert m["unbroken_step{}"] == 60
    assert m["unbroken_step_time_seconds{}"] == 0.25
    assert m["unbroken_faults_total{kind=device,level=RestartBusiness}"] == 1
    assert m["unbroken_faults_total{kind=device,level=SeparateNPU}"] == 1
    assert m["unbroken_recoveries_total{rung=recover}"] == 2
    assert m["unbroken_mttr_seconds_count{}"] == 2
    assert m["unbroken_mttr_seconds_sum{}"] == pytest.approx(10.0)
    assert m["unbroken_mttr_seconds_bucket{le=5.0}"] == 2
    assert m["unbroken_mttr_seconds_bucket{le=2.5}"] == 0
    assert m["unbroken_recovery_phase_seconds_sum{phase=state}"] == pytest.approx(4.0)
    # wall 100 -> 200 (the clock: the job has not finished); 10 startup + 2 x 5 incidents
    assert m["unbroken_goodput_ratio{}"] == pytest.approx(0.8)
    assert m["unbroken_badput_seconds{cause=startup}"] == pytest.approx(10.0)
    assert m["unbroken_devices_isolated{}"] == 1
    assert m["unbroken_pods_pending{}"] == 1


def test_every_request_needs_the_secret(endpoint: WebEndpoint) -> None:
    assert endpoint.address.startswith("127.0.0.1:")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": SECRET}):
        for path in ("/metrics", "/", "/nope"):
            resp = _get(endpoint, path, headers)
            assert resp.status == 401, (path, headers)
            assert resp.getheader("WWW-Authenticate") == 'Bearer realm="unbroken"'
    assert _get(endpoint, "/?token=wrong").status == 401
    auth = {"Authorization": f"Bearer {SECRET}"}
    assert _get(endpoint, "/nope", auth).status == 404
    assert _get(endpoint, "/", auth).status == 200


def test_a_browser_trades_the_token_for_a_cookie(endpoint: WebEndpoint) -> None:
    resp = _get(endpoint, f"/?token={SECRET}")
    assert resp.status == 303 and resp.getheader("Location") == "/"
    cookie = resp.getheader("Set-Cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    name, value = cookie.split(";")[0].split("=", 1)
    port = endpoint.address.split(":")[1]
    assert name == f"unbroken_{port}" and SECRET not in value
    resp = _get(endpoint, "/", {"Cookie": cookie.split(";")[0]})
    assert resp.status == 200
    assert _get(endpoint, "/", {"Cookie": f"{name}=wrong"}).status == 401
    assert _get(endpoint, "/", {"Cookie": f"{name}={SECRET}"}).status == 401


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_idle_connections_take_neither_a_thread_nor_a_descriptor_each(
    endpoint: WebEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of connections that never send a byte: the endpoint holds a bounded number
    of them, on its few threads, shuts each after its time, and answers once they stop."""
    monkeypatch.setattr(web, "CONNECTION_S", 2.0)
    host, port = endpoint.address.split(":")
    with socket.create_connection((host, int(port))) as idle:
        idle.settimeout(10.0)
        opened = time.monotonic()
        assert idle.recv(1) == b""  # shut by the endpoint, never answered
        assert 1.5 < time.monotonic() - opened < 5.0
    threads, descriptors = threading.active_count(), _descriptors()
    with IdleConnections([endpoint.address], 300) as flood:
        deadline = time.monotonic() + 30.0
        while flood.closed_by_server < 600 and time.monotonic() < deadline:
            time.sleep(0.2)
            with flood.lock:  # the flood opens and closes sockets between two readings
                held = _descriptors() - descriptors - sum(flood.open_now().values())
            assert held <= MAX_CONNECTIONS + 1, held
            assert threading.active_count() <= threads + 1  # the flood's own thread
        assert flood.closed_by_server >= 600  # refused past the bound, or shut in time
    # The flood's last connections may still hold every slot as it ends: each is shut within
    # its time, and the endpoint answers once they are (on a loaded machine, not at once).
    stopped = time.monotonic()
    while True:
        try:
            answer = _get(endpoint, "/metrics", {"Authorization": f"Bearer {SECRET}"})
            break
        except (http.client.RemoteDisconnected, ConnectionError):
            assert time.monotonic() - stopped < 2 * web.CONNECTION_S + 1.0, "never answered"
            time.sleep(0.1)
    assert answer.status == 200


def test_a_taken_port_is_an_error_naming_it(endpoint: WebEndpoint, ledger: Ledger) -> None:
    port = int(endpoint.address.split(":")[1])
    registry = registry_for(LedgerCollector(ledger))
    with pytest.raises(WebError, match=f"127.0.0.1:{port}: .*--metrics-port"):
        WebEndpoint(SECRET, registry, lambda: "", port=port)
