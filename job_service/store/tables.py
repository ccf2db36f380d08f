"""job_service core tables (reference §2.2, §3, §5, §6), all on :class:`job_service.store.base.Base`.

Columns are snake_case; the JSON/proto views are camelCase. Every time column
is ``DATETIME(6)`` on MySQL/MariaDB (microseconds, reference §2.2) and is written
from the database clock only (:mod:`job_service.store.clock`).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Double,
    Index,
    Integer,
    Numeric,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import Mapped, mapped_column

from job_service.store.base import Base

#: ``DATETIME(6)`` on MySQL/MariaDB, plain DATETIME (text with µs) on SQLite.
Micro = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: Auto-increment BIGINT (INTEGER on SQLite so it aliases the rowid).
Seq = BigInteger().with_variant(Integer(), "sqlite")
Id = String(64)


class Job(Base):
    """``ai_runtime_jobs``: one AI job and its lease (reference §2.2).

    Indexes: the poll/claim query ``status='pending' AND job_type IN (…) AND
    available_at <= now ORDER BY priority, created_at, seq`` walks
    ``ix_jobs_poll`` (status, priority, created_at, seq) in order — no filesort;
    the reaper walks ``ix_jobs_reaper`` (status, lock_until); user listings and
    quotas use ``ix_jobs_user`` (user_id, created_at); the console's time-range
    lists and counts ``ix_jobs_created_status``, its jobs-per-minute chart
    ``ix_jobs_finished_status`` (reference §9.5); a batch's children ``ix_jobs_parent``
    (parent_job_id, status).

    A batch's parent (reference §10.3) is a row of this table with ``batch_total``
    set (and every ``batch_*`` count and ``min_success_ratio``); its children name
    it in ``parent_job_id``. A parent is never polled, claimed or locked: its
    ``parked_until`` and ``available_at`` are :data:`PARENT_AVAILABLE_AT`, so it is
    out of ``ix_jobs_poll``'s claimable range (claims never scan past it) and the
    scheduler of parked jobs never takes it back.
    """

    __tablename__ = "ai_runtime_jobs"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(Id, nullable=False, unique=True)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False)
    job_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_id: Mapped[str] = mapped_column(String(128), nullable=False)
    snapshot_id: Mapped[str | None] = mapped_column(Id)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    priority: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    api_key_mode: Mapped[str] = mapped_column(String(32), nullable=False, default="platform_key")
    credential_id: Mapped[str | None] = mapped_column(Id)
    model_provider: Mapped[str] = mapped_column(String(32), nullable=False, default="deepseek")
    model_name: Mapped[str] = mapped_column(String(64), nullable=False, default="deepseek-chat")
    #: ``<jobType>.<version>`` (reference §10.4), chosen at create
    prompt_version: Mapped[str | None] = mapped_column(String(128))
    output_schema_version: Mapped[str | None] = mapped_column(String(16))
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    retry_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    max_retry_count: Mapped[int] = mapped_column(Integer, nullable=False, default=3)
    timeout_seconds: Mapped[int] = mapped_column(Integer, nullable=False, default=120)
    retried_from_job_id: Mapped[str | None] = mapped_column(Id)
    locked_by: Mapped[str | None] = mapped_column(String(128))
    locked_at: Mapped[datetime | None] = mapped_column(Micro)
    lock_until: Mapped[datetime | None] = mapped_column(Micro)
    available_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    started_at: Mapped[datetime | None] = mapped_column(Micro)
    finished_at: Mapped[datetime | None] = mapped_column(Micro)
    cancelled_at: Mapped[datetime | None] = mapped_column(Micro)
    expired_at: Mapped[datetime | None] = mapped_column(Micro)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    #: +1 on every UPDATE of the row (the ETag of reference §9.1).
    version: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    #: the job's virtual start in its priority's fair order (reference §10.1): claims
    #: take ``priority, vstart, createdAt, seq``
    vstart: Mapped[float] = mapped_column(Double, nullable=False, server_default=text("0"))
    #: a pending job not claimable before this time (its retry's backoff, or no provider
    #: with room for it): out of the claim's index range until the scheduler takes it
    #: back at that time (reference §2.4, §10.2); NULL: claimable
    parked_until: Mapped[datetime | None] = mapped_column(Micro)
    #: The create request's W3C ``traceparent`` (reference §9.5), or NULL.
    trace_parent: Mapped[str | None] = mapped_column(String(55))
    #: A child's parent job (reference §10.3); NULL for every other job.
    parent_job_id: Mapped[str | None] = mapped_column(Id)
    #: A parent's counts of its children by state (reference §10.3: pending; running
    #: = locked or running; succeeded; failed; cancelled); NULL on every other job.
    batch_total: Mapped[int | None] = mapped_column(Integer)
    batch_pending: Mapped[int | None] = mapped_column(Integer)
    batch_running: Mapped[int | None] = mapped_column(Integer)
    batch_succeeded: Mapped[int | None] = mapped_column(Integer)
    batch_failed: Mapped[int | None] = mapped_column(Integer)
    batch_cancelled: Mapped[int | None] = mapped_column(Integer)
    #: A parent's share of children that must succeed for it to succeed (0 < r ≤ 1).
    min_success_ratio: Mapped[float | None] = mapped_column(Double)

    __table_args__ = (
        CheckConstraint("retry_count >= 0", name="retry_count_nonneg"),
        CheckConstraint("retry_count <= max_retry_count", name="retry_count_le_max"),
        CheckConstraint("attempt_no >= 0", name="attempt_no_nonneg"),
        UniqueConstraint(
            "user_id",
            "job_type",
            "target_type",
            "target_id",
            "idempotency_key",
            name="uq_jobs_idempotency",
        ),
        Index("ix_jobs_poll", "status", "parked_until", "priority", "vstart", "created_at", "seq"),
        Index("ix_jobs_user_waiting", "user_id", "status", "priority", "vstart"),
        Index("ix_jobs_reaper", "status", "lock_until"),
        Index("ix_jobs_user", "user_id", "created_at"),
        Index("ix_jobs_status_seq", "status", "seq"),
        Index("ix_jobs_locked_by", "locked_by", "status"),
        Index("ix_jobs_created_status", "created_at", "status"),
        Index("ix_jobs_finished_status", "finished_at", "status"),
        Index("ix_jobs_parent", "parent_job_id", "status"),
    )


#: A parent's ``parked_until`` and ``available_at`` (reference §10.3): later than any
#: claim's now, so a parent is out of the claim's and the poll's range, and never
#: taken back into it (their index-backed order is the same with batches as without).
PARENT_AVAILABLE_AT = datetime(9999, 12, 31)


class JobEvent(Base):
    """``ai_runtime_job_events``: one row per state change, oldest first (reference §2.2).

    ``from_status`` is NULL for the creation row. A cancel request on a leased
    job is recorded too (from = to = the current status).
    """

    __tablename__ = "ai_runtime_job_events"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(Id, nullable=False)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16), nullable=False)
    error_code: Mapped[str | None] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(160), nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    #: The model provider the attempt was given, on the events of a lease grant
    #: (pending → locked, and the start of a claim with start); NULL on the others
    #: (reference §9.4).
    model_provider: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_job_events_job", "job_id", "seq"),)


class InvocationLog(Base):
    """``ai_runtime_invocation_logs``: one row per model call (reference §5).

    ``cost_usd`` is computed at insert from ``MODEL_PRICES`` (USD per million
    tokens). Never the key, never the prompt. ``ix_invocations_type_created``
    serves the per-version prompt stats of one job type over a time window
    (reference §10.4).
    """

    __tablename__ = "ai_runtime_invocation_logs"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(Id, nullable=False, unique=True)
    job_id: Mapped[str] = mapped_column(Id, nullable=False)
    job_type: Mapped[str] = mapped_column(String(32), nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False)
    model_provider: Mapped[str] = mapped_column(String(32), nullable=False)
    model_name: Mapped[str] = mapped_column(String(64), nullable=False)
    api_key_mode: Mapped[str] = mapped_column(String(32), nullable=False)
    credential_id: Mapped[str | None] = mapped_column(Id)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cache_hit_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    latency_ms: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    error_code: Mapped[str | None] = mapped_column(String(64))
    provider_request_id: Mapped[str | None] = mapped_column(String(128))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8), nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    #: the job's ``promptVersion`` when the call was logged: the version its attempt
    #: ran (reference §10.4 stats); NULL on rows logged before versions were recorded
    prompt_version: Mapped[str | None] = mapped_column(String(128))

    __table_args__ = (
        Index("ix_invocations_job", "job_id", "seq"),
        Index("ix_invocations_created", "created_at", "api_key_mode"),
        Index("ix_invocations_type_created", "job_type", "created_at"),
    )


class RuntimeWorker(Base):
    """``ai_runtime_workers``: runtime instances discovered from their calls (reference §3)."""

    __tablename__ = "ai_runtime_workers"

    instance_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    capabilities: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    status_address: Mapped[str | None] = mapped_column(String(255))
    in_flight: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_seen_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class AiAuthorization(Base):
    """``ai_authorizations``: per-user AI switch; no row = granted (reference §6)."""

    __tablename__ = "ai_authorizations"

    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    granted: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    changed_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class CircuitBreakerRow(Base):
    """``ai_circuit_breaker``: the platform-key breakers shared by all replicas, one row
    per model provider (reference §6, §9.4), keyed by the provider's name
    (``MODEL_PROVIDERS``; the default list is one ``deepseek`` row). Rows of every
    configured provider are made at start; a row of a provider no longer configured
    is left as it is and never read.
    """

    __tablename__ = "ai_circuit_breaker"

    provider: Mapped[str] = mapped_column(String(32), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False, default="closed")
    consecutive_failures: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    opened_at: Mapped[datetime | None] = mapped_column(Micro)
    half_open_at: Mapped[datetime | None] = mapped_column(Micro)
    probes_in_flight: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    updated_at: Mapped[datetime | None] = mapped_column(Micro)
    #: a provider's 429 pauses it for every worker until then (reference §10.2)
    paused_until: Mapped[datetime | None] = mapped_column(Micro)
    #: written by every lease grant to this provider while it has limits: grants of one
    #: provider are decided one transaction at a time, on every replica and node
    grants: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))


class ProviderGrant(Base):
    """``ai_provider_grants``: one row per platform-key attempt leased to a provider that
    has limits (reference §10.2): when it was granted, the tokens reserved for it (its
    job type's estimate) and, once the attempt has ended, the tokens it used.

    The provider's usage of the last 60 seconds is read from here by
    ``ix_provider_grants_window`` (provider, granted_at); rows older than a minute
    whose attempt has ended are deleted by the scheduler.
    """

    __tablename__ = "ai_provider_grants"
    __table_args__ = (
        Index("ix_provider_grants_window", "provider", "granted_at"),
        Index("ix_provider_grants_job", "job_id", "attempt_no"),
        Index("ix_provider_grants_age", "granted_at"),
    )

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    job_id: Mapped[str] = mapped_column(Id, nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False)
    granted_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    tokens_reserved: Mapped[int] = mapped_column(BigInteger, nullable=False)
    tokens_used: Mapped[int | None] = mapped_column(BigInteger)
    ended_at: Mapped[datetime | None] = mapped_column(Micro)


class CredentialPause(Base):
    """``ai_credential_pauses``: a user key its provider answered 429 is not leased until
    ``paused_until`` (reference §10.2); the row of a pause that has run out is left
    (the next 429 overwrites it)."""

    __tablename__ = "ai_credential_pauses"

    credential_id: Mapped[str] = mapped_column(Id, primary_key=True)
    paused_until: Mapped[datetime] = mapped_column(Micro, nullable=False)


jobs = cast(Table, Job.__table__)
events = cast(Table, JobEvent.__table__)
invocations = cast(Table, InvocationLog.__table__)
workers = cast(Table, RuntimeWorker.__table__)
authorizations = cast(Table, AiAuthorization.__table__)
breaker = cast(Table, CircuitBreakerRow.__table__)
grants = cast(Table, ProviderGrant.__table__)
credential_pauses = cast(Table, CredentialPause.__table__)


class UserAdmissionLock(Base):
    """``ai_user_admission_locks``: one row per user, locked by every create (reference §6).

    The create transaction writes the caller's row (``changes + 1``) before
    counting the day's jobs, so concurrent creates of one user (on any replica)
    are admitted one at a time and the daily quota is never overshot; a write,
    not a ``SELECT … FOR UPDATE``, so that on a Galera cluster admissions of one
    user on two nodes conflict at certification instead of both passing (reference
    §9.6). (SQLite already runs every write transaction alone.)
    """

    __tablename__ = "ai_user_admission_locks"

    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    #: +1 by every admission: the lock is taken by this write (replicated on Galera).
    changes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))


admission_locks = cast(Table, UserAdmissionLock.__table__)


#: Rows per UTC day in :class:`PlatformSpend`: concurrent reports add to different
#: rows, so they do not queue on one row lock.
PLATFORM_SPEND_SHARDS = 16


class PlatformSpend(Base):
    """``ai_runtime_platform_spend``: platform-key model cost per UTC day (reference §6 budget).

    A running total beside the invocation log: the transaction that logs a
    platform-key call adds its cost here too, to one of
    :data:`PLATFORM_SPEND_SHARDS` rows of the day. The budget check at create
    then sums at most that many rows by primary key, however many calls the day
    has logged; summing the log itself costs a scan of the day's calls.
    ``day`` is the database's UTC date when the call was logged.
    """

    __tablename__ = "ai_runtime_platform_spend"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), nullable=False, default=0)
    calls: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    updated_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


platform_spend = cast(Table, PlatformSpend.__table__)


class ErasedUsage(Base):
    """``ai_runtime_erased_usage``: jobs created per UTC day by users since erased
    (reference §9.2 ``DELETE /v1/me``), under a one-way pseudonym of the user id
    (keyed HMAC, :func:`job_service.services.erasure.pseudonym`).

    An erasure removes the user's jobs, so the day's quota count (their jobs of
    the day) would start again from 0; the count moves here instead, and the
    quota check adds the row of the caller's pseudonym for the day, so erasing
    does not reset a quota.
    """

    __tablename__ = "ai_runtime_erased_usage"

    pseudonym: Mapped[str] = mapped_column(String(64), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    jobs: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


erased_usage = cast(Table, ErasedUsage.__table__)
