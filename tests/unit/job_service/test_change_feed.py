"""The change feed behind ``WatchJobs`` and ``ListJobChanges`` (reference §9.1): a change
committed through one replica reaches a watcher of another; holes in the event
sequence are asked for again; a watcher that leaves is forgotten."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from job_service.maintenance.changes import Cursor
from tests.unit.job_service.conftest import Server, new_job, wait_until
from zhixi.airuntime.job.v1 import request_response_pb2 as rr


def test_cursor_remembers_holes_until_filled_or_expired() -> None:
    cursor = Cursor(head=10, gap_seconds=5)
    assert cursor.take([11, 14], now=0.0) == {11, 14}
    assert cursor.head == 14
    assert cursor.pending_gaps(now=1.0) == [12, 13]
    # a late commit fills a hole: new once, then a duplicate
    assert cursor.take([13], now=1.0) == {13}
    assert cursor.take([13, 14], now=1.0) == set()
    assert cursor.pending_gaps(now=1.0) == [12]
    # a hole nobody fills is given up after gap_seconds
    assert cursor.pending_gaps(now=5.5) == []


def test_cursor_bounds_its_holes() -> None:
    cursor = Cursor(head=0, gap_seconds=5, max_gaps=3)
    cursor.take([10], now=0.0)
    assert cursor.pending_gaps(now=0.0) == [7, 8, 9]
    big = Cursor(head=0, gap_seconds=5)
    big.take([1_000_000], now=0.0)  # a jump is not tracked hole by hole
    assert big.pending_gaps(now=0.0) == []
    assert big.head == 1_000_000


async def _next_changes(stream: Any, job_id: str) -> list[Any]:
    """Read the watch stream until a message carries ``job_id``; its changes of it."""
    async with asyncio.timeout(5.0):
        while True:
            resp = await stream.read()
            assert resp is not grpc.aio.EOF, "watch stream ended"
            found = [c for c in resp.changes if c.job.job_id == job_id]
            if found:
                return found


async def test_a_change_on_one_replica_reaches_the_watcher_of_another(
    make_server: Callable[..., Any],
) -> None:
    a: Server = await make_server(WATCH_POLL_INTERVAL_MS=20)
    b: Server = await make_server(WATCH_POLL_INTERVAL_MS=20)
    stream = b.stub.WatchJobs(rr.WatchJobsRequest(), metadata=b.md())
    first = await stream.read()
    assert not first.changes and first.head_seq >= 0

    job = await new_job(a.domain)
    created = await _next_changes(stream, job.job_id)
    assert created[-1].seq > first.head_seq
    assert created[-1].job.version == job.version

    cancelled = await a.domain.cancel(job.job_id, user_id="u1", actor="user:u1")
    changes = await _next_changes(stream, job.job_id)
    assert changes[-1].job.version == cancelled.version > job.version
    assert changes[-1].seq > created[-1].seq
    assert b.domain.changes.subscriber_count == 1

    stream.cancel()
    await wait_until(lambda: _async(b.domain.changes.subscriber_count == 0))


async def _async(value: bool) -> bool:
    return value


async def test_the_poller_runs_only_while_someone_watches(server: Server) -> None:
    feed = server.domain.changes
    assert feed.subscriber_count == 0
    before = feed.polls
    await asyncio.sleep(0.3)
    assert feed.polls == before  # nobody watches: no queries
    sub = await feed.subscribe()
    await wait_until(lambda: _async(feed.polls > before))
    feed.unsubscribe(sub)


@pytest.mark.parametrize("limit", [0, 1])
async def test_list_job_changes_gives_each_changed_job_of_the_user_once(
    server: Server, limit: int
) -> None:
    head = (
        await server.stub.ListJobChanges(
            rr.ListJobChangesRequest(user_id="u1"), metadata=server.md()
        )
    ).head_seq
    mine = await new_job(server.domain)
    await new_job(server.domain, user_id="u2")
    cancelled = await server.domain.cancel(mine.job_id, user_id="u1", actor="user:u1")
    resp = await server.stub.ListJobChanges(
        rr.ListJobChangesRequest(user_id="u1", after_seq=head, limit=limit or 0),
        metadata=server.md(),
    )
    # the job as it is now, whichever of its changes the page reached
    assert [c.job.job_id for c in resp.changes] == [mine.job_id]
    assert resp.changes[0].job.version == cancelled.version
    if limit == 1:  # one change row read: the creation's cursor, more to come
        assert resp.changes[0].seq < resp.head_seq and resp.more
        return
    assert not resp.more
    again = await server.stub.ListJobChanges(
        rr.ListJobChangesRequest(user_id="u1", after_seq=resp.changes[0].seq),
        metadata=server.md(),
    )
    assert list(again.changes) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.ListJobChanges(
            rr.ListJobChangesRequest(user_id="u1", after_seq=0, limit=5000), metadata=server.md()
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_watching_needs_the_service_token(server: Server) -> None:
    stream = server.stub.WatchJobs(rr.WatchJobsRequest(), metadata=(("x-internal-api-key", "no"),))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stream.read()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.domain.changes.subscriber_count == 0


async def test_a_quiet_watch_sends_keepalives(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from job_service.rpc import watch as watch_rpc

    monkeypatch.setattr(watch_rpc, "KEEPALIVE_SECONDS", 0.05)
    stream = server.stub.WatchJobs(rr.WatchJobsRequest(), metadata=server.md())
    await stream.read()
    async with asyncio.timeout(5):
        quiet = await stream.read()
    assert quiet is not grpc.aio.EOF and not quiet.changes
    stream.cancel()
