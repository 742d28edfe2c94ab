"""Prometheus metrics of a running job: scraped while it recovers from a killed rank, they agree
with the run's ledger; the endpoint listens on 127.0.0.1 only and refuses requests without the
run's secret."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.cli_runs import (
    FIXTURES,
    events,
    of_kind,
    start_job,
    unbroken,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.e2e


def _control(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((run_dir / "control.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def _get(address: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def _metrics(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}"] = s.value
    return values


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on ``port`` (Linux /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(addr)
    return found


def test_metrics_while_a_job_recovers(run_dir: Path, tmp_path: Path) -> None:
    job_yaml = write_job(tmp_path / "job.yaml", replace={"--steps=60": "--steps=200"})
    job = start_job(
        run_dir, tmp_path / "logs", "--chaos", FIXTURES / "kill-rank.yaml", job=job_yaml
    )
    try:

        def metrics_served() -> bool:
            assert job.proc.poll() is None, "the job ended early: " + str(job.output())
            control = _control(run_dir)
            return control is not None and bool(control.get("metrics"))

        wait_for(metrics_served, "the metrics address in control.json", deadline_s=120.0)
        control = _control(run_dir)
        assert control is not None
        address, secret = str(control["metrics"]), str(control["secret"])
        port = int(address.split(":")[1])
        assert address.startswith("127.0.0.1:")
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, no other interface
        stdout, _ = job.output()
        assert f"metrics http://{address}/metrics" in stdout

        for headers in ({}, {"Authorization": "Bearer not-the-secret"}):
            for path in ("/metrics", "/"):
                code, _ = _get(address, path, headers)
                assert code == 401, (path, headers)
        auth = {"Authorization": f"Bearer {secret}"}
        seen_recovering: list[dict[str, float]] = []

        def recovered() -> bool:
            assert job.proc.poll() is None, "the job ended before a scrape saw the recovery"
            code, text = _get(address, "/metrics", auth)
            assert code == 200
            m = _metrics(text)
            faults = sum(v for k, v in m.items() if k.startswith("unbroken_faults_total{"))
            done = sum(v for k, v in m.items() if k.startswith("unbroken_recoveries_total{"))
            if faults and not done:
                seen_recovering.append(m)
            return bool(done)

        wait_for(recovered, "a scrape counting the recovery", deadline_s=180.0)
        _, text = _get(address, "/metrics", auth)
        scraped = _metrics(text)
        code, page = _get(address, "/", auth)
        assert code == 200 and "ETTR" in page and 'class="steps"' in page
        assert job.wait().rc == 0
    finally:
        job.stop()
    stdout, _ = job.output()
    # the console says how long the decision's rung may take before the next one is tried
    (decision,) = [ln for ln in stdout.splitlines() if "] decision: " in ln]
    assert re.search(
        r"; [a-z-]+ has \d+ s to commit a step, then the next rung is tried$", decision
    )

    # while the job was recovering, a scrape counted the fault and no recovery yet
    assert seen_recovering, "no scrape saw the fault before its recovery"
    assert not any(k.startswith("unbroken_recoveries_total{") for k in seen_recovering[0])
    # after it, the scrape agrees with the ledger
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    (recovery,) = of_kind(evs, "RecoveryCompleted")
    assert scraped[f"unbroken_faults_total{{kind={fault['source']},level={fault['level']}}}"] == 1
    recoveries = {k: v for k, v in scraped.items() if k.startswith("unbroken_recoveries_total")}
    assert recoveries == {f"unbroken_recoveries_total{{rung={recovery['strategy']}}}": 1.0}
    res = unbroken("events", run_dir, "--incidents", "--json")
    assert res.rc == 0, res.explain()
    (incident,) = json.loads(res.stdout)["incidents"]
    assert scraped["unbroken_mttr_seconds_count{}"] == 1
    assert scraped["unbroken_mttr_seconds_sum{}"] == pytest.approx(incident["mttr_s"])
    for phase in incident["phases"]:
        if phase["duration_s"] is not None:
            key = f"unbroken_recovery_phase_seconds_sum{{phase={phase['name']}}}"
            assert scraped[key] == pytest.approx(phase["duration_s"]), phase["name"]
    steps = [e["step"] for e in of_kind(evs, "StepProgress") + of_kind(evs, "FirstStepCommitted")]
    assert scraped["unbroken_step{}"] in steps or scraped["unbroken_step{}"] <= max(steps)
    assert 0.0 < scraped["unbroken_goodput_ratio{}"] < 1.0
    assert scraped["unbroken_devices_isolated{}"] == 0
    assert scraped["unbroken_pods_pending{}"] == 0
    assert _control(run_dir) is None  # the run ended: control.json is gone with the endpoint
