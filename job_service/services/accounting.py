"""Accounting: model calls logged with their cost, the platform's daily spend, cost roll-ups
(reference §5 invocation logs, §6 budget, §3.1 ``/admin/ai/costs``)."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.services.core import Core, new_id
from job_service.services.inputs import ModelCallInput
from job_service.store import statements as st
from job_service.store.batch import StatementBatch, new_batch
from job_service.store.engine import DbExec
from job_service.store.records import EndingFacts, JobRecord
from job_service.store.tables import PLATFORM_SPEND_SHARDS

log = logging.getLogger("job_service.accounting")


#: Models already logged as having no price.
_UNPRICED: set[str] = set()


def cost_usd(
    prices: dict[str, dict[str, float]],
    model_name: str,
    prompt_tokens: int,
    completion_tokens: int,
    cache_hit_tokens: int,
) -> Decimal:
    """Cost of one call from ``MODEL_PRICES`` (USD per million tokens), keyed by the
    provider's model name; a model with no price costs 0, and the first such call of
    each model is logged (reference §9.4)."""
    p = prices.get(model_name)
    if not p:
        if model_name not in _UNPRICED and len(_UNPRICED) < 1000:
            _UNPRICED.add(model_name)
            log.warning(
                "model has no price in MODEL_PRICES: its calls cost 0",
                extra={"fields": {"modelName": model_name[:64]}},
            )
        return Decimal(0)
    hit = max(0, min(cache_hit_tokens, prompt_tokens))
    miss = max(0, prompt_tokens - hit)
    total = (
        Decimal(str(p.get("cacheHitInput", 0))) * hit
        + Decimal(str(p.get("cacheMissInput", 0))) * miss
        + Decimal(str(p.get("output", 0))) * max(0, completion_tokens)
    ) / Decimal(1_000_000)
    return total.quantize(Decimal("0.00000001"))


class Accounting:
    """Logs model calls and totals their cost.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    def call_rows(
        self, job: JobRecord | EndingFacts, attempt_no: int, calls: Sequence[ModelCallInput]
    ) -> list[dict[str, Any]]:
        """The invocation log rows of ``calls`` of ``job``'s attempt ``attempt_no``; a call's
        empty model/provider/key mode is the job's, its cost from ``MODEL_PRICES``, its
        ``promptVersion`` the job's as it stands (the version the attempt ran: a job
        keeps its version for all its attempts, reference §10.4).

        Raises:
            AppError: INVALID_ARGUMENT (``apiKeyMode``) for a call that gives a key mode
                other than the job's: a platform-key call logged as a user-key one
                would escape the daily budget (reference §6). Raised before anything is
                written; the caller's transaction rolls back.
        """
        rows = []
        prices = self.core.settings.MODEL_PRICES
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
                        prices, model_name, c.prompt_tokens, c.completion_tokens, c.cache_hit_tokens
                    ),
                    "prompt_version": job.prompt_version,
                }
            )
        return rows

    def queue_calls(
        self,
        batch: StatementBatch,
        job: JobRecord | EndingFacts,
        attempt_no: int,
        calls: Sequence[ModelCallInput],
        *,
        spend: bool = True,
    ) -> list[dict[str, Any]]:
        """Queue the log rows of ``calls`` and, with ``spend``, their platform spend in
        ``batch``; the rows (hand them to :meth:`observe` once the transaction
        committed). The log rows' INSERTs are queued to merge
        (:meth:`StatementBatch.add`): nothing reads their row counts. Without
        ``spend`` the caller queues the spend of these rows with others' in one
        :meth:`queue_spend`.

        Raises:
            AppError: as :meth:`call_rows` (nothing queued).
        """
        rows = self.call_rows(job, attempt_no, calls)
        clock = self.core.clock
        for row in rows:
            batch.add(st.insert_invocation.sql(clock, row), merge=True)
        if spend:
            self.queue_spend(batch, rows)
        return rows

    def queue_spend(self, batch: StatementBatch, rows: Sequence[dict[str, Any]]) -> None:
        """Queue one upsert adding the platform spend of logged call ``rows`` (of any
        number of jobs) to one of today's spend rows (:func:`spend_row`); nothing
        when none used the platform key. A group of results adds its spend in one
        statement: one row lock, where one upsert a job would lock several of the
        day's rows in a random order, and a concurrent group would wait on them
        until this transaction's COMMIT (or deadlock with it)."""
        spend = spend_row(rows)
        if spend is not None:
            batch.add(st.add_platform_spend.sql(self.core.clock, spend))

    @staticmethod
    def observe(rows: Sequence[dict[str, Any]]) -> None:
        """Feed ``airt_model_cost_usd_total`` with logged call ``rows`` (after their commit)."""
        for row in rows:
            metrics.MODEL_COST.labels(
                row["model_provider"], row["model_name"], row["api_key_mode"]
            ).inc(float(row["cost_usd"]))

    async def record_invocation(self, *, job_id: str, attempt_no: int, call: ModelCallInput) -> str:
        """Store one model call with its cost (reference §5); returns the log id.

        The call must belong to the job as it stands: an attempt the job has had
        (``attemptNo`` ≤ the job's), and the job's own ``apiKeyMode`` when one is
        given (a call on the platform key counts toward the daily budget, reference §6,
        so it cannot be logged as a user-key call, nor the other way round).

        Raises:
            AppError: INVALID_ARGUMENT (bad outcome, negative counts, more cache hits
                than prompt tokens, an attempt the job has not had, another key mode
                than the job's), JOB_NOT_FOUND.
        """
        call.check()
        if attempt_no < 0:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT, "attemptNo must be ≥ 0", {"field": "attemptNo"}
            )

        async def body(db: DbExec) -> list[dict[str, Any]]:
            job = await self.core.must_get_job(db, job_id)
            if attempt_no > job.attempt_no:
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"the job has had {job.attempt_no} attempt(s), not {attempt_no}",
                    {"field": "attemptNo"},
                )
            batch = new_batch(db)
            rows = self.queue_calls(batch, job, attempt_no, [call])
            await batch.run()
            return rows

        rows = await self.core.store.lean_tx(body)
        self.observe(rows)
        return str(rows[0]["id"])

    async def costs(self, from_date: str, to_date: str, group_by: str) -> list[dict[str, Any]]:
        """Cost roll-up over UTC days, inclusive (reference §3.1 /admin/ai/costs).

        Returns:
            ``[{"key","calls","promptTokens","completionTokens","cacheHitTokens","costUsd"}]``.

        Raises:
            AppError: INVALID_ARGUMENT for bad dates or ``groupBy``.
        """
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
        group = st.COST_GROUPS.get(group_by)
        if group is None:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "groupBy must be day, jobType, modelName, modelProvider or apiKeyMode",
                {"field": "groupBy"},
            )
        hi_day = end + timedelta(days=1)
        stmt = st.costs(
            group,
            datetime(start.year, start.month, start.day),
            datetime(hi_day.year, hi_day.month, hi_day.day),
        )
        async with self.core.store.sessions() as session:
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


def spend_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """What logged call ``rows`` add to the day's platform spend (values of
    :data:`~job_service.store.statements.add_platform_spend`: ``shard``, ``cost_usd``,
    ``calls``); None when no row used the platform key. The shard is random,
    spreading concurrent reports over the day's rows (reference §6 budget;
    :class:`~job_service.store.tables.PlatformSpend`)."""
    platform = [r for r in rows if r["api_key_mode"] == "platform_key"]
    if not platform:
        return None
    return {
        "shard": random.randrange(PLATFORM_SPEND_SHARDS),
        "cost_usd": sum((Decimal(r["cost_usd"]) for r in platform), Decimal(0)),
        "calls": len(platform),
    }
