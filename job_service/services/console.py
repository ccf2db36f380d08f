"""The operator console's reads (reference §9.5): job counts for a filter, a job explained
attempt by attempt, and jobs ended per minute with the failure rate.

Reads only; every query is named in :mod:`job_service.store.statements`
(``job_counts``, ``throughput``, ``events_of_job``, ``invocations_of_job``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.states import LEASED, JobStatus
from job_service.services.core import Core
from job_service.store import statements as st
from job_service.store.records import EventRecord, InvocationRecord, JobRecord

#: ``hours`` of the jobs-per-minute view: default and bounds.
DEFAULT_THROUGHPUT_HOURS = 6
MAX_THROUGHPUT_HOURS = 168
#: The states in the order the console lists them (``expired`` is only a step inside
#: one reaper transaction, never where a job rests).
STATES: tuple[str, ...] = tuple(s.value for s in JobStatus if s is not JobStatus.EXPIRED)
_RUNTIME_PREFIX = "runtime:"


@dataclass(frozen=True)
class AttemptView:
    """One attempt (``attempt_no`` ≥ 1) of a job: its events and model calls, oldest first.

    Attributes:
        runtime_instance_id: who held its lease (the actor of its lock event).
        started_at, ended_at: its first and last event's time.
        outcome: the state its ending left the job in (``pending`` for a retry,
            ``succeeded``, ``failed``, ``cancelled``); None while it runs.
        error_code: the ending's code, if any.
        latency_ms, cost_usd: sums over its model calls.
    """

    attempt_no: int
    runtime_instance_id: str | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    error_code: str | None
    events: list[EventRecord] = field(default_factory=list)
    invocations: list[InvocationRecord] = field(default_factory=list)
    latency_ms: int = 0
    cost_usd: Decimal = Decimal(0)


@dataclass(frozen=True)
class SnapshotSummaryView:
    """What a snapshot holds, without its text: sizes and the payload's ``stats``."""

    snapshot_id: str
    schema_version: str
    target_type: str
    target_id: str
    content_hash: str
    payload_bytes: int
    material_count: int
    block_count: int
    knowledge_point_count: int
    stats: dict[str, Any]


@dataclass(frozen=True)
class JobExplanation:
    """A job's whole story: events and model calls, grouped into attempts, and its snapshot."""

    job: JobRecord
    events: list[EventRecord]
    invocations: list[InvocationRecord]
    attempts: list[AttemptView]
    snapshot: SnapshotSummaryView | None


@dataclass(frozen=True)
class ThroughputView:
    """Jobs ended per minute in ``[since, until)``.

    Attributes:
        minutes: ``(minute start, succeeded, failed, cancelled)``, only minutes in
            which a job ended, oldest first.
        failure_rate: ``failed / (succeeded + failed)`` over the window (cancelled
            jobs are neither); None when no job succeeded or failed.
    """

    since: datetime
    until: datetime
    minutes: list[tuple[datetime, int, int, int]]
    succeeded: int
    failed: int
    cancelled: int
    failure_rate: float | None


def check_created_range(created_from: datetime | None, created_to: datetime | None) -> None:
    """A creation-time filter must be a non-empty range.

    Raises:
        AppError: INVALID_ARGUMENT (``createdFrom``) when ``created_from >= created_to``.
    """
    if created_from is not None and created_to is not None and created_from >= created_to:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "createdFrom must be before createdTo",
            {"field": "createdFrom"},
        )


def attempts_of(
    events: Sequence[EventRecord], invocations: Sequence[InvocationRecord]
) -> list[AttemptView]:
    """Group a job's events and model calls by attempt (reference §9.5 timeline).

    Events of attempt 0 (the creation, a cancel while pending) belong to no
    attempt. An attempt ends with its first event that leaves a leased state (a
    cancel request on a leased job stays in it and is not an ending); when that
    is the reaper's ``expired`` step, the next event says where the job went.
    """
    numbers = sorted(
        {e.attempt_no for e in events if e.attempt_no >= 1}
        | {i.attempt_no for i in invocations if i.attempt_no >= 1}
    )
    out: list[AttemptView] = []
    for number in numbers:
        evs = [e for e in events if e.attempt_no == number]
        invs = [i for i in invocations if i.attempt_no == number]
        ending = _ending(evs)
        holder = next((e.actor for e in evs if e.to_status == JobStatus.LOCKED), None)
        out.append(
            AttemptView(
                attempt_no=number,
                runtime_instance_id=holder.removeprefix(_RUNTIME_PREFIX)
                if holder and holder.startswith(_RUNTIME_PREFIX)
                else holder,
                started_at=evs[0].at if evs else None,
                ended_at=ending.at if ending else None,
                outcome=ending.to_status if ending else None,
                error_code=ending.error_code if ending else None,
                events=evs,
                invocations=invs,
                latency_ms=sum(i.latency_ms for i in invs),
                cost_usd=sum((Decimal(i.cost_usd) for i in invs), Decimal(0)),
            )
        )
    return out


