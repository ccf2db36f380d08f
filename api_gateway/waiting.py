"""Waiting for a job without polling (reference §9.1): ETags, held GETs and event streams.

* :func:`get_job` answers ``GET /v1/ai/jobs/{jobId}`` with ``ETag: "<version>"``,
  304 for a current ``If-None-Match``, and holds the answer for ``waitSeconds``.
* :func:`job_events` and :func:`user_events` answer the two ``text/event-stream``
  routes.

They wait on a :class:`~api_gateway.watch.Waiter` of the process's one watch
(:mod:`api_gateway.watch`): no database connection, no polling per waiter. A
lease renewal (heartbeat) bumps a job's version without a job event, so it is
not announced: a held GET still answers the new ETag at its deadline (it reads
the job once more then), and the streams show it with the next change.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from fastapi import Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from airuntime_common.enums import JOB_STATUS
from airuntime_common.errors import AppError, invalid_argument
from airuntime_common.lru import LruCache
from airuntime_common.states import TERMINAL
from api_gateway import convert
from api_gateway.backends import Caller
from api_gateway.watch import RESYNC, JobHub, Waiter
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

#: Longest single sleep of a stream between changes (it sleeps again after).
STREAM_NAP_SECONDS = 3600.0
#: Change rows read per ``ListJobChanges`` page of a per-user stream's catch-up.
CHANGES_PAGE = 500
#: Jobs whose last sent version a per-user stream remembers (oldest forgotten first).
MAX_REMEMBERED_JOBS = 10_000
#: ``(jobId, version)`` → the event's JSON text: a change sent to several streams
#: is serialized once.
_EVENT_DATA: LruCache[tuple[str, int], str] = LruCache(4096)


def etag(job: msg.Job) -> str:
    """The job's ETag header value: its version in double quotes."""
    return f'"{job.version}"'


def etag_matches(header: str | None, job: msg.Job) -> bool:
    """Whether an ``If-None-Match`` value names the job's current ETag (weak
    comparison, RFC 9110 §13.1.2: ``W/"5"`` matches ``"5"``; ``*`` matches)."""
    if header is None:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag == etag(job):
            return True
    return False


def is_terminal(job: msg.Job) -> bool:
    """Whether the job can no longer change (succeeded, failed, cancelled)."""
    return JOB_STATUS.to_str_or_none(job.status) in TERMINAL


def parse_event_id(value: str | None) -> int | None:
    """A ``Last-Event-ID`` as its integer, or None when absent (its declaration holds
    it to 1..18 decimal digits: :data:`api_gateway.headers.EVENT_ID`)."""
    return None if value is None else int(value)


async def read_job(call: Caller, job_id: str, user_id: str) -> msg.Job:
    """The caller's job as it is now (another user's → 404 ``JOB_NOT_FOUND``)."""
    resp = await call(call.job.GetJob, rr.GetJobRequest(job_id=job_id, user_id=user_id))
    job: msg.Job = resp.job
    return job


def job_answer(job: msg.Job, if_none_match: str | None) -> Response:
    """200 with the ``Job`` JSON and its ETag, or 304 (ETag only) when it matches."""
    headers = {"ETag": etag(job)}
    if etag_matches(if_none_match, job):
        return Response(status_code=304, headers=headers)
    return JSONResponse(convert.job_json(job), headers=headers)


