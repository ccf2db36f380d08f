"""The completer: ends the attempts of a set of reports in one transaction (reference §2.3–§2.5).

A report is an attempt's result (SubmitResult) or its fail (FailJob). A set of
1..N reports, at most one per job, goes through one body:

1. **read** — one round trip: the jobs, locked, each with its lease verdict from
   the database (:func:`~job_service.store.endings.ending_read`), and the results
   they already have;
   When some of the jobs are a batch's children, their parents are locked next,
   in job id order (:mod:`job_service.services.parents`, reference §10.3);
2. **judge** — per report, in the order of reference §2.5: an exact replay, a
   conflicting result, a lease not held (a fail may be a repeat of the one that
   ended this attempt), data deleted under a cancel request (reference §9.2) or a
   batch cancelled (reference §10.3), an output that fails validation, or the
   report is taken: a result succeeds, a fail ends the attempt as
   :func:`~job_service.lifecycle.end_attempt` decides;
3. **write** — one batch with the COMMIT: business rows, model calls, result rows
   (merged INSERTs), one UPDATE per transition under each job's own fencing token,
   each behind a fence expecting all of its jobs, the event rows, the day's
   platform spend, each platform-key attempt's provider grant settled with the
   tokens it used and a 429's pause of its provider or user key (reference §10.2),
   the parents' counts and states (one UPDATE and event each), and
   the rows of ended fails read back; a job an erasure kept until its attempt ended
   (its user erased, reference §9.2) then goes with its events.

Every outcome is per report: a refusal, a replay or an invalid output answers
that report only. A fence that breaks (a lease that lapsed between the read and
the UPDATE) raises :class:`~job_service.store.batch.FenceBroken`; nothing was
written, and the caller runs the set again, which then refuses that lease.
Run again after a lost connection, the set converges: accepted results replay
by their idempotency key, ended fails answer as repeats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import (
    CANCELLED,
    SUCCEEDED,
    TERMINAL,
    AttemptEnding,
    Lease,
    Op,
    end_attempt,
)
from job_service.maintenance import breaker
from job_service.maintenance.limits import pause_seconds
from job_service.services import parents
from job_service.services.accounting import Accounting, spend_row
from job_service.services.claim_round import ClaimAsk, Claimed, ClaimRound
from job_service.services.core import Core, lease_refusal, new_id, runtime_actor
from job_service.services.granting import Granting
from job_service.services.inputs import ModelCallInput
from job_service.services.ports import PreparedResult
from job_service.store import endings as sql
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import Outcome, new_batch, run_one
from job_service.store.cache import Sql
from job_service.store.engine import DbExec
from job_service.store.records import ENDING_FACTS, EndingFacts, JobRecord, job_of
from job_service.store.transitions import ending_values

#: The key mode whose attempts feed the platform breakers (reference §6).
PLATFORM_KEY = "platform_key"


def _taken(done: Done) -> bool:
    """Whether ``done`` is a result this transaction accepted (it may claim)."""
    return (
        done.ended
        and isinstance(done.report, ResultReport)
        and done.error is None
        and done.status == SUCCEEDED
    )


def result_key(job_id: str, attempt_no: int, output_hash: str) -> str:
    """A result's idempotency key, ``jobId:attemptNo:outputHash`` (reference §2.5)."""
    return f"{job_id}:{attempt_no}:{output_hash}"


@dataclass(frozen=True)
class ResultReport:
    """An attempt's output, checked for shape (SubmitResult).

    Attributes:
        lease: the reporting holder's fencing token.
        calls: the attempt's model calls, logged when the result ends the attempt.
        output_hash: sha256 hex of the output's canonical JSON (reference §2.5).
        claim: the next jobs the reporting instance asks for, for the slot the result
            frees: claimed in the same transaction when the result is taken.
    """

    lease: Lease
    calls: Sequence[ModelCallInput]
    prompt_version: str | None
    output_schema_version: str
    output: Any
    output_hash: str
    claim: ClaimAsk | None = None

    @property
    def key(self) -> str:
        """The result's idempotency key."""
        return result_key(self.lease.job_id, self.lease.attempt_no, self.output_hash)


@dataclass(frozen=True)
class FailReport:
    """An attempt's failure (FailJob): its code (at most 64 characters), message and
    the provider's ``Retry-After`` in seconds, if any."""

    lease: Lease
    calls: Sequence[ModelCallInput]
    code: str
    message: str
    retry_after: float | None


Report = ResultReport | FailReport


