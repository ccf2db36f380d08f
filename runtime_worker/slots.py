"""The worker's slots for model work, handed in claim order to the jobs held ahead.

``WORKER_CONCURRENCY`` jobs do their model work at once. A job claimed beyond them
(``WORKER_PREFETCH``) waits in line, leased and started, until a slot is handed to
it; a job stopped while it waits (lease lost, cancel requested, shutdown) leaves
the line at once instead of waiting for a slot it would not use. Unlike an
``asyncio.Semaphore``, a wait ends either way without cancelling a task.

How many jobs to hold ahead is bounded by time as well (:class:`PrefetchBound`):
long model calls hold none ahead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Protocol

#: weight of the newest model work time in the mean that bounds the jobs held ahead
WORK_WEIGHT = 0.2


class Waiter(Protocol):
    """What the line needs of a job: why it was stopped (None: not stopped), and the
    slot it waits for, which its stop answers ``False`` (:meth:`SlotLine.stop`)."""

    reason: str | None
    slot_wait: asyncio.Future[bool] | None


class SlotLine:
    """``slots`` slots; the jobs that find none free wait in line, first come first served.

    Args:
        slots: how many jobs may hold a slot at once (≥ 1).
    """

    def __init__(self, slots: int) -> None:
        self._idle = slots
        self._line: collections.deque[asyncio.Future[bool]] = collections.deque()

    async def take(self, job: Waiter) -> bool:
        """Wait for a slot for ``job`` (at once when one is idle and nobody waits).

        Returns:
            True with the slot taken (give it back with :meth:`release`); False when
            ``job`` was stopped before one was handed to it.
        """
        if self._idle > 0 and not self._line:
            self._idle -= 1
            return True
        if job.reason is not None:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        job.slot_wait = waiter
        self._line.append(waiter)
        try:
            return await waiter
        except BaseException:
            # cancelled just after the slot was handed over: hand it on
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()
            raise
        finally:
            job.slot_wait = None
            with contextlib.suppress(ValueError):
                self._line.remove(waiter)

    def release(self) -> None:
        """Give a slot back: to the first job in line still waiting, else idle."""
        while self._line:
            waiter = self._line.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self._idle += 1

    @staticmethod
    def stop(job: Waiter) -> None:
        """``job`` was stopped: if it waits in line, its wait ends with False."""
        if job.slot_wait is not None and not job.slot_wait.done():
            job.slot_wait.set_result(False)


class PrefetchBound:
    """How many jobs to hold ahead of ``slots`` slots: ``most`` (``WORKER_PREFETCH``),
    and once model work has been seen to end, at most as many as the slots reach within
    ``max_wait_s`` (``WORKER_PREFETCH_MAX_WAIT_MS`` in seconds; 0 = no bound).

    Args:
        slots: the slots for model work (``WORKER_CONCURRENCY``, ≥ 1).
        most: the most jobs held ahead (``WORKER_PREFETCH``, ≥ 0).
        max_wait_s: the longest a held job should wait for a slot (s).
    """

    def __init__(self, slots: int, most: int, max_wait_s: float) -> None:
        self.slots = slots
        self.most = most
        self.max_wait_s = max_wait_s
        #: mean seconds a slot's model work takes (moving average; None: none ended yet)
        self.work_seconds: float | None = None

    def held_ahead(self) -> int:
        """Jobs to hold ahead now: ``most``, at most ``max_wait_s × slots / work_seconds``."""
        if self.most == 0 or self.max_wait_s <= 0 or not self.work_seconds:
            return self.most
        return min(self.most, int(self.max_wait_s * self.slots / self.work_seconds))

    def observe(self, seconds: float) -> None:
        """One slot's model work took ``seconds``: the moving average :meth:`held_ahead`
        reads (weight :data:`WORK_WEIGHT` to the newest; the first sets it)."""
        mean = self.work_seconds
        self.work_seconds = seconds if mean is None else mean + WORK_WEIGHT * (seconds - mean)


__all__ = ["PrefetchBound", "SlotLine", "Waiter"]
