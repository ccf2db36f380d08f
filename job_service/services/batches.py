"""Batches: a parent job and its children, created, re-run and read as one
(reference §10.3).

A batch is made by admission's one create body (:meth:`Admission.admit_plan`): a
:class:`~job_service.services.admission.Plan` of one child per target and their
parent, every create check applied to all of it in one transaction (the quota
counts each child; a target not the caller's is 404; all or nothing). The parent
follows its children from then on (:mod:`.parents`); cancelling it is
:meth:`~job_service.services.cancellation.Cancellation.cancel_parent`.
"""

from __future__ import annotations

import math

from airuntime_common import jobtypes
from airuntime_common.enums import TARGET_TYPES
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from job_service.lifecycle import FAILED, SUCCEEDED
from job_service.services.admission import Admission, BatchOf, Plan, check_key
from job_service.services.core import Core
from job_service.services.inputs import CreateBatchInput, CreateJobInput, RetryInput
from job_service.services.params import check_range, normalize_params
from job_service.store.batch import run_one
from job_service.store.parents import children_of
from job_service.store.records import JobRecord


class Batches:
    """Creates and re-runs batches.

    Args:
        core: the shared core.
        admission: the one create body.
    """

    def __init__(self, core: Core, admission: Admission) -> None:
        self.core = core
        self.admission = admission

    async def create(self, req: CreateBatchInput) -> tuple[JobRecord, bool]:
        """Create a batch: its parent and one child per target (reference §10.3).

        Returns:
            ``(parent, replayed)``; a repeat of ``req.idempotency_key`` in the parent's
            scope answers the original, whatever the rest of the request.

        Raises:
            AppError: INVALID_ARGUMENT (type, params, targets: none, more than
                ``BATCH_MAX_CHILDREN``, one named twice, both or neither of targets
                and targetsOf, a ratio outside 0 < r ≤ 1), NOT_FOUND (a target not the
                caller's), AI_NOT_AUTHORIZED, QUOTA_EXCEEDED (the day's quota cannot
                take every child), PLATFORM_BUDGET_EXCEEDED, PLATFORM_CIRCUIT_OPEN,
                INVALID_CREDENTIAL. Nothing is created.
        """
        jobtypes.get(req.job_type)
        if not req.user_id:
            raise invalid_argument("userId is required", field="userId")
        check_key(req.idempotency_key)
        scope = _parent_scope(req.user_id, req.job_type, req.idempotency_key)
        if scope is not None:
            existing = await self.admission.by_scope(scope)
            if existing is not None:  # whatever the request (reference §2.5)
                return existing, True
        ratio = _ratio(req.min_success_ratio)
        check_range("maxRetryCount", req.max_retry_count, 0, 10)
        check_range("timeoutSeconds", req.timeout_seconds, 10, 3600)
        if req.priority is not None:
            check_range("priority", req.priority, 0, 1000)
        params = normalize_params(req.job_type, req.params)
        targets = await self._targets(req)
        plan = Plan(
            req.user_id, req.job_type, targets, params, req.api_key_mode,
            req.actor or f"user:{req.user_id}", req.idempotency_key, req.priority,
            req.max_retry_count, req.timeout_seconds, req.trace_parent,
            batch=BatchOf(ratio),
        )  # fmt: skip
        quota = self.admission.plan_quota(req.plan)
        jobs, replayed = await self.admission.admit_plan(plan, scope=scope, quota=quota)
        return jobs[-1], replayed

    async def _targets(self, req: CreateBatchInput) -> list[tuple[str, str]]:
        """The children's targets, checked (reference §10.3): ``targets`` as given, or
        those ``targetsOf`` names (read now, oldest first).

        Raises:
            AppError: INVALID_ARGUMENT as :meth:`create` says.
        """
        most = self.core.settings.BATCH_MAX_CHILDREN
        if (req.targets is None) == (req.targets_of is None):
            raise invalid_argument(
                "give either targets or targetsOf", field="targets", targetsOf=True
            )
        if req.targets_of is not None:
            target_type, material_id = req.targets_of
            async with self.core.store.sessions() as session:
                ids = await self.core.learning.targets_of(
                    session, req.user_id, target_type, material_id, most + 1
                )
            if not ids:
                raise invalid_argument("targetsOf matches no target", field="targetsOf")
            if len(ids) > most:
                raise invalid_argument(
                    f"targetsOf matches more than BATCH_MAX_CHILDREN ({most}) targets",
                    field="targetsOf",
                    max=most,
                )
            return [(target_type, i) for i in ids]
        targets = list(req.targets or [])
        if not 1 <= len(targets) <= most:
            raise invalid_argument(
                f"targets must name 1..{most} targets (BATCH_MAX_CHILDREN)",
                field="targets",
                count=len(targets),
            )
        out: list[tuple[str, str]] = []
        for n, (target_type, target_id) in enumerate(targets):
            if target_type not in TARGET_TYPES:
                raise invalid_argument(
                    f"targetType must be one of {', '.join(TARGET_TYPES)}",
                    field=f"targets[{n}].targetType",
                )
            if target_type == "user":
                target_id = target_id or req.user_id
                if target_id != req.user_id:
                    raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": target_id})
            if not target_id:
                raise invalid_argument("targetId is required", field=f"targets[{n}].targetId")
            out.append((target_type, target_id))
        if len(set(out)) != len(out):
            twice = next(t for t in out if out.count(t) > 1)
            raise invalid_argument(
                "a target is named twice",
                field="targets",
                targetType=twice[0],
                targetId=twice[1],
            )
        return out

    async def retry(self, req: RetryInput) -> tuple[JobRecord, bool]:
        """Re-run a failed job (:meth:`Admission.retry`); a failed batch's parent as a
        new batch (reference §10.3) whose children are the targets whose child did not
        succeed, in their order, each child naming the one it re-runs; the new parent
        keeps ``minSuccessRatio``, params, priority and key mode, and names the old one
        in ``retriedFromJobId``. Every check of a create applies (the quota, for a
        user's retry, counts each child).

        Raises:
            AppError: as :meth:`Admission.retry`; NOT_FOUND when a target is gone.
        """
        async with self.core.store.sessions() as session:
            old = await self.core.must_get_job(session, req.job_id, user_id=req.user_id)
            kids = [] if not old.is_parent else (
                await run_one(session, children_of.sql(self.core.clock, {"c_parent": old.job_id}))
            ).rows  # fmt: skip
        if not old.is_parent:
            return await self.admission.retry(req)
        check_key(req.idempotency_key)
        scope = _parent_scope(old.user_id, old.job_type, req.idempotency_key)
        if scope is not None:
            existing = await self.admission.by_scope(scope)
            if existing is not None:
                return existing, True
        if old.status != FAILED:
            raise AppError(
                ErrorCode.INVALID_JOB_STATE,
                "only failed jobs can be re-run",
                {"jobId": req.job_id, "status": old.status},
            )
        again = [row for row in kids if row[1] != SUCCEEDED]
        plan = Plan(
            old.user_id, old.job_type, [(str(r[2]), str(r[3])) for r in again], old.params,
            old.api_key_mode, req.actor, req.idempotency_key, old.priority,
            old.max_retry_count, old.timeout_seconds, req.trace_parent, old.model_name,
            retried_from=[str(r[0]) for r in again],
            batch=BatchOf(old.min_success_ratio or 1.0, old.job_id),
        )  # fmt: skip
        quota = self.admission.plan_quota(req.plan) if req.user_id is not None else 0
        jobs, replayed = await self.admission.admit_plan(plan, scope=scope, quota=quota)
        return jobs[-1], replayed

    async def rerun(
        self, job_id: str, *, rebuild_snapshot: bool, actor: str, trace_parent: str | None = None
    ) -> JobRecord:
        """Admin re-run of a failed job or batch (:meth:`retry` without a user: no quota)."""
        job, _ = await self.retry(
            RetryInput(job_id, rebuild_snapshot, actor or "admin", trace_parent=trace_parent)
        )
        return job


def _parent_scope(user_id: str, job_type: str, key: str | None) -> CreateJobInput | None:
    """The idempotency scope of a batch's parent (a ``user`` target: the user), or None."""
    if key is None:
        return None
    return CreateJobInput(user_id, job_type, "user", user_id, idempotency_key=key)


def _ratio(value: float | None) -> float:
    """``minSuccessRatio`` checked: 0 < r ≤ 1 (None: 1).

    Raises:
        AppError: INVALID_ARGUMENT.
    """
    if value is None:
        return 1.0
    if not (math.isfinite(value) and 0 < value <= 1):
        raise invalid_argument(
            "minSuccessRatio must be > 0 and ≤ 1", field="minSuccessRatio", value=value
        )
    return float(value)


__all__ = ["Batches"]
