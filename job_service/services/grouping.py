"""Group commit: requests that queue while others commit run together, one transaction a group.

A job service under load receives reports faster than it commits them one by
one: each transaction pays a connection checkout, its round trips and the
COMMIT's log flush. A :class:`GroupCommit` lets at most ``max_in_flight`` groups
run at a time; a request that arrives while they are all busy waits for the
next group, which takes every waiting request (up to ``max_size``). A request
that finds a free turn runs at once, as a group of one: groups form only when
requests queue, so one worker's latency is unchanged and a loaded service
does fewer, larger transactions.

There is one body for every group, whatever its size: it takes 1..N requests
and answers each. Two requests with the same key (the same job) never share a
group: the later one waits for the next. When the body raises, every request
of its group gets that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: A request waiting for its group, and the future its caller awaits.
_Waiting = tuple[T, "asyncio.Future[R]"]


class GroupCommit(Generic[T, R]):
    """Coalesces concurrent requests into groups (module doc).

    Args:
        run: runs a group of one or more requests in one transaction; returns one
            answer per request, in order.
        key: a request's key; requests with equal keys never share a group.
        max_size: most requests in one group (≥ 1).
        max_in_flight: most groups running at once (≥ 1).
        observe: called after each group with its size (metrics).

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        key: Callable[[T], Hashable],
        max_size: int,
        max_in_flight: int,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        if max_size < 1 or max_in_flight < 1:
            raise ValueError("max_size and max_in_flight must be at least 1")
        self._run = run
        self._key = key
        self._observe = observe
        self.max_size = max_size
        self.max_in_flight = max_in_flight
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Groups running now."""
        return self._in_flight

    async def submit(self, item: T) -> R:
        """Run ``item`` in the next group; its answer.

        A request that finds a free turn and nobody waiting runs at once in the
        caller's task (a group of one).

        Raises:
            Exception: what the group's body raised.
        """
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        if self._in_flight < self.max_in_flight and not self._waiting:
            self._in_flight += 1
            await self._flush([(item, future)])
        else:
            self._waiting.append((item, future))
            self._start()
        return await future

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        """The next group: waiting requests in order, one per key, at most ``max_size``."""
        group: list[tuple[T, asyncio.Future[R]]] = []
        left: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        for waiting in self._waiting:
            key = self._key(waiting[0])
            if len(group) < self.max_size and key not in keys:
                keys.add(key)
                group.append(waiting)
            else:
                left.append(waiting)
        self._waiting = left
        return group

    def _start(self) -> None:
        while self._waiting and self._in_flight < self.max_in_flight:
            group = self._take()
            self._in_flight += 1
            task = asyncio.create_task(self._flush(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            answers = await self._run([item for item, _ in group])
            for (_, future), answer in zip(group, answers, strict=True):
                if not future.done():
                    future.set_result(answer)
            if self._observe is not None:
                self._observe(len(group))
        except BaseException as exc:
            for _, future in group:
                if not future.done():
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:  # this task was cancelled (shutdown)
                        future.cancel()
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._start()
