"""The change feed: every job change committed by any replica, to this process's watchers
(reference §9.1).

One poller per process reads, every ``WATCH_POLL_INTERVAL_MS`` and only while
someone watches, the job events above its cursor joined with their jobs (one
query for all watchers, on the events' primary key), and hands each batch to
every :class:`Subscription`. Replicas need not know each other: each reads
what all of them committed.

An event sequence is taken when its row is inserted and becomes visible at
COMMIT, so a lower sequence may appear after a higher one was read. The
:class:`Cursor` remembers the holes below its head and asks for them again for
``WATCH_GAP_SECONDS``; a hole still empty then belongs to a rolled-back
transaction (or one slower than that; its job is re-read by waiters at their
deadline anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection

from job_service import metrics
from job_service.store import statements as st
from job_service.store.records import JobRecord
from job_service.store.tx import Store

log = logging.getLogger(__name__)

#: Most change rows read per poll (a full batch polls again at once).
BATCH_ROWS = 1000
#: Most holes remembered (the lowest are forgotten first).
MAX_GAPS = 1000
#: A jump of the sequence larger than this is not tracked as holes (a restore, a
#: manual insert): its holes are taken as never to be filled.
MAX_JUMP = 10_000
#: Seconds before polling again after a failed poll.
FAILED_POLL_PAUSE = 1.0
#: Most batches queued for one subscriber before it counts as stuck and is dropped.
MAX_QUEUED_BATCHES = 256


@dataclass(frozen=True)
class Change:
    """One change: the job as it is now and the sequence of the event announcing it.

    Attributes:
        seq: the job event's sequence (a cursor over every job's changes).
        job: the job row as read with it (its ``version`` is the ETag).
    """

    seq: int
    job: JobRecord


class Cursor:
    """Where the feed is in the event sequence, with the holes below it.

    Args:
        head: the highest sequence already seen.
        gap_seconds: how long a hole is asked for again.
        max_gaps: most holes remembered.
    """

    def __init__(self, head: int, gap_seconds: float, max_gaps: int = MAX_GAPS) -> None:
        self.head = head
        self.gap_seconds = gap_seconds
        self.max_gaps = max_gaps
        #: sequence → monotonic time after which it is no longer asked for
        self.gaps: dict[int, float] = {}

    def pending_gaps(self, now: float) -> list[int]:
        """The holes still worth asking for at ``now``, ascending (expired ones dropped)."""
        for seq in [s for s, until in self.gaps.items() if until <= now]:
            del self.gaps[seq]
        return sorted(self.gaps)

    def take(self, seqs: list[int], now: float) -> set[int]:
        """Record the sequences a poll returned; returns those never seen before.

        A sequence above the head moves it, the skipped ones becoming holes; a
        sequence that fills a hole is new; anything else was already delivered.
        """
        new: set[int] = set()
        for seq in sorted(seqs):
            if seq in self.gaps:
                del self.gaps[seq]
                new.add(seq)
            elif seq > self.head:
                if seq - self.head <= MAX_JUMP:
                    for hole in range(self.head + 1, seq):
                        self.gaps[hole] = now + self.gap_seconds
                self.head = seq
                new.add(seq)
        if len(self.gaps) > self.max_gaps:
            for hole in sorted(self.gaps)[: len(self.gaps) - self.max_gaps]:
                del self.gaps[hole]
        return new


@dataclass(eq=False)
class Subscription:
    """One watcher's queue of change batches.

    Attributes:
        head: the cursor the subscription starts after.
        queue: batches of :class:`Change` in cursor order; None means the feed
            dropped this subscription (it fell behind, or the feed closed).
    """

    head: int
    queue: asyncio.Queue[list[Change] | None] = field(default_factory=asyncio.Queue)


class ChangeFeed:
    """The process's one change poller and its subscribers (reference §9.1).

    Args:
        store: the job database.
        interval: seconds between polls (``WATCH_POLL_INTERVAL_MS`` / 1000).
        gap_seconds: ``WATCH_GAP_SECONDS``.
    """

    def __init__(self, store: Store, *, interval: float, gap_seconds: float) -> None:
        self.store = store
        self.interval = interval
        self.gap_seconds = gap_seconds
        self._subs: set[Subscription] = set()
        self._cursor: Cursor | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.polls = 0

    @property
    def subscriber_count(self) -> int:
        """How many watchers are subscribed now."""
        return len(self._subs)

    async def subscribe(self) -> Subscription:
        """A new subscription, starting after the current head.

        Starts the poller when it is the first (reading the head first).

        Raises:
            DBAPIError: the head could not be read (the database is down).
        """
        if self._cursor is None or self._task is None or self._task.done():
            head = await self._read_head()
            if self._task is None or self._task.done():
                self._cursor = Cursor(head, self.gap_seconds)
                self._task = asyncio.create_task(self._run(), name="change-feed")
        assert self._cursor is not None
        sub = Subscription(self._cursor.head)
        self._subs.add(sub)
        metrics.WATCHERS.set(len(self._subs))
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget ``sub`` (idempotent); the poller stops with the last one."""
        self._subs.discard(sub)
        metrics.WATCHERS.set(len(self._subs))

    def nudge(self) -> None:
        """Poll now rather than at the next interval (a local commit happened)."""
        self._wake.set()

    async def aclose(self) -> None:
        """Stop the poller and end every subscription (each queue gets None)."""
        for sub in list(self._subs):
            sub.queue.put_nowait(None)
        self._subs.clear()
        metrics.WATCHERS.set(0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _read_head(self) -> int:
        async def read(conn: AsyncConnection) -> int:
            value = (await conn.execute(st.latest_event_seq())).scalar()
            return int(value or 0)

        return await self.store.read(read)

    async def _run(self) -> None:
        while self._subs:
            full, pause = False, self.interval
            try:
                full = await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("job change poll failed", exc_info=True)
                pause = max(FAILED_POLL_PAUSE, self.interval)  # the database is down
            if full:
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=pause)
        self._cursor = None

    async def poll_once(self) -> bool:
        """Read the changes above the cursor (and in its holes) and hand them out.

        Returns:
            True when the read was a full batch (more may be waiting).
        """
        cursor = self._cursor
        if cursor is None:
            return False
        stmt = st.changes_after(cursor.head, cursor.pending_gaps(time.monotonic()), BATCH_ROWS)

        async def read(conn: AsyncConnection) -> list[Change]:
            rows = (await conn.execute(stmt)).all()
            return [Change(int(r.change_seq), JobRecord.from_row(r)) for r in rows]

        found = await self.store.read(read)
        self.polls += 1
        new = cursor.take([c.seq for c in found], time.monotonic())
        latest: dict[str, Change] = {}
        for change in found:
            if change.seq in new:
                latest[change.job.job_id] = change
        if latest:
            self._publish(sorted(latest.values(), key=lambda c: c.seq))
        return len(found) >= BATCH_ROWS

    def _publish(self, batch: list[Change]) -> None:
        metrics.CHANGES_DELIVERED.inc(len(batch))
        for sub in list(self._subs):
            if sub.queue.qsize() >= MAX_QUEUED_BATCHES:
                # stuck: end its stream; the watcher reconnects and re-reads
                self.unsubscribe(sub)
                sub.queue.put_nowait(None)
                continue
            sub.queue.put_nowait(batch)
