"""The load harness's simulated agent sends a heartbeat's wire form patched into a template;
it must be what the protocol's encoder makes of the same heartbeat, in every state."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from scale_harness.agents import STEP_S, SimAgent  # noqa: E402

from unbroken.protocol.messages import decode_report, encode_report  # noqa: E402

pytestmark = pytest.mark.unit


def test_a_heartbeats_wire_form_is_the_encoders_in_every_state() -> None:
    agent = SimAgent(SimpleNamespace(channel=lambda i: None), "pod-3", 3, 4242)  # type: ignore[arg-type]
    t0 = 1_000.0
    agent._started(0, None)
    agent.gen_start = t0
    seen = 0
    for k in range(40):
        now = t0 + k * STEP_S * 0.4
        if k == 15:
            agent.paused_at = agent.committed(now)  # paused at a step boundary
        if k == 25:
            agent._started(1, 7)  # rejoined from a replica's step
            agent.gen_start = now
        fast = agent.beat_body(now)
        assert fast == encode_report(agent.sender(now), agent.beat(now)), k
        # And the manager reads it as the heartbeat it is.
        _, beat = decode_report("AgentHeartbeat", fast)
        assert [r.record.committed for r in beat.ranks] == [agent.committed(now)] * 8
        seen += 1
    assert seen == 40
