"""Rows of the job tables as records (snake_case; times naive UTC from the database)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row

from job_service.store.tables import jobs


@dataclass
class JobRecord:
    """One ``ai_runtime_jobs`` row (snake_case; times naive UTC from the database)."""

    seq: int
    job_id: str
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    snapshot_id: str | None
    status: str
    priority: int
    idempotency_key: str | None
    params: dict[str, Any]
    api_key_mode: str
    credential_id: str | None
    model_provider: str
    model_name: str
    prompt_version: str | None
    output_schema_version: str | None
    attempt_no: int
    retry_count: int
    max_retry_count: int
    timeout_seconds: int
    retried_from_job_id: str | None
    locked_by: str | None
    locked_at: datetime | None
    lock_until: datetime | None
    available_at: datetime
    cancel_requested: bool
    started_at: datetime | None
    finished_at: datetime | None
    cancelled_at: datetime | None
    expired_at: datetime | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    #: +1 on every change of the row (reference §9.1 ETag).
    version: int = 0
    #: the create's W3C traceparent (reference §9.5), or None.
    trace_parent: str | None = None
    #: its place in its priority's fair order (reference §10.1; internal)
    vstart: float = 0.0
    #: parked out of the claim's range until then (reference §2.4, §10.2; internal)
    parked_until: datetime | None = None
    #: a child's parent job (reference §10.3), or None.
    parent_job_id: str | None = None
    #: a parent's counts of its children (reference §10.3); None on other jobs.
    batch_total: int | None = None
    batch_pending: int | None = None
    batch_running: int | None = None
    batch_succeeded: int | None = None
    batch_failed: int | None = None
    batch_cancelled: int | None = None
    min_success_ratio: float | None = None

    @property
    def is_parent(self) -> bool:
        """Whether this job is a batch's parent (reference §10.3)."""
        return self.batch_total is not None

    @classmethod
    def from_row(cls, row: Row[Any]) -> JobRecord:
        """Build from a ``select(jobs)`` row."""
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls)})

    @classmethod
    def from_values(cls, names: Sequence[str], values: Sequence[Any]) -> JobRecord:
        """Build from a plain row of a ``select(jobs)``: ``names`` are its column keys."""
        return cls(**{n: v for n, v in zip(names, values, strict=True) if n in _JOB_FIELDS})


@dataclass(frozen=True)
class EndingFacts:
    """The columns of a job that the completer reads to end an attempt (reference §2.3
    result and fail, §2.5): those its checks, business rows, invocation logs and
    metrics use, not the whole row.

    The driver parses a field description for every column of an answer, in
    Python, for about as long as the server takes to run the statement; the
    completer's locking read is one of the two wide reads of every job, and a
    narrow one costs the job service about 0.6 ms less per result than
    ``select(jobs)`` (35 columns) on the benchmark machine.
    """

    job_id: str
    user_id: str
    job_type: str
    snapshot_id: str | None
    status: str
    api_key_mode: str
    model_provider: str
    model_name: str
    cancel_requested: bool
    started_at: datetime | None
    retry_count: int
    max_retry_count: int
    credential_id: str | None
    #: the version the attempt ran: its model calls are logged under it (reference §10.4)
    prompt_version: str | None = None
    #: the job's parent when it is a batch's child (reference §10.3)
    parent_job_id: str | None = None


#: :class:`EndingFacts`' columns, in the order the completer's read selects them.
ENDING_FACTS: tuple[str, ...] = tuple(f.name for f in fields(EndingFacts))


@dataclass(frozen=True)
class EventRecord:
    """One ``ai_runtime_job_events`` row."""

    job_id: str
    from_status: str | None
    to_status: str
    error_code: str | None
    actor: str
    attempt_no: int
    at: datetime
    #: the provider the attempt was given (lease-grant events only, reference §9.4)
    model_provider: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> EventRecord:
        """Build from a ``select(events)`` row."""
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls) if f.name in m})


@dataclass(frozen=True)
class InvocationRecord:
    """One ``ai_runtime_invocation_logs`` row."""

    id: str
    job_id: str
    job_type: str
    attempt_no: int
    model_provider: str
    model_name: str
    api_key_mode: str
    credential_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cache_hit_tokens: int
    latency_ms: int
    outcome: str
    error_code: str | None
    provider_request_id: str | None
    cost_usd: Decimal
    created_at: datetime
    #: the version the call's attempt ran (reference §10.4); None on older rows
    prompt_version: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> InvocationRecord:
        """Build from a ``select(invocations)`` row."""
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls)})


_JOB_FIELDS = frozenset(f.name for f in fields(JobRecord))
#: Column keys of ``select(jobs)``, in order.
JOB_COLUMNS: tuple[str, ...] = tuple(c.key for c in jobs.c)


def job_of(values: Sequence[Any]) -> JobRecord:
    """The record of a ``select(jobs)`` row given as a plain tuple (a batch's rows)."""
    return JobRecord.from_values(JOB_COLUMNS, values)
