"""The platform budget's running total (``ai_runtime_platform_spend``, reference §6).

Every path that logs a model call adds a platform-key call's cost to the day's
total in the same transaction; the budget check at create reads the total, never
the log. Run again on MariaDB (the batched SubmitResult path) by
``tests/integration/job_service/test_platform_spend_on_mariadb.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.inputs import ModelCallInput
from job_service.store.tables import PLATFORM_SPEND_SHARDS, invocations, platform_spend
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]
#: $1 per thousand prompt tokens: a call of n tokens costs n/1000 USD.
PRICES = {"deepseek-chat": {"cacheHitInput": 0, "cacheMissInput": 1000, "output": 0}}


def _call(tokens: int, api_key_mode: str | None = None) -> ModelCallInput:
    return ModelCallInput(
        model_provider="",
        model_name="",
        api_key_mode=api_key_mode,
        credential_id=None,
        prompt_tokens=tokens,
        completion_tokens=0,
        cache_hit_tokens=0,
        latency_ms=3,
        outcome="succeeded",
    )


async def _spend(domain: JobDomain) -> tuple[Decimal, int, int]:
    """(cost, calls, rows) of the database's today in the running total."""
    async with domain.sessions() as s:
        row = (
            await s.execute(
                select(
                    func.coalesce(func.sum(platform_spend.c.cost_usd), 0),
                    func.coalesce(func.sum(platform_spend.c.calls), 0),
                    func.count(),
                ).where(platform_spend.c.day == domain.clock.today())
            )
        ).one()
    return Decimal(str(row[0])), int(row[1]), int(row[2])


async def _logged(domain: JobDomain) -> tuple[Decimal, int]:
    """(cost, calls) of the platform-key rows of the invocation log."""
    async with domain.sessions() as s:
        row = (
            await s.execute(
                select(func.coalesce(func.sum(invocations.c.cost_usd), 0), func.count()).where(
                    invocations.c.api_key_mode == "platform_key"
                )
            )
        ).one()
    return Decimal(str(row[0])), int(row[1])


