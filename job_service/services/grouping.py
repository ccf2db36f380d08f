"""Group commit: concurrent requests of one kind run together, one transaction a group.

A job service under load receives results faster than it commits them one by one:
each transaction pays a connection checkout, its round trips, the server's
statements of the claim that rides on it, and the COMMIT's log flush. A
:class:`GroupCommit` lets at most ``max_in_flight`` groups run at a time; a
request that arrives while they are all busy waits for the next group, which
takes every waiting request (up to ``max_size``). Alone, a request runs on its
own path at once: groups form only when requests queue, so one slot's latency
is unchanged and a loaded service does fewer, larger transactions.

A group's body decides which of its requests it can take (the common case) and
leaves the others (``None``) to their own path, run after the group's
transaction has ended; when the group's body raises, every request of the group
runs on its own path, so each gets the answer or error it would have had alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("job_service.grouping")


class GroupCommit(Generic[T, R]):
    """Coalesces concurrent requests into groups (module doc).

    Args:
        run_group: runs a group of two or more requests in one transaction; returns
            one answer per request, ``None`` for a request it left to ``run_one``.
        run_one: runs one request on its own (its own transaction); its answer or
            error is the caller's.
        max_size: most requests in one group (≥ 1).
        max_in_flight: most groups (or lone requests) running at once (≥ 1).
        observe: called after each group of two or more with its size and how many
            of its requests ran alone (metrics).

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(
        self,
        run_group: Callable[[list[T]], Awaitable[Sequence[R | None]]],
        run_one: Callable[[T], Awaitable[R]],
        *,
        max_size: int,
        max_in_flight: int,
        observe: Callable[[int, int], None] | None = None,
    ) -> None:
        if max_size < 1 or max_in_flight < 1:
            raise ValueError("max_size and max_in_flight must be at least 1")
        self._run_group = run_group
        self._run_one = run_one
        self._observe = observe
        self.max_size = max_size
        self.max_in_flight = max_in_flight
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Groups (or lone requests) running now."""
        return self._in_flight

    async def submit(self, item: T) -> R:
        """Run ``item``, in a group when others wait with it; its answer.

        Raises:
            Exception: what ``run_one`` raises for it (a group never raises to a caller).
        """
        if self._in_flight < self.max_in_flight and not self._waiting:
            self._in_flight += 1
            try:
                return await self._run_one(item)
            finally:
                self._in_flight -= 1
                self._start()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._start()
        return await future

    def _start(self) -> None:
        while self._waiting and self._in_flight < self.max_in_flight:
            group = self._waiting[: self.max_size]
            del self._waiting[: self.max_size]
            self._in_flight += 1
            task = asyncio.create_task(self._flush(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            answers: Sequence[R | None] = [None] * len(group)
            if len(group) > 1:
                try:
                    answers = await self._run_group([item for item, _ in group])
                except Exception:  # each request then runs alone: its own answer or error
                    log.debug("group of %d fell back to one transaction each", len(group))
                    answers = [None] * len(group)
            alone = []
            for (item, future), answer in zip(group, answers, strict=True):
                if answer is None:
                    alone.append(self._alone(item, future))
                elif not future.done():
                    future.set_result(answer)
            if len(group) > 1 and self._observe is not None:
                self._observe(len(group), len(alone))
            if alone:
                await asyncio.gather(*alone)
        finally:
            for _, future in group:
                if not future.done():  # this task was cancelled (shutdown)
                    future.cancel()
            self._in_flight -= 1
            self._start()

    async def _alone(self, item: T, future: asyncio.Future[R]) -> None:
        try:
            answer = await self._run_one(item)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(answer)
