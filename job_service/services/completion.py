"""Completion: an attempt's result or fail (reference §2.3, §2.4, §2.5, §5).

Both go through one path: the request is checked, joins the next group of
reports (:class:`~job_service.services.grouping.GroupCommit`: reports that queue
while others commit go together, a lone one at once), and the group is ended in
one transaction by the :class:`~job_service.services.completer.Completer`. Each
caller then gets its own report's answer: the metrics and log line of an ended
attempt, a refused credential marked invalid, and the refusal raised once the
transaction committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import PENDING, TERMINAL, Lease
from job_service.services.accounting import Accounting
from job_service.services.claim_round import ClaimAsk
from job_service.services.completer import Completer, Done, FailReport, Report, ResultReport
from job_service.services.core import MAX_ERROR_MESSAGE, Core, observe_pickup
from job_service.services.granting import Granting
from job_service.services.grouping import GroupCommit
from job_service.services.inputs import ModelCallInput, SubmitOutcome
from job_service.store.batch import FenceBroken
from job_service.store.records import JobRecord

log = logging.getLogger("job_service.completion")

#: Most reports one completer transaction takes: the statements a group builds are
#: cached per size, and past a few dozen jobs a group saves no more per job.
GROUP_MAX_SIZE = 32
#: Completer transactions a process runs at once; reports arriving while they are all
#: busy wait for the next group. Two keep one group's round trips overlapping the
#: next group's gathering, and hold two of the pool's connections at most.
GROUP_IN_FLIGHT = 2


class Completion:
    """Ends attempts: SubmitResult and FailJob.

    Args:
        core: the shared core.
        accounting: logs the attempts' model calls.
    """

    def __init__(self, core: Core, accounting: Accounting, granting: Granting) -> None:
        self.core = core
        self.accounting = accounting
        self.completer = Completer(core, accounting, granting)
        #: reports that arrive while others commit end in one transaction together
        self.groups: GroupCommit[Report, Done] = GroupCommit(
            self._run,
            key=lambda report: report.lease.job_id,
            max_size=GROUP_MAX_SIZE,
            max_in_flight=GROUP_IN_FLIGHT,
            observe=metrics.RESULT_GROUP_SIZE.observe,
        )

    async def _run(self, reports: list[Report]) -> list[Done]:
        """End ``reports`` in one transaction; again when a lease lapsed between the read
        and the write (:class:`FenceBroken`: the next read refuses that lease)."""
        for _ in range(len(reports)):
            try:
                return await self.core.store.lean_tx(
                    lambda db: self.completer.complete(db, reports)
                )
            except FenceBroken:
                continue
        return await self.core.store.lean_tx(lambda db: self.completer.complete(db, reports))

    async def submit_result(
        self,
        lease: Lease,
        *,
        prompt_version: str | None,
        output_schema_version: str,
        output: Any,
        calls: Sequence[ModelCallInput] = (),
        claim: ClaimAsk | None = None,
    ) -> SubmitOutcome:
        """Accept an attempt's output (reference §2.3 result, §2.5 idempotency, §5 validation).

        Order: exact replay (200) → already succeeded with another hash
        (RESULT_ALREADY_EXISTS) → lease (LOCK_NOT_HELD) → validation (INVALID_SCHEMA:
        no business rows, job → failed, or cancelled when a cancel was requested;
        committed, then raised).

        ``calls`` (the attempt's model calls) are logged in the same transaction
        when the result ends the attempt; a replay or a refusal logs none (the
        caller then uses RecordInvocation).

        With ``claim`` (the next jobs of the slot the result frees), a result taken now
        also claims them for the caller, started, in the same transaction, as ClaimJobs
        with start would (no long poll); a replay, a refusal or an invalid output claims
        none. Run again after a lost answer, the result replays and claims nothing: jobs
        the lost answer claimed go back to pending when their lease expires, as those
        of a lost ClaimJobs answer do.

        Raises:
            AppError: JOB_NOT_FOUND, RESULT_ALREADY_EXISTS, LOCK_NOT_HELD, INVALID_SCHEMA,
                INVALID_JOB_STATE (the job's data was deleted; it ends cancelled);
                INVALID_ARGUMENT for a bad call (nothing changed).
        """
        for call in calls:
            call.check()
        report = ResultReport(
            lease,
            calls,
            prompt_version,
            output_schema_version,
            output,
            content_hash(output),
            claim,
        )
        done = await self._complete(report)
        if done.error is not None:
            raise done.error
        assert done.facts is not None
        if done.claimed is not None:
            for job in done.claimed.jobs:
                observe_pickup(job)
        return SubmitOutcome(
            done.facts.job_id,
            done.status,
            done.result_id,
            report.output_hash,
            done.replayed,
            done.claimed,
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
        """End an attempt with a failure (reference §2.3, §2.4;
        :func:`~job_service.lifecycle.end_attempt` decides).

        cancelRequested or ``CANCELLED`` → cancelled; a retryable code with retries
        left → pending (``retryCount+1``, ``availableAt = now + backoff``); otherwise
        failed. A repeat of the fail that ended this attempt answers the job as it
        stands.

        ``calls`` (the attempt's model calls) are logged in the fail's transaction;
        a repeated or refused fail logs none.

        Raises:
            AppError: INVALID_ARGUMENT (empty code, bad call, negative
                ``retryAfterSeconds``), JOB_NOT_FOUND, LOCK_NOT_HELD.
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
        report = FailReport(
            lease,
            calls,
            error_code[:64],
            (error_message or "")[:MAX_ERROR_MESSAGE],
            retry_after_seconds,
        )
        done = await self._complete(report)
        if done.error is not None:
            raise done.error
        assert done.job is not None
        if done.refused_credential is not None:
            await self.core.credentials.mark_invalid(
                done.refused_credential, "model refused the key"
            )
        return done.job

    async def _complete(self, report: Report) -> Done:
        """Run ``report`` in the next group; then what follows a committed ending."""
        done = await self.groups.submit(report)
        self.accounting.observe(done.calls)
        if done.error is not None and done.error.code == ErrorCode.LOCK_NOT_HELD:
            metrics.LEASE_LOSSES.labels(
                "result" if isinstance(report, ResultReport) else "fail"
            ).inc()
        if done.ended:
            self._attempt_ended(done)
        return done

    def _attempt_ended(self, done: Done) -> None:
        """Metrics, the long polls' wake-up and the log line of an ended attempt."""
        facts, report = done.facts, done.report
        assert facts is not None
        if done.status == PENDING:
            self.core.signal.notify()
        elif done.status in TERMINAL:
            metrics.JOBS_FINISHED.labels(facts.job_type, done.status).inc()
            if facts.started_at is not None and done.db_now is not None:
                metrics.RUN_TIME.labels(facts.job_type, done.status).observe(
                    max(0.0, (done.db_now - facts.started_at).total_seconds())
                )
        fields: dict[str, Any] = {
            "jobId": report.lease.job_id,
            "attemptNo": report.lease.attempt_no,
            "runtimeInstanceId": report.lease.instance_id,
            "status": done.status,
            "errorCode": done.ending.code if done.ending is not None else None,
        }
        if isinstance(report, FailReport) and done.job is not None:
            fields["retryCount"] = done.job.retry_count
        failed = isinstance(report, FailReport)
        log.info("attempt failed" if failed else "attempt ended", extra={"fields": fields})
