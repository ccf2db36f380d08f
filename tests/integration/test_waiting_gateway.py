"""Waiting for a job without polling, over the real gateway and job_service (reference §9.1):
ETags and 304, held GETs, the two event streams, their limit and their clean-up.

Each test runs on SQLite and on MariaDB (``db_url``; MariaDB needs ``TEST_MYSQL_URL``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from job_service.lifecycle import Lease
from tests.integration.waiting_support import (
    Gateway,
    fail_for_good,
    locked_job,
    open_stream,
    start_gateway,
    wait_for,
)
from tests.unit.job_service.conftest import (  # noqa: F401
    Server,
    db_url,
    make_server,
    new_job,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server(
    make_server: Callable[..., Any],  # noqa: F811
) -> Server:
    srv: Server = await make_server(WATCH_POLL_INTERVAL_MS=20)
    return srv


@pytest.fixture
async def gateway(server: Server) -> AsyncIterator[Gateway]:
    gw = await start_gateway(server.app.address, SSE_PING_SECONDS=0.2, SSE_MAX_STREAMS_PER_USER=3)
    yield gw
    await gw.stop()


def _etag(version: int) -> str:
    return f'"{version}"'


async def test_every_get_carries_the_etag_and_a_current_one_is_304(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        first = await http.get(f"/v1/ai/jobs/{job.job_id}")
        assert first.status_code == 200
        assert first.headers["ETag"] == _etag(job.version)
        same = await http.get(
            f"/v1/ai/jobs/{job.job_id}", headers={"If-None-Match": first.headers["ETag"]}
        )
        assert same.status_code == 304 and same.content == b""
        assert same.headers["ETag"] == first.headers["ETag"]
        weak = await http.get(
            f"/v1/ai/jobs/{job.job_id}", headers={"If-None-Match": f'"x", W/{_etag(job.version)}'}
        )
        assert weak.status_code == 304
        locked = await server.domain.lock(job.job_id, "w1")
        stale = await http.get(
            f"/v1/ai/jobs/{job.job_id}", headers={"If-None-Match": first.headers["ETag"]}
        )
        assert stale.status_code == 200
        assert stale.headers["ETag"] == _etag(locked.version) != first.headers["ETag"]
        assert stale.json()["status"] == "locked"


@pytest.mark.parametrize("value", ["61", "-1", "soon"])
async def test_wait_seconds_out_of_range_is_refused(
    server: Server, gateway: Gateway, value: str
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        reply = await http.get(f"/v1/ai/jobs/{job.job_id}", params={"waitSeconds": value})
    assert reply.status_code == 400
    assert reply.json()["code"] == "INVALID_ARGUMENT"


async def test_a_held_get_answers_the_change_as_soon_as_it_is_committed(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        held = asyncio.create_task(
            http.get(
                f"/v1/ai/jobs/{job.job_id}",
                params={"waitSeconds": 30},
                headers={"If-None-Match": _etag(job.version)},
            )
        )
        await wait_for(lambda: gateway.app.state.hub is not None)
        await wait_for(lambda: gateway.hub.connected and gateway.hub.subscriber_count == 1)
        await asyncio.sleep(0.1)
        assert not held.done()  # nothing changed yet: still held
        started = time.monotonic()
        locked = await server.domain.lock(job.job_id, "w1")
        reply = await held
        assert time.monotonic() - started < 1.0
    assert reply.status_code == 200
    assert reply.headers["ETag"] == _etag(locked.version)
    assert reply.json()["status"] == "locked"
    await wait_for(lambda: gateway.hub.subscriber_count == 0)


async def test_a_held_get_without_a_change_is_304_after_wait_seconds(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        started = time.monotonic()
        reply = await http.get(
            f"/v1/ai/jobs/{job.job_id}",
            params={"waitSeconds": 1},
            headers={"If-None-Match": _etag(job.version)},
        )
        assert 0.9 <= time.monotonic() - started < 5
        assert reply.status_code == 304
        # a terminal job can no longer change: 304 at once
        done = await server.domain.cancel(job.job_id, user_id="u1", actor="user:u1")
        started = time.monotonic()
        final = await http.get(
            f"/v1/ai/jobs/{job.job_id}",
            params={"waitSeconds": 30},
            headers={"If-None-Match": _etag(done.version)},
        )
        assert final.status_code == 304 and time.monotonic() - started < 5


async def test_without_if_none_match_the_get_is_held_until_terminal(
    server: Server, gateway: Gateway
) -> None:
    job, lease = await locked_job(server)
    async with gateway.client() as http:
        held = asyncio.create_task(
            http.get(f"/v1/ai/jobs/{job.job_id}", params={"waitSeconds": 30})
        )
        await wait_for(lambda: gateway.app.state.hub is not None)
        await wait_for(lambda: gateway.hub.connected and gateway.hub.subscriber_count == 1)
        await server.domain.start(lease)  # a change, not terminal: still held
        await asyncio.sleep(0.3)
        assert not held.done()
        failed = await fail_for_good(server, lease)
        reply = await held
        assert reply.status_code == 200 and reply.json()["status"] == "failed"
        assert reply.headers["ETag"] == _etag(failed.version)
        pending = await new_job(server.domain)
        timed = await http.get(f"/v1/ai/jobs/{pending.job_id}", params={"waitSeconds": 1})
        assert timed.status_code == 200 and timed.json()["status"] == "pending"


async def test_another_users_job_is_not_found_on_every_route(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain, user_id="u2")
    async with gateway.client("u1") as http:
        for path, params in (
            (f"/v1/ai/jobs/{job.job_id}", {"waitSeconds": 5}),
            (f"/v1/ai/jobs/{job.job_id}/events", {}),
        ):
            reply = await http.get(path, params=params)
            assert reply.status_code == 404, path
            assert reply.json()["code"] == "JOB_NOT_FOUND"
    await wait_for(lambda: gateway.hub.subscriber_count == 0)
    assert gateway.hub.open_streams("u1") == 0


async def test_the_job_stream_sends_each_change_and_ends_after_terminal(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with (
        gateway.client() as http,
        open_stream(http, f"/v1/ai/jobs/{job.job_id}/events") as (response, sse),
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        first = await sse.next()
        assert first is not None and first.event == "job" and first.id == str(job.version)
        body = json.loads(first.data)
        expected = (await http.get(f"/v1/ai/jobs/{job.job_id}")).json()
        assert body == expected  # the same JSON as GET
        await wait_for(lambda: gateway.hub.connected)
        # idle: a ping comment comes (SSE_PING_SECONDS=0.2 here)
        await wait_for(lambda: any(c.startswith(": ping") for c in sse.comments))
        locked = await server.domain.lock(job.job_id, "w1")
        second = await sse.next()
        assert second is not None and second.id == str(locked.version)
        assert json.loads(second.data)["status"] == "locked"
        await server.domain.cancel(job.job_id, user_id="u1", actor="user:u1")
        third = await sse.next()
        assert third is not None and json.loads(third.data)["cancelRequested"] is True
        failed = await server.domain.fail(
            Lease(job.job_id, "w1", locked.attempt_no),
            error_code="CANCELLED",
            error_message="stopped",
        )
        last = await sse.next()
        assert last is not None and last.id == str(failed.version)
        assert json.loads(last.data)["status"] == "cancelled"
        assert await sse.next() is None  # the stream ended
    await wait_for(lambda: gateway.hub.subscriber_count == 0)
    assert gateway.hub.open_streams("u1") == 0


async def test_last_event_id_resumes_and_after_terminal_is_204(
    server: Server, gateway: Gateway
) -> None:
    job, lease = await locked_job(server)
    failed = await fail_for_good(server, lease)
    path = f"/v1/ai/jobs/{job.job_id}/events"
    async with gateway.client() as http:
        done = await http.get(path, headers={"Last-Event-ID": str(failed.version)})
        assert done.status_code == 204
        async with open_stream(http, path, {"Last-Event-ID": str(job.version)}) as (resp, sse):
            assert resp.status_code == 200
            event = await sse.next()
            assert event is not None and event.id == str(failed.version)
            assert await sse.next() is None
        bad = await http.get(path, headers={"Last-Event-ID": "yesterday"})
        assert bad.status_code == 400 and bad.json()["code"] == "INVALID_ARGUMENT"


def _assert_cursor_refused(resp: Any) -> None:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "INVALID_ARGUMENT"
    assert body["details"]["field"] == "Last-Event-ID"


async def test_a_resume_from_a_cursor_above_the_jobs_version_is_400_never_204(
    server: Server, gateway: Gateway
) -> None:
    """A client that keeps one cursor for everything resumes a job's stream with the
    per-user stream's ``Last-Event-ID``: 400 ``INVALID_ARGUMENT`` naming the header, on
    a live job and on a finished one alike (a 204 would tell it to stop reconnecting
    before it learnt how the job ended); nothing stays subscribed (reference §9.1, case N6)."""
    job, lease = await locked_job(server)
    for _ in range(3):
        await new_job(server.domain)  # other jobs move the user's cursor on
    async with gateway.client() as http:
        async with open_stream(http, "/v1/ai/events", {"Last-Event-ID": "0"}) as (_, sse):
            cursors = [int((await sse.next()).id or 0) for _ in range(4)]  # type: ignore[union-attr]
        path = f"/v1/ai/jobs/{job.job_id}/events"
        live = await server.domain.get(job.job_id)
        assert max(cursors) > live.version  # the per-user cursor is not this job's
        for cursor in (max(cursors), 999999, live.version + 1):
            _assert_cursor_refused(await http.get(path, headers={"Last-Event-ID": str(cursor)}))
        failed = await fail_for_good(server, lease)
        for cursor in (max(cursors), 999999, failed.version + 1):
            assert cursor > failed.version
            _assert_cursor_refused(await http.get(path, headers={"Last-Event-ID": str(cursor)}))
        done = await http.get(path, headers={"Last-Event-ID": str(failed.version)})
        assert done.status_code == 204
    await wait_for(lambda: gateway.hub.subscriber_count == 0)
    assert gateway.hub.open_streams("u1") == 0


async def test_the_user_stream_carries_every_job_of_the_user_and_resumes(
    server: Server, gateway: Gateway
) -> None:
    async with gateway.client() as http:
        async with open_stream(http, "/v1/ai/events") as (response, sse):
            assert response.status_code == 200
            await wait_for(lambda: gateway.hub.connected)
            mine = await new_job(server.domain)
            await new_job(server.domain, user_id="u2")  # not the caller's
            created = await sse.next()
            assert created is not None and created.event == "job"
            assert json.loads(created.data)["jobId"] == mine.job_id
            cursor = created.id
            assert cursor is not None and cursor.isdigit()
            cancelled = await server.domain.cancel(mine.job_id, user_id="u1", actor="user:u1")
            change = await sse.next()
            assert change is not None and int(change.id or 0) > int(cursor)
            assert json.loads(change.data)["status"] == "cancelled"
            # it does not end by itself: pings, no end
            await wait_for(lambda: len([c for c in sse.comments if c.startswith(": ping")]) >= 2)
            assert sse._events.empty()
        # resume from the first cursor: the job as it is now, once
        async with open_stream(http, "/v1/ai/events", {"Last-Event-ID": cursor}) as (_, sse):
            again = await sse.next()
            assert again is not None and again.id == change.id
            body = json.loads(again.data)
            assert body["jobId"] == mine.job_id and body["status"] == "cancelled"
            assert cancelled.version >= 1
    await wait_for(lambda: gateway.hub.subscriber_count == 0)


async def test_one_stream_too_many_is_429_and_disconnects_free_everything(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        async with (
            open_stream(http, "/v1/ai/events") as (a, _),
            open_stream(http, f"/v1/ai/jobs/{job.job_id}/events") as (b, _),
            open_stream(http, "/v1/ai/events") as (c, _),
        ):
            assert [a.status_code, b.status_code, c.status_code] == [200, 200, 200]
            assert gateway.hub.open_streams("u1") == 3
            refused = await http.get("/v1/ai/events")
            assert refused.status_code == 429
            assert refused.json()["code"] == "TOO_MANY_STREAMS"
            assert int(refused.headers["Retry-After"]) >= 1
            async with (
                gateway.client("u2") as other,  # the limit is per user
                open_stream(other, "/v1/ai/events") as (d, _),
            ):
                assert d.status_code == 200
            await wait_for(lambda: gateway.hub.connected)
            await wait_for(lambda: gateway.hub.subscriber_count == 3)
            await wait_for(lambda: server.domain.changes.subscriber_count == 1)
        # the client went away: every waiter and slot is freed at once
        await wait_for(lambda: gateway.hub.subscriber_count == 0, within=2)
        assert gateway.hub.open_streams("u1") == 0
        assert gateway.hub.open_streams("u2") == 0
        again = await http.get(f"/v1/ai/jobs/{job.job_id}", params={"waitSeconds": 0})
        assert again.status_code == 200


async def test_with_every_stream_taken_a_resume_that_opens_none_still_answers(
    server: Server, gateway: Gateway
) -> None:
    """With all of a user's stream slots taken, a resume at a finished job's last
    event opens no stream: 204 as with a slot free, and a foreign cursor 400; a
    resume that would stream is 429 ``TOO_MANY_STREAMS`` (reference §9.1)."""
    job, lease = await locked_job(server)
    failed = await fail_for_good(server, lease)
    live = await new_job(server.domain)
    async with (
        gateway.client() as http,
        open_stream(http, "/v1/ai/events") as (a, _),
        open_stream(http, "/v1/ai/events") as (b, _),
        open_stream(http, "/v1/ai/events") as (c, _),
    ):
        assert [a.status_code, b.status_code, c.status_code] == [200, 200, 200]
        path = f"/v1/ai/jobs/{job.job_id}/events"
        done = await http.get(path, headers={"Last-Event-ID": str(failed.version)})
        assert done.status_code == 204
        foreign = str(failed.version + 5)
        _assert_cursor_refused(await http.get(path, headers={"Last-Event-ID": foreign}))
        busy = await http.get(f"/v1/ai/jobs/{live.job_id}/events", headers={"Last-Event-ID": "0"})
        assert busy.status_code == 429 and busy.json()["code"] == "TOO_MANY_STREAMS"
        assert gateway.hub.open_streams("u1") == 3
    await wait_for(lambda: gateway.hub.subscriber_count == 0)


async def test_a_watch_that_drops_reconnects_and_the_waiter_still_gets_the_change(
    server: Server, gateway: Gateway
) -> None:
    job = await new_job(server.domain)
    async with gateway.client() as http:
        held = asyncio.create_task(
            http.get(
                f"/v1/ai/jobs/{job.job_id}",
                params={"waitSeconds": 30},
                headers={"If-None-Match": _etag(job.version)},
            )
        )
        await wait_for(lambda: gateway.app.state.hub is not None)
        await wait_for(lambda: gateway.hub.connected and gateway.hub.subscriber_count == 1)
        connects = gateway.hub.connects
        await server.domain.changes.aclose()  # job_service ends every watch stream
        await wait_for(lambda: gateway.hub.connects > connects)
        locked = await server.domain.lock(job.job_id, "w1")
        reply = await held
    assert reply.status_code == 200 and reply.headers["ETag"] == _etag(locked.version)


async def test_a_lease_renewal_moves_the_etag_but_is_no_event(
    server: Server, gateway: Gateway
) -> None:
    """Case N9: a renewal changes the job's version and ETag, yet wakes no held GET (it
    answers at its deadline, with the latest version) and sends nothing on the streams
    (the next event is the next real change)."""
    job, lease = await locked_job(server)
    started = await server.domain.start(lease)
    path = f"/v1/ai/jobs/{job.job_id}"
    async with gateway.client() as http, open_stream(http, f"{path}/events") as (_, sse):
        first = await sse.next()
        assert first is not None and first.id == str(started.version)
        await wait_for(lambda: gateway.hub.connected and gateway.hub.subscriber_count == 1)
        since = time.monotonic()  # before the GET is sent: its 3 s run from after this
        held = asyncio.create_task(
            http.get(
                path, params={"waitSeconds": 3}, headers={"If-None-Match": _etag(started.version)}
            )
        )
        await wait_for(lambda: gateway.hub.subscriber_count == 2)
        # the GET subscribes, then reads the job: a renewal before that read is a
        # changed version, answered at once; let the read happen first
        await asyncio.sleep(0.5)
        renewed = await server.domain.heartbeat(lease)
        woke_at = time.monotonic() - since  # a GET woken by it would answer about now
        assert renewed.version > started.version and renewed.status == "running"
        reply = await held
        waited = time.monotonic() - since
        assert waited >= 2.9, (waited, woke_at)  # not woken: answered at its deadline
        assert reply.status_code == 200
        assert reply.headers["ETag"] == _etag(renewed.version)
        ended = await fail_for_good(server, lease)
        after = await sse.next()
        assert after is not None and after.id == str(ended.version)  # nothing in between