async def test_every_path_that_logs_a_platform_call_adds_it_to_the_days_total(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(MODEL_PRICES=PRICES, MAX_RETRY_COUNT=0)
    succeed, fail, logged_alone = [await new_job(domain) for _ in range(3)]
    user_key = await new_job(domain, api_key_mode="user_deepseek_key")
    await domain.claim("w1", CAPS, 4, 0)
    # RecordInvocation: a platform call, and a user-key call that costs the platform nothing
    await domain.record_invocation(
        job_id=logged_alone.job_id,
        attempt_no=1,
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode=None,
        credential_id=None,
        prompt_tokens=7,
        completion_tokens=0,
        cache_hit_tokens=0,
        latency_ms=3,
        outcome="failed",
        error_code="MODEL_TIMEOUT",
        provider_request_id=None,
    )
    await domain.fail(
        Lease(user_key.job_id, "w1", 1),
        error_code="MODEL_TIMEOUT",
        error_message="slow",
        calls=[_call(500)],
    )
    # FailJob and SubmitResult with their calls (two calls in one report)
    await domain.fail(
        Lease(fail.job_id, "w1", 1),
        error_code="MODEL_TIMEOUT",
        error_message="slow",
        calls=[_call(20), _call(30)],
    )
    await domain.submit_result(
        Lease(succeed.job_id, "w1", 1),
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[_call(100)],
    )
    cost, calls, rows = await _spend(domain)
    assert (cost, calls) == (Decimal("0.157"), 4)  # (7 + 20 + 30 + 100) / 1000
    assert (cost, calls) == await _logged(domain)
    assert 1 <= rows <= PLATFORM_SPEND_SHARDS


async def test_concurrent_reports_add_up_exactly(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(MODEL_PRICES=PRICES)
    n = 24
    made = [await new_job(domain) for _ in range(n)]
    await domain.claim("w1", CAPS, n, 0)

    async def report(i: int, job_id: str) -> None:
        await domain.submit_result(
            Lease(job_id, "w1", 1),
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[_call(i + 1)],
        )

    await asyncio.gather(*(report(i, j.job_id) for i, j in enumerate(made)))
    cost, calls, rows = await _spend(domain)
    assert (cost, calls) == (Decimal(n * (n + 1) // 2) / 1000, n)
    assert (cost, calls) == await _logged(domain)
    assert rows <= PLATFORM_SPEND_SHARDS


async def test_a_group_of_results_adds_its_spend_in_one_upsert(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(MODEL_PRICES=PRICES)
    domain.completion.groups.max_in_flight = 1  # what queues behind the first is one group
    n = 10
    made = [await new_job(domain) for _ in range(n)]
    await domain.claim("w1", CAPS, n, 0)

    async def report(i: int, job_id: str) -> None:
        await domain.submit_result(
            Lease(job_id, "w1", 1),
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[_call(i + 1)],
        )

    await asyncio.gather(*(report(i, j.job_id) for i, j in enumerate(made)))
    cost, calls, rows = await _spend(domain)
    assert (cost, calls) == (Decimal(n * (n + 1) // 2) / 1000, n)
    assert (cost, calls) == await _logged(domain)
    # the first result alone, the nine behind it in one statement: at most two of the
    # day's rows (an upsert a result would have touched several of the 16)
    assert rows <= 2


async def test_the_budget_check_reads_todays_total(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(PLATFORM_DAILY_BUDGET_USD=5)

    async def add(day: Any, cost: str) -> None:
        async with domain.sessions() as s, s.begin():
            await s.execute(
                insert(platform_spend).values(
                    day=day, shard=3, cost_usd=Decimal(cost), calls=1, updated_at=domain.clock.now()
                )
            )

    async with domain.sessions() as s:
        today: date = (await s.execute(select(domain.clock.today()))).scalar_one()
    if isinstance(today, str):  # SQLite answers the expression as text
        today = date.fromisoformat(today)
    await add(today - timedelta(days=1), "99")  # yesterday's spend is not today's
    assert (await new_job(domain)).status == "pending"
    await add(today, "5")
    with pytest.raises(AppError) as refused:
        await new_job(domain)
    assert refused.value.code == ErrorCode.PLATFORM_BUDGET_EXCEEDED
    assert refused.value.details == {"budgetUsd": 5, "spentUsd": 5.0}
    assert (await new_job(domain, api_key_mode="user_deepseek_key")).status == "pending"


def migrate_with_logged_calls(url: str) -> None:
    """Schema at 0002 with calls logged on two days, then upgraded: the total starts
    with every day the log holds; a downgrade drops it again."""
    from alembic import command
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url

    from job_service.migrate import alembic_config

    cfg = alembic_config(url)
    command.upgrade(cfg, "0002")
    sync = make_url(url)
    dialect = sync.drivername.split("+")[0]
    sync = sync.set(drivername="mysql+pymysql" if dialect == "mysql" else dialect)
    engine = create_engine(sync)
    try:
        rows = [
            ("platform_key", "0.5", "2026-11-29 23:59:59.999999"),
            ("platform_key", "0.25", "2026-11-29 00:00:00"),
            ("platform_key", "1", "2026-11-30 12:00:00"),
            ("user_deepseek_key", "9", "2026-11-29 10:00:00"),
        ]
        with engine.begin() as conn:
            for i, (mode, cost, at) in enumerate(rows):
                conn.execute(
                    invocations.insert().values(
                        id=f"inv{i}",
                        job_id="j",
                        job_type="learning_state_analysis",
                        attempt_no=1,
                        model_provider="deepseek",
                        model_name="deepseek-chat",
                        api_key_mode=mode,
                        prompt_tokens=1,
                        completion_tokens=1,
                        cache_hit_tokens=0,
                        latency_ms=1,
                        outcome="succeeded",
                        cost_usd=Decimal(cost),
                        created_at=datetime.fromisoformat(at),
                    )
                )
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            got = conn.execute(
                select(
                    platform_spend.c.day,
                    platform_spend.c.shard,
                    platform_spend.c.cost_usd,
                    platform_spend.c.calls,
                ).order_by(platform_spend.c.day)
            ).all()
        assert [(str(d), s, Decimal(str(c)), n) for d, s, c, n in got] == [
            ("2026-11-29", 0, Decimal("0.75"), 2),
            ("2026-11-30", 0, Decimal("1"), 1),
        ]
        command.downgrade(cfg, "0002")
        assert "ai_runtime_platform_spend" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_the_migration_starts_the_total_from_the_log(sqlite_url: str) -> None:
    migrate_with_logged_calls(sqlite_url)
