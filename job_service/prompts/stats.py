"""Per-version prompt stats from the invocation logs and the job events (reference §10.4).

An *attempt* of a version is a ``(jobId, attemptNo)`` with model calls logged under
that version in the window (the calls record the version their attempt ran, so
an attempt counts under its own version even when its job later moved to
another). Its ending is read from the job's events of that attempt: a
``succeeded`` event, or an event with code ``INVALID_SCHEMA`` (the output failed
validation on the worker or on job_service). So ``invalidSchemaRate`` = attempts
ending ``INVALID_SCHEMA`` / attempts, per attempt, not per model call.

Tokens are means over the version's model calls; latencies (p50, p95, nearest
rank) are the calls' ``latencyMs``; the cost per succeeded job is the cost of all
the version's calls over its succeeded attempts. Feedback counts the ratings
given in the window on items whose job ran the version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, exists, func, select

from airuntime_common.errors import ErrorCode
from airuntime_common.prompts import full_version
from airuntime_common.states import JobStatus
from job_service.prompts.tables import result_feedback
from job_service.store.engine import DbExec
from job_service.store.tables import events, invocations


@dataclass(frozen=True)
class AttemptCounts:
    """A version's attempts in a window and how many ended each way."""

    attempts: int = 0
    succeeded: int = 0
    invalid_schema: int = 0

    @property
    def invalid_schema_rate(self) -> float | None:
        """``invalid_schema / attempts``; None without attempts."""
        return self.invalid_schema / self.attempts if self.attempts else None


@dataclass(frozen=True)
class VersionStats:
    """The stats of one version over a window (``GET /admin/ai/prompts/{jobType}``).

    Attributes:
        version: the bare version (``v2``).
        counts: attempts, succeeded, ending INVALID_SCHEMA.
        mean_prompt_tokens: per model call; None without calls.
        mean_completion_tokens: per model call; None without calls.
        p50_latency_ms: of the model calls (ms); None without calls.
        p95_latency_ms: of the model calls (ms); None without calls.
        cost_per_succeeded_usd: the calls' cost over the succeeded attempts; None
            without a success.
        feedback_positive: ratings of +1.
        feedback_negative: ratings of -1.
    """

    version: str
    counts: AttemptCounts
    mean_prompt_tokens: float | None = None
    mean_completion_tokens: float | None = None
    p50_latency_ms: int | None = None
    p95_latency_ms: int | None = None
    cost_per_succeeded_usd: float | None = None
    feedback_positive: int = 0
    feedback_negative: int = 0

    def json(self) -> dict[str, Any]:
        """The camelCase view of reference §10.4."""
        c = self.counts
        return {
            "version": self.version,
            "attempts": c.attempts,
            "succeeded": c.succeeded,
            "invalidSchemaRate": c.invalid_schema_rate,
            "meanPromptTokens": self.mean_prompt_tokens,
            "meanCompletionTokens": self.mean_completion_tokens,
            "p50LatencyMs": self.p50_latency_ms,
            "p95LatencyMs": self.p95_latency_ms,
            "costPerSucceededUsd": self.cost_per_succeeded_usd,
            "feedback": {"positive": self.feedback_positive, "negative": self.feedback_negative},
        }


def _window(job_type: str, since: datetime, full_versions: Sequence[str]) -> Any:
    return and_(
        invocations.c.job_type == job_type,
        invocations.c.created_at >= since,
        invocations.c.prompt_version.in_(sorted(set(full_versions))),
    )


