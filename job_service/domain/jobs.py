"""Job operations of SPEC §2–§3 over the state machine (:mod:`.statemachine`).

Each operation is one short transaction (retried on deadlocks / busy SQLite)
that changes the job with a guarded UPDATE and appends its event rows. All
times come from the database clock. Refusals raise :class:`AppError` with the
SPEC §4 code; the job is unchanged when refused.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, cast

from sqlalchemy import (
    Integer,
    Row,
    String,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from airuntime_common.canonical import content_hash
from airuntime_common.db import DisconnectedBeforeCommit, retry_transient
from airuntime_common.enums import JOB_TYPES
from airuntime_common.errors import AppError, ErrorCode, is_retryable
from job_service import metrics
from job_service.db import WRITE_TX, DbExec
from job_service.domain import breaker as breaker_mod
from job_service.domain import sqlcache
from job_service.domain.batch import FenceBroken, StatementBatch, supports_batches
from job_service.domain.clock import DbClock
from job_service.domain.learning import adding_upsert
from job_service.domain.params import check_range, normalize_params
from job_service.domain.ports import (
    CredentialChecker,
    LearningPort,
    SnapshotRead,
    SnapshotView,
)
from job_service.domain.scheduler import (
    RECHECK_SECONDS,
    JobSignal,
    PendingProbe,
    WorkerRegistry,
)
from job_service.domain.statemachine import (
    CANCELLED,
    FAILED,
    LEASED,
    LOCKED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    Lease,
    Op,
    TransitionSql,
    apply,
    apply_many,
    event_params,
    event_sql,
    lease_guard,
    lease_guard_bound,
    lease_params,
    leases_guard,
    lock_guard,
    record_event,
    renew_many,
    run_transition,
    transition_many_sql,
    transition_sql,
)
from job_service.learning_models import AiResult
from job_service.models import (
    PLATFORM_SPEND_SHARDS,
    admission_locks,
    authorizations,
    events,
    invocations,
    jobs,
    platform_spend,
)
from job_service.settings import JobServiceSettings

#: Accepted results (``ai_results``, owned by the learning-data module's models).
results = cast(Table, AiResult.__table__)

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_POLL_LIMIT = 50
DEFAULT_POLL_LIMIT = 10
MAX_WAIT_MS = 20_000
MAX_HEARTBEAT_LEASES = 500
#: ``attempt_no + 1`` (lock/claim), shared so statements embedding it are cached.
NEXT_ATTEMPT: Any = sqlcache.stable(jobs.c.attempt_no + 1)
#: Plain multi-row insert of event rows (claim).
EVENTS_INSERT: Any = insert(events)
#: Claimed jobs whose snapshot id is remembered for GetSnapshot (oldest dropped first).
MAX_CLAIMED_SNAPSHOTS = 20_000
#: How many users' admission lock rows a process remembers as existing (LRU).
ADMISSION_ROWS_KNOWN = 10_000
MAX_ERROR_MESSAGE = 4000
#: Most tokens one model call may log per count (prompt, completion, cache hits):
#: ten million, far above any context window, so a broken count (2^53) cannot be
#: priced into billions of dollars and exhaust the platform budget (SPEC §5, §6).
MAX_CALL_TOKENS = 10_000_000
#: Longest latency (ms) one model call may log: a day.
MAX_CALL_LATENCY_MS = 86_400_000


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
class ResultFacts:
    """The columns of a job that SubmitResult reads (SPEC §2.3 result, §2.5): those
    its checks, business rows, invocation log and metrics use, not the whole row.

    The driver parses a field description for every column of an answer, in
    Python, for about as long as the server takes to run the statement; the
    locking read of a result is one of the two wide reads of every job, and a
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


#: :class:`ResultFacts`' columns, in the order SubmitResult's read selects them.
RESULT_FACTS: tuple[str, ...] = tuple(f.name for f in fields(ResultFacts))


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


@dataclass
class CreateJobInput:
    """A create request after transport decoding (SPEC §3.1 create / admin create).

    Attributes:
        priority, max_retry_count, timeout_seconds: admin overrides; None = defaults.
        plan: the caller's ``plan`` claim for the per-plan daily quota.
        actor: ``"user:<id>"`` / ``"admin:<id>"``.
    """

    user_id: str
    job_type: str
    target_type: str
    target_id: str
    params: dict[str, Any] = field(default_factory=dict)
    api_key_mode: str = "platform_key"
    idempotency_key: str | None = None
    priority: int | None = None
    max_retry_count: int | None = None
    timeout_seconds: int | None = None
    plan: str | None = None
    actor: str = ""


@dataclass(frozen=True)
class LeaseHolderView:
    """A leased job as credential resolution sees it (SPEC §3 VerifyLease)."""

    user_id: str
    api_key_mode: str
    credential_id: str | None
    model_provider: str
    model_name: str


@dataclass(frozen=True)
class ModelCallInput:
    """One model call of an attempt, as reported by its worker (SPEC §5 invocation log).

    Attributes:
        model_provider / model_name: empty → the job's.
        api_key_mode: ``platform_key`` / ``user_key``; None → the job's.
        credential_id: the user credential used, if any.
        prompt_tokens / completion_tokens / cache_hit_tokens: token counts (≥ 0).
        latency_ms: wall time of the call in milliseconds (≥ 0).
        outcome: ``succeeded`` or ``failed``.
        error_code: SPEC §4 code of a failed call.
        provider_request_id: the provider's request id header.
    """

    model_provider: str
    model_name: str
    api_key_mode: str | None
    credential_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cache_hit_tokens: int
    latency_ms: int
    outcome: str
    error_code: str | None = None
    provider_request_id: str | None = None

    def check(self) -> None:
        """Raises AppError(INVALID_ARGUMENT) for a bad outcome, a negative count, a count
        over :data:`MAX_CALL_TOKENS` (latency over :data:`MAX_CALL_LATENCY_MS`) or more
        cache-hit tokens than prompt tokens."""
        if self.outcome not in ("succeeded", "failed"):
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "outcome must be succeeded or failed",
                {"field": "outcome"},
            )
        for name, value in (
            ("promptTokens", self.prompt_tokens),
            ("completionTokens", self.completion_tokens),
            ("cacheHitTokens", self.cache_hit_tokens),
            ("latencyMs", self.latency_ms),
        ):
            if value < 0:
                raise AppError(ErrorCode.INVALID_ARGUMENT, f"{name} must be ≥ 0", {"field": name})
            limit = MAX_CALL_LATENCY_MS if name == "latencyMs" else MAX_CALL_TOKENS
            if value > limit:
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT, f"{name} must be ≤ {limit}", {"field": name}
                )
        if self.cache_hit_tokens > self.prompt_tokens:
            # cache hits are a part of the prompt's tokens (DeepSeek's usage): more is
            # a broken count, and its cost would be a guess
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "cacheHitTokens must be ≤ promptTokens",
                {"field": "cacheHitTokens"},
            )


@dataclass(frozen=True)
class SubmitOutcome:
    """Answer of a result submission (SPEC §3 result)."""

    job_id: str
    status: str
    result_id: str
    output_hash: str
    replayed: bool
    #: with ``claim_next``: the jobs claimed in the result's transaction (running,
    #: leased to the caller) and their snapshots by job id
    claimed: list[JobRecord] = field(default_factory=list)
    snapshots: dict[str, SnapshotView] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimNext:
    """A claim riding on a result (SubmitResult ``claim_next``): ClaimJobs with
    snapshots, no long poll, in the result's transaction.

    Attributes:
        capabilities: job types the caller runs (closed enum, SPEC §2.6).
        limit: jobs wanted, ≥ 1 (at most 50 are claimed, as by ClaimJobs).
    """

    capabilities: list[str]
    limit: int


@dataclass(frozen=True)
class LeaseAnswer:
    """One answer of a batched heartbeat (SPEC §3 leases/heartbeat)."""

    job_id: str
    attempt_no: int
    held: bool
    lock_until: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class AuthorizationView:
    """Per-user AI authorization (SPEC §6)."""

    granted: bool
    changed_at: datetime | None
    cancelled: int = 0
    cancel_requested: int = 0


_JOB_FIELDS = frozenset(f.name for f in fields(JobRecord))
#: Column keys of ``select(jobs)``, in order.
JOB_COLUMNS: tuple[str, ...] = tuple(c.key for c in jobs.c)


def _claimed(stmt: Any, status: str = LOCKED) -> Any:
    """``stmt`` narrowed to the rows a claim just locked (bound: ``ids`` list,
    ``instance_id``), now in ``status`` (``running`` once a claim with start
    started them), in pick order."""
    return stmt.where(
        jobs.c.job_id.in_(bindparam("ids", expanding=True)),
        jobs.c.status == status,
        jobs.c.locked_by == bindparam("instance_id", type_=String()),
    ).order_by(jobs.c.priority, jobs.c.created_at, jobs.c.seq)


def _claim_read_stmt(status: str = LOCKED) -> Any:
    """The rows a claim just locked (see :func:`_claimed`)."""
    return _claimed(select(jobs), status)


#: A claim's event rows: to-status → (from-status, the column that holds its time).
_CLAIM_EVENTS = {LOCKED: (PENDING, jobs.c.locked_at), RUNNING: (LOCKED, jobs.c.started_at)}


def _claim_events_stmt(to_status: str = LOCKED) -> Any:
    """The pending → locked (or, for a claim with start, locked → running) event of
    every row a claim just moved, read from the rows (bound: ``ids``,
    ``instance_id``, ``e_actor``); its time is the row's ``lockedAt`` (``startedAt``)."""
    from_status, at = _CLAIM_EVENTS[to_status]
    source = _claimed(
        select(
            jobs.c.job_id,
            bindparam("e_from", from_status, type_=String()),
            bindparam("e_to", to_status, type_=String()),
            bindparam("e_code", None, type_=String()),
            bindparam("e_actor", type_=String()),
            jobs.c.attempt_no,
            at,
        ),
        to_status,
    )
    return insert(events).from_select(
        ["job_id", "from_status", "to_status", "error_code", "actor", "attempt_no", "at"], source
    )


async def _read_rows(
    session: DbExec, key: Any, stmt: Any, params: dict[str, Any], *, commit: bool = False
) -> list[Sequence[Any]]:
    """The rows of one ``SELECT`` (``key``: its :mod:`sqlcache` key) in the caller's
    transaction, as plain tuples in the order of its columns.

    On MySQL/MariaDB it goes to the driver as a one-statement batch, past
    SQLAlchemy's execution layer (about a quarter of a millisecond of CPU per
    read on the benchmark machine); with ``commit`` (a read-only transaction:
    nothing to roll back) its COMMIT goes in the same round trip. Elsewhere it
    runs as usual and the caller's block commits.

    Raises:
        sqlalchemy.exc.DBAPIError: as the statement run through SQLAlchemy would.
    """
    if supports_batches(session):
        batch = StatementBatch(session)
        batch.add(key, lambda: stmt, params)
        if commit:
            batch.commit()
        return list((await batch.run())[0].rows)
    return list((await session.execute(stmt, params)).all())


#: What a claim returns inside: the jobs, and (claim with start) their snapshots by job id.
_Claimed = tuple[list[JobRecord], dict[str, SnapshotView]]


def _by_job(
    claimed: Sequence[JobRecord], snapshot_ids: dict[str, str], views: dict[str, SnapshotView]
) -> dict[str, SnapshotView]:
    """Each claimed job's snapshot view, by job id (jobs without one left out)."""
    out: dict[str, SnapshotView] = {}
    for job in claimed:
        view = views.get(snapshot_ids.get(job.job_id, ""))
        if view is not None:
            out[job.job_id] = view
    return out


def _lease_refusal(lease: Lease, status: str | None) -> AppError:
    """The refusal of a lease not held: ``JOB_NOT_FOUND`` (no job, ``status`` None) or
    ``LOCK_NOT_HELD`` with the job's current status."""
    if status is None:
        return AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": lease.job_id})
    return AppError(
        ErrorCode.LOCK_NOT_HELD,
        "the caller does not hold this job's lease",
        {"jobId": lease.job_id, "attemptNo": lease.attempt_no, "status": status},
    )


def new_id() -> str:
    """A fresh opaque id (uuid4 hex)."""
    return uuid.uuid4().hex


def runtime_actor(instance_id: str) -> str:
    """Event actor for a runtime instance."""
    return f"runtime:{instance_id}"


