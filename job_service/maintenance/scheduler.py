"""Long-poll wake-ups (reference §2.6).

Long poll: a waiter re-runs the poll query when :class:`JobSignal` fires (a
job became pending in *this* process: create, retry, reaper requeue) and in
any case every :data:`RECHECK_SECONDS` (0.25 s), which is how jobs created or
requeued by *another* replica, or whose ``availableAt`` backoff ran out, are
found. The recheck is one index-backed query per process (:class:`PendingProbe`,
shared by every waiter), so an idle system's cost does not grow with its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

RECHECK_SECONDS = 0.25
log = logging.getLogger(__name__)


class JobSignal:
    """Wakes long-poll waiters of this process when a job becomes pending."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake every current waiter."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> bool:
        """Wait until :meth:`notify` or ``seconds``, whichever is first.

        Returns:
            True when woken by :meth:`notify`, False on timeout.
        """
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(0.0, seconds))
        return event.is_set()


class PendingProbe:
    """One shared "is any job claimable?" query for all long-poll waiters of a process.

    Waiters that found nothing used to re-run their own poll/claim every
    :data:`RECHECK_SECONDS`, so an idle system cost one transaction per waiting
    worker 4 times a second. Now they ask this probe, which runs ``check`` at most
    once per ``every`` seconds however many waiters there are (concurrent askers
    share the query in flight); only a True answer sends them back to claim.
    A failing ``check`` answers True, so the waiters fall back to their own query.

    Args:
        check: the query (True when a pending, available job exists).
        every: seconds a result stays fresh.
    """

    def __init__(self, check: Callable[[], Awaitable[bool]], every: float) -> None:
        self._check = check
        self._every = every
        self._at = float("-inf")
        self._value = False
        self._inflight: asyncio.Future[bool] | None = None

    async def claimable(self) -> bool:
        """The latest answer, refreshed when older than ``every`` seconds."""
        if time.monotonic() - self._at < self._every:
            return self._value
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._inflight)

    async def _run(self) -> bool:
        try:
            value = await self._check()
        except Exception:
            log.warning("pending-job probe failed", exc_info=True)
            value = True
        self._value, self._at, self._inflight = value, time.monotonic(), None
        return value
