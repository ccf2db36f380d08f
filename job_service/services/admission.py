"""Admission: creating jobs and re-running failed ones, with every create-time check
(reference §2.3 create, §2.5 idempotency, §6 authorization, quota, budget, breaker).

A create is one transaction on both databases: the admission checks read
together in one batch (the user's admission lock first on MySQL/MariaDB, so one
create per user runs at a time on every replica and the day's count sees every
job committed before it), then the snapshot, then the job row, its first event
and its generation plan in a second batch.

The same body makes a batch (reference §10.3, :mod:`.batches`): a :class:`Plan` of
one job per target, and for a batch their parent. The checks run once for all of
them (the quota counts each child), the snapshots are built as a set, and every
row goes in the one insert batch; one job is a plan of one target.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cached_property
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.lru import LruCache
from job_service import metrics
from job_service.lifecycle import FAILED, PENDING
from job_service.maintenance import breaker
from job_service.prompts import Prompts
from job_service.services.core import Core, new_id
from job_service.services.fair_order import Place, fair_vstart
from job_service.services.inputs import CreateJobInput, RetryInput
from job_service.services.params import check_range, normalize_params
from job_service.services.pseudonyms import pseudonym, pseudonym_key
from job_service.store import creation
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import new_batch, run_one
from job_service.store.engine import DbExec
from job_service.store.records import JobRecord, job_of
from job_service.store.transitions import MAX_ACTOR

log = logging.getLogger("job_service.admission")
T = TypeVar("T")

#: How many users' admission lock rows a process remembers as existing (LRU, about
#: 170 bytes each); a user who fell out costs one more ``INSERT IGNORE``.
ADMISSION_ROWS_KNOWN = 10_000
#: The model every new job asks for (reference §2.2 ``modelName``).
DEFAULT_MODEL_NAME = "deepseek-chat"


@dataclass(frozen=True)
class NewJob:
    """The columns of a job about to be inserted that are not defaults (see
    :meth:`Admission.insert_job`); None for priority and the limits = the settings'."""

    job_id: str
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    snapshot_id: str | None
    params: dict[str, Any]
    api_key_mode: str
    credential_id: str | None
    idempotency_key: str | None
    priority: int | None
    max_retry_count: int | None
    timeout_seconds: int | None
    retried_from_job_id: str | None
    model_provider: str = "deepseek"
    model_name: str = DEFAULT_MODEL_NAME
    trace_parent: str | None = None
    #: ``<jobType>.<version>`` chosen by the routing in force (reference §10.4)
    prompt_version: str | None = None
    #: its place in its priority's fair order (:class:`Place`)
    vstart: float = 0.0
    #: a batch's child: its parent (reference §10.3)
    parent_job_id: str | None = None
    #: a batch's parent: how many children it has, and the share that must succeed
    batch_total: int | None = None
    min_success_ratio: float | None = None


@dataclass(frozen=True)
class BatchOf:
    """The parent a :class:`Plan` makes beside its jobs (reference §10.3)."""

    min_success_ratio: float
    retried_from_job_id: str | None = None


@dataclass(frozen=True)
class Plan:
    """The jobs one admission transaction makes once its checks passed: one per target
    of ``targets``, alike but for the target, and with ``batch`` their parent (the
    batch's children name it; ``idempotency_key`` is then the parent's).

    Attributes:
        retried_from: per target, the job the new one re-runs (empty: none).
    """

    user_id: str
    job_type: str
    targets: Sequence[tuple[str, str]]
    params: dict[str, Any]
    api_key_mode: str
    actor: str
    idempotency_key: str | None = None
    priority: int | None = None
    max_retry_count: int | None = None
    timeout_seconds: int | None = None
    trace_parent: str | None = None
    model_name: str = DEFAULT_MODEL_NAME
    model_provider: str | None = None
    credential_id: str | None = None
    retried_from: Sequence[str | None] = ()
    batch: BatchOf | None = None
    #: the user's weight in the fair order (reference §10.1; :meth:`Admission.weight`)
    weight: float = 1.0


class AdmissionRowMissing(Exception):
    """The user's admission lock row was gone (MySQL/MariaDB): erased with its user
    (reference §9.2) while this process remembered it. The admission ran unlocked, so its
    transaction is rolled back and run again once the row exists."""