async def attempt_counts(
    db: DbExec, job_type: str, since: datetime, full_versions: Sequence[str]
) -> dict[str, AttemptCounts]:
    """Attempts of each of ``full_versions`` (``quiz_generation.v2``…) whose calls were
    logged since ``since`` (naive UTC), with how many succeeded and how many ended
    ``INVALID_SCHEMA``; a version with none is absent."""
    if not full_versions:
        return {}
    logs = invocations
    attempts = (
        select(logs.c.prompt_version.label("pv"), logs.c.job_id, logs.c.attempt_no)
        .where(_window(job_type, since, full_versions))
        .group_by(logs.c.prompt_version, logs.c.job_id, logs.c.attempt_no)
        .subquery()
    )
    same = and_(events.c.job_id == attempts.c.job_id, events.c.attempt_no == attempts.c.attempt_no)
    succeeded = exists().where(same, events.c.to_status == JobStatus.SUCCEEDED.value)
    invalid = exists().where(same, events.c.error_code == ErrorCode.INVALID_SCHEMA.value)
    stmt = select(
        attempts.c.pv,
        func.count(),
        func.sum(case((succeeded, 1), else_=0)),
        func.sum(case((invalid, 1), else_=0)),
    ).group_by(attempts.c.pv)
    rows = (await db.execute(stmt)).all()
    return {str(r[0]): AttemptCounts(int(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in rows}


async def version_stats(
    db: DbExec, job_type: str, since: datetime, versions: Sequence[str]
) -> list[VersionStats]:
    """The stats of each of the bare ``versions`` of ``job_type`` since ``since``, in
    that order (a version with no attempts has null rates and latencies)."""
    full = {full_version(job_type, v): v for v in versions}
    counts = await attempt_counts(db, job_type, since, list(full))
    logs = invocations
    calls = {
        str(r[0]): r
        for r in (
            await db.execute(
                select(
                    logs.c.prompt_version,
                    func.count(),
                    func.avg(logs.c.prompt_tokens),
                    func.avg(logs.c.completion_tokens),
                    func.sum(logs.c.cost_usd),
                )
                .where(_window(job_type, since, list(full)))
                .group_by(logs.c.prompt_version)
            )
        ).all()
    }
    feedback = await _feedback(db, job_type, since, list(full))
    out = []
    for name, version in full.items():
        c = counts.get(name, AttemptCounts())
        row = calls.get(name)
        positive, negative = feedback.get(name, (0, 0))
        stats = VersionStats(version, c, feedback_positive=positive, feedback_negative=negative)
        if row is not None and int(row[1]) > 0:
            n = int(row[1])
            p50, p95 = await _latency(db, job_type, since, name, n)
            stats = VersionStats(
                version,
                c,
                mean_prompt_tokens=float(row[2]),
                mean_completion_tokens=float(row[3]),
                p50_latency_ms=p50,
                p95_latency_ms=p95,
                cost_per_succeeded_usd=float(row[4]) / c.succeeded if c.succeeded else None,
                feedback_positive=positive,
                feedback_negative=negative,
            )
        out.append(stats)
    return out


async def _latency(
    db: DbExec, job_type: str, since: datetime, name: str, n: int
) -> tuple[int, int]:
    """p50 and p95 (nearest rank) of the ``n`` calls of version ``name`` in the window,
    each one ordered read in the database (no latency leaves it but the two)."""
    out = []
    for q in (0.5, 0.95):
        rank = max(1, math.ceil(q * n))
        stmt = (
            select(invocations.c.latency_ms)
            .where(_window(job_type, since, [name]))
            .order_by(invocations.c.latency_ms)
            .limit(1)
            .offset(rank - 1)
        )
        value = (await db.execute(stmt)).scalar()
        out.append(int(value or 0))
    return out[0], out[1]


async def _feedback(
    db: DbExec, job_type: str, since: datetime, full_versions: Sequence[str]
) -> dict[str, tuple[int, int]]:
    fb = result_feedback
    stmt = (
        select(
            fb.c.prompt_version,
            func.sum(case((fb.c.rating > 0, 1), else_=0)),
            func.sum(case((fb.c.rating < 0, 1), else_=0)),
        )
        .where(
            fb.c.job_type == job_type,
            fb.c.updated_at >= since,
            fb.c.prompt_version.in_(sorted(set(full_versions))),
        )
        .group_by(fb.c.prompt_version)
    )
    rows = (await db.execute(stmt)).all()
    return {str(r[0]): (int(r[1] or 0), int(r[2] or 0)) for r in rows}
