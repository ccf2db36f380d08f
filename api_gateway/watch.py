"""The gateway's one watch of job changes and its local fan-out (reference §9.1).

:class:`JobHub` keeps one ``JobService.WatchJobs`` stream per gateway process
(opened on the first waiter, closed after :data:`IDLE_SECONDS` without any)
and hands each change to the :class:`Waiter` objects of the held requests and
event streams that follow its job or its user. No waiter holds a database
connection or polls: they sleep on their own queue.

A change can be missed only while the stream is down; so every (re)connect
puts :data:`RESYNC` in every waiter's queue, and the waiter re-reads what it
follows (``GetJob``, ``ListJobChanges``). A waiter whose queue overflows (a
slow client) gets its queue replaced by one :data:`RESYNC` as well.

It also counts each user's open event streams against
``SSE_MAX_STREAMS_PER_USER`` (per gateway process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.metadata import outgoing
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

log = logging.getLogger(__name__)

#: Seconds the watch stream stays open with no waiter left.
IDLE_SECONDS = 30.0
#: Most changes queued for one waiter; past it the queue becomes one RESYNC.
MAX_QUEUED = 1000
#: Seconds of silence after which the watch counts as dead and is re-opened
#: (job_service sends a keepalive every 10 s): a half-open connection is noticed.
STALE_SECONDS = 35.0


class _Resync:
    """The marker "changes may have been missed: re-read"."""

    def __repr__(self) -> str:
        return "RESYNC"


#: Queued when changes may have been missed (the watch reconnected, the queue overflowed).
RESYNC: Final = _Resync()

Item = msg.JobChange | _Resync


@dataclass(eq=False)
class Waiter:
    """One held request or event stream following a job or a user's jobs.

    Attributes:
        job_id: the job followed, or None.
        user_id: the user whose jobs are followed, or None.
        queue: changes (``JobChange``) and :data:`RESYNC` markers, oldest first.
    """

    job_id: str | None
    user_id: str | None
    queue: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)

    async def next(self, seconds: float) -> Item | None:
        """The next change or RESYNC, or None after ``seconds`` (≤ 0: no wait)."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        if seconds <= 0:
            return None
        try:
            return await asyncio.wait_for(self.queue.get(), seconds)
        except TimeoutError:
            return None

    def put(self, item: Item) -> None:
        """Queue ``item``; a full queue is replaced by one RESYNC."""
        if self.queue.qsize() >= MAX_QUEUED:
            while not self.queue.empty():
                self.queue.get_nowait()
            item = RESYNC
        self.queue.put_nowait(item)


