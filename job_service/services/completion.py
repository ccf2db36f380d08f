"""Completion: an attempt's result or fail (SPEC §2.3, §2.4, §2.5, §5).

A result is one transaction: one locking read answers the replay, the lease
and the run time; then the output is validated (schema, ownership: reads
only); then everything left is decided and goes in one batch (business rows,
model calls, the result row, the succeed UPDATE behind a fence, its event, and
with ``claim_next`` the next job's pick). Results that queue go together
(:meth:`Completion._submit_group`): one read, one batch, their succeeds one UPDATE per
run of like results behind one fence. An invalid output ends the attempt
as a fail would (:func:`job_service.lifecycle.end_attempt`), committed, and
only then is ``INVALID_SCHEMA`` raised to the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import LEASED, PENDING, SUCCEEDED, TERMINAL, Lease, Op, end_attempt
from job_service.maintenance import breaker
from job_service.services.accounting import Accounting
from job_service.services.claiming import (
    PLATFORM_KEY,
    Claimed,
    Claiming,
    ClaimPlan,
    check_poll_args,
)
from job_service.services.core import (
    MAX_ERROR_MESSAGE,
    Core,
    lease_refusal,
    new_id,
    observe_finished,
    observe_pickup,
    runtime_actor,
)
from job_service.services.grouping import GroupCommit
from job_service.services.inputs import ClaimNext, ModelCallInput, SubmitOutcome
from job_service.services.ports import PreparedResult
from job_service.store import statements as st
from job_service.store.batch import FenceBroken, StatementBatch, new_batch, run_one
from job_service.store.engine import DbExec
from job_service.store.records import RESULT_FACTS, JobRecord, ResultFacts, job_of
from job_service.store.tables import jobs
from job_service.store.transitions import (
    ending_values,
    events_from_rows,
    lease_params,
    transition_many_sql,
    transition_sql,
)

log = logging.getLogger("job_service.completion")

#: Most jobs one claim of a result group picks (its results share them in order).
GROUP_PICK_LIMIT = 200


def result_key(job_id: str, attempt_no: int, output_hash: str) -> str:
    """A result's idempotency key, ``jobId:attemptNo:outputHash`` (SPEC §2.5)."""
    return f"{job_id}:{attempt_no}:{output_hash}"


@dataclass(frozen=True)
class _Submission:
    """A result submission, checked, as the transaction body needs it."""

    lease: Lease
    prompt_version: str | None
    output_schema_version: str
    output: Any
    output_hash: str
    calls: Sequence[ModelCallInput]
    next_caps: list[str]
    next_n: int

    @property
    def key(self) -> str:
        return result_key(self.lease.job_id, self.lease.attempt_no, self.output_hash)


@dataclass(frozen=True)
class _Submitted:
    """What the result's transaction did: its answer, the job as read, the database's
    now at the read, and the INVALID_SCHEMA refusal to raise once committed."""

    outcome: SubmitOutcome
    facts: ResultFacts
    db_now: datetime
    invalid: AppError | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Failed:
    """What a fail's transaction did: the job after it, whether it repeated the fail that
    ended this attempt, and a user credential the model refused (to mark invalid)."""

    job: JobRecord
    repeated: bool = False
    refused_credential: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Read:
    """SubmitResult's locking read, split."""

    facts: ResultFacts
    lease_held: bool
    prior_result_id: str | None
    db_now: datetime
    breaker_peek: tuple[str | None, int | None] = field(default=(None, None))
    #: the ``claim_next`` pick's rows (locked, not yet claimed), read with the job
    picked: list[tuple[Any, ...]] = field(default_factory=list)