@dataclass
class Done:
    """What the completer did with one report.

    Attributes:
        facts: the job as the read found it (None: no such job).
        db_now: the database's time at the read.
        status: the job's status after the transaction.
        ended: this report ended the attempt (not a replay, a repeat or a refusal).
        error: raised to the caller once committed (a refusal; INVALID_SCHEMA or
            INVALID_JOB_STATE after the ending it caused).
        result_id: an accepted or replayed result's id.
        replayed: an exact replay of an accepted result.
        job: a fail report's job as it stands after the transaction.
        calls: the invocation log rows written for the report.
        refused_credential: a user credential the model refused (to mark invalid).
    """

    report: Report
    facts: EndingFacts | None = None
    db_now: datetime | None = None
    status: str = ""
    ended: bool = False
    error: AppError | None = None
    result_id: str = ""
    replayed: bool = False
    job: JobRecord | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    refused_credential: str | None = None
    #: how the attempt ends when it does not succeed; its UPDATE's columns
    ending: AttemptEnding | None = None
    prepared: PreparedResult | None = None
    #: the breaker of the job's provider as the read saw it: (state, failures)
    peek: tuple[str | None, int | None] = (None, None)
    #: a batch's child: its parent's state as locked by this transaction
    parent_status: str | None = None
    #: the jobs a taken result's ``claim`` was given (claimed with start)
    claimed: Claimed | None = None


@dataclass(frozen=True)
class _Read:
    """The locking read: each job's facts and the read's columns after them, by job id,
    the results the jobs have: ``(jobId, resultId, idempotencyKey, outputHash)``, and
    the parents of the children among them, locked (reference §10.3)."""

    rows: dict[str, tuple[Any, ...]]
    stored: list[tuple[Any, ...]]
    parents: dict[str, parents.ParentRow] = field(default_factory=dict)
    #: the read's outcomes (a claim's pick rode in its round trip)
    out: Sequence[Outcome] = ()