class Admission:
    """Creates jobs (reference §2.3, §2.5, §6).

    Args:
        core: the shared core.
        prompts: the prompt registry: a new job's ``promptVersion`` is chosen in the
            create's transaction from the routing in force (reference §10.4).
    """

    def __init__(self, core: Core, prompts: Prompts | None = None) -> None:
        self.core = core
        self.prompts = prompts if prompts is not None else Prompts(core.store)
        #: users whose admission lock row is known to exist (MySQL/MariaDB)
        self.admission_rows: LruCache[str, bool] = LruCache(ADMISSION_ROWS_KNOWN)

    @cached_property
    def pseudonym_key(self) -> bytes:
        """The key of erased users' pseudonyms (their day's jobs still count, reference §9.2)."""
        return pseudonym_key(self.core.settings)

    async def create(self, req: CreateJobInput) -> tuple[JobRecord, bool]:
        """Create a job, or return the original in its idempotency scope (reference §2.3, §2.5).

        Returns:
            ``(job, replayed)``.

        Raises:
            AppError: INVALID_ARGUMENT, NOT_FOUND (target), AI_NOT_AUTHORIZED,
                QUOTA_EXCEEDED, PLATFORM_BUDGET_EXCEEDED, PLATFORM_CIRCUIT_OPEN,
                INVALID_CREDENTIAL.
        """
        _check_request(req)
        if req.idempotency_key is not None:
            existing = await self.by_scope(req)
            if existing is not None:  # whatever its params, even invalid ones (reference §2.5)
                return existing, True
        plan = Plan(
            req.user_id, req.job_type, [(req.target_type, req.target_id)],
            normalize_params(req.job_type, req.params), req.api_key_mode,
            req.actor or f"user:{req.user_id}", req.idempotency_key, req.priority,
            req.max_retry_count, req.timeout_seconds, req.trace_parent,
            weight=self.weight(req.plan, req.actor or ""),
        )  # fmt: skip
        jobs, replayed = await self.admit_plan(plan, scope=req, quota=self.quota(req))
        return jobs[0], replayed

    async def admit_plan(
        self, plan: Plan, *, scope: CreateJobInput | None, quota: int
    ) -> tuple[list[JobRecord], bool]:
        """The body of every create (module doc): the credential check, then one
        transaction: the admission checks for all of ``plan``'s jobs (:meth:`admit`,
        the quota counting one per target), then :meth:`make`.

        Args:
            scope: the idempotency scope of the job (a batch: of its parent), if keyed;
                its pre-check is the caller's (before the request's own checks).
            quota: the user's daily quota (0: none).

        Returns:
            ``(jobs, replayed)``: the jobs made, in ``plan.targets`` order, the parent
            last; or the original job of ``scope`` alone.

        Raises:
            AppError: INVALID_CREDENTIAL, AI_NOT_AUTHORIZED, QUOTA_EXCEEDED,
                PLATFORM_BUDGET_EXCEEDED, PLATFORM_CIRCUIT_OPEN, NOT_FOUND (a target).
        """
        credential_id = await self.core.credentials.check(plan.user_id, plan.api_key_mode)
        plan = replace(plan, credential_id=credential_id)
        await self.ensure_admission_row(plan.user_id)

        async def body(session: AsyncSession) -> tuple[list[JobRecord], bool]:
            place = Place(self.priority(plan.priority), plan.weight)
            existing = await self.admit(
                session,
                plan.user_id,
                scope=scope,
                quota=quota,
                platform=plan.api_key_mode == "platform_key",
                count=len(plan.targets),
                place=place,
            )
            if existing is not None:
                return [existing], True
            return await self.make(session, plan, place), False

        try:
            jobs, replayed = await self.locked_tx(plan.user_id, body)
        except IntegrityError:
            existing = await self.by_scope(scope) if scope is not None else None
            if scope is None or scope.idempotency_key is None or existing is None:
                raise
            return [existing], True
        if not replayed:
            self.created(jobs)
        return jobs, replayed

    async def make(self, session: AsyncSession, plan: Plan, place: Place) -> list[JobRecord]:
        """``plan``'s snapshots (one set build) and rows (:meth:`insert_jobs`), in the
        caller's admission transaction; the jobs in target order, a parent last.

        The jobs take their places in the fair order one after another from
        ``place.vstart`` (reference §10.1: as if created one by one; under ``fifo`` all
        at ``V``), and their prompt version from the routing in force (reference §10.4).

        Raises:
            AppError: NOT_FOUND for the first target that is not the user's.
        """
        snapshot_ids = await self.core.learning.build_snapshots(
            session,
            user_id=plan.user_id,
            job_type=plan.job_type,
            targets=plan.targets,
            params=plan.params,
        )
        provider = plan.model_provider or self.initial_provider(plan.api_key_mode, plan.model_name)
        parent_id = new_id() if plan.batch is not None else None
        version = await self.prompts.choose(session, plan.job_type, plan.user_id)
        step = 1.0 / plan.weight if self.core.settings.SCHEDULING_POLICY == "fair" else 0.0

        def job(job_id: str, target: tuple[str, str], snapshot_id: str | None, **kw: Any) -> NewJob:
            return NewJob(
                job_id=job_id,
                user_id=plan.user_id,
                job_type=plan.job_type,
                target_type=target[0],
                target_id=target[1],
                snapshot_id=snapshot_id,
                params=plan.params,
                api_key_mode=plan.api_key_mode,
                credential_id=plan.credential_id,
                priority=plan.priority,
                max_retry_count=plan.max_retry_count,
                timeout_seconds=plan.timeout_seconds,
                model_provider=provider,
                model_name=plan.model_name,
                trace_parent=plan.trace_parent,
                **kw,
            )

        news = [
            job(
                new_id(),
                target,
                snapshot_id,
                idempotency_key=None if plan.batch is not None else plan.idempotency_key,
                retried_from_job_id=plan.retried_from[i] if plan.retried_from else None,
                parent_job_id=parent_id,
                prompt_version=version,
                vstart=place.vstart + i * step,
            )
            for i, (target, snapshot_id) in enumerate(zip(plan.targets, snapshot_ids, strict=True))
        ]
        if plan.batch is not None and parent_id is not None:
            news.append(
                job(
                    parent_id,
                    ("user", plan.user_id),
                    None,
                    idempotency_key=plan.idempotency_key,
                    retried_from_job_id=plan.batch.retried_from_job_id,
                    batch_total=len(plan.targets),
                    min_success_ratio=plan.batch.min_success_ratio,
                    vstart=place.vstart,
                )
            )
        return await self.insert_jobs(session, news, actor=plan.actor)

    async def rerun(
        self,
        job_id: str,
        *,
        rebuild_snapshot: bool,
        actor: str,
        trace_parent: str | None = None,
    ) -> JobRecord:
        """Admin re-run of a failed job: a new job with ``retriedFromJobId`` (reference §2.3).

        The new job passes the create-time checks a create of its user would (reference
        §6): the user's AI switch (serialised with a revoke by the user's admission
        lock, as a create is), a usable key of the job's ``apiKeyMode`` (the user's
        *current* credential is recorded, not the failed job's, which may have been
        replaced or marked invalid since) and, for the platform key, the budget and
        the breaker. Like an admin create, it is not held to the user's daily quota.

        Raises:
            AppError: JOB_NOT_FOUND, INVALID_JOB_STATE (not failed), AI_NOT_AUTHORIZED,
                INVALID_CREDENTIAL, PLATFORM_CIRCUIT_OPEN, PLATFORM_BUDGET_EXCEEDED,
                NOT_FOUND (target gone, when rebuilding).
        """
        job, _ = await self.retry(
            RetryInput(job_id, rebuild_snapshot, actor or "admin", trace_parent=trace_parent)
        )
        return job

    async def retry(self, req: RetryInput) -> tuple[JobRecord, bool]:
        """Re-run a failed job as a new one (reference §2.3 admin re-run, §9.2 user retry).

        With ``req.user_id`` (``POST /v1/ai/jobs/{id}/retry``) the job must be that
        user's and the new job is held to their daily quota (``req.plan``) as a create
        is; ``req.idempotency_key`` makes a repeat answer the original new job (scope
        as a create's: user, type, target, key). A snapshot that no longer exists
        (its material was deleted) is rebuilt, as with ``rebuild_snapshot``.

        Returns:
            ``(job, replayed)``.

        Raises:
            AppError: as :meth:`rerun`, and QUOTA_EXCEEDED; INVALID_ARGUMENT for a bad key.
        """
        # A failed job is terminal: what this read sees of it cannot change.
        async with self.core.store.sessions() as session:
            old = await self.core.must_get_job(session, req.job_id, user_id=req.user_id)
        scope = _retry_scope(old, req.idempotency_key)
        existing = await self.by_scope(scope) if scope is not None else None
        if existing is not None:
            return existing, True
        if old.status != FAILED:
            raise AppError(
                ErrorCode.INVALID_JOB_STATE,
                "only failed jobs can be re-run",
                {"jobId": req.job_id, "status": old.status},
            )
        credential_id = await self.core.credentials.check(old.user_id, old.api_key_mode)
        await self.ensure_admission_row(old.user_id)
        quota = self.plan_quota(req.plan) if req.user_id is not None else 0

        place = Place(old.priority, self.weight(req.plan, req.actor))

        async def body(session: AsyncSession) -> tuple[JobRecord, bool]:
            platform = old.api_key_mode == "platform_key"
            found = await self.admit(
                session, old.user_id, scope=scope, quota=quota, platform=platform, place=place
            )
            if found is not None:
                return found, True
            snapshot_id = old.snapshot_id
            if (
                req.rebuild_snapshot
                or not snapshot_id
                or not await self.core.learning.snapshot_stored(session, snapshot_id)
            ):
                snapshot_id = await self.core.learning.build_snapshot(
                    session,
                    user_id=old.user_id,
                    job_type=old.job_type,
                    target_type=old.target_type,
                    target_id=old.target_id,
                    params=old.params,
                )
            new = NewJob(
                new_id(), old.user_id, old.job_type, old.target_type, old.target_id,
                snapshot_id, old.params, old.api_key_mode, credential_id, req.idempotency_key,
                old.priority, old.max_retry_count, old.timeout_seconds, old.job_id,
                self.initial_provider(old.api_key_mode, old.model_name, old.model_provider),
                old.model_name, req.trace_parent,
                await self.prompts.choose(session, old.job_type, old.user_id), place.vstart,
            )  # fmt: skip
            return await self.insert_job(session, new, actor=req.actor), False

        try:
            job, replayed = await self.locked_tx(old.user_id, body)
        except IntegrityError:
            existing = await self.by_scope(scope) if scope is not None else None
            if existing is None:
                raise
            return existing, True
        if not replayed:
            self.created([job])
        return job, replayed

    def created(self, jobs: Sequence[JobRecord]) -> None:
        """After new jobs committed: count them (a batch's parent runs nothing: not
        counted), wake this process's long polls, log each (a batch: its parent)."""
        for job in jobs:
            if not job.is_parent:
                metrics.JOBS_CREATED.labels(job.job_type, job.api_key_mode).inc()
        self.core.signal.notify()
        for job in jobs if len(jobs) == 1 else [j for j in jobs if j.is_parent]:
            log.info(
                "job created",
                extra={
                    "fields": {
                        "jobId": job.job_id,
                        "jobType": job.job_type,
                        "apiKeyMode": job.api_key_mode,
                        "userId": job.user_id,
                        "children": job.batch_total,
                    }
                },
            )

    async def locked_tx(self, user_id: str, body: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run an admission transaction ``body`` (:meth:`admit` first); when it finds the
        user's lock row gone (:class:`AdmissionRowMissing`), make the row and run it again."""
        try:
            return await self.core.store.tx(body)
        except AdmissionRowMissing:
            self.admission_rows.pop(user_id)
            await self.ensure_admission_row(user_id)
            return await self.core.store.tx(body)

    async def ensure_admission_row(self, user_id: str) -> None:
        """Make sure the user's admission lock row exists (MySQL/MariaDB only).

        Inserted in its own short transaction (``INSERT IGNORE``), never in the
        create transaction: an ignored duplicate takes a shared lock there, and
        two of those upgrading to the exclusive lock would deadlock.
        """
        if self.core.clock.is_sqlite or self.admission_rows.get(user_id):
            return
        sql = st.ensure_admission_row.sql(self.core.clock, {"user_id": user_id})
        await self.core.store.lean_tx(lambda conn: run_one(conn, sql))
        self.admission_rows.put(user_id, True)

    async def by_scope(self, req: CreateJobInput) -> JobRecord | None:
        """The job of ``req``'s idempotency scope (reference §2.5), or None."""
        sql = st.scope_job.sql(self.core.clock, _scope_params(req))
        found = await self.core.store.read(lambda conn: run_one(conn, sql))
        return job_of(found.rows[0]) if found.rows else None

    async def admit(
        self,
        db: DbExec,
        user_id: str,
        *,
        scope: CreateJobInput | None,
        quota: int,
        platform: bool,
        place: Place | None = None,
        count: int = 1,
    ) -> JobRecord | None:
        """The admission checks of ``count`` new jobs (a batch's children, reference
        §10.3: all or none), in the caller's transaction (reference §6).

        One batch reads, in order: the user's admission row ``FOR UPDATE`` (one
        create per user at a time on every replica), the job of ``scope``'s
        idempotency scope (a racing repeat that lost the pre-check gets the
        original, not a quota refusal), the AI switch, the day's job count
        (``quota`` > 0), the day's platform spend and the breaker's state
        (``platform``), and with ``place`` what the job's place in the fair order is
        made of (:data:`~job_service.store.statements.fair_start`, read after the
        user's lock: their newest waiting job cannot change meanwhile; ``place.vstart``
        is set). They are then judged in that order; a breaker that is not closed
        goes through :func:`breaker.admit_new_job` (its locking read and transitions).

        Returns:
            The original job of ``scope``, else None (admitted).

        Raises:
            AppError: AI_NOT_AUTHORIZED, QUOTA_EXCEEDED, PLATFORM_BUDGET_EXCEEDED,
                PLATFORM_CIRCUIT_OPEN.
        """
        clock = self.core.clock
        user = {"a_user": user_id}
        batch = new_batch(db)
        lock = batch.add(st.admission_lock.sql(clock, user))
        found = None
        if scope is not None and scope.idempotency_key is not None:
            found = batch.add(st.scope_job.sql(clock, _scope_params(scope)))
        granted = batch.add(st.ai_granted.sql(clock, user))
        used = None
        if quota > 0:
            counted = {**user, "a_pseudonym": pseudonym(self.pseudonym_key, user_id)}
            used = batch.add(st.jobs_created_today.sql(clock, counted))
        spent = state = None
        names = self.breaker_candidates()
        if platform:
            spent = batch.add(st.platform_spent_today.sql(clock, {}))
            state = batch.add(breaker.rows_sql(providers=names))
        start = None
        if place is not None:
            start = batch.add(sched.fair_start.sql(clock, {**user, "f_priority": place.priority}))
        out = await batch.run()
        if place is not None and start is not None:
            user_last, fresh_min, *taken = out[start].rows[0]
            policy = self.core.settings.SCHEDULING_POLICY
            place.vstart = fair_vstart(policy, place.weight, user_last, fresh_min, taken)
        if not clock.is_sqlite and out[lock].rowcount == 0:
            raise AdmissionRowMissing(user_id)
        if found is not None and out[found].rows:
            return job_of(out[found].rows[0])
        check_granted(out[granted].rows[0][0] if out[granted].rows else None)
        if used is not None:
            check_quota(quota, out[used].rows[0][0], count)
        if spent is not None and state is not None:
            self.check_budget(out[spent].rows[0][0])
            await self.check_breakers(db, names, out[state].rows)
        return None

    def breaker_candidates(self) -> list[str]:
        """The providers a new platform-key job may run on (the default model's), in
        order of preference; at least the first configured one."""
        return self.core.platform_candidates(DEFAULT_MODEL_NAME) or [self.core.providers.first.name]

    def initial_provider(self, api_key_mode: str, model_name: str, old: str | None = None) -> str:
        """A new job's ``modelProvider``: for the platform key the provider its first
        attempt would prefer (each lease grant chooses again, reference §9.4); for a user
        key ``old`` (a re-run's) or the first configured provider."""
        if api_key_mode == "platform_key":
            candidates = self.core.platform_candidates(model_name)
            if candidates:
                return candidates[0]
        return old or self.core.providers.first.name

    async def check_breakers(self, db: DbExec, names: list[str], rows: Any) -> None:
        """The breaker guard of a new platform-key job (reference §6, §9.4), given the rows of
        ``names``' breakers as the admission batch read them: with one provider, its
        breaker's :func:`breaker.admit_new_job` unless it is closed; with several,
        refused only while every one is open (:func:`breaker.judge_failover_create`).

        Raises:
            AppError: PLATFORM_CIRCUIT_OPEN.
        """
        found = {r.provider: r for r in (breaker.BreakerRow.of(row) for row in rows)}
        if len(names) == 1:
            row = found.get(names[0])
            if row is None or row.state != "closed":
                await breaker.admit_new_job(db, self.core.clock, self.core.settings, names[0])
            return
        ordered = [found.get(n) or breaker.BreakerRow(n) for n in names]
        if all(r.state != "closed" for r in ordered):
            now = await self.core.clock.read(db)
            breaker.judge_failover_create(ordered, now, self.core.settings.BREAKER_COOLDOWN_SECONDS)

    def priority(self, priority: int | None) -> int:
        """A new job's priority: the one asked for (admin), else ``DEFAULT_PRIORITY``."""
        return self.core.settings.DEFAULT_PRIORITY if priority is None else priority

    def weight(self, plan: str | None, actor: str) -> float:
        """A new job's user's weight in the fair order (reference §10.1): their plan's in
        ``PLAN_SCHEDULING_WEIGHTS``, else 1; a job an admin creates weighs 1."""
        if actor.startswith("admin") or not plan:
            return 1.0
        return self.core.settings.PLAN_SCHEDULING_WEIGHTS.get(plan, 1.0)

    def quota(self, req: CreateJobInput) -> int:
        """The daily job quota of ``req``'s user: their plan's, else the default (0 = none)."""
        return self.plan_quota(req.plan)

    def plan_quota(self, plan: str | None) -> int:
        """The daily job quota of a user on ``plan``: the plan's, else the default (0 = none)."""
        plans = self.core.settings.PLAN_DAILY_JOB_QUOTAS
        if plan and plan in plans:
            return plans[plan]
        return self.core.settings.USER_DAILY_JOB_QUOTA

    def check_budget(self, spent: Any) -> None:
        """Refuse a platform-key job once the day's spend reached the budget (reference §6).

        Raises:
            AppError: PLATFORM_BUDGET_EXCEEDED.
        """
        budget = self.core.settings.PLATFORM_DAILY_BUDGET_USD
        if Decimal(str(spent)) >= Decimal(str(budget)):
            raise AppError(
                ErrorCode.PLATFORM_BUDGET_EXCEEDED,
                "the platform's daily AI budget is used up",
                {"budgetUsd": budget, "spentUsd": float(spent)},
            )

    async def insert_job(self, db: DbExec, new: NewJob, *, actor: str) -> JobRecord:
        """:meth:`insert_jobs` of one job."""
        return (await self.insert_jobs(db, [new], actor=actor))[0]

    async def insert_jobs(
        self, db: DbExec, news: Sequence[NewJob], *, actor: str
    ) -> list[JobRecord]:
        """Insert pending jobs, each with its first event and generation plan
        (quiz/flashcard), in the caller's transaction, in one batch; returns the jobs as
        stored, in ``news`` order. The rows of one shape go as one INSERT on
        MySQL/MariaDB (merged), in order, so a batch's children come in target order
        and its parent (``batch_total`` set, inserted with
        :data:`~job_service.store.tables.PARENT_AVAILABLE_AT`) after them.

        The batch does not end in COMMIT: a create run again after a lost
        connection would make a second job, so the create's own COMMIT follows alone.

        Raises:
            sqlalchemy.exc.IntegrityError: a job of the same idempotency scope exists.
        """
        clock = self.core.clock
        batch = new_batch(db)
        for new in news:
            values = self._row(new)
            if new.batch_total is None:
                batch.add(st.insert_job.sql(clock, values), merge=True)
            else:
                batch.add(creation.insert_parent.sql(clock, values))
            plan = None
            if new.batch_total is None:
                plan = self.core.learning.generation_plan(
                    clock,
                    job_id=new.job_id,
                    user_id=new.user_id,
                    job_type=new.job_type,
                    target_type=new.target_type,
                    target_id=new.target_id,
                    params=new.params,
                )
            if plan is not None:
                batch.add(plan, merge=True)
        ids = [new.job_id for new in news]
        batch.add(creation.creation_events.sql(clock, {"ids": ids, "e_actor": actor[:MAX_ACTOR]}))
        read = batch.add(creation.jobs_in_order.sql(clock, {"ids": ids}))
        out = await batch.run()
        found = {job.job_id: job for job in (job_of(row) for row in out[read].rows)}
        return [found[job_id] for job_id in ids]

    def _row(self, new: NewJob) -> dict[str, Any]:
        """The columns :meth:`insert_jobs` writes for ``new`` (a parent's counts: all of
        its children pending)."""
        s = self.core.settings
        values: dict[str, Any] = {
            "job_id": new.job_id,
            "user_id": new.user_id,
            "job_type": new.job_type,
            "target_type": new.target_type,
            "target_id": new.target_id,
            "snapshot_id": new.snapshot_id,
            "params": new.params,
            "api_key_mode": new.api_key_mode,
            "credential_id": new.credential_id,
            "idempotency_key": new.idempotency_key,
            "retried_from_job_id": new.retried_from_job_id,
            "model_provider": new.model_provider,
            "model_name": new.model_name,
            "status": PENDING,
            "priority": self.priority(new.priority),
            "vstart": new.vstart,
            "attempt_no": 0,
            "retry_count": 0,
            "max_retry_count": _or(new.max_retry_count, s.MAX_RETRY_COUNT),
            "timeout_seconds": _or(new.timeout_seconds, s.JOB_TIMEOUT_SECONDS),
            "cancel_requested": False,
            "version": 0,
            "trace_parent": new.trace_parent,
            "prompt_version": new.prompt_version,
            "parent_job_id": new.parent_job_id,
        }
        if new.batch_total is not None:
            values.update(
                batch_total=new.batch_total,
                batch_pending=new.batch_total,
                batch_running=0,
                batch_succeeded=0,
                batch_failed=0,
                batch_cancelled=0,
                min_success_ratio=new.min_success_ratio,
            )
        return values


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _check_request(req: CreateJobInput) -> None:
    """The checks of a create that need no database (reference §2.1, §2.5, §3.1).

    Raises:
        AppError: INVALID_ARGUMENT; NOT_FOUND for a ``user`` target that is not the caller.
    """
    jobtypes.get(req.job_type)
    if not req.user_id:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
    if req.target_type == "user":
        if not req.target_id:
            req.target_id = req.user_id
        elif req.target_id != req.user_id:
            raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": req.target_id})
    if not req.target_id:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "targetId is required", {"field": "targetId"})
    check_key(req.idempotency_key)
    check_range("maxRetryCount", req.max_retry_count, 0, 10)
    check_range("timeoutSeconds", req.timeout_seconds, 10, 3600)
    if req.priority is not None:
        check_range("priority", req.priority, 0, 1000)


