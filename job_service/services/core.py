"""What every service of the job core shares, and the small helpers they all use."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.lru import LruCache
from airuntime_common.model_providers import ModelProviders, ProviderConfig
from job_service import metrics
from job_service.lifecycle import Lease, RetryPolicy
from job_service.maintenance.changes import ChangeFeed
from job_service.maintenance.scheduler import RECHECK_SECONDS, JobSignal, PendingProbe
from job_service.maintenance.workers import WorkerRegistry
from job_service.services.ports import CredentialChecker, LearningPort, SnapshotView
from job_service.settings import JobServiceSettings
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import run_one
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.tx import Store

log = logging.getLogger("job_service.services")

#: Claimed jobs whose snapshot id is remembered for GetSnapshot (oldest dropped first).
MAX_CLAIMED_SNAPSHOTS = 20_000
#: Longest error message stored.
MAX_ERROR_MESSAGE = 4000


@dataclass
class Core:
    """One per process: the store, the settings, the seams and the process-wide state.

    Attributes:
        store: the job database.
        settings: job_service settings.
        learning: snapshots, plans and business rows.
        credentials: the credential service.
        signal: wakes this process's long polls when a job becomes pending.
        registry: the runtime-instance registry.
        changes: the change feed of ``WatchJobs`` (reference §9.1).
        claimed_snapshots: jobId → snapshotId of jobs this process handed out by
            claim (a job's snapshot never changes), so GetSnapshot after a claim
            skips reading the job row for it.
    """

    store: Store
    settings: JobServiceSettings
    learning: LearningPort
    credentials: CredentialChecker
    signal: JobSignal = field(default_factory=JobSignal)
    registry: WorkerRegistry = field(init=False)
    probe: PendingProbe = field(init=False)
    changes: ChangeFeed = field(init=False)
    claimed_snapshots: LruCache[str, str] = field(
        default_factory=lambda: LruCache(MAX_CLAIMED_SNAPSHOTS)
    )
    _providers: ModelProviders | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.registry = WorkerRegistry(self.store.clock)
        self.probe = PendingProbe(self._any_claimable, RECHECK_SECONDS)
        self.changes = ChangeFeed(
            self.store,
            interval=self.settings.WATCH_POLL_INTERVAL_MS / 1000.0,
            gap_seconds=self.settings.WATCH_GAP_SECONDS,
        )

    @property
    def providers(self) -> ModelProviders:
        """``MODEL_PROVIDERS`` (read from the settings once)."""
        if self._providers is None:
            self._providers = self.settings.providers()
        return self._providers

    def platform_candidates(self, model_name: str) -> list[str]:
        """The providers a platform-key attempt of a job asking for ``model_name`` may
        run on, in order of preference (reference §9.4): those of ``MODEL_PROVIDERS`` that
        serve the model and have a platform key. Which have one only credential_service
        knows; it says so in every platform-key check at create
        (``platform_providers`` of the checker), and until this process has seen
        one, a provider naming an ``apiKeyEnv`` is taken to have one."""
        known = getattr(self.credentials, "platform_providers", None)
        return [
            p.name
            for p in self.providers.serving(model_name)
            if (p.name in known if known is not None else p.apiKeyEnv is not None)
        ]

    def provider(self, name: str) -> ProviderConfig | None:
        """The configured provider called ``name``, or None."""
        return self.providers.get(name)

    @property
    def clock(self) -> DbClock:
        """The database clock (reference §1: one clock)."""
        return self.store.clock

    @property
    def retry_policy(self) -> RetryPolicy:
        """Backoff of retried jobs (reference §2.4)."""
        s = self.settings
        return RetryPolicy(s.RETRY_BACKOFF_BASE_SECONDS, s.RETRY_BACKOFF_MAX_SECONDS)

    async def get_job(self, db: DbExec, job_id: str, *, lock: bool = False) -> JobRecord | None:
        """One job by id in the caller's transaction (``lock``: ``FOR UPDATE``), or None."""
        rows = (await run_one(db, st.get_job.sql(self.clock, {"g_job_id": job_id}, lock))).rows
        return job_of(rows[0]) if rows else None

    async def must_get_job(
        self, db: DbExec, job_id: str, *, user_id: str | None = None, lock: bool = False
    ) -> JobRecord:
        """:meth:`get_job`; another user's job is missing too (reference §4).

        Raises:
            AppError: JOB_NOT_FOUND.
        """
        job = await self.get_job(db, job_id, lock=lock)
        if job is None or (user_id is not None and job.user_id != user_id):
            raise AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": job_id})
        return job

    async def load_snapshot(self, db: DbExec, snapshot_id: str) -> SnapshotView:
        """A stored snapshot (the cached view, else one read).

        Raises:
            AppError: NOT_FOUND when no snapshot has this id.
        """
        read = self.learning.snapshot_read(snapshot_id)
        if read.view is not None:
            return read.view
        rows = (await run_one(db, read.sql)).rows
        if not rows:
            raise read.not_found()
        return read.from_row(rows[0])

    async def _any_claimable(self) -> bool:
        """Whether some pending job is available now (the :class:`PendingProbe` query)."""
        found = await self.store.read(
            lambda conn: run_one(conn, sched.any_claimable.sql(self.clock, {}))
        )
        return bool(found.rows)


def new_id() -> str:
    """A fresh opaque id (uuid4 hex)."""
    return uuid.uuid4().hex


def runtime_actor(instance_id: str) -> str:
    """Event actor for a runtime instance."""
    return f"runtime:{instance_id}"


def lease_refusal(lease: Lease, status: str | None) -> AppError:
    """The refusal of a lease not held: ``JOB_NOT_FOUND`` (no job, ``status`` None) or
    ``LOCK_NOT_HELD`` with the job's current status (reference §3 fencing)."""
    if status is None:
        return AppError(ErrorCode.JOB_NOT_FOUND, "job not found", {"jobId": lease.job_id})
    return AppError(
        ErrorCode.LOCK_NOT_HELD,
        "the caller does not hold this job's lease",
        {"jobId": lease.job_id, "attemptNo": lease.attempt_no, "status": status},
    )


def observe_pickup(job: JobRecord) -> None:
    """Feed ``airt_job_pickup_seconds``: from ``availableAt`` to the lock."""
    if job.locked_at is not None:
        delay = (job.locked_at - job.available_at).total_seconds()
        metrics.PICKUP_LATENCY.labels(job.job_type).observe(max(0.0, delay))


def observe_finished(job: JobRecord) -> None:
    """Feed ``airt_jobs_finished_total`` and ``airt_job_run_seconds`` of a job that just
    reached a terminal state (its startedAt → finishedAt)."""
    metrics.JOBS_FINISHED.labels(job.job_type, job.status).inc()
    if job.started_at is not None and job.finished_at is not None:
        seconds = (job.finished_at - job.started_at).total_seconds()
        metrics.RUN_TIME.labels(job.job_type, job.status).observe(max(0.0, seconds))
