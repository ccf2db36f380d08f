"""The worker's slot line: slots handed in order, a stopped wait ends at once,
a slot handed to a job cancelled meanwhile is handed on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from runtime_worker.slots import SlotLine


@dataclass
class Job:
    reason: str | None = None
    slot_wait: asyncio.Future[bool] | None = None


async def test_slots_are_handed_in_line_order() -> None:
    line = SlotLine(1)
    assert await line.take(Job())
    jobs = [Job() for _ in range(3)]
    waits = [asyncio.create_task(line.take(j)) for j in jobs]
    await asyncio.sleep(0)
    for i in range(3):
        line.release()
        await asyncio.sleep(0)
        assert [w.done() for w in waits] == [k <= i for k in range(3)]
    assert [w.result() for w in waits] == [True, True, True]


async def test_a_stopped_job_leaves_the_line_without_a_slot() -> None:
    line = SlotLine(1)
    assert await line.take(Job())
    first, second = Job(), Job()
    waits = [asyncio.create_task(line.take(first)), asyncio.create_task(line.take(second))]
    await asyncio.sleep(0)
    first.reason = "lease_lost"
    SlotLine.stop(first)
    assert await waits[0] is False and first.slot_wait is None
    line.release()  # goes to the second, not the stopped first
    assert await waits[1] is True
    assert not await line.take(Job(reason="shutdown"))  # none idle, stopped: no wait


async def test_a_slot_handed_to_a_job_cancelled_meanwhile_is_handed_on() -> None:
    line = SlotLine(1)
    assert await line.take(Job())
    cancelled, nxt = Job(), Job()
    wait = asyncio.create_task(line.take(cancelled))
    wait_next = asyncio.create_task(line.take(nxt))
    await asyncio.sleep(0)
    line.release()  # handed to the first in line ...
    wait.cancel()  # ... which is cancelled before it runs again
    await asyncio.gather(wait, return_exceptions=True)
    assert wait.cancelled()
    assert await wait_next is True
    line.release()
    assert await line.take(Job())  # the slot came back idle: nothing leaked