def _ending(events: Sequence[EventRecord]) -> EventRecord | None:
    """The event that ended an attempt (see :func:`attempts_of`), or None while it runs."""
    for index, event in enumerate(events):
        if event.from_status in LEASED and event.to_status not in LEASED:
            if event.to_status == JobStatus.EXPIRED and index + 1 < len(events):
                step = events[index + 1]
                return replace(step, error_code=step.error_code or event.error_code)
            return event
    return None


def summarize_snapshot(view: Any) -> SnapshotSummaryView:
    """A snapshot view (:class:`~job_service.services.ports.SnapshotView`) → its summary."""
    payload = view.payload if isinstance(view.payload, dict) else {}
    stats = payload.get("stats")

    def count(key: str) -> int:
        value = payload.get(key)
        return len(value) if isinstance(value, list) else 0

    raw = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)
    return SnapshotSummaryView(
        snapshot_id=view.snapshot_id,
        schema_version=view.schema_version,
        target_type=view.target_type,
        target_id=view.target_id,
        content_hash=view.content_hash,
        payload_bytes=len(raw.encode("utf-8")),
        material_count=count("materials"),
        block_count=count("blocks"),
        knowledge_point_count=count("knowledgePoints"),
        stats=stats if isinstance(stats, dict) else {},
    )


def _minute(text: str) -> datetime:
    """``'YYYY-MM-DD HH:MM'`` (the database's group key) → the minute's start."""
    return datetime.strptime(text[:16], "%Y-%m-%d %H:%M")


class Console:
    """The console's reads on the shared core.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    async def job_counts(
        self,
        *,
        user_id: str | None,
        job_type: str | None,
        created_from: datetime | None,
        created_to: datetime | None,
    ) -> dict[str, int]:
        """Exact counts per state (every state, zeros included) of the jobs matching
        the filters but the status (reference §9.5); one GROUP BY.

        Raises:
            AppError: INVALID_ARGUMENT for an empty creation range.
        """
        check_created_range(created_from, created_to)
        stmt = st.job_counts(
            user_id=user_id, job_type=job_type, created_from=created_from, created_to=created_to
        )
        async with self.core.store.sessions() as session:
            rows = (await session.execute(stmt)).all()
        found = {str(r[0]): int(r[1]) for r in rows}
        return {state: found.get(state, 0) for state in STATES}

    async def explain(self, job_id: str) -> JobExplanation:
        """A job with its events, model calls, attempts and snapshot summary (admin).

        Raises:
            AppError: JOB_NOT_FOUND.
        """
        async with self.core.store.sessions() as session:
            job = await self.core.must_get_job(session, job_id)
            evs = [EventRecord.from_row(r) for r in await session.execute(st.events_of_job(job_id))]
            invs = [
                InvocationRecord.from_row(r)
                for r in await session.execute(st.invocations_of_job(job_id))
            ]
            snapshot = None
            if job.snapshot_id:
                try:
                    view = await self.core.load_snapshot(session, job.snapshot_id)
                except AppError as exc:  # deleted with its material (reference §9.2)
                    if exc.code != ErrorCode.NOT_FOUND:
                        raise
                else:
                    snapshot = summarize_snapshot(view)
        return JobExplanation(job, evs, invs, attempts_of(evs, invs), snapshot)

    async def throughput(self, hours: int) -> ThroughputView:
        """Jobs ended per minute by outcome over the last ``hours`` (0 = 6; 1..168) by
        the database's clock, and the window's failure rate (reference §9.5).

        Raises:
            AppError: INVALID_ARGUMENT (``hours``) outside 1..168.
        """
        hours = hours or DEFAULT_THROUGHPUT_HOURS
        if not 1 <= hours <= MAX_THROUGHPUT_HOURS:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                f"hours must be between 1 and {MAX_THROUGHPUT_HOURS}",
                {"field": "hours", "value": hours},
            )
        async with self.core.store.sessions() as session:
            until = await self.core.store.clock.read(session)
            since = until - timedelta(hours=hours)
            rows = (await session.execute(st.throughput(since))).all()
        minutes = [(_minute(str(r[0])), int(r[1]), int(r[2]), int(r[3])) for r in rows]
        succeeded = sum(m[1] for m in minutes)
        failed = sum(m[2] for m in minutes)
        cancelled = sum(m[3] for m in minutes)
        ended = succeeded + failed
        return ThroughputView(
            since=since,
            until=until,
            minutes=minutes,
            succeeded=succeeded,
            failed=failed,
            cancelled=cancelled,
            failure_rate=failed / ended if ended else None,
        )