def key_followed(api_key_mode: str, calls: Sequence[ModelCallInput]) -> dict[str, Any]:
    """The columns a user-key job takes from its attempt's last model call that names a
    credential: that ``credential_id`` (the user's current key, which the resolve
    handed out, SPEC §9.4: the job's ``credentialId`` follows) and its
    ``model_provider`` (the key's provider: the job shows the latest attempt's).
    Nothing for a platform-key job, whose provider its lease grant chose."""
    if api_key_mode == "platform_key":
        return {}
    for call in reversed(calls):
        if call.credential_id:
            out: dict[str, Any] = {"credential_id": call.credential_id}
            if call.model_provider:
                out["model_provider"] = call.model_provider
            return out
    return {}


class Completion:
    """Ends attempts.

    Args:
        core: the shared core.
        claiming: claims the next job of a result with ``claim_next``.
        accounting: logs the attempt's model calls.
    """

    def __init__(self, core: Core, claiming: Claiming, accounting: Accounting) -> None:
        self.core = core
        self.claiming = claiming
        self.accounting = accounting
        #: results that arrive while others commit go in one transaction together
        self.groups: GroupCommit[_Submission, _Submitted] = GroupCommit(
            self._submit_group_tx,
            self._submit_tx,
            max_size=core.settings.RESULT_GROUP_MAX_SIZE,
            max_in_flight=core.settings.RESULT_GROUP_IN_FLIGHT,
            observe=_observe_group,
        )

    async def _submit_tx(self, sub: _Submission) -> _Submitted:
        """One result in its own transaction."""
        return await self.core.store.lean_tx(lambda db: self._submit(db, sub))

    async def _submit_group_tx(self, subs: list[_Submission]) -> list[_Submitted | None]:
        """Results of a group in one transaction (:meth:`_submit_group`)."""
        return await self.core.store.lean_tx(lambda db: self._submit_group(db, subs))

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
        no business rows, job → failed (cancelled when a cancel was requested),
        committed, then raised).

        ``calls`` (the attempt's model calls) are logged in the same transaction
        when the result is accepted or fails validation; a replay or a refusal
        logs none (the caller then uses RecordInvocation).

        With ``claim_next``, a result accepted now also claims, in the same
        transaction, up to ``claim_next.limit`` jobs for the caller as a claim with
        start would (no long poll). A replay or an INVALID_SCHEMA ending claims
        nothing. Sent again after a lost answer, the call replays without
        claiming; jobs the lost answer claimed go back to pending when their lease
        expires (as a lost ClaimJobs answer's do).

        Raises:
            AppError: JOB_NOT_FOUND, RESULT_ALREADY_EXISTS, LOCK_NOT_HELD, INVALID_SCHEMA;
                INVALID_ARGUMENT for a bad call or ``claim_next`` (nothing changed).
        """
        for call in calls:
            call.check()
        caps, n = _claim_next_args(claim_next)
        sub = _Submission(
            lease,
            prompt_version,
            output_schema_version,
            output,
            content_hash(output),
            calls,
            caps,
            n,
        )
        done = await self.groups.submit(sub)
        self.accounting.observe(done.calls)
        for job in done.outcome.claimed:
            observe_pickup(job)
        if done.invalid is not None or not done.outcome.replayed:
            self._attempt_ended(sub, done)
        if done.invalid is not None:
            raise AppError(done.invalid.code, done.invalid.message, done.invalid.details)
        return done.outcome

    async def _submit(self, db: DbExec, sub: _Submission) -> _Submitted:
        read = await self._read(db, sub)
        facts = read.facts
        if read.prior_result_id is not None:
            outcome = SubmitOutcome(
                facts.job_id, facts.status, read.prior_result_id, sub.output_hash, True
            )
            return _Submitted(outcome, facts, read.db_now)
        if facts.status == SUCCEEDED:
            replay = await self._replay_after_race(db, facts, sub)
            if replay is not None:
                return _Submitted(replay, facts, read.db_now)
        if not read.lease_held:
            metrics.LEASE_LOSSES.labels("result").inc()
            raise lease_refusal(sub.lease, facts.status)
        if facts.cancel_requested and not await self.core.learning.snapshot_stored(
            db, facts.snapshot_id or ""
        ):
            # Its data was deleted (SPEC §9.2): nothing to cite, nothing written.
            gone = AppError(
                ErrorCode.INVALID_JOB_STATE,
                "the job's data was deleted; it is cancelled",
                {"jobId": facts.job_id, "status": "cancelled"},
            )
            return await self._end_invalid(db, read, sub, gone, code=ErrorCode.CANCELLED)
        try:
            prepared = await self._prepare(db, facts, sub)
        except AppError as err:
            if err.code != ErrorCode.INVALID_SCHEMA:
                raise
            return await self._end_invalid(db, read, sub, err)
        return await self._accept(db, read, sub, prepared)

    async def _read(self, db: DbExec, sub: _Submission) -> _Read:
        """The locking read: the job's result facts, whether the lease is live, a prior
        result with this idempotency key, the database's now and the breaker's peek;
        with ``claim_next``, the claim's pick in the same round trip (its rows stay
        locked to this transaction; a result that is not accepted claims none)."""
        clock = self.core.clock
        batch = new_batch(db)
        read = batch.add(st.submit_read.sql(clock, {**lease_params(sub.lease), "r_key": sub.key}))
        pick = batch.add(self.claiming.pick_sql(sub.next_caps, sub.next_n)) if sub.next_n else None
        out = await batch.run()
        rows = out[read].rows
        if not rows:
            raise lease_refusal(sub.lease, None)
        row = rows[0]
        facts = ResultFacts(*row[: len(RESULT_FACTS)])
        lease_held, prior, db_now, state, failures = row[len(RESULT_FACTS) :]
        picked = out[pick].rows if pick is not None else []
        return _Read(facts, bool(lease_held), prior, db_now, (state, failures), picked)

    async def _replay_after_race(
        self, db: DbExec, facts: ResultFacts, sub: _Submission
    ) -> SubmitOutcome | None:
        """A job that already succeeded: a replay of its result, or a conflict.

        A racing identical submit won: the locking read waited for its commit and
        then saw the job succeeded, but on MySQL/MariaDB the prior-result subquery
        read the snapshot taken before that wait (READ COMMITTED: one read view
        per statement). This newer statement sees the winner's row: still a
        replay (SPEC §2.5). The same output from another attempt is not "another
        result": the lease check answers it (SPEC §2.5 order).

        Raises:
            AppError: RESULT_ALREADY_EXISTS (another output succeeded).
        """
        stored = (
            await run_one(db, st.results_of_job.sql(self.core.clock, {"r_job_id": facts.job_id}))
        ).rows
        for result_id, idempotency_key, _ in stored:
            if idempotency_key == sub.key:
                return SubmitOutcome(facts.job_id, facts.status, result_id, sub.output_hash, True)
        if sub.output_hash not in {r[2] for r in stored}:
            raise AppError(
                ErrorCode.RESULT_ALREADY_EXISTS,
                "the job already has a different result",
                {"jobId": facts.job_id},
            )
        return None

    async def _prepare(self, db: DbExec, facts: ResultFacts, sub: _Submission) -> PreparedResult:
        """Validate the output (schema, ownership; reads only) and build its writes.

        Raises:
            AppError: INVALID_SCHEMA; INVALID_SNAPSHOT.
        """
        if not isinstance(sub.output, dict):
            raise AppError(ErrorCode.INVALID_SCHEMA, "output must be a JSON object", None)
        return await self.core.learning.prepare_result(
            db,
            job_id=facts.job_id,
            user_id=facts.user_id,
            job_type=facts.job_type,
            snapshot_id=facts.snapshot_id or "",
            output_schema_version=sub.output_schema_version,
            output=sub.output,
        )

    async def _end_invalid(
        self,
        db: DbExec,
        read: _Read,
        sub: _Submission,
        err: AppError,
        *,
        code: str = ErrorCode.INVALID_SCHEMA,
    ) -> _Submitted:
        """An invalid output ends the attempt as a fail with ``code`` would (SPEC §2.3:
        failed, or cancelled when a cancel was requested); its calls are logged, ``err``
        is raised once committed. ``code`` ``CANCELLED``: a cancel-requested job whose
        data was deleted (SPEC §9.2), ended cancelled."""
        clock, facts, lease = self.core.clock, read.facts, sub.lease
        ending = end_attempt(
            cancel_requested=bool(facts.cancel_requested),
            retry_count=0,  # INVALID_SCHEMA / CANCELLED are final: the counters do not matter
            max_retry_count=0,
            code=code,
            retry_after=None,
            policy=self.core.retry_policy,
        )
        values = {
            **ending_values(clock, ending, (err.message or "invalid output")[:MAX_ERROR_MESSAGE]),
            "prompt_version": sub.prompt_version,
            "output_schema_version": sub.output_schema_version,
            **key_followed(facts.api_key_mode, sub.calls),
        }
        end = transition_sql(
            clock,
            ending.ending.op(),
            job_id=facts.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            from_state=facts.status,
            error_code=code,
            values=values,
        )
        if end is None:
            raise lease_refusal(lease, facts.status)
        batch = new_batch(db)
        end.queue_fenced(batch, "end")
        calls = self.accounting.queue_calls(batch, facts, lease.attempt_no, sub.calls)
        try:
            await batch.run()
        except FenceBroken:
            raise lease_refusal(lease, facts.status) from None
        if facts.api_key_mode == "platform_key":
            # Neutral for the breaker, but it frees a half-open probe slot.
            await breaker.record_ending(
                db,
                clock,
                self.core.settings,
                code,
                provider=facts.model_provider,
            )
        outcome = SubmitOutcome(facts.job_id, ending.ending.to_state, "", sub.output_hash, False)
        return _Submitted(outcome, facts, read.db_now, invalid=err, calls=calls)

    async def _accept(
        self, db: DbExec, read: _Read, sub: _Submission, prepared: PreparedResult
    ) -> _Submitted:
        """Everything left is decided: one batch, the COMMIT included, with the claim of
        the rows the read picked (``claim_next``). The fence stops it before the
        event, the claim and the COMMIT if the lease lapsed since the read; run
        again after a lost connection, the transaction replays by the idempotency
        key (and claims nothing)."""
        clock, facts, lease = self.core.clock, read.facts, sub.lease
        if facts.api_key_mode == "platform_key":
            await breaker.record_ending(
                db, clock, self.core.settings, None, read.breaker_peek, facts.model_provider
            )
        plan = await self.claiming.plan_claim(db, lease.instance_id, read.picked, start=True)
        batch = new_batch(db)
        result_id, calls = self._queue_accept(batch, facts, sub, prepared)
        queued = self.claiming.queue_claim(batch, plan) if plan is not None else None
        batch.commit()
        try:
            out = await batch.run()
        except FenceBroken:
            raise lease_refusal(lease, facts.status) from None
        claimed = self.claiming.claimed_from(out, queued) if queued is not None else Claimed()
        outcome = SubmitOutcome(
            facts.job_id,
            SUCCEEDED,
            result_id,
            sub.output_hash,
            False,
            claimed.jobs,
            claimed.snapshots,
        )
        return _Submitted(outcome, facts, read.db_now, calls=calls)

    def _queue_accept(
        self,
        batch: StatementBatch,
        facts: ResultFacts,
        sub: _Submission,
        prepared: PreparedResult,
    ) -> tuple[str, list[dict[str, Any]]]:
        """Queue an accepted result's writes on ``batch``: its rows
        (:meth:`_queue_rows`), then the succeed UPDATE behind its fence with its event.

        Returns:
            ``(resultId, the logged calls)``.

        Raises:
            AppError: LOCK_NOT_HELD (the job's state has no succeed transition).
        """
        lease = sub.lease
        succeed = transition_sql(
            self.core.clock,
            Op.SUCCEED,
            job_id=facts.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            from_state=facts.status,
            values=self._succeed_values(facts, sub),
        )
        if succeed is None:
            raise lease_refusal(lease, facts.status)
        done = self._queue_rows(batch, facts, sub, prepared)
        succeed.queue_fenced(batch, "succeed")
        return done

    def _succeed_values(self, facts: ResultFacts, sub: _Submission) -> dict[str, Any]:
        """The columns a result's succeed sets: the lease cleared, ``finishedAt`` now,
        the versions it was made with, no error; a user-key job's credential and
        provider as its calls followed them (:func:`key_followed`)."""
        return {
            "lock_until": None,
            "finished_at": self.core.clock.now(),
            "prompt_version": sub.prompt_version,
            "output_schema_version": sub.output_schema_version,
            "error_code": None,
            "error_message": None,
            **key_followed(facts.api_key_mode, sub.calls),
        }

    def _queue_rows(
        self,
        batch: StatementBatch,
        facts: ResultFacts,
        sub: _Submission,
        prepared: PreparedResult,
        *,
        spend: bool = True,
    ) -> tuple[str, list[dict[str, Any]]]:
        """Queue an accepted result's rows on ``batch``: its business rows, model calls
        (with their platform spend unless ``spend`` is False: a group queues its
        results' spend at once, :meth:`Accounting.queue_spend`) and result row. Each
        INSERT merges with a group's others (:meth:`StatementBatch.add`): no row count
        of theirs is read, and the plan's outcome counts the rows themselves.

        Returns:
            ``(resultId, the logged calls)``.
        """
        clock, lease = self.core.clock, sub.lease
        result_id = new_id()
        for statement in prepared.statements(clock):
            batch.add(statement, merge=True)
        calls = self.accounting.queue_calls(batch, facts, lease.attempt_no, sub.calls, spend=spend)
        batch.add(st.insert_result.sql(clock, _result_row(result_id, sub)), merge=True)
        return result_id, calls

    def _queue_succeeds(
        self, batch: StatementBatch, accepted: Sequence[tuple[ResultFacts, _Submission]]
    ) -> None:
        """Queue a group's succeeds: one UPDATE per run of results that set the same
        values from the same state under leases of one holder and attempt (most of a
        group is one run), behind a fence expecting every job of the run, then the
        run's events in one INSERT … SELECT. Each job's event is the one
        :meth:`_queue_accept` would append (its ``at`` the row's ``updatedAt``).

        A job whose lease lapsed since the group's locking read fails its run's fence
        (:class:`FenceBroken`): the group rolls back and each result runs alone.
        """
        clock = self.core.clock
        runs: dict[tuple[Any, ...], tuple[dict[str, Any], list[str]]] = {}
        for facts, sub in accepted:
            values = self._succeed_values(facts, sub)
            key = (
                sub.lease.instance_id,
                sub.lease.attempt_no,
                facts.status,
                sub.prompt_version,
                sub.output_schema_version,
                tuple(sorted(key_followed(facts.api_key_mode, sub.calls).items())),
            )
            runs.setdefault(key, (values, []))[1].append(facts.job_id)
        for (instance_id, attempt_no, status, *_), (values, ids) in runs.items():
            batch.add(
                transition_many_sql(
                    clock,
                    Op.SUCCEED,
                    job_ids=ids,
                    values=values,
                    holder=instance_id,
                    attempt_no=attempt_no,
                    from_state=status,
                )
            )
            batch.fence("succeed", rows=len(ids))
            batch.add(
                events_from_rows(
                    clock,
                    from_status=status,
                    to_status=SUCCEEDED,
                    at="updated_at",
                    params={
                        "ids": ids,
                        "instance_id": instance_id,
                        "e_actor": runtime_actor(instance_id),
                    },
                    provider=False,
                )
            )

    async def _submit_group(self, db: DbExec, subs: list[_Submission]) -> list[_Submitted | None]:
        """Several results in one transaction: the plain ones (lease held, no prior result,
        no cancel requested, a valid output, no breaker change) are accepted as
        :meth:`_accept` would, in one locking read (with the claims' picks, one per
        caller and capabilities) and one batch (with those claims and the COMMIT);
        every other result is left (``None``) to its own transaction, which answers
        it as alone (replay, refusal, INVALID_SCHEMA ending). A fence that breaks
        raises :class:`FenceBroken`: the group is rolled back and each result then
        runs alone.
        """
        clock = self.core.clock
        answers: list[_Submitted | None] = [None] * len(subs)
        first: dict[str, int] = {}
        wanting: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, sub in enumerate(subs):
            first.setdefault(sub.lease.job_id, i)
            if sub.next_n:
                wanting.setdefault((sub.lease.instance_id, tuple(sub.next_caps)), []).append(i)
        batch = new_batch(db)
        read = batch.add(st.submit_read_many.sql(clock, {"ids": list(first)}))
        keyed = batch.add(st.results_by_keys.sql(clock, {"keys": [sub.key for sub in subs]}))
        # every pick runs before any lock and skips no row of its own transaction, so
        # picks of overlapping capabilities see the same first rows: each reads as far
        # as the whole group asks, and the rows are shared out below without repeats
        reach = _wanted(subs, [i for idx in wanting.values() for i in idx])
        picks = {key: batch.add(self.claiming.pick_sql(list(key[1]), reach)) for key in wanting}
        got = await batch.run()
        rows = {str(row[0]): row for row in got[read].rows}
        prior = {str(row[1]) for row in got[keyed].rows}
        ready: list[tuple[int, ResultFacts, datetime, PreparedResult]] = []
        for i, sub in enumerate(subs):
            row = rows.get(sub.lease.job_id)
            if row is None or first[sub.lease.job_id] != i or sub.key in prior:
                continue
            facts, db_now, plain = _group_row(row, sub.lease)
            if not plain:
                continue
            try:
                prepared = await self._prepare(db, facts, sub)
            except AppError as err:
                if err.code != ErrorCode.INVALID_SCHEMA:
                    raise
                continue  # ended alone, as an invalid output is
            ready.append((i, facts, db_now, prepared))
        if not ready:
            return answers
        accepted_ids = {i for i, *_ in ready}
        plans: list[tuple[ClaimPlan, list[int]]] = []
        taken: set[str] = set()  # rows an earlier claim of this group already has
        for key, idx in wanting.items():
            idx = [i for i in idx if i in accepted_ids]
            if not idx:
                continue
            fresh = [r for r in got[picks[key]].rows if str(r[0]) not in taken]
            fresh = fresh[: _wanted(subs, idx)]
            taken.update(str(r[0]) for r in fresh)
            plan = await self.claiming.plan_claim(db, key[0], fresh, start=True)
            if plan is not None:
                plans.append((plan, idx))
        batch = new_batch(db)
        accepted = {
            i: self._queue_rows(batch, facts, subs[i], p, spend=False) for i, facts, _, p in ready
        }
        self._queue_succeeds(batch, [(facts, subs[i]) for i, facts, _, _ in ready])
        queued = [(self.claiming.queue_claim(batch, plan), idx) for plan, idx in plans]
        # the group's spend in one upsert, last: its row lock is held the shortest
        self.accounting.queue_spend(batch, [row for _, rows in accepted.values() for row in rows])
        batch.commit()  # run again, this transaction replays: no claim
        out = await batch.run()
        shares: dict[int, Claimed] = {}
        for claim, idx in queued:
            claimed = self.claiming.claimed_from(out, claim)
            shares.update(_share(claimed, [(i, subs[i].next_n) for i in idx]))
        for i, facts, db_now, _ in ready:
            result_id, calls = accepted[i]
            share = shares.get(i, Claimed())
            outcome = SubmitOutcome(
                facts.job_id,
                SUCCEEDED,
                result_id,
                subs[i].output_hash,
                False,
                share.jobs,
                share.snapshots,
            )
            answers[i] = _Submitted(outcome, facts, db_now, calls=calls)
        return answers

    def _attempt_ended(self, sub: _Submission, done: _Submitted) -> None:
        """Metrics and the log line of an attempt a result ended (not of a replay)."""
        status = done.outcome.status
        facts = done.facts
        metrics.JOBS_FINISHED.labels(facts.job_type, status).inc()
        if facts.started_at is not None:
            metrics.RUN_TIME.labels(facts.job_type, status).observe(
                max(0.0, (done.db_now - facts.started_at).total_seconds())
            )
        log.info(
            "attempt ended",
            extra={
                "fields": {
                    "jobId": sub.lease.job_id,
                    "attemptNo": sub.lease.attempt_no,
                    "runtimeInstanceId": sub.lease.instance_id,
                    "status": status,
                    "errorCode": done.invalid.code if done.invalid else None,
                }
            },
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
        """End an attempt with a failure (SPEC §2.3, §2.4; :func:`end_attempt` decides).

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
        code = error_code[:64]
        message = (error_message or "")[:MAX_ERROR_MESSAGE]
        done = await self.core.store.lean_tx(
            lambda db: self._fail(db, lease, code, message, retry_after_seconds, calls)
        )
        job = done.job
        self.accounting.observe(done.calls)
        if done.repeated:
            return job
        if done.refused_credential is not None:
            await self.core.credentials.mark_invalid(
                done.refused_credential, "model refused the key"
            )
        if job.status == PENDING:
            self.core.signal.notify()
        elif job.status in TERMINAL:
            observe_finished(job)
        log.info(
            "attempt failed",
            extra={
                "fields": {
                    "jobId": job.job_id,
                    "attemptNo": lease.attempt_no,
                    "runtimeInstanceId": lease.instance_id,
                    "errorCode": code,
                    "status": job.status,
                    "retryCount": job.retry_count,
                }
            },
        )
        return job

    async def _fail(
        self,
        db: DbExec,
        lease: Lease,
        code: str,
        message: str,
        retry_after: float | None,
        calls: Sequence[ModelCallInput],
    ) -> _Failed:
        clock = self.core.clock
        rows = (await run_one(db, st.get_leased_for_update.sql(clock, lease_params(lease)))).rows
        if not rows:
            job = await self.core.get_job(db, lease.job_id)
            if job is not None and await self._attempt_ended_by(db, lease, code):
                return _Failed(job, repeated=True)
            metrics.LEASE_LOSSES.labels("fail").inc()
            raise lease_refusal(lease, None if job is None else job.status)
        job = job_of(rows[0])
        followed = key_followed(job.api_key_mode, calls)
        ending = end_attempt(
            cancel_requested=bool(job.cancel_requested),
            retry_count=job.retry_count,
            max_retry_count=job.max_retry_count,
            code=code,
            retry_after=retry_after,
            policy=self.core.retry_policy,
        )
        end = transition_sql(
            clock,
            ending.ending.op(),
            job_id=job.job_id,
            actor=runtime_actor(lease.instance_id),
            lease=lease,
            from_state=job.status,
            error_code=code,
            values={**ending_values(clock, ending, message), **followed},
            where=jobs.c.retry_count == job.retry_count,
        )
        if end is None:
            raise lease_refusal(lease, job.status)
        batch = new_batch(db)
        end.queue_fenced(batch, "end")
        logged = self.accounting.queue_calls(batch, job, lease.attempt_no, calls)
        read = batch.add(st.get_job.sql(clock, {"g_job_id": job.job_id}, False))
        try:
            out = await batch.run()
        except FenceBroken:
            raise lease_refusal(lease, job.status) from None
        refused = None
        if job.api_key_mode == "platform_key":
            await breaker.record_ending(
                db, clock, self.core.settings, code, provider=job.model_provider
            )
        elif code == ErrorCode.INVALID_CREDENTIAL:
            refused = followed.get("credential_id") or job.credential_id
        return _Failed(job_of(out[read].rows[0]), refused_credential=refused, calls=logged)

    async def _attempt_ended_by(self, db: DbExec, lease: Lease, code: str) -> bool:
        """Whether the lease's holder ended its attempt with ``code`` (its event row): a
        fail repeating it answers 200 even after the job moved on (SPEC §2.3)."""
        params = {
            "e_job_id": lease.job_id,
            "e_attempt": lease.attempt_no,
            "e_actor": runtime_actor(lease.instance_id)[:160],
            "e_code": code,
        }
        return bool((await run_one(db, st.attempt_ended_by.sql(self.core.clock, params))).rows)


def _claim_next_args(claim_next: ClaimNext | None) -> tuple[list[str], int]:
    """The capabilities and count of a result's ``claim_next`` (``([], 0)`` without one).

    Raises:
        AppError: INVALID_ARGUMENT (a limit < 1; capabilities as ClaimJobs checks them).
    """
    if claim_next is None:
        return [], 0
    if claim_next.limit < 1:  # slots to fill: no "0 = the default" here
        raise AppError(
            ErrorCode.INVALID_ARGUMENT, "claimNext.limit must be ≥ 1", {"field": "claimNext.limit"}
        )
    n = check_poll_args(claim_next.capabilities, claim_next.limit, 0)
    return sorted(set(claim_next.capabilities)), n


def _group_row(row: Sequence[Any], lease: Lease) -> tuple[ResultFacts, datetime, bool]:
    """A :data:`statements.submit_read_many` row: the job's facts, the database's now,
    and whether the result is plain (see :meth:`Completion._submit_group`). The lease
    check is :func:`~job_service.store.transitions.lease_guard_bound`'s, on the row."""
    n = len(RESULT_FACTS)
    facts = ResultFacts(*row[:n])
    locked_by, attempt_no, live, db_now, state, failures = row[n:]
    plain = (
        facts.status in LEASED
        and locked_by == lease.instance_id
        and attempt_no == lease.attempt_no
        and bool(live)
        and not facts.cancel_requested
        # a platform-key success that changes its breaker goes alone (record_ending)
        and (facts.api_key_mode != PLATFORM_KEY or (state == "closed" and failures == 0))
    )
    return facts, db_now, plain


def _observe_group(size: int, alone: int) -> None:
    metrics.RESULT_GROUP_SIZE.observe(size)
    metrics.RESULT_GROUP_ALONE.inc(alone)


def _wanted(subs: Sequence[_Submission], idx: Sequence[int]) -> int:
    """How many jobs one claim of a group picks: what its results asked for, at most
    :data:`GROUP_PICK_LIMIT`."""
    return min(GROUP_PICK_LIMIT, sum(subs[i].next_n for i in idx))


def _share(claimed: Claimed, wants: Sequence[tuple[int, int]]) -> dict[int, Claimed]:
    """A group's claim shared among its results in order, each up to what it asked."""
    shares: dict[int, Claimed] = {}
    at = 0
    for i, n in wants:
        jobs_i = claimed.jobs[at : at + n]
        at += n
        snaps = {
            j.job_id: claimed.snapshots[j.job_id] for j in jobs_i if j.job_id in claimed.snapshots
        }
        shares[i] = Claimed(jobs_i, snaps)
    return shares


def _result_row(result_id: str, sub: _Submission) -> dict[str, Any]:
    """The ``ai_results`` row of an accepted result."""
    return {
        "result_id": result_id,
        "idempotency_key": sub.key,
        "job_id": sub.lease.job_id,
        "attempt_no": sub.lease.attempt_no,
        "output_hash": sub.output_hash,
        "prompt_version": sub.prompt_version,
        "output_schema_version": sub.output_schema_version,
        "output": sub.output,
    }