class Completer:
    """The one body that ends attempts (module doc).

    Args:
        core: the shared core.
        accounting: logs the attempts' model calls.
        granting: the lease grants of the claims results ask for.
    """

    def __init__(self, core: Core, accounting: Accounting, granting: Granting) -> None:
        self.core = core
        self.accounting = accounting
        self.granting = granting

    async def complete(self, db: DbExec, reports: Sequence[Report]) -> list[Done]:
        """End the attempts of ``reports`` (distinct jobs) in the caller's transaction.

        Returns:
            One :class:`Done` per report, in order.

        Raises:
            FenceBroken: a lease lapsed between the read and the UPDATE; nothing was
                written and the caller runs the set again.
            sqlalchemy.exc.DBAPIError: a database error (the whole set).
        """
        asking = [
            i for i, r in enumerate(reports) if isinstance(r, ResultReport) and r.claim is not None
        ]
        claim = None
        if asking:
            asks = [r.claim for r in (reports[i] for i in asking) if isinstance(r, ResultReport)]
            claim = ClaimRound(self.core, self.granting, [a for a in asks if a], start=True)
        read = await self._read(db, reports, claim)
        done = [self._judge(report, read) for report in reports]
        for d in done:
            if d.error is not None and isinstance(d.report, FailReport) and d.facts is not None:
                await self._repeat_of_ending(db, d)
        for d in done:
            if d.ended and isinstance(d.report, ResultReport):
                await self._validate(db, d)
        await self._feed_breakers(db, done)
        if claim is not None:
            # only a result taken now claims: a replay, a refusal or an invalid output none
            serve = [k for k, i in enumerate(asking) if _taken(done[i])]
            freed = Counter(
                d.facts.model_provider
                for d in done
                if d.ended and d.facts is not None and d.facts.api_key_mode == PLATFORM_KEY
            )
            if serve and await claim.grant(db, read.out, serve, freed):
                await claim.hold_parents(db)
        out = await self._write(db, done, read.parents, claim)
        if claim is not None:
            for i, claimed in zip(asking, claim.claimed(out), strict=True):
                done[i].claimed = claimed
            claim.observe()
        return done

    async def _read(self, db: DbExec, reports: Sequence[Report], claim: ClaimRound | None) -> _Read:
        holders = [
            sql.Holder(r.lease.job_id, r.lease.instance_id, r.lease.attempt_no) for r in reports
        ]
        rows_sql, stored_sql = sql.ending_read(self.core.clock, holders)
        batch = new_batch(db)
        rows_at = batch.add(rows_sql)
        stored_at = batch.add(stored_sql)
        if claim is not None:
            claim.queue_pick(batch)
        out = await batch.run()
        rows = {str(row[0]): row for row in out[rows_at].rows}
        at = ENDING_FACTS.index("parent_job_id")
        held = await parents.lock(self.core.clock, db, {str(r[at]) for r in rows.values() if r[at]})
        return _Read(rows, out[stored_at].rows, held, out)

    def _judge(self, report: Report, read: _Read) -> Done:
        """One report's verdict from the read (reference §2.5 order for a result)."""
        lease = report.lease
        row = read.rows.get(lease.job_id)
        if row is None:
            return Done(report, error=lease_refusal(lease, None))
        n = len(ENDING_FACTS)
        facts = EndingFacts(*row[:n])
        lease_held, db_now, state, failures = row[n : n + 4]
        done = Done(report, facts, db_now, status=facts.status, peek=(state, failures))
        if facts.parent_job_id is not None and facts.parent_job_id in read.parents:
            done.parent_status = read.parents[facts.parent_job_id].status
        if isinstance(report, ResultReport):
            stored = [s for s in read.stored if s[0] == lease.job_id]
            for _, result_id, key, _ in stored:
                if key == report.key:
                    done.result_id, done.replayed = str(result_id), True
                    return done
            if facts.status == SUCCEEDED and report.output_hash not in {s[3] for s in stored}:
                done.error = AppError(
                    ErrorCode.RESULT_ALREADY_EXISTS,
                    "the job already has a different result",
                    {"jobId": lease.job_id},
                )
                return done
        if not lease_held:
            done.error = lease_refusal(lease, facts.status)
            return done
        done.ended = True
        if isinstance(report, FailReport):
            self._end(done, report.code, report.retry_after)
            if report.code == ErrorCode.INVALID_CREDENTIAL and facts.api_key_mode != PLATFORM_KEY:
                followed = key_followed(facts.api_key_mode, report.calls)
                done.refused_credential = followed.get("credential_id") or facts.credential_id
        return done

    def _end(self, done: Done, code: str, retry_after: float | None) -> None:
        """Decide how ``done``'s attempt ends without success (:func:`end_attempt`)."""
        facts = done.facts
        assert facts is not None
        done.ending = end_attempt(
            cancel_requested=bool(facts.cancel_requested),
            retry_count=facts.retry_count,
            max_retry_count=facts.max_retry_count,
            code=code,
            retry_after=retry_after,
            policy=self.core.retry_policy,
        )
        done.status = done.ending.ending.to_state

    async def _repeat_of_ending(self, db: DbExec, done: Done) -> None:
        """A fail whose lease is gone may repeat the fail that ended this attempt: then it
        answers 200 with the job as it stands (reference §2.3)."""
        report = done.report
        assert isinstance(report, FailReport)
        lease = report.lease
        params = {
            "e_job_id": lease.job_id,
            "e_attempt": lease.attempt_no,
            "e_actor": runtime_actor(lease.instance_id)[:160],
            "e_code": report.code,
        }
        clock = self.core.clock
        if (await run_one(db, st.attempt_ended_by.sql(clock, params))).rows:
            done.error = None
            done.job = await self.core.get_job(db, lease.job_id)

    async def _validate(self, db: DbExec, done: Done) -> None:
        """Validate a result's output (schema, ownership; reads only, reference §5); an
        invalid one ends the attempt as a fail with ``INVALID_SCHEMA`` would, and its
        refusal is raised once that ending has committed. A job whose cancel was
        requested and whose data was deleted meanwhile ends cancelled instead
        (reference §9.2)."""
        report, facts = done.report, done.facts
        assert isinstance(report, ResultReport) and facts is not None
        learning = self.core.learning
        gone = None
        if done.parent_status == CANCELLED:
            gone = "the job's batch was cancelled; it is cancelled"  # reference §10.3
        elif facts.cancel_requested and not await learning.snapshot_stored(
            db, facts.snapshot_id or ""
        ):
            gone = "the job's data was deleted; it is cancelled"  # reference §9.2
        if gone is not None:
            # nothing to cite, or no one to cite it for: nothing written
            self._end(done, ErrorCode.CANCELLED, None)
            done.error = AppError(
                ErrorCode.INVALID_JOB_STATE, gone, {"jobId": facts.job_id, "status": "cancelled"}
            )
            return
        try:
            if not isinstance(report.output, dict):
                raise AppError(ErrorCode.INVALID_SCHEMA, "output must be a JSON object", None)
            done.prepared = await learning.prepare_result(
                db,
                job_id=facts.job_id,
                user_id=facts.user_id,
                job_type=facts.job_type,
                snapshot_id=facts.snapshot_id or "",
                output_schema_version=report.output_schema_version,
                output=report.output,
            )
            done.status = SUCCEEDED
        except AppError as err:
            if err.code != ErrorCode.INVALID_SCHEMA:
                raise
            self._end(done, ErrorCode.INVALID_SCHEMA, None)
            done.error = err

    async def _feed_breakers(self, db: DbExec, done: Sequence[Done]) -> None:
        """Feed each ended platform-key attempt to its provider's breaker, in order
        (reference §6, §9.4): a success, or the ending's code. The read's peek spares
        a success on a closed breaker its row lock; once a provider's row may have
        changed in this set, it is read again."""
        changed: set[str] = set()
        settings, clock = self.core.settings, self.core.clock
        for d in done:
            facts = d.facts
            if not d.ended or facts is None or facts.api_key_mode != PLATFORM_KEY:
                continue
            provider = facts.model_provider
            code = None if d.ending is None else d.ending.code
            peek = None if provider in changed else d.peek
            await breaker.record_ending(db, clock, settings, code, peek, provider)
            if code is not None or peek != ("closed", 0):
                changed.add(provider)

    async def _write(
        self,
        db: DbExec,
        done: Sequence[Done],
        held: dict[str, parents.ParentRow],
        claim: ClaimRound | None,
    ) -> Sequence[Outcome]:
        """Queue every write of the set on one batch, with the claim's moves and the
        COMMIT, and run it (``held``: the parents the read locked); its outcomes."""
        clock = self.core.clock
        batch = new_batch(db)
        ended = [d for d in done if d.ended]
        for d in ended:
            self._queue_rows(batch, d)
        by_op: dict[Op, list[sql.JobEnd]] = {}
        for d in ended:
            op, values = self._transition(d)
            by_op.setdefault(op, []).append(sql.JobEnd(_holder(d.report.lease), values))
        for op, ends in by_op.items():
            batch.add(sql.end_jobs(clock, op, ends))
            batch.fence(op, rows=len(ends))
        if ended:
            batch.add(sql.ending_events(clock, [self._event(d) for d in ended]))
        self.accounting.queue_spend(batch, [row for d in ended for row in d.calls])
        for statement in self._provider_state(ended):
            batch.add(statement)
        fails = [d for d in ended if isinstance(d.report, FailReport)]
        reads = [
            batch.add(st.get_job.sql(clock, {"g_job_id": d.report.lease.job_id}, False))
            for d in fails
        ]
        erased = [
            (d.facts.job_id, d.facts.user_id)
            for d in ended
            if d.facts is not None
            and d.facts.user_id.startswith(st.PSEUDONYM_PREFIX)
            and d.status in TERMINAL
        ]
        for statement in st.forget_erased_jobs(erased) if erased else ():
            batch.add(statement)
        changes = self._queue_parents(batch, ended, held)
        if claim is not None:
            claim.queue_moves(batch)
        batch.commit()  # run again, a taken result replays and claims nothing
        out = await batch.run()
        parents.observe(changes)
        for d, at in zip(fails, reads, strict=True):
            d.job = job_of(out[at].rows[0])
        return out

    def _provider_state(self, ended: Sequence[Done]) -> list[Sql]:
        """What the ended attempts change of the providers' state (reference §10.2): each
        platform-key attempt's grant settled with the tokens its calls used, and a 429 (``MODEL_RATE_LIMIT``) pausing its provider (platform key)
        or its user key for every worker, from now for its ``Retry-After``."""
        clock = self.core.clock
        out: list[Sql] = []
        settled = [
            (d.report.lease.job_id, d.report.lease.attempt_no, _tokens(d.report.calls))
            for d in ended
            if d.facts is not None and d.facts.api_key_mode == PLATFORM_KEY
        ]
        out += sched.settle_grants(clock, settled)
        for d in ended:
            facts, ending, report = d.facts, d.ending, d.report
            if facts is None or ending is None or ending.code != ErrorCode.MODEL_RATE_LIMIT:
                continue
            wait = pause_seconds(report.retry_after if isinstance(report, FailReport) else None)
            if facts.api_key_mode == PLATFORM_KEY:
                out.append(sched.pause_provider(clock, facts.model_provider, wait))
                continue
            followed = key_followed(facts.api_key_mode, report.calls).get("credential_id")
            credential = str(followed or facts.credential_id or "")
            if credential:
                out += sched.pause_credential(clock, credential, wait)
        return out

    def _queue_parents(
        self, batch: Any, ended: Sequence[Done], held: dict[str, parents.ParentRow]
    ) -> list[parents.ParentChange]:
        """The parents of the ended children follow them (reference §10.3)."""
        moves = [
            parents.ChildMove(
                d.facts.parent_job_id,
                d.facts.status,
                d.status,
                actor=runtime_actor(d.report.lease.instance_id),
            )
            for d in ended
            if d.facts is not None and d.facts.parent_job_id is not None
        ]
        if not moves:
            return []
        return parents.queue(self.core.clock, batch, held, moves, actor=moves[0].actor or "")

    def _queue_rows(self, batch: Any, done: Done) -> None:
        """Queue an ended attempt's rows: an accepted result's business rows and result
        row, and the attempt's model calls (INSERTs that merge with the set's others;
        the spend of the set is one upsert, :meth:`Accounting.queue_spend`)."""
        report, facts, clock = done.report, done.facts, self.core.clock
        assert facts is not None
        if done.prepared is not None and isinstance(report, ResultReport):
            for statement in done.prepared.statements(clock):
                batch.add(statement, merge=True)
        done.calls = self.accounting.queue_calls(
            batch, facts, report.lease.attempt_no, report.calls, spend=False
        )
        if done.prepared is not None and isinstance(report, ResultReport):
            done.result_id = new_id()
            batch.add(st.insert_result.sql(clock, _result_row(done.result_id, report)), merge=True)

    def _transition(self, done: Done) -> tuple[Op, dict[str, Any]]:
        """The transition that ends ``done``'s attempt and the columns it sets: a success
        (the lease cleared, ``finishedAt``, the versions the output was made with), or
        the ending's (:func:`ending_values`); a result's versions either way, and a
        user-key job's credential and provider as its calls followed them."""
        report, facts, clock = done.report, done.facts, self.core.clock
        assert facts is not None
        followed = key_followed(facts.api_key_mode, report.calls)
        values: dict[str, Any] = {
            "credential_id": followed.get("credential_id", sql.KEEP),
            "model_provider": followed.get("model_provider", sql.KEEP),
        }
        if isinstance(report, ResultReport):
            values["prompt_version"] = report.prompt_version
            values["output_schema_version"] = report.output_schema_version
        if done.ending is None:
            values.update(
                lock_until=None, finished_at=clock.now(), error_code=None, error_message=None
            )
            return Op.SUCCEED, values
        message = report.message if isinstance(report, FailReport) else done_message(done)
        values.update(ending_values(clock, done.ending, message))
        return done.ending.ending.op(), values

    def _event(self, done: Done) -> sql.EndEvent:
        facts = done.facts
        assert facts is not None
        return sql.EndEvent(
            job_id=facts.job_id,
            from_status=facts.status,
            to_status=done.status,
            error_code=None if done.ending is None else done.ending.code,
            actor=runtime_actor(done.report.lease.instance_id),
        )


