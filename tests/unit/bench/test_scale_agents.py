"""The load harness's simulated agent writes a heartbeat's wire form into a template; it must
be what the protocol's encoder makes of the same heartbeat, in every state. Its ranks
rendezvous as real ranks do: no step moves before every pod entered the generation."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from scale_harness.agents import STEP_S, Fleet, SimAgent  # noqa: E402

from unbroken.protocol.messages import decode_report, encode_report  # noqa: E402

pytestmark = pytest.mark.unit


def test_a_heartbeats_wire_form_is_the_encoders_in_every_state() -> None:
    fleet = SimpleNamespace(channel=lambda i: None, entered=lambda generation: None)
    agent = SimAgent(fleet, "pod-3", 3, 4242)  # type: ignore[arg-type]
    t0 = 1_000.0
    agent._started(0, None)
    agent.gen_start, agent.waiting = t0, False
    seen = 0
    for k in range(40):
        now = t0 + k * STEP_S * 0.4
        if k == 15:
            agent.paused_at = agent.committed(now)  # paused at a step boundary
        if k == 25:
            agent._started(1, 7)  # rejoined from a replica's step
            agent.gen_start, agent.waiting = now, False
        fast = json.loads(agent.beat_wire(now))
        assert fast == encode_report(agent.sender(now), agent.beat(now)), k
        # And the manager reads it as the heartbeat it is.
        _, beat = decode_report("AgentHeartbeat", fast)
        assert [r.record.committed for r in beat.ranks] == [agent.committed(now)] * 8
        seen += 1
    assert seen == 40


def test_a_generation_rendezvous_once_every_pod_entered_it_and_no_step_moves_before() -> None:
    async def run() -> None:
        fleet = Fleet("127.0.0.1:1", "secret", channels=1, heartbeat_s=1.0, world=3)
        try:
            agents = [SimAgent(fleet, f"pod-{i}", i, 100 + i) for i in range(3)]
            agents[0]._started(1, 7)
            agents[1]._started(1, 7)
            waiting = asyncio.ensure_future(fleet.rendezvous(1))
            await asyncio.sleep(0.01)
            assert not waiting.done() and 1 not in fleet.rendezvous_at
            later = agents[0].gen_start + 5 * STEP_S
            assert agents[0].committed(later) == 7  # not ready: no step of generation 1
            agents[2]._started(1, 7)
            assert await waiting == fleet.rendezvous_at[1] >= agents[2].gen_start
            assert await fleet.rendezvous(2, timeout_s=0.01) > 0  # never complete: now
        finally:
            await fleet.close()

    asyncio.run(run())