def backoff_seconds(
    settings: JobServiceSettings,
    retry_count: int,
    code: str,
    retry_after: float | None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Delay before a retried job is pollable again (SPEC §2.4).

    ``RETRY_BACKOFF_BASE_SECONDS × 2^(retryCount−1)`` capped at
    ``RETRY_BACKOFF_MAX_SECONDS``, ±10 % jitter; on a ``MODEL_RATE_LIMIT`` fail
    a longer ``retryAfterSeconds`` (the provider's ``Retry-After``) wins, and on
    any other code it is ignored; ``WORKER_SHUTDOWN`` retries at once (0).

    Args:
        retry_count: the retry count *after* this retry was granted (≥ 1).
        retry_after: seconds, or None.
    """
    if code == ErrorCode.WORKER_SHUTDOWN:
        return 0.0
    base = float(settings.RETRY_BACKOFF_BASE_SECONDS) * float(2 ** max(0, retry_count - 1))
    delay = min(base, settings.RETRY_BACKOFF_MAX_SECONDS) * (0.9 + 0.2 * rng())
    if code != ErrorCode.MODEL_RATE_LIMIT:
        return delay
    if retry_after is not None and retry_after > delay:
        delay = float(retry_after)
    return delay


def cost_usd(
    prices: dict[str, dict[str, float]],
    model_name: str,
    prompt_tokens: int,
    completion_tokens: int,
    cache_hit_tokens: int,
) -> Decimal:
    """Cost of one call from ``MODEL_PRICES`` (USD per million tokens); unknown models cost 0."""
    p = prices.get(model_name)
    if not p:
        return Decimal(0)
    hit = max(0, min(cache_hit_tokens, prompt_tokens))
    miss = max(0, prompt_tokens - hit)
    total = (
        Decimal(str(p.get("cacheHitInput", 0))) * hit
        + Decimal(str(p.get("cacheMissInput", 0))) * miss
        + Decimal(str(p.get("output", 0))) * max(0, completion_tokens)
    ) / Decimal(1_000_000)
    return total.quantize(Decimal("0.00000001"))


def _encode_list_token(created_at: datetime | None, seq: int) -> str:
    """A job list's opaque page token: ``s:<seq>``, or ``t:<created_at>|<seq>`` for
    lists in (created_at, seq) order (URL-safe base64)."""
    raw = f"s:{seq}" if created_at is None else f"t:{created_at.isoformat()}|{seq}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_list_token(token: str) -> tuple[datetime | None, int]:
    """``(created_at or None, seq)`` of a job list's page token.

    The token is opaque (SPEC §3.1) but comes from the caller: a crafted one is
    held to what :func:`_encode_list_token` writes, a naive UTC time and a
    ``seq`` within the column's signed 64-bit range.

    Raises:
        AppError: INVALID_ARGUMENT (``pageToken``) for anything else.
    """
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        at: datetime | None = None
        if raw.startswith("t:"):
            stamp, seq_text = raw[2:].rsplit("|", 1)
            at = datetime.fromisoformat(stamp)
            if at.tzinfo is not None:
                raise ValueError("not a database time")
        else:
            seq_text = raw.removeprefix("s:")
        seq = int(seq_text)
        if not 0 <= seq < 2**63:
            raise ValueError("seq out of range")
        return at, seq
    except (ValueError, UnicodeDecodeError):
        raise AppError(
            ErrorCode.INVALID_ARGUMENT, "invalid pageToken", {"field": "pageToken"}
        ) from None


def _check_granted(granted: Any) -> None:
    """Refuse when the user turned AI off (``granted`` false; no row = granted, SPEC §6).

    Raises:
        AppError: AI_NOT_AUTHORIZED.
    """
    if granted is not None and not granted:
        raise AppError(
            ErrorCode.AI_NOT_AUTHORIZED, "AI features are turned off for this user", None
        )


def _check_quota(quota: int, used: Any) -> None:
    """Refuse once the user's jobs of the day reached ``quota`` (SPEC §6).

    Raises:
        AppError: QUOTA_EXCEEDED.
    """
    if used >= quota:
        raise AppError(
            ErrorCode.QUOTA_EXCEEDED,
            "daily AI job quota reached",
            {"quota": quota, "used": int(used)},
        )


def _admission_lock_stmt() -> Any:
    """The user's (``a_user``) admission row, locked (MySQL/MariaDB)."""
    return (
        select(admission_locks.c.user_id)
        .where(admission_locks.c.user_id == bindparam("a_user", type_=String()))
        .with_for_update()
    )


def _scope_stmt() -> Any:
    """The job of an idempotency scope (SPEC §2.5): user, type, target and key."""
    return select(jobs).where(
        jobs.c.user_id == bindparam("a_user", type_=String()),
        jobs.c.job_type == bindparam("a_type", type_=String()),
        jobs.c.target_type == bindparam("a_target_type", type_=String()),
        jobs.c.target_id == bindparam("a_target", type_=String()),
        jobs.c.idempotency_key == bindparam("a_key", type_=String()),
    )


def _scope_params(req: CreateJobInput) -> dict[str, Any]:
    """:func:`_scope_stmt`'s values for ``req``."""
    return {
        "a_user": req.user_id,
        "a_type": req.job_type,
        "a_target_type": req.target_type,
        "a_target": req.target_id,
        "a_key": req.idempotency_key,
    }


def _get_job_stmt() -> Any:
    """One job row by id (``g_job_id``), every column."""
    return select(jobs).where(jobs.c.job_id == bindparam("g_job_id", type_=String()))


def _granted_stmt() -> Any:
    """The user's (``a_user``) AI switch (no row: granted)."""
    return select(authorizations.c.granted).where(
        authorizations.c.user_id == bindparam("a_user", type_=String())
    )


class JobDomain:
    """Every job operation; one instance per process, shared by all RPCs.

    Args:
        sessions: the job database's session factory.
        clock: the database clock of that engine's dialect.
        settings: job_service settings.
        learning: snapshot/result delegate.
        credentials: credential service client.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        clock: DbClock,
        settings: JobServiceSettings,
        learning: LearningPort,
        credentials: CredentialChecker,
    ) -> None:
        self.sessions = sessions
        self._engine: AsyncEngine = sessions.kw["bind"]
        self.clock = clock
        self.settings = settings
        self.learning = learning
        self.credentials = credentials
        self.signal = JobSignal()
        self.probe = PendingProbe(self._any_claimable, RECHECK_SECONDS)
        self.registry = WorkerRegistry(clock)
        #: SQLite has one writer: queue this process's write transactions here.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if clock.is_sqlite else None
        #: Users whose admission lock row is known to exist (MySQL/MariaDB), the
        #: most recent :data:`ADMISSION_ROWS_KNOWN` of them (about 170 bytes each);
        #: a user who fell out costs one more ``INSERT IGNORE`` on their next create.
        self._admission_rows: OrderedDict[str, None] = OrderedDict()
        #: jobId → snapshotId of jobs this process handed out by claim (a job's
        #: snapshot never changes), so GetSnapshot after a claim skips reading the row.
        self._claimed_snapshots: OrderedDict[str, str] = OrderedDict()

    # ---------------------------------------------------------------- helpers

    async def tx(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction on a session, retried on transient errors
        (deadlock, lock wait timeout, a connection that died before COMMIT)."""

        async def run() -> T:
            async with self.sessions() as session, session.begin():
                return await self._body(fn, session)

        return await self._transaction(run)

    async def lean_tx(self, fn: Callable[[DbExec], Awaitable[T]]) -> T:
        """:meth:`tx` on a bare connection: the same transaction, retries and SQLite
        write queue, without the ORM session's bookkeeping (about a quarter of a
        millisecond per transaction). For the runtime hot path, whose SQL is Core."""

        async def run() -> T:
            async with self._engine.begin() as conn:
                return await self._body(fn, conn)

        return await self._transaction(run)

    @staticmethod
    async def _body(fn: Callable[[Any], Awaitable[T]], db: DbExec) -> T:
        try:
            return await fn(db)
        except DBAPIError as exc:
            # raised before COMMIT: the server rolled the transaction back
            if exc.connection_invalidated:
                raise DisconnectedBeforeCommit(exc) from exc
            raise

    async def _transaction(self, run: Callable[[], Awaitable[T]]) -> T:
        async def once() -> T:
            token = WRITE_TX.set(True)
            try:
                if self._write_lock is None:
                    return await run()
                async with self._write_lock:
                    return await run()
            finally:
                WRITE_TX.reset(token)

        return await retry_transient(once)

    def _for_update(self, stmt: Any) -> Any:
        return stmt if self.clock.is_sqlite else stmt.with_for_update()

    async def _get(self, session: DbExec, job_id: str, *, lock: bool = False) -> JobRecord | None:
        lock = lock and not self.clock.is_sqlite

        def build() -> Any:
            stmt = _get_job_stmt()
            return stmt.with_for_update() if lock else stmt

        stmt = sqlcache.statement(("get_job", self.clock.dialect, lock), build)
        row = (await session.execute(stmt, {"g_job_id": job_id})).first()
        return JobRecord.from_row(row) if row is not None else None

    async def _get_leased(self, session: DbExec, lease: Lease) -> JobRecord | None:
        """The job when ``lease`` is live on it, else None (SPEC §3 fencing)."""
        stmt = sqlcache.statement(
            ("get_leased", self.clock.dialect),
            lambda: select(jobs).where(lease_guard_bound(self.clock)),
        )
        row = (await session.execute(stmt, lease_params(lease))).first()
        return JobRecord.from_row(row) if row is not None else None

    async def _must_get(
        self, session: DbExec, job_id: str, *, user_id: str | None = None, lock: bool = False
    ) -> JobRecord:
        job = await self._get(session, job_id, lock=lock)
        if job is None or (user_id is not None and job.user_id != user_id):
            raise AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": job_id})
        return job

    def _lease_lost(self, job: JobRecord | ResultFacts | None, lease: Lease) -> AppError:
        return _lease_refusal(lease, None if job is None else job.status)

    # ------------------------------------------------------------------ reads

    async def get(self, job_id: str, user_id: str | None = None) -> JobRecord:
        """One job; another user's job is ``JOB_NOT_FOUND`` (SPEC §4)."""
        async with self.sessions() as session:
            return await self._must_get(session, job_id, user_id=user_id)

    async def history(self, job_id: str) -> tuple[list[EventRecord], list[InvocationRecord]]:
        """Events (oldest first) and invocations of a job (admin view)."""
        async with self.sessions() as session:
            ev = (
                await session.execute(
                    select(events).where(events.c.job_id == job_id).order_by(events.c.seq)
                )
            ).all()
            inv = (
                await session.execute(
                    select(invocations)
                    .where(invocations.c.job_id == job_id)
                    .order_by(invocations.c.seq)
                )
            ).all()
        return (
            [
                EventRecord(
                    r.job_id, r.from_status, r.to_status, r.error_code, r.actor, r.attempt_no, r.at
                )
                for r in ev
            ],
            [
                InvocationRecord(**{f.name: r._mapping[f.name] for f in fields(InvocationRecord)})
                for r in inv
            ],
        )

    async def list_jobs(
        self,
        *,
        user_id: str | None,
        status: str | None,
        job_type: str | None,
        page_size: int,
        page_token: str,
    ) -> tuple[list[JobRecord], str]:
        """Jobs newest first with an opaque page token (SPEC §3.1 paging).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a page size outside 1..100 or a bad token.
        """
        if page_size == 0:
            page_size = 20
        if not 1 <= page_size <= 100:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "pageSize must be between 1 and 100",
                {"field": "pageSize", "value": page_size},
            )
        stmt = select(jobs)
        if user_id is not None:
            stmt = stmt.where(jobs.c.user_id == user_id)
        if status is not None:
            stmt = stmt.where(jobs.c.status == status)
        if job_type is not None:
            stmt = stmt.where(jobs.c.job_type == job_type)
        # One user's jobs come newest first by (created_at, seq), the order of their
        # index (ix_jobs_user; InnoDB keys end with the primary key): a page reads
        # about page_size rows however many jobs the user or the table has. By
        # seq alone, MariaDB walks the whole table's primary key backwards to
        # find an old user's rows. Other lists go by seq (the primary key, or
        # ix_jobs_status_seq with a status).
        by_time = user_id is not None
        if page_token:
            at, before = _decode_list_token(page_token)
            if by_time and at is not None:
                stmt = stmt.where(
                    or_(
                        jobs.c.created_at < at,
                        and_(jobs.c.created_at == at, jobs.c.seq < before),
                    )
                )
            else:
                stmt = stmt.where(jobs.c.seq < before)
        if by_time:
            stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.seq.desc())
        else:
            stmt = stmt.order_by(jobs.c.seq.desc())
        stmt = stmt.limit(page_size + 1)
        async with self.sessions() as session:
            rows = [JobRecord.from_row(r) for r in (await session.execute(stmt)).all()]
        token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            last = rows[-1]
            token = _encode_list_token(last.created_at if by_time else None, last.seq)
        return rows, token

    # ----------------------------------------------------------------- create

    async def create(self, req: CreateJobInput) -> tuple[JobRecord, bool]:
        """Create a job, or return the original in its idempotency scope (SPEC §2.3, §2.5).

        Returns:
            ``(job, replayed)``.

        Raises:
            AppError: INVALID_ARGUMENT, NOT_FOUND (target), AI_NOT_AUTHORIZED,
                QUOTA_EXCEEDED, PLATFORM_BUDGET_EXCEEDED, PLATFORM_CIRCUIT_OPEN,
                INVALID_CREDENTIAL.
        """
        if req.job_type not in JOB_TYPES:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "unknown jobType", {"field": "jobType"})
        if not req.user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        if req.target_type == "user":
            if not req.target_id:
                req.target_id = req.user_id
            elif req.target_id != req.user_id:
                raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": req.target_id})
        if not req.target_id:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "targetId is required", {"field": "targetId"}
            )
        if req.idempotency_key is not None and not 1 <= len(req.idempotency_key) <= 255:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "idempotency key must be 1..255 characters",
                {"field": "idempotencyKey"},
            )
        check_range("maxRetryCount", req.max_retry_count, 0, 10)
        check_range("timeoutSeconds", req.timeout_seconds, 10, 3600)
        if req.priority is not None:
            check_range("priority", req.priority, 0, 1000)
        if req.idempotency_key is not None:
            existing = await self._by_scope(req)
            if existing is not None:  # whatever its params, even invalid ones (SPEC §2.5)
                return existing, True
        params = normalize_params(req.job_type, req.params)

        credential_id = await self.credentials.check(req.user_id, req.api_key_mode)
        await self._ensure_admission_row(req.user_id)

        async def body(session: AsyncSession) -> tuple[JobRecord, bool]:
            if not self.clock.is_sqlite:
                existing = await self._admission_batched(await session.connection(), req)
                if existing is not None:
                    return existing, True
            else:  # SQLite runs one write transaction at a time: no lock to take
                if req.idempotency_key is not None:
                    # A racing repeat that lost the pre-check gets the original
                    # here, not a quota refusal.
                    existing = await self._by_scope(req, session)
                    if existing is not None:
                        return existing, True
                await self._admission(session, req)
            snapshot_id = await self.learning.build_snapshot(
                session,
                user_id=req.user_id,
                job_type=req.job_type,
                target_type=req.target_type,
                target_id=req.target_id,
                params=params,
            )
            job = await self._insert_job(
                session,
                job_id=new_id(),
                user_id=req.user_id,
                job_type=req.job_type,
                target_type=req.target_type,
                target_id=req.target_id,
                snapshot_id=snapshot_id,
                params=params,
                api_key_mode=req.api_key_mode,
                credential_id=credential_id,
                idempotency_key=req.idempotency_key,
                priority=req.priority,
                max_retry_count=req.max_retry_count,
                timeout_seconds=req.timeout_seconds,
                retried_from_job_id=None,
                actor=req.actor or f"user:{req.user_id}",
            )
            return job, False

        try:
            job, replayed = await self.tx(body)
        except IntegrityError:
            if req.idempotency_key is None:
                raise
            existing = await self._by_scope(req)
            if existing is None:
                raise
            return existing, True
        if replayed:
            return job, True
        metrics.JOBS_CREATED.labels(job.job_type, job.api_key_mode).inc()
        self.signal.notify()
        log.info(
            "job created",
            extra={
                "fields": {
                    "jobId": job.job_id,
                    "jobType": job.job_type,
                    "apiKeyMode": job.api_key_mode,
                    "userId": job.user_id,
                }
            },
        )
        return job, False

    async def _ensure_admission_row(self, user_id: str) -> None:
        """Make sure the user's admission lock row exists (MySQL/MariaDB only).

        Inserted in its own short transaction (``INSERT IGNORE``), never in the
        create transaction: an ignored duplicate takes a shared lock there, and
        two of those upgrading to the exclusive lock would deadlock.
        """
        if self.clock.is_sqlite:
            return
        if user_id in self._admission_rows:
            self._admission_rows.move_to_end(user_id)
            return

        async def run() -> None:
            async with self.sessions() as session, session.begin():
                await session.execute(
                    mysql_insert(admission_locks).values(user_id=user_id).prefix_with("IGNORE")
                )

        await retry_transient(run)
        self._admission_rows[user_id] = None
        while len(self._admission_rows) > ADMISSION_ROWS_KNOWN:
            self._admission_rows.popitem(last=False)

    async def _by_scope(
        self, req: CreateJobInput, session: DbExec | None = None
    ) -> JobRecord | None:
        stmt = sqlcache.statement(("admission_scope", self.clock.dialect), _scope_stmt)
        if session is not None:
            row = (await session.execute(stmt, _scope_params(req))).first()
        else:
            async with self.sessions() as own:
                row = (await own.execute(stmt, _scope_params(req))).first()
        return JobRecord.from_row(row) if row is not None else None

    async def _admission(self, session: DbExec, req: CreateJobInput) -> None:
        """The create transaction's admission, one statement at a time (SPEC §6):
        the AI switch, the daily quota, then the platform guards.

        Raises:
            AppError: AI_NOT_AUTHORIZED, QUOTA_EXCEEDED, PLATFORM_BUDGET_EXCEEDED,
                PLATFORM_CIRCUIT_OPEN.
        """
        dialect = self.clock.dialect
        user = {"a_user": req.user_id}
        await self._check_ai_granted(session, req.user_id)
        quota = self._quota(req)
        if quota > 0:
            used = await session.execute(
                sqlcache.statement(("admission_used", dialect), self._used_stmt), user
            )
            _check_quota(quota, used.scalar_one())
        if req.api_key_mode == "platform_key":
            await self._platform_guards(session)

    async def _lock_admission(self, session: DbExec, user_id: str) -> None:
        """Take the user's admission lock (MySQL/MariaDB; SQLite runs one write
        transaction at a time). Creates, re-runs and AI switch changes of one user
        take it first, so none slips a pending job past a revoke (SPEC §6)."""
        if not self.clock.is_sqlite:
            await session.execute(
                sqlcache.statement(("admission_lock", self.clock.dialect), _admission_lock_stmt),
                {"a_user": user_id},
            )

    async def _check_ai_granted(self, session: DbExec, user_id: str) -> None:
        """Refuse when the user turned AI off (SPEC §6).

        Raises:
            AppError: AI_NOT_AUTHORIZED.
        """
        granted = await session.execute(
            sqlcache.statement(("admission_granted", self.clock.dialect), _granted_stmt),
            {"a_user": user_id},
        )
        _check_granted(granted.scalar_one_or_none())

    async def _admission_batched(
        self, conn: AsyncConnection, req: CreateJobInput
    ) -> JobRecord | None:
        """:meth:`_admission` on MySQL/MariaDB in one round trip, the user's admission
        lock and the idempotency re-check included.

        The server runs the reads in order, each after the one before: the user's
        admission row ``FOR UPDATE`` (one create per user at a time on every
        replica, so the day's count sees every job committed before it, SPEC §6),
        the job of the request's idempotency scope (a racing repeat that lost the
        pre-check gets the original, not a quota refusal), the AI switch, the
        day's job count, the day's platform spend and the breaker's state. They
        are then judged in :meth:`_admission`'s order. A breaker that is not
        closed goes through :func:`breaker.admit_new_job` (its locking read and
        transitions) as before.

        Returns:
            The original job of the request's idempotency scope, else None.

        Raises:
            AppError: as :meth:`_admission`.
        """
        dialect = self.clock.dialect
        user = {"a_user": req.user_id}
        batch = StatementBatch(conn)
        batch.add(("admission_lock", dialect), _admission_lock_stmt, user)
        scope = None
        if req.idempotency_key is not None:
            scope = batch.add(("admission_scope", dialect), _scope_stmt, _scope_params(req))
        granted = batch.add(("admission_granted", dialect), _granted_stmt, user)
        quota = self._quota(req)
        used = None
        if quota > 0:
            used = batch.add(("admission_used", dialect), self._used_stmt, user)
        platform = req.api_key_mode == "platform_key"
        spent = state = None
        if platform:
            spent = batch.add(("admission_spent", dialect), self._spent_stmt, {})
            state = batch.add(*breaker_mod.row_sql(lock=False), {})
        out = await batch.run()
        if scope is not None and out[scope].rows:
            return JobRecord.from_values(JOB_COLUMNS, out[scope].rows[0])
        _check_granted(out[granted].rows[0][0] if out[granted].rows else None)
        if used is not None:
            _check_quota(quota, out[used].rows[0][0])
        if spent is not None and state is not None:
            self._check_budget(out[spent].rows[0][0])
            rows = out[state].rows
            if not rows or rows[0][0] != "closed":
                await breaker_mod.admit_new_job(conn, self.clock, self.settings)
        return None

    def _quota(self, req: CreateJobInput) -> int:
        """The daily job quota of ``req``'s user: their plan's, else the default (0 = none)."""
        if req.plan and req.plan in self.settings.PLAN_DAILY_JOB_QUOTAS:
            return self.settings.PLAN_DAILY_JOB_QUOTAS[req.plan]
        return self.settings.USER_DAILY_JOB_QUOTA

    def _used_stmt(self) -> Any:
        """The user's (``a_user``) jobs created since the database's UTC midnight."""
        return (
            select(func.count())
            .select_from(jobs)
            .where(
                jobs.c.user_id == bindparam("a_user", type_=String()),
                jobs.c.created_at >= self.clock.day_start(),
            )
        )

    def _spent_stmt(self) -> Any:
        """The day's platform-key spend: its running total's rows, by primary key
        (at most PLATFORM_SPEND_SHARDS), never a sum over the invocation log."""
        return select(func.coalesce(func.sum(platform_spend.c.cost_usd), 0)).where(
            platform_spend.c.day == self.clock.today()
        )

    def _check_budget(self, spent: Any) -> None:
        """Refuse a platform-key job once the day's spend reached the budget (SPEC §6).

        Raises:
            AppError: PLATFORM_BUDGET_EXCEEDED.
        """
        budget = self.settings.PLATFORM_DAILY_BUDGET_USD
        if Decimal(str(spent)) >= Decimal(str(budget)):
            raise AppError(
                ErrorCode.PLATFORM_BUDGET_EXCEEDED,
                "the platform's daily AI budget is used up",
                {"budgetUsd": budget, "spentUsd": float(spent)},
            )

    async def _platform_guards(self, session: DbExec) -> None:
        spent = (
            await session.execute(
                sqlcache.statement(("admission_spent", self.clock.dialect), self._spent_stmt)
            )
        ).scalar_one()
        self._check_budget(spent)
        await breaker_mod.admit_new_job(session, self.clock, self.settings)

    async def _insert_job(
        self,
        session: AsyncSession,
        *,
        job_id: str,
        user_id: str,
        job_type: str,
        target_type: str,
        target_id: str,
        snapshot_id: str | None,
        params: dict[str, Any],
        api_key_mode: str,
        credential_id: str | None,
        idempotency_key: str | None,
        priority: int | None,
        max_retry_count: int | None,
        timeout_seconds: int | None,
        retried_from_job_id: str | None,
        actor: str,
        model_provider: str = "deepseek",
        model_name: str = "deepseek-chat",
    ) -> JobRecord:
        """Insert a pending job, its generation plan (quiz/flashcard) and its first
        event in the caller's transaction; returns the job as stored.

        On MySQL/MariaDB the job row, its event and the read of the stored row go
        as one batch (no COMMIT: the create's own COMMIT follows alone, since a
        create run again after a lost connection would make a second job).

        Raises:
            sqlalchemy.exc.IntegrityError: a job of the same idempotency scope exists.
        """
        values = self._job_values(
            job_id=job_id,
            user_id=user_id,
            job_type=job_type,
            target_type=target_type,
            target_id=target_id,
            snapshot_id=snapshot_id,
            params=params,
            api_key_mode=api_key_mode,
            credential_id=credential_id,
            idempotency_key=idempotency_key,
            priority=priority,
            max_retry_count=max_retry_count,
            timeout_seconds=timeout_seconds,
            retried_from_job_id=retried_from_job_id,
            model_provider=model_provider,
            model_name=model_name,
        )
        first_event = event_params(
            job_id=job_id, from_status=None, to_status=PENDING, actor=actor, attempt_no=0
        )
        plan: dict[str, Any] = {
            "job_id": job_id,
            "user_id": user_id,
            "job_type": job_type,
            "target_type": target_type,
            "target_id": target_id,
            "params": params,
        }
        if not self.clock.is_sqlite:
            batch = StatementBatch(await session.connection())
            batch.add(self._insert_job_key, self._insert_job_stmt, values)
            batch.add(*event_sql(self.clock), first_event)
            read = batch.add(
                ("get_job", self.clock.dialect, False), _get_job_stmt, {"g_job_id": job_id}
            )
            out = await batch.run()
            await self.learning.create_generation_plan(session, **plan)
            return JobRecord.from_values(JOB_COLUMNS, out[read].rows[0])
        await session.execute(
            sqlcache.statement(self._insert_job_key, self._insert_job_stmt), values
        )
        # created_at and available_at come from one statement, so they are equal.
        await self.learning.create_generation_plan(session, **plan)
        await session.execute(sqlcache.statement(*event_sql(self.clock)), first_event)
        return await self._must_get(session, job_id)

    def _job_values(
        self,
        *,
        priority: int | None,
        max_retry_count: int | None,
        timeout_seconds: int | None,
        **given: Any,
    ) -> dict[str, Any]:
        """A new pending job's column values but its times (:meth:`_insert_job_stmt`),
        the settings' defaults filling ``priority``, ``max_retry_count`` and
        ``timeout_seconds`` when None."""
        s = self.settings
        return {
            **given,
            "status": PENDING,
            "priority": s.DEFAULT_PRIORITY if priority is None else priority,
            "attempt_no": 0,
            "retry_count": 0,
            "max_retry_count": s.MAX_RETRY_COUNT if max_retry_count is None else max_retry_count,
            "timeout_seconds": s.JOB_TIMEOUT_SECONDS
            if timeout_seconds is None
            else timeout_seconds,
            "cancel_requested": False,
        }

    @property
    def _insert_job_key(self) -> tuple[str, str]:
        return ("insert_job", self.clock.dialect)

    def _insert_job_stmt(self) -> Any:
        """INSERT of a job row, its times from one database clock reading (so
        ``created_at`` = ``available_at`` = ``updated_at``); values: :meth:`_job_values`."""
        now = self.clock.now()
        return insert(jobs).values(available_at=now, created_at=now, updated_at=now)

    # ------------------------------------------------------------ scheduling

    def _poll_query(self, capabilities: Sequence[str], limit: int) -> Any:
        return (
            select(jobs)
            .where(
                jobs.c.status == PENDING,
                jobs.c.job_type.in_(list(capabilities)),
                jobs.c.available_at <= self.clock.now(),
            )
            .order_by(jobs.c.priority, jobs.c.created_at, jobs.c.seq)
            .limit(limit)
        )

    @staticmethod
    def check_poll_args(capabilities: Sequence[str], limit: int, wait_ms: int) -> int:
        """Validate poll/claim arguments (SPEC §2.6); returns the effective limit.

        Raises:
            AppError: ``INVALID_ARGUMENT`` for empty/unknown capabilities, limit < 0
                (0 means the default 10) or ``waitMs`` outside 0..20000.
        """
        if not capabilities:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "capabilities must not be empty",
                {"field": "capabilities"},
            )
        unknown = [c for c in capabilities if c not in JOB_TYPES]
        if unknown:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "unknown capabilities",
                {"field": "capabilities", "value": unknown},
            )
        if limit < 0:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "limit must be ≥ 1", {"field": "limit"})
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "waitMs must be 0..20000", {"field": "waitMs"}
            )
        return min(limit or DEFAULT_POLL_LIMIT, MAX_POLL_LIMIT)

    async def seen(
        self,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> None:
        """Registry upsert for a runtime call (throttled: see :meth:`WorkerRegistry.due`)."""
        if not self.registry.due(instance_id, capabilities, status_address):
            return

        async def body(session: AsyncSession) -> None:
            await self.registry.touch(session, instance_id, capabilities, status_address)

        try:
            await self.tx(body)
        except Exception:  # the registry must never fail a runtime call
            log.warning("worker registry update failed", exc_info=True)

    async def poll(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> list[JobRecord]:
        """Pending jobs the caller can run, not locked (SPEC §2.6), long-polling up to ``wait_ms``."""
        n = self.check_poll_args(capabilities, limit, wait_ms)

        async def once() -> list[JobRecord]:
            async with self.sessions() as session:
                rows = (await session.execute(self._poll_query(capabilities, n))).all()
            return [JobRecord.from_row(r) for r in rows]

        return await self._long_poll(once, wait_ms)

    async def claim(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> list[JobRecord]:
        """Poll + lock up to ``limit`` jobs in one short transaction (SPEC §3 claim).

        On MySQL/MariaDB the candidate rows are taken ``FOR UPDATE SKIP LOCKED``
        so concurrent claimers get disjoint batches; on SQLite the transaction
        holds the single write lock.

        Raises:
            AppError: INVALID_ARGUMENT (bad ``limit``, ``waitMs`` or capabilities).
        """
        claimed, _ = await self._claim(instance_id, capabilities, limit, wait_ms, start=False)
        return claimed

    async def claim_started(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> tuple[list[JobRecord], dict[str, SnapshotView]]:
        """Claim, and start each claimed job, in the same short transaction.

        What :meth:`claim` then :meth:`snapshot` for every job would do, without a
        call per job: each job goes pending → locked → running (two event rows,
        SPEC §2.3: the start is the one a snapshot read implies) and its snapshot
        is read. The jobs come back ``running``.

        Returns:
            ``(jobs, snapshots)``: the jobs as :meth:`claim` returns them, and the
            snapshot of each by job id. A job whose snapshot row is missing has
            none there (:meth:`snapshot` then answers as usual).

        Raises:
            AppError: INVALID_ARGUMENT (bad ``limit``, ``waitMs`` or capabilities).
        """
        return await self._claim(instance_id, capabilities, limit, wait_ms, start=True)

    async def _claim(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int, *, start: bool
    ) -> tuple[list[JobRecord], dict[str, SnapshotView]]:
        n = self.check_poll_args(capabilities, limit, wait_ms)
        caps = sorted(set(capabilities))

        async def once() -> _Claimed:
            return await self.lean_tx(
                lambda session: self._claim_in(session, instance_id, caps, n, start=start)
            )

        result: _Claimed = ([], {})

        async def any_claimed() -> list[JobRecord]:
            nonlocal result
            result = await once()
            return result[0]

        await self._long_poll(any_claimed, wait_ms)
        claimed, snapshots = result
        for job in claimed:
            self._observe_pickup(job)
        if not start:
            self._remember_claimed(claimed)
        return claimed, snapshots

    def _claim_pick(self, caps: list[str], n: int) -> tuple[Any, Callable[[], Any], dict[str, Any]]:
        """The claim's pick (``FOR UPDATE SKIP LOCKED``) as ``(cache key, build, params)``."""
        return (("claim_pick", self.clock.dialect), self._claim_pick_stmt, {"caps": caps, "n": n})

    async def _claim_in(
        self,
        session: DbExec,
        instance_id: str,
        caps: list[str],
        n: int,
        *,
        start: bool,
        picked: Sequence[Sequence[Any]] | None = None,
        commit: bool = False,
    ) -> _Claimed:
        """A claim's statements inside the caller's transaction.

        Args:
            caps: the capabilities, sorted and without repeats.
            n: how many jobs at most (checked by :meth:`check_poll_args`).
            start: also start each job and read its snapshot (ClaimJobs with snapshots).
            picked: the pick's rows when the caller already ran it (in a batch);
                None runs it here.
            commit: end the writes' batch with the COMMIT (MySQL/MariaDB), for a
                caller whose transaction converges when run again; else the
                caller's block commits.
        """
        lease_s = self.settings.LOCK_LEASE_SECONDS
        actor = runtime_actor(instance_id)
        if picked is None:
            key, build, params = self._claim_pick(caps, n)
            picked = await _read_rows(session, key, build(), params)
        if not picked:
            return [], {}
        ids = [row[0] for row in picked]
        snapshot_ids = {row[0]: row[1] for row in picked if row[1]} if start else {}
        if supports_batches(session):
            return await self._lock_claimed(
                session, ids, snapshot_ids, instance_id, actor, lease_s, start=start, commit=commit
            )
        status = RUNNING if start else LOCKED
        await apply_many(
            session,
            self.clock,
            Op.LOCK,
            job_ids=ids,
            where=lock_guard(self.clock),
            values=self._lock_values(instance_id, lease_s),
        )
        if start:
            await apply_many(
                session,
                self.clock,
                Op.START,
                job_ids=ids,
                values={"started_at": self.clock.now()},
                holder=instance_id,
            )
        rows = (
            await session.execute(
                sqlcache.statement(
                    ("claim_read", self.clock.dialect, status),
                    lambda: _claim_read_stmt(status),
                ),
                {"ids": ids, "instance_id": instance_id},
            )
        ).all()
        out = [JobRecord.from_row(r) for r in rows]
        if out:
            steps = [(PENDING, LOCKED)] + ([(LOCKED, RUNNING)] if start else [])
            await session.execute(
                EVENTS_INSERT,
                [
                    {
                        "job_id": j.job_id,
                        "from_status": from_status,
                        "to_status": to_status,
                        "error_code": None,
                        "actor": actor,
                        "attempt_no": j.attempt_no,
                        "at": j.locked_at if to_status == LOCKED else j.started_at,
                    }
                    for j in out
                    for (from_status, to_status) in steps
                ],
            )
        views = await self._load_snapshots(
            session, {snapshot_ids[j.job_id] for j in out if j.job_id in snapshot_ids}
        )
        return out, _by_job(out, snapshot_ids, views)

    async def _lock_claimed(
        self,
        session: DbExec,
        ids: list[str],
        snapshot_ids: dict[str, str],
        instance_id: str,
        actor: str,
        lease_s: float,
        *,
        start: bool,
        commit: bool = False,
    ) -> tuple[list[JobRecord], dict[str, SnapshotView]]:
        """Claim's writes after its pick, in one round trip (MySQL/MariaDB).

        The lock UPDATE, the event rows (read from the rows it locked: their new
        ``attemptNo`` and ``lockedAt``) and the read of those rows go as one
        batch; the COMMIT follows on its own. Run again after a COMMIT whose
        answer was lost, ClaimJobs would lock other jobs, so its batch does not
        end in COMMIT (:mod:`job_service.domain.batch`); a result's claim
        (``commit``) does, since run again it replays and claims nothing. A job
        the UPDATE's guard skipped is neither read nor logged.

        With ``start``, the start UPDATE (guarded by the lease just granted) and
        its events follow the lock's in the same batch, and so do the reads of
        the snapshots (``snapshot_ids``: job id → snapshot id) not in the cache.
        """
        lock = transition_many_sql(
            self.clock,
            Op.LOCK,
            job_ids=ids,
            where=lock_guard(self.clock),
            values=self._lock_values(instance_id, lease_s),
        )
        moved = {"ids": ids, "instance_id": instance_id, "e_actor": actor[:160]}
        batch = StatementBatch(session)
        batch.add(lock.key, lock.build, lock.params)
        batch.add(("claim_events", self.clock.dialect, LOCKED), _claim_events_stmt, moved)
        status = LOCKED
        if start:
            status = RUNNING
            begin = transition_many_sql(
                self.clock,
                Op.START,
                job_ids=ids,
                values={"started_at": self.clock.now()},
                holder=instance_id,
            )
            batch.add(begin.key, begin.build, begin.params)
            batch.add(
                ("claim_events", self.clock.dialect, RUNNING),
                lambda: _claim_events_stmt(RUNNING),
                moved,
            )
        read = batch.add(
            ("claim_read", self.clock.dialect, status),
            lambda: _claim_read_stmt(status),
            {"ids": ids, "instance_id": instance_id},
        )
        views: dict[str, SnapshotView] = {}
        reads: dict[str, tuple[int, SnapshotRead]] = {}
        reader = getattr(self.learning, "snapshot_read", None)
        for sid in set(snapshot_ids.values()):
            if reader is None:
                break
            snap: SnapshotRead = reader(sid)
            if snap.view is not None:
                views[sid] = snap.view
            else:
                reads[sid] = (batch.add(snap.key, snap.build, snap.params), snap)
        if commit and reader is not None:
            batch.commit()
        out = await batch.run()
        claimed = [JobRecord.from_values(JOB_COLUMNS, row) for row in out[read].rows]
        for sid, (index, snap) in reads.items():
            if out[index].rows:
                views[sid] = snap.from_row(out[index].rows[0])
        if reader is None:
            views = await self._load_snapshots(session, set(snapshot_ids.values()))
        return claimed, _by_job(claimed, snapshot_ids, views)

    async def _load_snapshots(
        self, session: DbExec, snapshot_ids: set[str]
    ) -> dict[str, SnapshotView]:
        """The snapshots of a claim with start, one read each, by snapshot id; a
        snapshot without a row is left out (its job's GetSnapshot answers NOT_FOUND)."""
        views: dict[str, SnapshotView] = {}
        for sid in snapshot_ids:
            try:
                views[sid] = await self.learning.load_snapshot(session, sid)
            except AppError as err:
                if err.code != ErrorCode.NOT_FOUND:
                    raise
        return views

    def _claim_pick_stmt(self) -> Any:
        """Claim's candidate read: ``(jobId, snapshotId)`` rows (bound: ``caps`` list,
        ``n``), ``SKIP LOCKED`` on MySQL."""

        def build() -> Any:
            q = (
                select(jobs.c.job_id, jobs.c.snapshot_id)
                .where(
                    jobs.c.status == PENDING,
                    jobs.c.job_type.in_(bindparam("caps", expanding=True)),
                    jobs.c.available_at <= self.clock.now(),
                )
                .order_by(jobs.c.priority, jobs.c.created_at, jobs.c.seq)
                .limit(bindparam("n", type_=Integer()))
            )
            return q if self.clock.is_sqlite else q.with_for_update(skip_locked=True)

        return sqlcache.statement(("claim_pick", self.clock.dialect), build)

    def _lock_values(self, instance_id: str, lease_s: float) -> dict[str, Any]:
        """pending → locked: a new attempt, its lease, and no ``startedAt`` yet (a retried
        job's old one would let the reaper time the new attempt out before it starts)."""
        return {
            "attempt_no": NEXT_ATTEMPT,
            "started_at": None,
            "locked_by": instance_id,
            "locked_at": self.clock.now(),
            "lock_until": self.clock.plus(lease_s),
        }

    async def _lock_event(self, session: DbExec, job: JobRecord) -> None:
        await record_event(
            session,
            self.clock,
            job_id=job.job_id,
            from_status=PENDING,
            to_status=LOCKED,
            actor=runtime_actor(job.locked_by or ""),
            attempt_no=job.attempt_no,
        )

    def _observe_pickup(self, job: JobRecord) -> None:
        if job.locked_at is not None:
            delay = (job.locked_at - job.available_at).total_seconds()
            metrics.PICKUP_LATENCY.labels(job.job_type).observe(max(0.0, delay))

    async def _long_poll(
        self, once: Callable[[], Awaitable[list[JobRecord]]], wait_ms: int
    ) -> list[JobRecord]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000.0
        while True:
            found = await once()
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                return found
            # Until a local wake-up, ask the shared probe (one query per process
            # per RECHECK_SECONDS) instead of re-running this caller's query; when
            # the wait ends with the probe still saying "nothing", answer empty
            # without a last query of our own (the caller polls again anyway).
            while True:
                if await self.signal.wait(min(RECHECK_SECONDS, remaining)):
                    break
                if await self.probe.claimable():
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []

    async def _any_claimable(self) -> bool:
        """Whether some pending job is available now (the :class:`PendingProbe` query)."""
        async with self.sessions() as session:
            row = (
                await session.execute(
                    select(jobs.c.seq)
                    .where(jobs.c.status == PENDING, jobs.c.available_at <= self.clock.now())
                    .limit(1)
                )
            ).first()
        return row is not None

    async def lock(self, job_id: str, instance_id: str) -> JobRecord:
        """pending → locked for the caller (SPEC §2.3 lock).

        Raises:
            AppError: JOB_NOT_FOUND; INVALID_JOB_STATE (terminal/cancelled);
                JOB_ALREADY_LOCKED (leased, or a pending job whose old lease has not lapsed).
        """

        async def body(session: DbExec) -> JobRecord:
            ok = await apply(
                session,
                self.clock,
                Op.LOCK,
                job_id=job_id,
                actor=runtime_actor(instance_id),
                where=lock_guard(self.clock),
                values=self._lock_values(instance_id, self.settings.LOCK_LEASE_SECONDS),
                record=False,
            )
            job = await self._must_get(session, job_id)
            if not ok:
                if job.status in TERMINAL:
                    raise AppError(
                        ErrorCode.INVALID_JOB_STATE,
                        f"job is {job.status}",
                        {"jobId": job_id, "status": job.status},
                    )
                raise AppError(
                    ErrorCode.JOB_ALREADY_LOCKED,
                    "job is already locked",
                    {"jobId": job_id, "status": job.status},
                )
            await self._lock_event(session, job)
            return job

        job = await self.lean_tx(body)
        self._observe_pickup(job)
        return job

    # ---------------------------------------------------------- lease holder

    async def _start_or_renew(
        self, session: DbExec, lease: Lease, *, renew: bool
    ) -> JobRecord | None:
        """locked → running (implied start) and/or renew; None when the lease is not held.

        Two statements whatever the state: the transition's guarded UPDATE (renew
        tried first when renewing, since a heartbeat mostly finds the job running),
        then the row read back under the lease guard.
        """
        lease_s = self.settings.LOCK_LEASE_SECONDS
        if not renew:
            await self._start(session, lease)
            return await self._get_leased(session, lease)
        actor = runtime_actor(lease.instance_id)
        renewed = await apply(
            session,
            self.clock,
            Op.RENEW,
            job_id=lease.job_id,
            actor=actor,
            lease=lease,
            values={"lock_until": self.clock.plus(lease_s)},
        )
        if not renewed:
            await apply(
                session,
                self.clock,
                Op.START,
                job_id=lease.job_id,
                actor=actor,
                lease=lease,
                values={"started_at": self.clock.now(), "lock_until": self.clock.plus(lease_s)},
            )
        return await self._get_leased(session, lease)

    async def _start(self, session: DbExec, lease: Lease) -> bool:
        """locked → running for the lease holder; False when not locked or not held."""
        return await run_transition(session, self.clock, self._start_sql(lease))

    def _start_sql(self, lease: Lease, where: Any = None) -> TransitionSql:
        """The implied start (locked → running) of ``lease``'s job, and its event;
        ``where``: an extra registered guard."""
        sql = transition_sql(
            self.clock,
            Op.START,
            job_id=lease.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            values={"started_at": self.clock.now()},
            where=where,
        )
        assert sql is not None and sql.event is not None  # START always applies and records
        return sql

    def _remember_claimed(self, claimed: Sequence[JobRecord]) -> None:
        for job in claimed:
            if job.snapshot_id:
                self._claimed_snapshots[job.job_id] = job.snapshot_id
        while len(self._claimed_snapshots) > MAX_CLAIMED_SNAPSHOTS:
            self._claimed_snapshots.popitem(last=False)

    async def start(self, lease: Lease) -> JobRecord:
        """locked → running; a repeat by the holder returns the same ``startedAt`` (SPEC §2.3).

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD.
        """

        async def body(session: DbExec) -> JobRecord:
            job = await self._start_or_renew(session, lease, renew=False)
            if job is None:
                raise self._lease_lost(await self._get(session, lease.job_id), lease)
            return job

        return await self.lean_tx(body)

    async def heartbeat(self, lease: Lease) -> JobRecord:
        """Renew the lease (``lockUntil = now + lease``); implies start (SPEC §2.3).

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD (the lease lapsed or moved: stop work).
        """

        async def body(session: DbExec) -> JobRecord:
            job = await self._start_or_renew(session, lease, renew=True)
            if job is None:
                raise self._lease_lost(await self._get(session, lease.job_id), lease)
            return job

        try:
            return await self.lean_tx(body)
        except AppError as err:
            if err.code == ErrorCode.LOCK_NOT_HELD:
                metrics.LEASE_LOSSES.labels("heartbeat").inc()
            raise

    async def heartbeat_leases(
        self, instance_id: str, leases: list[tuple[str, int]]
    ) -> list[LeaseAnswer]:
        """Renew up to 500 leases; one answer per lease, in order (SPEC §3).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for more than 500 leases.
        """
        if len(leases) > MAX_HEARTBEAT_LEASES:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "at most 500 leases", {"field": "leases"})

        refs = list(dict.fromkeys(leases))
        if not refs:
            return []

        async def body(session: DbExec) -> list[LeaseAnswer]:
            # one UPDATE renews every running lease; one SELECT reads them all back;
            # only a job not started yet needs its own implied start (and event row)
            await renew_many(
                session,
                self.clock,
                instance_id=instance_id,
                refs=refs,
                lease_seconds=self.settings.LOCK_LEASE_SECONDS,
            )
            held: dict[tuple[str, int], tuple[datetime | None, bool]] = {}
            rows = await session.execute(
                select(
                    jobs.c.job_id,
                    jobs.c.attempt_no,
                    jobs.c.status,
                    jobs.c.lock_until,
                    jobs.c.cancel_requested,
                ).where(leases_guard(self.clock, instance_id, refs))
            )
            for r in rows.all():
                key = (str(r.job_id), int(r.attempt_no))
                if r.status == LOCKED:
                    job = await self._start_or_renew(
                        session, Lease(key[0], instance_id, key[1]), renew=True
                    )
                    if job is not None:
                        held[key] = (job.lock_until, bool(job.cancel_requested))
                else:
                    held[key] = (r.lock_until, bool(r.cancel_requested))
            out: list[LeaseAnswer] = []
            for job_id, attempt_no in leases:
                state = held.get((job_id, attempt_no))
                if state is None:
                    out.append(LeaseAnswer(job_id, attempt_no, False, None, False))
                else:
                    out.append(LeaseAnswer(job_id, attempt_no, True, state[0], state[1]))
            return out

        return await self.lean_tx(body)

    async def verify_lease(self, lease: Lease) -> LeaseHolderView:
        """What credential resolution needs when ``lease`` is live (SPEC §3 fencing).

        One read of the few columns it needs (no full row), under the lease guard.

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD.
        """
        stmt = sqlcache.statement(
            ("verify_lease", self.clock.dialect),
            lambda: select(
                jobs.c.user_id,
                jobs.c.api_key_mode,
                jobs.c.credential_id,
                jobs.c.model_provider,
                jobs.c.model_name,
            ).where(lease_guard_bound(self.clock)),
        )

        async def body(session: DbExec) -> LeaseHolderView:
            rows = await _read_rows(
                session,
                ("verify_lease", self.clock.dialect),
                stmt,
                lease_params(lease),
                commit=True,
            )
            found = rows[0] if rows else None
            if found is None:
                raise self._lease_lost(await self._get(session, lease.job_id), lease)
            return LeaseHolderView(*found)

        return await self.lean_tx(body)

    async def verify_leases(self, leases: Sequence[Lease]) -> list[LeaseHolderView | AppError]:
        """:meth:`verify_lease` for several leases in one read; one verdict per lease, in order.

        Each lease is judged as :meth:`verify_lease` judges it (the holder's instance
        and ``attemptNo``, a leased status, ``lockUntil ≥ now`` on the database
        clock), from one ``SELECT … WHERE jobId IN (…)``.

        Returns:
            The key settings for each held lease; the ``AppError`` (``JOB_NOT_FOUND``,
            ``LOCK_NOT_HELD``) :meth:`verify_lease` would raise for each other.

        Raises:
            AppError: INVALID_ARGUMENT for more than 500 leases.
        """
        if len(leases) > MAX_HEARTBEAT_LEASES:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "at most 500 leases", {"field": "leases"})
        if not leases:
            return []
        stmt = sqlcache.statement(("verify_leases", self.clock.dialect), self._verify_leases_stmt)
        params = {"ids": sorted({lease.job_id for lease in leases})}

        async def body(session: DbExec) -> list[Sequence[Any]]:
            return await _read_rows(
                session, ("verify_leases", self.clock.dialect), stmt, params, commit=True
            )

        rows = {row[0]: row for row in await self.lean_tx(body)}
        out: list[LeaseHolderView | AppError] = []
        for lease in leases:
            row = rows.get(lease.job_id)
            if row is None:
                out.append(_lease_refusal(lease, None))
                continue
            _, status, locked_by, attempt_no, live, *view = row
            if (
                status in LEASED
                and locked_by == lease.instance_id
                and attempt_no == lease.attempt_no
                and bool(live)
            ):
                out.append(LeaseHolderView(*view))
            else:
                out.append(_lease_refusal(lease, status))
        return out

    def _verify_leases_stmt(self) -> Any:
        """:meth:`verify_leases`' read (bound: ``ids`` list): per job its lease columns,
        whether the lease is live (``lockUntil ≥ now``), and the key settings."""
        live = and_(jobs.c.lock_until.is_not(None), jobs.c.lock_until >= self.clock.now())
        return select(
            jobs.c.job_id,
            jobs.c.status,
            jobs.c.locked_by,
            jobs.c.attempt_no,
            case((live, 1), else_=0).label("live"),
            jobs.c.user_id,
            jobs.c.api_key_mode,
            jobs.c.credential_id,
            jobs.c.model_provider,
            jobs.c.model_name,
        ).where(jobs.c.job_id.in_(bindparam("ids", expanding=True)))

    async def snapshot(self, lease: Lease) -> SnapshotView:
        """The leased job's snapshot; reading it implies start (SPEC §2.3, §3).

        One transaction: the implied start, the lease check and the snapshot read
        (snapshots are immutable, so a process-wide LRU usually answers the last).

        Raises:
            AppError: JOB_NOT_FOUND, LOCK_NOT_HELD, INVALID_SNAPSHOT (job has none).
        """

        # the holder's first read forgets it (a caller without the lease does not)
        snapshot_id = self._claimed_snapshots.get(lease.job_id)

        async def body(session: DbExec) -> SnapshotView:
            if supports_batches(session) and snapshot_id is not None:
                view = await self._start_and_read_snapshot(session, lease, snapshot_id)
                if view is not None:
                    self._claimed_snapshots.pop(lease.job_id, None)
                    return view
            started = await self._start(session, lease)
            if started and snapshot_id is not None:
                # the lease-guarded UPDATE matched: the caller holds the lease
                self._claimed_snapshots.pop(lease.job_id, None)
                return await self.learning.load_snapshot(session, snapshot_id)
            job = await self._get_leased(session, lease)
            if job is None:
                raise self._lease_lost(await self._get(session, lease.job_id), lease)
            if not job.snapshot_id:
                raise AppError(
                    ErrorCode.INVALID_SNAPSHOT, "job has no snapshot", {"jobId": job.job_id}
                )
            return await self.learning.load_snapshot(session, job.snapshot_id)

        return await self.lean_tx(body)

    async def _start_and_read_snapshot(
        self, session: DbExec, lease: Lease, snapshot_id: str
    ) -> SnapshotView | None:
        """GetSnapshot right after claim, in one round trip (MySQL/MariaDB).

        The implied start, its event (appended only when the start matched), the
        snapshot read and the COMMIT go as one batch. When the snapshot is not
        cached, the start also requires its row to exist, so a missing snapshot
        starts nothing. None when the start matched no row (a repeat, a lease not
        held, a missing snapshot): the caller then answers as the one-statement
        path does, in a new transaction.
        """
        reader = getattr(self.learning, "snapshot_read", None)
        if reader is None:
            return None
        read: SnapshotRead = reader(snapshot_id)
        start = self._start_sql(lease, None if read.view is not None else read.exists)
        assert start.event is not None
        params = start.params if read.view is not None else {**start.params, **read.params}
        batch = StatementBatch(session)
        started = batch.add(start.key, start.build, params)
        batch.add(*event_sql(self.clock, if_matched=True), start.event)
        loaded = None if read.view is not None else batch.add(read.key, read.build, read.params)
        batch.commit()
        out = await batch.run()
        if out[started].rowcount != 1:
            return None
        if loaded is None:
            return cast(SnapshotView, read.view)
        if not out[loaded].rows:
            raise read.not_found()
        return read.from_row(out[loaded].rows[0])

    def _submit_read_stmt(self) -> Any:
        """SubmitResult's locking read (bound: :func:`lease_params` and ``r_key``): the
        :class:`ResultFacts` columns first, then ``lease_held``, ``prior_result_id``,
        ``db_now`` and the breaker's peek."""

        def build() -> Any:
            stmt = select(
                *(jobs.c[name] for name in RESULT_FACTS),
                lease_guard_bound(self.clock).label("lease_held"),
                select(results.c.result_id)
                .where(results.c.idempotency_key == bindparam("r_key", type_=String()))
                .scalar_subquery()
                .label("prior_result_id"),
                self.clock.now().label("db_now"),
                *breaker_mod.peek_columns(),
            ).where(jobs.c.job_id == bindparam("l_job_id", type_=String()))
            return self._for_update(stmt)

        return sqlcache.statement(("submit_read", self.clock.dialect), build)

    async def submit_result(
        self,
        lease: Lease,
        *,
        prompt_version: str | None,
        output_schema_version: str,
        output: Any,
        calls: Sequence[ModelCallInput] = (),
        claim_next: ClaimNext | None = None,
    ) -> SubmitOutcome:
        """Accept an attempt's output (SPEC §2.3 result, §2.5 idempotency, §5 validation).

        Order: exact replay (200) → already succeeded with another hash
        (RESULT_ALREADY_EXISTS) → lease (LOCK_NOT_HELD) → validation (INVALID_SCHEMA:
        business rows rolled back, job → failed, committed, then raised).

        ``calls`` (the attempt's model calls) are logged in the same transaction
        when the result is accepted or fails validation; a replay or a refusal
        logs none (the caller then uses :meth:`record_invocation`).

        With ``claim_next``, a result accepted now also claims, in the same
        transaction, up to ``claim_next.limit`` jobs for the caller as
        :meth:`claim_started` would (no long poll): the slot the attempt frees is
        filled without a ClaimJobs call and its COMMIT. A replay or an
        INVALID_SCHEMA ending claims nothing. Sent again after a lost answer, the
        call replays without claiming; jobs the lost answer claimed go back to
        pending when their lease expires (as a lost ClaimJobs answer's do).

        Raises:
            AppError: JOB_NOT_FOUND, RESULT_ALREADY_EXISTS, LOCK_NOT_HELD, INVALID_SCHEMA;
                INVALID_ARGUMENT for a bad call or ``claim_next`` (nothing changed).
        """
        for call in calls:
            call.check()
        next_caps: list[str] = []
        next_n = 0
        if claim_next is not None:
            if claim_next.limit < 1:  # slots to fill: no "0 = the default" here
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    "claimNext.limit must be ≥ 1",
                    {"field": "claimNext.limit"},
                )
            next_n = self.check_poll_args(claim_next.capabilities, claim_next.limit, 0)
            next_caps = sorted(set(claim_next.capabilities))
        output_hash = content_hash(output)
        key = f"{lease.job_id}:{lease.attempt_no}:{output_hash}"
        actor = runtime_actor(lease.instance_id)
        invalid: list[AppError] = []
        seen: list[Any] = []  # [the job as read, the database's now] of the last try

        async def body(session: DbExec) -> SubmitOutcome:
            invalid.clear()
            # business rows for the batch (``PreparedResult.statements()``), if any
            business: list[tuple[Any, Any, dict[str, Any]]] | None = None
            # One locking read answers the replay, the lease and the run time:
            # the job row, whether the caller's lease is live, a prior result
            # with this idempotency key, and the database's now.
            found = await _read_rows(
                session,
                ("submit_read", self.clock.dialect),
                self._submit_read_stmt(),
                {**lease_params(lease), "r_key": key},
            )
            if not found:
                raise self._lease_lost(None, lease)
            row = found[0]
            job = ResultFacts(*row[: len(RESULT_FACTS)])
            lease_held, prior, db_now, breaker_state, breaker_failures = row[len(RESULT_FACTS) :]
            breaker_peek = (breaker_state, breaker_failures)
            seen[:] = [job, db_now]
            if prior is not None:
                return SubmitOutcome(job.job_id, job.status, prior, output_hash, True)
            if job.status == SUCCEEDED:
                stored = (
                    await session.execute(
                        select(
                            results.c.result_id, results.c.idempotency_key, results.c.output_hash
                        ).where(results.c.job_id == job.job_id)
                    )
                ).all()
                # A racing identical submit won: this locking read waited for its
                # commit and then saw the job succeeded, but on MySQL/MariaDB the
                # prior-result subquery read the snapshot taken before that wait
                # (READ COMMITTED: one read view per statement). This newer
                # statement sees the winner's row: still a replay (SPEC §2.5).
                for result_id, idempotency_key, _ in stored:
                    if idempotency_key == key:
                        return SubmitOutcome(job.job_id, job.status, result_id, output_hash, True)
                # Same output from another attempt is not "another result": the
                # lease check below answers it (SPEC §2.5 order).
                if output_hash not in {r[2] for r in stored}:
                    raise AppError(
                        ErrorCode.RESULT_ALREADY_EXISTS,
                        "the job already has a different result",
                        {"jobId": job.job_id},
                    )
            if not lease_held:
                metrics.LEASE_LOSSES.labels("result").inc()
                raise self._lease_lost(job, lease)
            if not isinstance(output, dict):
                err = AppError(ErrorCode.INVALID_SCHEMA, "output must be a JSON object", None)
            else:
                err = None
                # a savepoint undoes a port's partial writes on INVALID_SCHEMA; a
                # port that validates everything before writing needs none
                guarded = not getattr(self.learning, "validates_before_write", False)
                nested = await session.begin_nested() if guarded else None
                accept: dict[str, Any] = {
                    "job_id": job.job_id,
                    "user_id": job.user_id,
                    "job_type": job.job_type,
                    "snapshot_id": job.snapshot_id or "",
                    "output_schema_version": output_schema_version,
                    "output": output,
                }
                try:
                    prepare = getattr(self.learning, "prepare_result", None)
                    if prepare is not None and supports_batches(session):
                        # checked now, written with the result's batch when they can be
                        prepared = await prepare(session, **accept)
                        business = prepared.statements()
                        if business is None:
                            await prepared.write(session)
                    else:
                        await self.learning.accept_result(session, **accept)
                except AppError as exc:
                    if nested is not None:
                        await nested.rollback()
                    if exc.code != ErrorCode.INVALID_SCHEMA:
                        raise
                    err = exc
                else:
                    if nested is not None:
                        await nested.commit()
            if err is not None:
                await self._insert_calls(session, job, lease.attempt_no, calls)
                message = (err.message or "invalid output")[:MAX_ERROR_MESSAGE]
                values: dict[str, Any] = {
                    "lock_until": None,
                    "finished_at": self.clock.now(),
                    "error_code": ErrorCode.INVALID_SCHEMA,
                    "error_message": message,
                    "prompt_version": prompt_version,
                    "output_schema_version": output_schema_version,
                }
                # an invalid result is a fail: with a cancel requested it ends cancelled
                # (SPEC §2.3 "fail with any code while cancelRequested")
                if job.cancel_requested:
                    values["cancelled_at"] = self.clock.now()
                ok = await apply(
                    session,
                    self.clock,
                    Op.ACK_CANCEL if job.cancel_requested else Op.FAIL,
                    job_id=job.job_id,
                    actor=actor,
                    lease=lease,
                    from_state=job.status,
                    error_code=ErrorCode.INVALID_SCHEMA,
                    values=values,
                )
                if not ok:
                    raise self._lease_lost(job, lease)
                if job.api_key_mode == "platform_key":
                    # Neutral for the breaker, but it frees a half-open probe slot.
                    await breaker_mod.record_ending(
                        session, self.clock, self.settings, ErrorCode.INVALID_SCHEMA
                    )
                invalid.append(err)
                ended = CANCELLED if job.cancel_requested else FAILED
                return SubmitOutcome(job.job_id, ended, "", output_hash, False)
            if job.api_key_mode == "platform_key":
                await breaker_mod.record_ending(
                    session, self.clock, self.settings, None, breaker_peek
                )
            result_id = new_id()
            result_row = {
                "result_id": result_id,
                "idempotency_key": key,
                "job_id": job.job_id,
                "attempt_no": lease.attempt_no,
                "output_hash": output_hash,
                "prompt_version": prompt_version,
                "output_schema_version": output_schema_version,
                "output": output,
            }
            succeed = transition_sql(
                self.clock,
                Op.SUCCEED,
                job_id=job.job_id,
                actor=actor,
                lease=lease,
                from_state=job.status,
                values={
                    "lock_until": None,
                    "finished_at": self.clock.now(),
                    "prompt_version": prompt_version,
                    "output_schema_version": output_schema_version,
                    "error_code": None,
                    "error_message": None,
                },
            )
            if succeed is None:
                raise self._lease_lost(job, lease)
            if supports_batches(session):
                # Everything left is decided: one round trip, the COMMIT included.
                # The fence stops it before the event and COMMIT if the lease
                # lapsed since the read; a re-run after a lost connection
                # replays by the idempotency key.
                batch = StatementBatch(session)
                for statement in business or ():
                    batch.add(*statement)
                call_rows = self._call_rows(job, lease.attempt_no, calls)
                for call_row in call_rows:
                    batch.add(self._insert_calls_key, self._insert_calls_stmt, call_row)
                spend = self._spend_row(call_rows)
                if spend is not None:
                    batch.add(self._add_spend_key, self._add_spend_stmt, spend)
                batch.add(self._insert_result_key, self._insert_result_stmt, result_row)
                batch.add(succeed.key, succeed.build, succeed.params)
                batch.fence("succeed")
                if succeed.event is not None:
                    batch.add(*event_sql(self.clock), succeed.event)
                pick = batch.add(*self._claim_pick(next_caps, next_n)) if next_n else None
                if pick is None:
                    batch.commit()
                # else the COMMIT ends the claim's batch, or goes alone if none waits
                try:
                    out = await batch.run()
                except FenceBroken:
                    raise self._lease_lost(job, lease) from None
                claimed: _Claimed = ([], {})
                if pick is not None:
                    claimed = await self._claim_in(
                        session,
                        lease.instance_id,
                        next_caps,
                        next_n,
                        start=True,
                        picked=out[pick].rows,
                        commit=True,  # run again, this transaction replays: no claim
                    )
                return SubmitOutcome(job.job_id, SUCCEEDED, result_id, output_hash, False, *claimed)
            await self._insert_calls(session, job, lease.attempt_no, calls)
            await session.execute(
                sqlcache.statement(self._insert_result_key, self._insert_result_stmt),
                result_row,
            )
            ok = await run_transition(session, self.clock, succeed)
            if not ok:
                raise self._lease_lost(job, lease)
            claimed = ([], {})
            if next_n:
                claimed = await self._claim_in(
                    session, lease.instance_id, next_caps, next_n, start=True
                )
            return SubmitOutcome(job.job_id, SUCCEEDED, result_id, output_hash, False, *claimed)

        outcome = await self.lean_tx(body)
        for claimed in outcome.claimed:
            self._observe_pickup(claimed)
        if invalid or not outcome.replayed:
            status = outcome.status if invalid else SUCCEEDED
            job, db_now = seen
            metrics.JOBS_FINISHED.labels(job.job_type, status).inc()
            if job.started_at is not None:
                metrics.RUN_TIME.labels(job.job_type, status).observe(
                    max(0.0, (db_now - job.started_at).total_seconds())
                )
            log.info(
                "attempt ended",
                extra={
                    "fields": {
                        "jobId": lease.job_id,
                        "attemptNo": lease.attempt_no,
                        "runtimeInstanceId": lease.instance_id,
                        "status": status,
                        "errorCode": ErrorCode.INVALID_SCHEMA if invalid else None,
                    }
                },
            )
        if invalid:
            err = invalid[0]
            raise AppError(ErrorCode.INVALID_SCHEMA, err.message, err.details)
        return outcome

    async def _observe_run_time(self, job_id: str, job: JobRecord | None = None) -> None:
        """Feed ``airt_job_run_seconds`` from a finished job's startedAt/finishedAt."""
        if job is None:
            async with self.sessions() as session:
                job = await self._get(session, job_id)
        if job is not None and job.started_at is not None and job.finished_at is not None:
            seconds = (job.finished_at - job.started_at).total_seconds()
            metrics.RUN_TIME.labels(job.job_type, job.status).observe(max(0.0, seconds))

    async def fail(
        self,
        lease: Lease,
        *,
        error_code: str,
        error_message: str,
        retry_after_seconds: float | None = None,
        calls: Sequence[ModelCallInput] = (),
    ) -> JobRecord:
        """End an attempt with a failure (SPEC §2.3, §2.4).

        cancelRequested or ``CANCELLED`` → cancelled; a retryable code with retries
        left → pending (``retryCount+1``, ``availableAt = now + backoff``); otherwise
        failed. A repeat of the fail that ended this attempt answers the current state.

        ``calls`` (the attempt's model calls) are logged in the fail's transaction;
        a repeated or refused fail logs none.

        Raises:
            AppError: INVALID_ARGUMENT (empty code, bad call), JOB_NOT_FOUND, LOCK_NOT_HELD.
        """
        for call in calls:
            call.check()
        if not error_code:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "errorCode is required", {"field": "errorCode"}
            )
        if retry_after_seconds is not None and retry_after_seconds < 0:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "retryAfterSeconds must be ≥ 0",
                {"field": "retryAfterSeconds"},
            )
        error_code = error_code[:64]
        message = (error_message or "")[:MAX_ERROR_MESSAGE]
        actor = runtime_actor(lease.instance_id)
        mark_credential: list[str] = []

        repeated: list[bool] = []

        async def body(session: DbExec) -> JobRecord:
            mark_credential.clear()
            repeated.clear()
            row = (
                await session.execute(
                    self._for_update(select(jobs).where(lease_guard(self.clock, lease)))
                )
            ).first()
            if row is None:
                job = await self._get(session, lease.job_id)
                if job is not None and await self._attempt_ended_by(session, lease, error_code):
                    repeated.append(True)
                    return job
                metrics.LEASE_LOSSES.labels("fail").inc()
                raise self._lease_lost(job, lease)
            job = JobRecord.from_row(row)
            common = {"lock_until": None, "error_code": error_code, "error_message": message}
            if job.cancel_requested or error_code == ErrorCode.CANCELLED:
                op = Op.ACK_CANCEL
                values = {
                    **common,
                    "cancelled_at": self.clock.now(),
                    "finished_at": self.clock.now(),
                }
            elif is_retryable(error_code) and job.retry_count < job.max_retry_count:
                op = Op.RETRY
                delay = backoff_seconds(
                    self.settings, job.retry_count + 1, error_code, retry_after_seconds
                )
                values = {
                    **common,
                    "locked_by": None,
                    "retry_count": jobs.c.retry_count + 1,
                    "available_at": self.clock.plus(delay, varying=True),
                }
            else:
                op = Op.FAIL
                values = {**common, "finished_at": self.clock.now()}
            ok = await apply(
                session,
                self.clock,
                op,
                job_id=job.job_id,
                actor=actor,
                lease=lease,
                from_state=job.status,
                error_code=error_code,
                values=values,
                where=jobs.c.retry_count == job.retry_count,
            )
            if not ok:
                raise self._lease_lost(job, lease)
            await self._insert_calls(session, job, lease.attempt_no, calls)
            if job.api_key_mode == "platform_key":
                await breaker_mod.record_ending(session, self.clock, self.settings, error_code)
            elif error_code == ErrorCode.INVALID_CREDENTIAL and job.credential_id:
                mark_credential.append(job.credential_id)
            out = await self._get(session, job.job_id)
            assert out is not None
            return out

        job = await self.lean_tx(body)
        if repeated:
            return job
        for credential_id in mark_credential:
            await self.credentials.mark_invalid(credential_id, "model refused the key")
        if job.status == PENDING:
            self.signal.notify()
        elif job.status in TERMINAL:
            metrics.JOBS_FINISHED.labels(job.job_type, job.status).inc()
            await self._observe_run_time(job.job_id, job)
        log.info(
            "attempt failed",
            extra={
                "fields": {
                    "jobId": job.job_id,
                    "attemptNo": lease.attempt_no,
                    "runtimeInstanceId": lease.instance_id,
                    "errorCode": error_code,
                    "status": job.status,
                    "retryCount": job.retry_count,
                }
            },
        )
        return job

    async def _attempt_ended_by(self, session: DbExec, lease: Lease, error_code: str) -> bool:
        """Whether the lease's holder ended its attempt with ``error_code`` (its event row):
        a fail repeating it answers 200 even after the job moved on (SPEC §2.3)."""
        stmt = sqlcache.statement(
            ("attempt_ended_by", self.clock.dialect),
            lambda: (
                select(events.c.seq)
                .where(
                    events.c.job_id == bindparam("e_job_id", type_=String()),
                    events.c.attempt_no == bindparam("e_attempt", type_=Integer()),
                    events.c.actor == bindparam("e_actor", type_=String()),
                    events.c.error_code == bindparam("e_code", type_=String()),
                    events.c.from_status.in_(sorted(LEASED)),
                )
                .limit(1)
            ),
        )
        row = (
            await session.execute(
                stmt,
                {
                    "e_job_id": lease.job_id,
                    "e_attempt": lease.attempt_no,
                    "e_actor": runtime_actor(lease.instance_id)[:160],
                    "e_code": error_code,
                },
            )
        ).first()
        return row is not None

    # ------------------------------------------------------- cancel and auth

    async def cancel(self, job_id: str, *, user_id: str | None, actor: str) -> JobRecord:
        """pending → cancelled; leased → cancelRequested; terminal → INVALID_JOB_STATE (SPEC §2.3).

        Raises:
            AppError: JOB_NOT_FOUND (also another user's job), INVALID_JOB_STATE.
        """

        async def body(session: DbExec) -> JobRecord:
            job = await self._must_get(session, job_id, user_id=user_id, lock=True)
            if job.status == PENDING:
                ok = await apply(
                    session,
                    self.clock,
                    Op.CANCEL_PENDING,
                    job_id=job_id,
                    actor=actor,
                    attempt_no=job.attempt_no,
                    values={
                        "cancelled_at": self.clock.now(),
                        "finished_at": self.clock.now(),
                        "cancel_requested": True,
                        "locked_by": None,
                        "lock_until": None,
                    },
                )
            elif job.status in LEASED:
                if job.cancel_requested:
                    return job
                ok = await apply(
                    session,
                    self.clock,
                    Op.REQUEST_CANCEL,
                    job_id=job_id,
                    actor=actor,
                    from_state=job.status,
                    attempt_no=job.attempt_no,
                    values={"cancel_requested": True},
                )
            else:
                raise AppError(
                    ErrorCode.INVALID_JOB_STATE,
                    f"job is {job.status}",
                    {"jobId": job_id, "status": job.status},
                )
            if not ok:  # pragma: no cover - the row is locked / the writer is single
                raise AppError(ErrorCode.INVALID_JOB_STATE, "job changed", {"jobId": job_id})
            return await self._must_get(session, job_id)

        job = await self.tx(body)
        if job.status == CANCELLED:
            metrics.JOBS_FINISHED.labels(job.job_type, CANCELLED).inc()
        return job

    async def get_authorization(self, user_id: str) -> AuthorizationView:
        """Per-user AI authorization; granted by default (SPEC §6)."""
        async with self.sessions() as session:
            row = (
                await session.execute(
                    select(authorizations.c.granted, authorizations.c.changed_at).where(
                        authorizations.c.user_id == user_id
                    )
                )
            ).first()
        if row is None:
            return AuthorizationView(True, None)
        return AuthorizationView(bool(row.granted), row.changed_at)

    async def set_authorization(self, user_id: str, granted: bool) -> AuthorizationView:
        """Grant or revoke AI for a user; revoking cancels pending and flags leased jobs (SPEC §6).

        Raises:
            AppError: ``INVALID_ARGUMENT`` without a user id.
        """
        if not user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        actor = f"user:{user_id}"
        await self._ensure_admission_row(user_id)

        async def body(session: DbExec) -> AuthorizationView:
            await self._lock_admission(session, user_id)  # serialised with creates
            exists = (
                await session.execute(
                    self._for_update(
                        select(authorizations.c.user_id).where(authorizations.c.user_id == user_id)
                    )
                )
            ).first()
            if exists is None:
                await session.execute(
                    insert(authorizations).values(
                        user_id=user_id, granted=granted, changed_at=self.clock.now()
                    )
                )
            else:
                await session.execute(
                    update(authorizations)
                    .where(authorizations.c.user_id == user_id)
                    .values(granted=granted, changed_at=self.clock.now())
                )
            cancelled = requested = 0
            if not granted:
                rows = (
                    await session.execute(
                        self._for_update(
                            select(jobs.c.job_id, jobs.c.status, jobs.c.attempt_no).where(
                                jobs.c.user_id == user_id,
                                jobs.c.status.in_([PENDING, LOCKED, RUNNING]),
                            )
                        )
                    )
                ).all()
                for r in rows:
                    if r.status == PENDING:
                        ok = await apply(
                            session,
                            self.clock,
                            Op.CANCEL_PENDING,
                            job_id=r.job_id,
                            actor=actor,
                            attempt_no=r.attempt_no,
                            values={
                                "cancelled_at": self.clock.now(),
                                "finished_at": self.clock.now(),
                                "cancel_requested": True,
                            },
                        )
                        cancelled += int(ok)
                    else:
                        ok = await apply(
                            session,
                            self.clock,
                            Op.REQUEST_CANCEL,
                            job_id=r.job_id,
                            actor=actor,
                            from_state=r.status,
                            attempt_no=r.attempt_no,
                            where=jobs.c.cancel_requested.is_(False),
                            values={"cancel_requested": True},
                        )
                        requested += int(ok)
            changed = (
                await session.execute(
                    select(authorizations.c.changed_at).where(authorizations.c.user_id == user_id)
                )
            ).scalar_one()
            return AuthorizationView(granted, changed, cancelled, requested)

        return await self.tx(body)

    # ------------------------------------------------------------------ rerun

    async def rerun(self, job_id: str, *, rebuild_snapshot: bool, actor: str) -> JobRecord:
        """Admin re-run of a failed job: a new job with ``retriedFromJobId`` (SPEC §2.3).

        The new job passes the create-time checks a create of its user would (SPEC
        §6): the user's AI switch (serialised with a revoke by the user's admission
        lock, as a create is), a usable key of the job's ``apiKeyMode`` (the user's
        *current* credential is recorded, not the failed job's, which may have been
        replaced or marked invalid since) and, for the platform key, the budget and
        the breaker. Like an admin create, it is not held to the user's daily
        quota.

        Raises:
            AppError: JOB_NOT_FOUND, INVALID_JOB_STATE (not failed), AI_NOT_AUTHORIZED,
                INVALID_CREDENTIAL, PLATFORM_CIRCUIT_OPEN, PLATFORM_BUDGET_EXCEEDED,
                NOT_FOUND (target gone, when rebuilding).
        """
        # A failed job is terminal: what this read sees of it cannot change.
        old = await self.get(job_id)
        if old.status != FAILED:
            raise AppError(
                ErrorCode.INVALID_JOB_STATE,
                "only failed jobs can be re-run",
                {"jobId": job_id, "status": old.status},
            )
        credential_id = await self.credentials.check(old.user_id, old.api_key_mode)
        await self._ensure_admission_row(old.user_id)

        async def body(session: AsyncSession) -> JobRecord:
            await self._lock_admission(session, old.user_id)
            await self._check_ai_granted(session, old.user_id)
            if old.api_key_mode == "platform_key":
                await self._platform_guards(session)
            snapshot_id = old.snapshot_id
            if rebuild_snapshot or not snapshot_id:
                snapshot_id = await self.learning.build_snapshot(
                    session,
                    user_id=old.user_id,
                    job_type=old.job_type,
                    target_type=old.target_type,
                    target_id=old.target_id,
                    params=old.params,
                )
            new_job_id = new_id()
            return await self._insert_job(
                session,
                job_id=new_job_id,
                user_id=old.user_id,
                job_type=old.job_type,
                target_type=old.target_type,
                target_id=old.target_id,
                snapshot_id=snapshot_id,
                params=old.params,
                api_key_mode=old.api_key_mode,
                credential_id=credential_id,
                idempotency_key=None,
                priority=old.priority,
                max_retry_count=old.max_retry_count,
                timeout_seconds=old.timeout_seconds,
                retried_from_job_id=old.job_id,
                actor=actor or "admin",
                model_provider=old.model_provider,
                model_name=old.model_name,
            )

        job = await self.tx(body)
        metrics.JOBS_CREATED.labels(job.job_type, job.api_key_mode).inc()
        self.signal.notify()
        return job

    # ------------------------------------------------------------ invocations

    async def record_invocation(
        self,
        *,
        job_id: str,
        attempt_no: int,
        model_provider: str,
        model_name: str,
        api_key_mode: str | None,
        credential_id: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cache_hit_tokens: int,
        latency_ms: int,
        outcome: str,
        error_code: str | None,
        provider_request_id: str | None,
    ) -> str:
        """Store one model call with its cost (SPEC §5); returns the log id.

        The call must belong to the job as it stands: an attempt the job has had
        (``attemptNo`` ≤ the job's), and the job's own ``apiKeyMode`` when one is
        given (a call on the platform key counts toward the daily budget, SPEC §6,
        so it cannot be logged as a user-key call, nor the other way round).

        Raises:
            AppError: INVALID_ARGUMENT (bad outcome, negative counts, more cache hits
                than prompt tokens, an attempt the job has not had, another key mode
                than the job's), JOB_NOT_FOUND.
        """
        call = ModelCallInput(
            model_provider,
            model_name,
            api_key_mode,
            credential_id,
            prompt_tokens,
            completion_tokens,
            cache_hit_tokens,
            latency_ms,
            outcome,
            error_code,
            provider_request_id,
        )
        call.check()
        if attempt_no < 0:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "attemptNo must be ≥ 0", {"field": "attemptNo"}
            )

        async def body(session: DbExec) -> str:
            job = await self._must_get(session, job_id)
            if attempt_no > job.attempt_no:
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"the job has had {job.attempt_no} attempt(s), not {attempt_no}",
                    {"field": "attemptNo"},
                )
            [log_id] = await self._insert_calls(session, job, attempt_no, [call])
            return log_id

        return await self.lean_tx(body)

    async def _insert_calls(
        self,
        session: DbExec,
        job: JobRecord | ResultFacts,
        attempt_no: int,
        calls: Sequence[ModelCallInput],
    ) -> list[str]:
        """Log ``calls`` of ``job``'s attempt ``attempt_no`` with their cost, in the caller's
        tx; a call's empty model/provider/key mode is the job's. Returns the log ids."""
        rows = self._call_rows(job, attempt_no, calls)
        if rows:
            await session.execute(
                sqlcache.statement(self._insert_calls_key, self._insert_calls_stmt), rows
            )
            spend = self._spend_row(rows)
            if spend is not None:
                await session.execute(
                    sqlcache.statement(self._add_spend_key, self._add_spend_stmt), spend
                )
        return [str(row["id"]) for row in rows]

    @staticmethod
    def _spend_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """What logged call ``rows`` add to the day's platform spend (values of
        :meth:`_add_spend_stmt`: ``shard``, ``cost_usd``, ``calls``); None when no row
        used the platform key. The shard is random, spreading concurrent reports
        over the day's rows (SPEC §6 budget; :class:`~job_service.models.PlatformSpend`)."""
        platform = [r for r in rows if r["api_key_mode"] == "platform_key"]
        if not platform:
            return None
        return {
            "shard": random.randrange(PLATFORM_SPEND_SHARDS),
            "cost_usd": sum((Decimal(r["cost_usd"]) for r in platform), Decimal(0)),
            "calls": len(platform),
        }

    @property
    def _add_spend_key(self) -> tuple[str, str]:
        return ("add_spend", self.clock.dialect)

    def _add_spend_stmt(self) -> Any:
        """Upsert adding ``cost_usd`` and ``calls`` to today's row ``shard``."""
        return adding_upsert(
            self.clock.dialect,
            platform_spend,
            keys=("day", "shard"),
            add=("cost_usd", "calls"),
            replace=("updated_at",),
            values={"day": self.clock.today(), "updated_at": self.clock.now()},
        )

    def _call_rows(
        self, job: JobRecord | ResultFacts, attempt_no: int, calls: Sequence[ModelCallInput]
    ) -> list[dict[str, Any]]:
        """The invocation log rows of ``calls`` (values of :meth:`_insert_calls_stmt`).

        Raises:
            AppError: INVALID_ARGUMENT (``apiKeyMode``) for a call that gives a key mode
                other than the job's: a platform-key call logged as a user-key one
                would escape the daily budget (SPEC §6). Raised before anything is
                written; the caller's transaction rolls back.
        """
        rows = []
        for c in calls:
            if c.api_key_mode and c.api_key_mode != job.api_key_mode:
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"the job's calls use apiKeyMode {job.api_key_mode}",
                    {"field": "apiKeyMode"},
                )
            model_name = c.model_name or job.model_name
            rows.append(
                {
                    "id": new_id(),
                    "job_id": job.job_id,
                    "job_type": job.job_type,
                    "attempt_no": attempt_no,
                    "model_provider": c.model_provider or job.model_provider,
                    "model_name": model_name,
                    "api_key_mode": c.api_key_mode or job.api_key_mode,
                    "credential_id": c.credential_id,
                    "prompt_tokens": c.prompt_tokens,
                    "completion_tokens": c.completion_tokens,
                    "cache_hit_tokens": c.cache_hit_tokens,
                    "latency_ms": c.latency_ms,
                    "outcome": c.outcome,
                    "error_code": c.error_code,
                    "provider_request_id": c.provider_request_id,
                    "cost_usd": cost_usd(
                        self.settings.MODEL_PRICES,
                        model_name,
                        c.prompt_tokens,
                        c.completion_tokens,
                        c.cache_hit_tokens,
                    ),
                }
            )
        return rows

    @property
    def _insert_calls_key(self) -> tuple[str, str]:
        return ("insert_calls", self.clock.dialect)

    def _insert_calls_stmt(self) -> Any:
        return insert(invocations).values(created_at=self.clock.now())

    @property
    def _insert_result_key(self) -> tuple[str, str]:
        return ("insert_result", self.clock.dialect)

    def _insert_result_stmt(self) -> Any:
        return insert(results).values(created_at=self.clock.now())

    async def costs(self, from_date: str, to_date: str, group_by: str) -> list[dict[str, Any]]:
        """Cost rollup over UTC days, inclusive (SPEC §3.1 /admin/ai/costs).

        Returns:
            ``[{"key","calls","promptTokens","completionTokens","cacheHitTokens","costUsd"}]``.

        Raises:
            AppError: INVALID_ARGUMENT for bad dates or ``groupBy``.
        """
        from datetime import date, timedelta

        try:
            start = date.fromisoformat(from_date)
            end = date.fromisoformat(to_date)
        except ValueError:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "from/to must be YYYY-MM-DD", {"field": "from"}
            ) from None
        if end < start:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "to is before from", {"field": "to"})
        if end >= date.max:  # the exclusive upper bound (end + 1 day) must exist
            raise AppError(ErrorCode.INVALID_ARGUMENT, "to is out of range", {"field": "to"})
        columns = {
            "day": func.date(invocations.c.created_at),
            "jobType": invocations.c.job_type,
            "modelName": invocations.c.model_name,
            "apiKeyMode": invocations.c.api_key_mode,
        }
        if group_by not in columns:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "groupBy must be day, jobType, modelName or apiKeyMode",
                {"field": "groupBy"},
            )
        key = columns[group_by].label("k")
        lo = datetime(start.year, start.month, start.day)
        hi_d = end + timedelta(days=1)
        hi = datetime(hi_d.year, hi_d.month, hi_d.day)
        stmt = (
            select(
                key,
                func.count(),
                func.coalesce(func.sum(invocations.c.prompt_tokens), 0),
                func.coalesce(func.sum(invocations.c.completion_tokens), 0),
                func.coalesce(func.sum(invocations.c.cache_hit_tokens), 0),
                func.coalesce(func.sum(invocations.c.cost_usd), 0),
            )
            .where(and_(invocations.c.created_at >= lo, invocations.c.created_at < hi))
            .group_by(key)
            .order_by(key)
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        return [
            {
                "key": str(r[0]),
                "calls": int(r[1]),
                "promptTokens": int(r[2]),
                "completionTokens": int(r[3]),
                "cacheHitTokens": int(r[4]),
                "costUsd": float(r[5]),
            }
            for r in rows
        ]

    # ---------------------------------------------------------------- breaker

    async def breaker_view(self) -> breaker_mod.BreakerView:
        """The platform circuit breaker (SPEC §3.1 admin)."""
        cooldown = self.settings.BREAKER_COOLDOWN_SECONDS
        view = await self.tx(lambda s: breaker_mod.read(s, self.clock, cooldown))
        metrics.set_breaker(view.state, view.consecutive_failures)
        return view

    async def breaker_reset(self) -> breaker_mod.BreakerView:
        """Close the platform circuit breaker (SPEC §3.1 admin reset)."""
        view = await self.tx(lambda s: breaker_mod.reset(s, self.clock))
        metrics.set_breaker(view.state, view.consecutive_failures)
        log.info("circuit breaker reset")
        return view

    async def refresh_gauges(self) -> dict[tuple[str, str], int]:
        """Re-read the database-wide gauges: queue depth by state/type and the breaker.

        Returns:
            ``{(state, jobType): count}`` of the non-terminal jobs (also published
            as ``airt_jobs_queue_depth``; pairs that emptied are set to 0).
        """
        stmt = (
            select(jobs.c.status, jobs.c.job_type, func.count())
            .where(jobs.c.status.in_([PENDING, LOCKED, RUNNING]))
            .group_by(jobs.c.status, jobs.c.job_type)
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
            view = await breaker_mod.read(
                session, self.clock, self.settings.BREAKER_COOLDOWN_SECONDS
            )
        depth = {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
        for state in (PENDING, LOCKED, RUNNING):
            for job_type in JOB_TYPES:
                metrics.QUEUE_DEPTH.labels(state, job_type).set(depth.get((state, job_type), 0))
        metrics.set_breaker(view.state, view.consecutive_failures)
        return depth

    async def health(self) -> tuple[bool, list[Any]]:
        """``(serving, workers)``: SERVING while an instance was seen recently (SPEC §3)."""
        async with self.sessions() as session:
            found = await self.registry.list_workers(session, self.settings.worker_alive_seconds())
        return any(w.status == "alive" for w in found), found