def check_key(key: str | None) -> None:
    """An idempotency key is 1..255 characters (reference §2.5).

    Raises:
        AppError: INVALID_ARGUMENT.
    """
    if key is not None and not 1 <= len(key) <= 255:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "idempotency key must be 1..255 characters",
            {"field": "idempotencyKey"},
        )


def _retry_scope(old: JobRecord, key: str | None) -> CreateJobInput | None:
    """The idempotency scope of a retry of ``old`` with ``key`` (a create's: its user,
    type and target, reference §2.5), or None without a key.

    Raises:
        AppError: INVALID_ARGUMENT for a bad key.
    """
    if key is None:
        return None
    scope = CreateJobInput(
        old.user_id, old.job_type, old.target_type, old.target_id, idempotency_key=key
    )
    _check_request(scope)
    return scope


def _scope_params(req: CreateJobInput) -> dict[str, Any]:
    """:data:`~job_service.store.statements.scope_job`'s values for ``req``."""
    return {
        "a_user": req.user_id,
        "a_type": req.job_type,
        "a_target_type": req.target_type,
        "a_target": req.target_id,
        "a_key": req.idempotency_key,
    }


def check_granted(granted: Any) -> None:
    """Refuse when the user turned AI off (``granted`` false; no row = granted, reference §6).

    Raises:
        AppError: AI_NOT_AUTHORIZED.
    """
    if granted is not None and not granted:
        raise AppError(
            ErrorCode.AI_NOT_AUTHORIZED, "AI features are turned off for this user", None
        )


def check_quota(quota: int, used: Any, count: int = 1) -> None:
    """Refuse ``count`` new jobs unless the user's jobs of the day stay within ``quota``
    with all of them (reference §6; a batch is all or none, reference §10.3).

    Raises:
        AppError: QUOTA_EXCEEDED.
    """
    if used + count > quota:
        details = {"quota": quota, "used": int(used)}
        if count != 1:
            details["requested"] = count
        raise AppError(ErrorCode.QUOTA_EXCEEDED, "daily AI job quota reached", details)
