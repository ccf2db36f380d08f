"""The job core as one object: every operation the servicers call, by name.

:class:`JobDomain` builds the services on one :class:`~job_service.services.core.Core`
and forwards each operation to the room that owns it; it holds no logic of its
own. The operations' documentation is on the services:

=================  ============================================================
admission          create, rerun (:mod:`job_service.services.admission`)
batches            create a batch, re-run one (:mod:`job_service.services.batches`)
authorization      get/set the AI switch (:mod:`job_service.services.authorization`)
claiming           poll, claim, lock (:mod:`job_service.services.claiming`)
leases             start, heartbeats, lease checks, snapshot (:mod:`~.leases`)
completion         result, fail (:mod:`job_service.services.completion`)
cancellation       cancel (:mod:`job_service.services.cancellation`)
accounting         model calls, costs (:mod:`job_service.services.accounting`)
views              get, history, lists, health, gauges, breaker (:mod:`~.views`)
console            counts, a job explained, jobs per minute (:mod:`~.console`)
prompts            prompt versions, routings, stats, feedback, the guard
                   (:mod:`job_service.prompts`, reference §10.4)
=================  ============================================================
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.maintenance.breaker import BreakerView
from job_service.maintenance.changes import Change, ChangeFeed
from job_service.maintenance.scheduler import JobSignal
from job_service.maintenance.workers import WorkerRegistry, WorkerView
from job_service.prompts import Prompts
from job_service.services.accounting import Accounting
from job_service.services.admission import Admission
from job_service.services.authorization import Authorization
from job_service.services.batches import Batches
from job_service.services.cancellation import Cancellation
from job_service.services.claim_round import ClaimAsk
from job_service.services.claiming import Claiming, check_poll_args
from job_service.services.completion import Completion
from job_service.services.console import Console, JobExplanation, ThroughputView
from job_service.services.core import Core
from job_service.services.erasure import Erased, Erasure
from job_service.services.inputs import (
    AuthorizationView,
    CreateBatchInput,
    CreateJobInput,
    LeaseAnswer,
    LeaseHolderView,
    ModelCallInput,
    RetryInput,
    SubmitOutcome,
)
from job_service.services.leases import Leases
from job_service.services.ports import CredentialChecker, LearningPort, SnapshotView
from job_service.services.removal import EndedJobs, Removal
from job_service.services.views import ProviderStateView, Views
from job_service.settings import JobServiceSettings
from job_service.store.clock import DbClock
from job_service.store.records import EventRecord, InvocationRecord, JobRecord
from job_service.store.tx import Store

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobDomain:
    """Every job operation; one instance per process, shared by all RPCs.

    Args:
        sessions: the job database's session factory.
        clock: the database clock of that engine's dialect.
        settings: job_service settings.
        learning: snapshot/result delegate.
        credentials: credential service client.
    """

    check_poll_args = staticmethod(check_poll_args)

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        clock: DbClock,
        settings: JobServiceSettings,
        learning: LearningPort,
        credentials: CredentialChecker,
    ) -> None:
        self.store = Store(sessions, clock)
        self.core = Core(self.store, settings, learning, credentials)
        self.accounting = Accounting(self.core)
        self.prompts = Prompts(self.store, settings.PROMPT_GUARD_INTERVAL_SECONDS)
        self.admission = Admission(self.core, self.prompts)
        self.batches = Batches(self.core, self.admission)
        self.authorization = Authorization(self.core, self.admission)
        self.claiming = Claiming(self.core)
        self.leases = Leases(self.core)
        self.completion = Completion(self.core, self.accounting, self.claiming.granting)
        self.cancellation = Cancellation(self.core)
        self.views = Views(self.core)
        self.console = Console(self.core)
        self.removal = Removal(self.core, self.admission)
        self.erasure = Erasure(self.core, self.admission)

    # the shared parts, as tests and the app reach them
    @property
    def sessions(self) -> async_sessionmaker[AsyncSession]:
        return self.store.sessions

    @sessions.setter
    def sessions(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.store.sessions = sessions

    @property
    def clock(self) -> DbClock:
        return self.store.clock

    @property
    def settings(self) -> JobServiceSettings:
        return self.core.settings

    @property
    def learning(self) -> LearningPort:
        return self.core.learning

    @learning.setter
    def learning(self, port: LearningPort) -> None:
        self.core.learning = port

    @property
    def credentials(self) -> CredentialChecker:
        return self.core.credentials

    @credentials.setter
    def credentials(self, checker: CredentialChecker) -> None:
        self.core.credentials = checker

    @property
    def signal(self) -> JobSignal:
        return self.core.signal

    @property
    def changes(self) -> ChangeFeed:
        """The change feed of ``WatchJobs`` (reference §9.1)."""
        return self.core.changes

    async def user_changes(
        self, user_id: str, after: int | None, limit: int
    ) -> tuple[list[Change], int, bool]:
        """See :meth:`Views.user_changes`."""
        return await self.views.user_changes(user_id, after, limit)

    @property
    def registry(self) -> WorkerRegistry:
        return self.core.registry

    async def tx(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """One write transaction on a session (:meth:`Store.tx`)."""
        return await self.store.tx(fn)

    async def lean_tx(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """One write transaction on a bare connection (:meth:`Store.lean_tx`)."""
        return await self.store.lean_tx(fn)

    # ---------------------------------------------------------------- admission

    async def create(self, req: CreateJobInput) -> tuple[JobRecord, bool]:
        """:meth:`Admission.create`."""
        return await self.admission.create(req)

    async def create_batch(self, req: CreateBatchInput) -> tuple[JobRecord, bool]:
        """:meth:`Batches.create`."""
        return await self.batches.create(req)

    async def rerun(
        self,
        job_id: str,
        *,
        rebuild_snapshot: bool,
        actor: str,
        trace_parent: str | None = None,
    ) -> JobRecord:
        """:meth:`Batches.rerun` (a job, or a batch's parent)."""
        return await self.batches.rerun(
            job_id, rebuild_snapshot=rebuild_snapshot, actor=actor, trace_parent=trace_parent
        )

    async def retry(self, req: RetryInput) -> tuple[JobRecord, bool]:
        """:meth:`Batches.retry` (a job, or a batch's parent)."""
        return await self.batches.retry(req)

    async def get_authorization(self, user_id: str) -> AuthorizationView:
        """:meth:`Authorization.get`."""
        return await self.authorization.get(user_id)

    async def set_authorization(self, user_id: str, granted: bool) -> AuthorizationView:
        """:meth:`Authorization.set`."""
        return await self.authorization.set(user_id, granted)

    # ----------------------------------------------------------------- claiming

    async def seen(
        self,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> None:
        """Registry upsert for a runtime call (throttled: see :meth:`WorkerRegistry.due`);
        never fails the call."""
        registry = self.core.registry
        if not registry.due(instance_id, capabilities, status_address):
            return
        try:
            await self.store.lean_tx(
                lambda db: registry.touch(db, instance_id, capabilities, status_address)
            )
        except Exception:  # the registry must never fail a runtime call
            log.warning("worker registry update failed", exc_info=True)

    async def poll(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> list[JobRecord]:
        """:meth:`Claiming.poll`."""
        return await self.claiming.poll(instance_id, capabilities, limit, wait_ms)

    async def claim(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> list[JobRecord]:
        """:meth:`Claiming.claim` without start: the jobs, locked."""
        return (
            await self.claiming.claim(instance_id, capabilities, limit, wait_ms, start=False)
        ).jobs

    async def claim_started(
        self, instance_id: str, capabilities: list[str], limit: int, wait_ms: int
    ) -> tuple[list[JobRecord], dict[str, SnapshotView]]:
        """:meth:`Claiming.claim` with start: the jobs, running, and their snapshots."""
        got = await self.claiming.claim(instance_id, capabilities, limit, wait_ms, start=True)
        return got.jobs, got.snapshots

    async def lock(self, job_id: str, instance_id: str) -> JobRecord:
        """:meth:`Claiming.lock`."""
        return await self.claiming.lock(job_id, instance_id)

    # ------------------------------------------------------------------- leases

    async def start(self, lease: Lease) -> JobRecord:
        """:meth:`Leases.start`."""
        return await self.leases.start(lease)

    async def heartbeat(self, lease: Lease) -> JobRecord:
        """:meth:`Leases.heartbeat`."""
        return await self.leases.heartbeat(lease)

    async def heartbeat_leases(
        self, instance_id: str, leases: list[tuple[str, int]]
    ) -> list[LeaseAnswer]:
        """:meth:`Leases.heartbeat_leases`."""
        return await self.leases.heartbeat_leases(instance_id, leases)

    async def verify_lease(self, lease: Lease) -> LeaseHolderView:
        """:meth:`Leases.verify_lease`."""
        return await self.leases.verify_lease(lease)

    async def verify_leases(self, leases: Sequence[Lease]) -> list[LeaseHolderView | AppError]:
        """:meth:`Leases.verify_leases`."""
        return await self.leases.verify_leases(leases)

    async def snapshot(self, lease: Lease) -> SnapshotView:
        """:meth:`Leases.snapshot`."""
        return await self.leases.snapshot(lease)

    # --------------------------------------------------------------- completion

    async def submit_result(
        self,
        lease: Lease,
        *,
        prompt_version: str | None,
        output_schema_version: str,
        output: Any,
        calls: Sequence[ModelCallInput] = (),
        claim_next: tuple[Sequence[str], int] | None = None,
    ) -> SubmitOutcome:
        """:meth:`Completion.submit_result`; ``claim_next``: ``(capabilities, limit)`` of
        the jobs to claim for the slot the result frees (checked as a claim's are:
        INVALID_ARGUMENT, nothing changed)."""
        claim = None
        if claim_next is not None:
            caps, limit = claim_next
            if limit < 1:  # a slot to fill: no "0 = the default" here
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT, "claimNext.limit must be ≥ 1", {"field": "limit"}
                )
            n = check_poll_args(list(caps), limit, 0)
            claim = ClaimAsk(lease.instance_id, tuple(sorted(set(caps))), n)
        return await self.completion.submit_result(
            lease,
            prompt_version=prompt_version,
            output_schema_version=output_schema_version,
            output=output,
            calls=calls,
            claim=claim,
        )

    async def fail(
        self,
        lease: Lease,
        *,
        error_code: str,
        error_message: str,
        retry_after_seconds: float | None = None,
        calls: Sequence[ModelCallInput] = (),
    ) -> JobRecord:
        """:meth:`Completion.fail`."""
        return await self.completion.fail(
            lease,
            error_code=error_code,
            error_message=error_message,
            retry_after_seconds=retry_after_seconds,
            calls=calls,
        )

    async def cancel(self, job_id: str, *, user_id: str | None, actor: str) -> JobRecord:
        """:meth:`Cancellation.cancel`."""
        return await self.cancellation.cancel(job_id, user_id=user_id, actor=actor)

    # --------------------------------------------------------------- accounting

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
        """:meth:`Accounting.record_invocation` of one model call; returns the log id."""
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
        return await self.accounting.record_invocation(
            job_id=job_id, attempt_no=attempt_no, call=call
        )

    async def costs(self, from_date: str, to_date: str, group_by: str) -> list[dict[str, Any]]:
        """:meth:`Accounting.costs`."""
        return await self.accounting.costs(from_date, to_date, group_by)

    # -------------------------------------------------------------------- views

    async def get(self, job_id: str, user_id: str | None = None) -> JobRecord:
        """:meth:`Views.get`."""
        return await self.views.get(job_id, user_id)

    async def history(self, job_id: str) -> tuple[list[EventRecord], list[InvocationRecord]]:
        """:meth:`Views.history`."""
        return await self.views.history(job_id)

    async def list_jobs(
        self,
        *,
        user_id: str | None,
        status: str | None,
        job_type: str | None,
        page_size: int,
        page_token: str,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        parent_job_id: str | None = None,
    ) -> tuple[list[JobRecord], str]:
        """:meth:`Views.list_jobs`."""
        return await self.views.list_jobs(
            user_id=user_id,
            status=status,
            job_type=job_type,
            page_size=page_size,
            page_token=page_token,
            created_from=created_from,
            created_to=created_to,
            parent_job_id=parent_job_id,
        )

    async def delete_material(self, user_id: str, material_id: str) -> EndedJobs:
        """:meth:`Removal.delete_material`."""
        return await self.removal.delete_material(user_id, material_id)

    async def erase_user(self, user_id: str) -> Erased:
        """:meth:`Erasure.erase_user`."""
        return await self.erasure.erase_user(user_id)

    async def jobs_by_ids(self, user_id: str, job_ids: Sequence[str]) -> list[JobRecord]:
        """:meth:`Views.jobs_by_ids`."""
        return await self.views.jobs_by_ids(user_id, job_ids)

    async def health(self) -> tuple[bool, list[WorkerView]]:
        """:meth:`Views.health`."""
        return await self.views.health()

    async def refresh_gauges(self) -> dict[tuple[str, str], int]:
        """:meth:`Views.refresh_gauges`."""
        return await self.views.refresh_gauges()

    async def breaker_view(self) -> BreakerView:
        """:meth:`Views.breaker_view`."""
        return await self.views.breaker_view()

    async def breaker_views(self) -> list[BreakerView]:
        """:meth:`Views.breaker_views`."""
        return await self.views.breaker_views()

    async def provider_states(self) -> list[ProviderStateView]:
        """:meth:`Views.provider_states`."""
        return await self.views.provider_states()

    async def breaker_reset(self, provider: str | None = None) -> BreakerView:
        """:meth:`Views.breaker_reset`."""
        return await self.views.breaker_reset(provider)

    # ------------------------------------------------------------------ console

    async def job_counts(
        self,
        *,
        user_id: str | None,
        job_type: str | None,
        created_from: datetime | None,
        created_to: datetime | None,
    ) -> dict[str, int]:
        """:meth:`Console.job_counts`."""
        return await self.console.job_counts(
            user_id=user_id, job_type=job_type, created_from=created_from, created_to=created_to
        )

    async def explain(self, job_id: str) -> JobExplanation:
        """:meth:`Console.explain`."""
        return await self.console.explain(job_id)

    async def throughput(self, hours: int) -> ThroughputView:
        """:meth:`Console.throughput`."""
        return await self.console.throughput(hours)