class JobHub:
    """The watch stream of one gateway process and its waiters.

    Args:
        job_stub: the ``JobServiceStub`` to watch through.
        token: ``RUNTIME_SERVICE_TOKEN``.
        max_streams_per_user: ``SSE_MAX_STREAMS_PER_USER``.
        reconnect_seconds: pause before re-opening a watch that failed.
        idle_seconds: how long the watch stays open without waiters.
        stale_seconds: silence after which the watch is re-opened.
    """

    def __init__(
        self,
        job_stub: Any,
        token: str,
        *,
        max_streams_per_user: int,
        reconnect_seconds: float = 0.5,
        idle_seconds: float = IDLE_SECONDS,
        stale_seconds: float = STALE_SECONDS,
    ) -> None:
        self.job_stub = job_stub
        self.token = token
        self.max_streams_per_user = max_streams_per_user
        self.reconnect_seconds = reconnect_seconds
        self.idle_seconds = idle_seconds
        self.stale_seconds = stale_seconds
        self._by_job: dict[str, set[Waiter]] = {}
        self._by_user: dict[str, set[Waiter]] = {}
        self._streams: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        #: True while the watch stream is open and has answered.
        self.connected = False
        #: Times the watch has (re)connected.
        self.connects = 0

    # -- waiters --------------------------------------------------------------------

    @property
    def subscriber_count(self) -> int:
        """How many waiters are registered now."""
        return sum(map(len, self._by_job.values())) + sum(map(len, self._by_user.values()))

    def subscribe(self, *, job_id: str | None = None, user_id: str | None = None) -> Waiter:
        """Register a waiter on one job (``job_id``) or on all of a user's jobs
        (``user_id``), and make sure the watch is open."""
        waiter = Waiter(job_id, user_id)
        if job_id is not None:
            self._by_job.setdefault(job_id, set()).add(waiter)
        else:
            assert user_id is not None, "subscribe to a job or to a user"
            self._by_user.setdefault(user_id, set()).add(waiter)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="job-watch")
        return waiter

    def unsubscribe(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (idempotent); the last one starts the idle timer."""
        index, key = (
            (self._by_job, waiter.job_id)
            if waiter.job_id is not None
            else (self._by_user, waiter.user_id)
        )
        group = index.get(key or "")
        if group is not None:
            group.discard(waiter)
            if not group:
                del index[key or ""]
        idle = not self._by_job and not self._by_user
        if idle and self._task is not None and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(
                self.idle_seconds, self._stop_if_idle
            )

    # -- stream slots ---------------------------------------------------------------

    def open_streams(self, user_id: str) -> int:
        """How many event streams ``user_id`` has open on this gateway."""
        return self._streams.get(user_id, 0)

    def take_stream(self, user_id: str) -> None:
        """Take one of ``user_id``'s stream slots.

        Raises:
            AppError: 429 ``TOO_MANY_STREAMS`` when all ``SSE_MAX_STREAMS_PER_USER``
                are taken (reference §9.1).
        """
        held = self._streams.get(user_id, 0)
        if held >= self.max_streams_per_user:
            raise AppError(
                ErrorCode.TOO_MANY_STREAMS,
                "too many open event streams; close one first",
                {"maxStreams": self.max_streams_per_user},
            )
        self._streams[user_id] = held + 1

    def release_stream(self, user_id: str) -> None:
        """Give back a slot taken by :meth:`take_stream`."""
        held = self._streams.get(user_id, 0) - 1
        if held > 0:
            self._streams[user_id] = held
        else:
            self._streams.pop(user_id, None)

    # -- the watch ------------------------------------------------------------------

    def _stop_if_idle(self) -> None:
        self._idle = None
        if not self._by_job and not self._by_user and self._task is not None:
            self._task.cancel()
            self._task = None
            self.connected = False

    async def aclose(self) -> None:
        """Close the watch and wake every waiter with RESYNC."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.connected = False

    async def _run(self) -> None:
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning("job watch stream failed: %s", exc.code().name)
            except TimeoutError:
                log.warning("job watch stream silent for %s s: re-opening", self.stale_seconds)
            except Exception:
                log.warning("job watch stream failed", exc_info=True)
            self.connected = False
            await asyncio.sleep(self.reconnect_seconds)

    async def _watch_once(self) -> None:
        call = self.job_stub.WatchJobs(
            rr.WatchJobsRequest(), metadata=outgoing(self.token, None, None)
        )
        try:
            while True:
                resp = await asyncio.wait_for(call.read(), self.stale_seconds)
                if resp is grpc.aio.EOF:
                    return
                if not self.connected:
                    self.connected = True
                    self.connects += 1
                    self._broadcast(RESYNC)
                for change in resp.changes:
                    self._dispatch(change)
        finally:
            call.cancel()

    def _broadcast(self, item: Item) -> None:
        for group in (*self._by_job.values(), *self._by_user.values()):
            for waiter in group:
                waiter.put(item)

    def _dispatch(self, change: msg.JobChange) -> None:
        for waiter in self._by_job.get(change.job.job_id, ()):
            waiter.put(change)
        for waiter in self._by_user.get(change.job.user_id, ()):
            waiter.put(change)