def done_message(done: Done) -> str:
    """The error message an attempt's non-success ending records."""
    from job_service.services.core import MAX_ERROR_MESSAGE

    text = done.error.message if done.error is not None else ""
    return (text or "invalid output")[:MAX_ERROR_MESSAGE]


def key_followed(api_key_mode: str, calls: Sequence[ModelCallInput]) -> dict[str, Any]:
    """The columns a user-key job takes from its attempt's last model call that names a
    credential: that ``credential_id`` (the user's current key, which the resolve
    handed out, reference §9.4: the job's ``credentialId`` follows) and its
    ``model_provider`` (the key's provider: the job shows the latest attempt's).
    Nothing for a platform-key job, whose provider its lease grant chose."""
    if api_key_mode == PLATFORM_KEY:
        return {}
    for call in reversed(calls):
        if call.credential_id:
            out: dict[str, Any] = {"credential_id": call.credential_id}
            if call.model_provider:
                out["model_provider"] = call.model_provider
            return out
    return {}


def _tokens(calls: Sequence[ModelCallInput]) -> int:
    """The tokens an attempt's model calls used (prompt and completion)."""
    return sum(c.prompt_tokens + c.completion_tokens for c in calls)


def _holder(lease: Lease) -> sql.Holder:
    return sql.Holder(lease.job_id, lease.instance_id, lease.attempt_no)


def _result_row(result_id: str, report: ResultReport) -> dict[str, Any]:
    """The ``ai_results`` row of an accepted result."""
    return {
        "result_id": result_id,
        "idempotency_key": report.key,
        "job_id": report.lease.job_id,
        "attempt_no": report.lease.attempt_no,
        "output_hash": report.output_hash,
        "prompt_version": report.prompt_version,
        "output_schema_version": report.output_schema_version,
        "output": report.output,
    }


__all__ = [
    "Completer",
    "Done",
    "FailReport",
    "Report",
    "ResultReport",
    "key_followed",
    "result_key",
    "spend_row",
]