async def _until(
    waiter: Waiter,
    call: Caller,
    job: msg.Job,
    *,
    seconds: float,
    done: Callable[[msg.Job], bool],
) -> msg.Job:
    """Sleep on ``waiter`` until ``done(job)`` for the newest job seen, or ``seconds``
    pass (then the job is read once more: unannounced changes count too)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        item = await waiter.next(deadline - loop.time())
        if item is None:
            return await read_job(call, job.job_id, job.user_id)
        fresh = await read_job(call, job.job_id, job.user_id) if item is RESYNC else item.job  # type: ignore[union-attr]
        if fresh.version > job.version:
            job = fresh
        if done(job):
            return job


async def get_job(
    call: Caller,
    hub: JobHub,
    *,
    job_id: str,
    user_id: str,
    wait_seconds: int,
    if_none_match: str | None,
) -> Response:
    """``GET /v1/ai/jobs/{jobId}`` (reference §9.1).

    Args:
        wait_seconds: 0..60. With a matching ``If-None-Match``: held until the job
            changes (200) or the time passes (304); a terminal job answers 304 at
            once. Without one: held until the job is terminal or the time passes,
            then 200 with the job as it is. ``If-None-Match: *`` is never held.

    Raises:
        AppError: 404 ``JOB_NOT_FOUND`` (another user's job too), 503 when
            job_service cannot be reached.
    """
    if wait_seconds <= 0:
        return job_answer(await read_job(call, job_id, user_id), if_none_match)
    waiter = hub.subscribe(job_id=job_id)  # before the read: no change slips between
    try:
        job = await read_job(call, job_id, user_id)
        if if_none_match is not None:
            if etag_matches(if_none_match, job) and not is_terminal(job) and if_none_match != "*":
                seen = job.version
                job = await _until(
                    waiter, call, job, seconds=wait_seconds, done=lambda j: j.version != seen
                )
        elif not is_terminal(job):
            job = await _until(waiter, call, job, seconds=wait_seconds, done=is_terminal)
        return job_answer(job, if_none_match)
    finally:
        hub.unsubscribe(waiter)


def _job_event(job: msg.Job, event_id: int) -> ServerSentEvent:
    key = (job.job_id, job.version)
    data = _EVENT_DATA.get(key)
    if data is None:
        data = json.dumps(convert.job_json(job), separators=(",", ":"))
        _EVENT_DATA.put(key, data)
    return ServerSentEvent(data=data, event="job", id=str(event_id))


class _Release:
    """Frees a stream's waiter and slot exactly once (generator end or response end)."""

    def __init__(self, hub: JobHub, waiter: Waiter, user_id: str) -> None:
        self.hub, self.waiter, self.user_id = hub, waiter, user_id
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.hub.unsubscribe(self.waiter)
            self.hub.release_stream(self.user_id)


def _stream(
    events: AsyncIterator[ServerSentEvent], release: _Release, ping_seconds: float
) -> EventSourceResponse:
    async def guarded() -> AsyncIterator[ServerSentEvent]:
        try:
            async for event in events:
                yield event
        except AppError:
            return  # job_service went away mid-stream: end it, the client reconnects
        finally:
            release()

    return EventSourceResponse(
        guarded(),
        ping=ping_seconds,
        background=BackgroundTask(release),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def job_events(
    call: Caller,
    hub: JobHub,
    *,
    job_id: str,
    user_id: str,
    last_event_id: str | None,
    ping_seconds: float,
) -> Response:
    """``GET /v1/ai/jobs/{jobId}/events`` (reference §9.1): the job as it is, then one
    ``event: job`` per change (``id`` its version), ending after a terminal state.

    ``Last-Event-ID`` resumes after that version; at the terminal event the
    answer is 204 (no stream: stop reconnecting). An id above the job's current
    version was never sent on this stream (a cursor of the per-user stream, say):
    400, never a silent empty stream that the reconnect would turn into a 204
    (reference §9.1).

    Raises:
        AppError: 400 ``INVALID_ARGUMENT`` for a ``Last-Event-ID`` above the job's
            version, 404 ``JOB_NOT_FOUND``,
            429 ``TOO_MANY_STREAMS`` past ``SSE_MAX_STREAMS_PER_USER``.
    """
    last = parse_event_id(last_event_id)
    try:
        hub.take_stream(user_id)
    except AppError as full:
        if last is None:
            raise
        # a resume that opens no stream (at the terminal event, or a foreign cursor)
        # answers as it would with a slot free; any other one is refused
        try:
            _check_resume(await read_job(call, job_id, user_id), last)
        except _NoStream:
            return Response(status_code=204)
        raise full from None
    waiter = hub.subscribe(job_id=job_id)
    release = _Release(hub, waiter, user_id)
    try:
        job = await read_job(call, job_id, user_id)
        if last is not None:
            _check_resume(job, last)
    except _NoStream:
        release()
        return Response(status_code=204)
    except BaseException:
        release()
        raise

    async def events() -> AsyncIterator[ServerSentEvent]:
        current, sent = job, -1 if last is None else last
        while True:
            if current.version > sent:
                yield _job_event(current, current.version)
                sent = current.version
            if is_terminal(current):
                return
            item = await waiter.next(STREAM_NAP_SECONDS)
            if item is None:
                continue
            fresh = await read_job(call, job_id, user_id) if item is RESYNC else item.job  # type: ignore[union-attr]
            if fresh.version > current.version:
                current = fresh

    return _stream(events(), release, ping_seconds)


class _NoStream(Exception):
    """A resume at the job's terminal event: 204, no stream (reference §9.1)."""


def _check_resume(job: msg.Job, last: int) -> None:
    """Judge a resume of ``job``'s stream after version ``last``.

    Raises:
        AppError: 400 ``INVALID_ARGUMENT`` for ``last`` above the job's version.
        _NoStream: ``last`` is the job's terminal event.
    """
    if last > job.version:
        raise invalid_argument(
            f"Last-Event-ID {last} is above the job's version {job.version}: it is not an "
            "event id of this job's stream (a cursor of GET /v1/ai/events, say)",
            field="Last-Event-ID",
        )
    if job.version == last and is_terminal(job):
        raise _NoStream


async def _changes_after(call: Caller, user_id: str, cursor: int) -> list[msg.JobChange]:
    """Every change of the user's jobs after ``cursor``, page after page."""
    found: list[msg.JobChange] = []
    while True:
        resp = await call(
            call.job.ListJobChanges,
            rr.ListJobChangesRequest(user_id=user_id, after_seq=cursor, limit=CHANGES_PAGE),
        )
        found.extend(resp.changes)
        if not resp.more or not resp.changes:
            return found
        cursor = resp.changes[-1].seq


async def user_events(
    call: Caller,
    hub: JobHub,
    *,
    user_id: str,
    last_event_id: str | None,
    ping_seconds: float,
) -> Response:
    """``GET /v1/ai/events`` (reference §9.1): every change of the caller's jobs as
    ``event: job`` with a cursor as ``id``; never ends by itself.

    ``Last-Event-ID`` (a cursor) first replays the jobs changed after it, each
    once as it is now (job events are kept, so far older cursors than 24 h work).

    Raises:
        AppError: 429 ``TOO_MANY_STREAMS``.
    """
    cursor = parse_event_id(last_event_id)
    hub.take_stream(user_id)
    waiter = hub.subscribe(user_id=user_id)
    release = _Release(hub, waiter, user_id)
    try:
        if cursor is None:
            head = await call(call.job.ListJobChanges, rr.ListJobChangesRequest(user_id=user_id))
            start, backlog = int(head.head_seq), []
        else:
            start, backlog = cursor, await _changes_after(call, user_id, cursor)
    except BaseException:
        release()
        raise

    async def events() -> AsyncIterator[ServerSentEvent]:
        sent: dict[str, int] = {}
        position, pending = start, backlog
        while True:
            for change in pending:
                job = change.job
                if job.version > sent.get(job.job_id, -1):
                    sent.pop(job.job_id, None)
                    sent[job.job_id] = job.version
                    if len(sent) > MAX_REMEMBERED_JOBS:
                        del sent[next(iter(sent))]
                    yield _job_event(job, change.seq)
                position = max(position, change.seq)
            item = await waiter.next(STREAM_NAP_SECONDS)
            if item is None:
                pending = []
            elif item is RESYNC:
                pending = await _changes_after(call, user_id, position)
            else:
                pending = [item]  # type: ignore[list-item]

    return _stream(events(), release, ping_seconds)


__all__ = ["etag", "etag_matches", "get_job", "job_events", "user_events"]
