"""The protocol at scale (unbroken.manager.service): the heartbeat interval the control plane
sets from the job's size, the silence that loses a node, and the agents' order mailboxes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from unbroken.manager.service import (
    HEARTBEAT_FLOOR_S,
    HEARTBEATS_PER_S,
    Mailbox,
    heartbeat_interval_s,
    silence_timeout_s,
)
from unbroken.protocol.messages import HelloAnswer, JoinFrom, decode_answer, encode_answer

pytestmark = pytest.mark.unit


def test_a_small_job_keeps_the_agents_rate_and_a_large_one_a_bounded_total() -> None:
    assert heartbeat_interval_s(1) == HEARTBEAT_FLOOR_S == 0.1
    assert heartbeat_interval_s(50) == 0.1
    for nodes in (1000, 2000, 5000, 10_000):
        offered = nodes / heartbeat_interval_s(nodes)
        assert offered == pytest.approx(HEARTBEATS_PER_S)
    assert heartbeat_interval_s(10_000) == pytest.approx(20.0)


def test_silence_loses_a_node_after_three_intervals_never_sooner_than_the_agent_timeout() -> None:
    assert silence_timeout_s(0.1, 2.0) == 2.0
    assert silence_timeout_s(2.0, 2.0) == 6.0
    assert silence_timeout_s(20.0, 2.0) == 60.0


def test_the_hello_answer_carries_the_interval_and_an_old_answer_reads_as_none() -> None:
    answer = HelloAnswer(ok=True, generation=3, join=JoinFrom(source=1, step=7), heartbeat_s=2.0)
    assert decode_answer(encode_answer(answer)) == answer
    old = {"ok": True, "generation": 3, "join": None}
    assert decode_answer(old).heartbeat_s == 0.0  # the agent keeps its own interval


def test_an_order_put_from_another_thread_wakes_the_waiting_stream() -> None:
    box = Mailbox()

    async def wait_two() -> list[dict[str, int]]:
        first = await box.get()
        return [first, await box.get()]

    async def main() -> list[dict[str, int]]:
        task = asyncio.create_task(wait_two())
        await asyncio.sleep(0)  # the stream waits on an empty mailbox
        t = threading.Thread(target=lambda: (box.put({"n": 1}), box.put({"n": 2})))
        t.start()
        t.join()
        return await asyncio.wait_for(task, timeout=5.0)

    assert asyncio.run(main()) == [{"n": 1}, {"n": 2}]
    assert box.empty()
    box.put({"n": 3})
    assert box.get_nowait() == {"n": 3}


def test_an_order_sent_to_every_agent_is_encoded_once_and_read_back_as_sent() -> None:
    from unbroken.manager.service import CommandQueues
    from unbroken.protocol.messages import RejoinRanks, decode_order
    from unbroken.protocol.wire import loads
    from unbroken.rpc.channel import Encoded, _dumps

    queues = CommandQueues()
    order = RejoinRanks(generation=4, master_port=29500, source=3, step=17)
    queues.send_all([(f"pod-{i}", 100 + i, order) for i in range(3)])
    items = [queues.of(f"pod-{i}", 100 + i).get_nowait() for i in range(3)]
    assert all(isinstance(item, Encoded) for item in items)
    assert items[0] is items[1] is items[2]  # one encoding for all of them
    assert _dumps(items[0]) == items[0]  # the stream sends it as it is
    assert decode_order(loads(items[0])) == order
