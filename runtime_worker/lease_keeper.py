"""Keeps the worker's leases alive with ONE batched heartbeat (reference §2.3, §3).

Every ``HEARTBEAT_INTERVAL_SECONDS`` all in-flight leases are renewed with one
``HeartbeatLeases`` call. A lease answered ``held=false`` is lost (expired and
perhaps re-locked by another worker): its job is stopped at once and nothing
more is reported for it. ``cancel_requested=true`` stops the job's model call
so the worker acknowledges with ``FailJob(CANCELLED)`` (case C1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from airuntime_common.errors import AppError

log = logging.getLogger(__name__)


class LeaseHolder(Protocol):
    """What the keeper needs from an in-flight job."""

    job_id: str
    attempt_no: int

    def lease_lost(self) -> None:
        """The lease is gone: stop now, report nothing."""

    def cancel_requested(self) -> None:
        """A cancel was requested: stop the model call, then FailJob(CANCELLED)."""


class HeartbeatClient(Protocol):
    """The one RPC the keeper calls."""

    async def heartbeat_leases(self, leases: list[tuple[str, int]]) -> list[Any]:
        """One ``LeaseState`` per lease, in order."""
        ...


@dataclass
class LeaseCheck:
    """A single lease's state after a heartbeat."""

    held: bool
    cancel_requested: bool


class LeaseKeeper:
    """Renews every registered lease on a fixed period.

    Args:
        client: something with ``heartbeat_leases`` (the :class:`~runtime_worker.client.RuntimeClient`).
        interval: seconds between batched heartbeats.
        on_beat: optional hook called after each successful beat (for metrics/tests).
    """

    def __init__(
        self,
        client: HeartbeatClient,
        interval: float,
        on_beat: Callable[[int], None] | None = None,
    ) -> None:
        self._client = client
        self._interval = interval
        self._holders: dict[tuple[str, int], LeaseHolder] = {}
        self._on_beat = on_beat
        self._task: asyncio.Task[None] | None = None
        self.beats = 0

    def register(self, holder: LeaseHolder) -> None:
        """Start renewing ``holder``'s lease."""
        self._holders[(holder.job_id, holder.attempt_no)] = holder

    def unregister(self, holder: LeaseHolder) -> None:
        """Stop renewing ``holder``'s lease (its attempt ended)."""
        self._holders.pop((holder.job_id, holder.attempt_no), None)

    @property
    def leases(self) -> list[tuple[str, int]]:
        """The ``(jobId, attemptNo)`` pairs currently renewed."""
        return list(self._holders)

    async def beat_once(self) -> None:
        """Renew every registered lease with one call and act on the answers.

        A failed call is logged and skipped (the next beat tries again; a lease
        that lapses meanwhile is refused on the next report, case L2).
        """
        keys = list(self._holders)
        if not keys:
            return
        try:
            states = await self._client.heartbeat_leases(keys)
        except AppError as exc:
            log.warning(
                "lease heartbeat failed: %s",
                exc.code,
                extra={"fields": {"leases": len(keys), "code": exc.code}},
            )
            return
        self.beats += 1
        for key, state in zip(keys, states, strict=False):
            holder = self._holders.get(key)
            if holder is None:
                continue
            if not state.held:
                log.warning(
                    "lease lost; stopping the job",
                    extra={"fields": {"jobId": key[0], "attemptNo": key[1]}},
                )
                self.unregister(holder)
                holder.lease_lost()
            elif state.cancel_requested:
                holder.cancel_requested()
        if self._on_beat is not None:
            self._on_beat(len(keys))

    async def check(self, job_id: str, attempt_no: int) -> LeaseCheck:
        """Heartbeat one lease now (before starting a job held a while).

        Raises:
            AppError: when job_service cannot be reached.
        """
        states = await self._client.heartbeat_leases([(job_id, attempt_no)])
        if not states:
            return LeaseCheck(held=False, cancel_requested=False)
        return LeaseCheck(
            held=bool(states[0].held), cancel_requested=bool(states[0].cancel_requested)
        )

    async def run(self) -> None:
        """Beat every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.beat_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the keeper die
                log.exception("lease keeper beat crashed")

    def start(self) -> None:
        """Run :meth:`run` in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="lease-keeper")

    async def stop(self) -> None:
        """Stop the background task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
