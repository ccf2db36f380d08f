"""The gateway's job watch (reference §9.1): fan-out by job and by user, re-opening a watch
that ended or went silent (every waiter then re-reads), overflow, idle close, and the
per-user stream slots. A fake stub stands in for job_service."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from airuntime_common.errors import AppError, ErrorCode
from api_gateway import watch
from api_gateway.watch import RESYNC, JobHub
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr


class FakeCall:
    """A WatchJobs call: answers what is pushed, in order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.queue.put_nowait(rr.WatchJobsResponse(head_seq=1))
        self.cancelled = False

    async def read(self) -> Any:
        return await self.queue.get()

    def cancel(self) -> None:
        self.cancelled = True


class FakeStub:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def WatchJobs(self, request: Any, metadata: Any) -> FakeCall:
        call = FakeCall()
        self.calls.append(call)
        return call


def change(job_id: str, user_id: str, version: int, seq: int) -> msg.JobChange:
    return msg.JobChange(seq=seq, job=msg.Job(job_id=job_id, user_id=user_id, version=version))


def hub(stub: FakeStub, **kw: Any) -> JobHub:
    return JobHub(stub, "token", max_streams_per_user=2, reconnect_seconds=0.01, **kw)


async def until(pred: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_changes_reach_the_waiters_of_their_job_and_user_only() -> None:
    stub = FakeStub()
    h = hub(stub)
    by_job = h.subscribe(job_id="j1")
    by_user = h.subscribe(user_id="u1")
    other = h.subscribe(job_id="j2")
    await until(lambda: h.connected)
    for w in (by_job, by_user, other):
        assert await w.next(1) is RESYNC  # the first connect: re-read
    stub.calls[0].queue.put_nowait(rr.WatchJobsResponse(changes=[change("j1", "u1", 3, 10)]))
    got = await by_job.next(1)
    assert isinstance(got, msg.JobChange) and got.job.version == 3
    got = await by_user.next(1)
    assert isinstance(got, msg.JobChange) and got.seq == 10
    assert await other.next(0.05) is None
    for w in (by_job, by_user, other):
        h.unsubscribe(w)
    assert h.subscriber_count == 0
    await h.aclose()


@pytest.mark.parametrize("how", ["ended", "silent", "failed"])
async def test_a_watch_that_ends_or_goes_silent_is_reopened_and_waiters_re_read(
    how: str,
) -> None:
    stub = FakeStub()
    h = hub(stub, stale_seconds=0.2)
    waiter = h.subscribe(job_id="j1")
    await until(lambda: h.connected)
    assert await waiter.next(1) is RESYNC
    first = stub.calls[0]
    if how == "ended":
        first.queue.put_nowait(grpc.aio.EOF)
    elif how == "failed":
        first.queue.put_nowait(None)  # a broken answer: the read raises
    # "silent": nothing at all, not even a keepalive
    await until(lambda: h.connects == 2)
    assert first.cancelled
    assert await waiter.next(1) is RESYNC
    h.unsubscribe(waiter)
    await h.aclose()


async def test_an_overflowing_waiter_gets_one_resync_instead(monkeypatch: Any) -> None:
    monkeypatch.setattr(watch, "MAX_QUEUED", 3)
    stub = FakeStub()
    h = hub(stub)
    waiter = h.subscribe(user_id="u1")
    await until(lambda: h.connected)
    stub.calls[0].queue.put_nowait(
        rr.WatchJobsResponse(changes=[change(f"j{i}", "u1", 1, i) for i in range(10)])
    )
    await until(lambda: waiter.queue.qsize() >= 1 and stub.calls[0].queue.empty())
    items = []
    while (item := await waiter.next(0)) is not None:
        items.append(item)
    assert RESYNC in items and len(items) <= 3
    h.unsubscribe(waiter)
    await h.aclose()


async def test_the_watch_closes_once_idle() -> None:
    stub = FakeStub()
    h = hub(stub, idle_seconds=0.05)
    waiter = h.subscribe(job_id="j1")
    await until(lambda: h.connected)
    h.unsubscribe(waiter)
    await until(lambda: stub.calls[0].cancelled)
    assert not h.connected
    again = h.subscribe(job_id="j1")  # a new waiter opens a new watch
    await until(lambda: len(stub.calls) == 2 and h.connected)
    h.unsubscribe(again)
    await h.aclose()


def test_stream_slots_per_user() -> None:
    h = hub(FakeStub())
    h.take_stream("u1")
    h.take_stream("u1")
    h.take_stream("u2")
    with pytest.raises(AppError) as err:
        h.take_stream("u1")
    assert err.value.code == ErrorCode.TOO_MANY_STREAMS
    h.release_stream("u1")
    h.take_stream("u1")
    for _ in range(2):
        h.release_stream("u1")
    assert h.open_streams("u1") == 0 and h.open_streams("u2") == 1
