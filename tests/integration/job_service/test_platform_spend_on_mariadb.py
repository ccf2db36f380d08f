"""The platform budget's running total on MariaDB: the batched SubmitResult path,
concurrent reports on the day's shards, the migration, and the budget read's plan.

Skipped without TEST_MYSQL_URL. Each test gets its own database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from job_service.services.domain import JobDomain
from tests.integration.job_service.conftest import *  # noqa: F403
from tests.unit.job_service.conftest import new_job
from tests.unit.job_service.test_platform_spend import (  # noqa: F401
    migrate_with_logged_calls,
    test_concurrent_reports_add_up_exactly,
    test_every_path_that_logs_a_platform_call_adds_it_to_the_days_total,
    test_the_budget_check_reads_todays_total,
)

pytestmark = pytest.mark.mysql


def test_the_migration_starts_the_total_from_the_log_on_mariadb(mysql_url: str) -> None:
    migrate_with_logged_calls(mysql_url)


async def test_the_budget_read_is_a_primary_key_range_not_a_log_scan(
    make_domain: Callable[..., Any],
) -> None:
    """With a day's log of thousands of platform calls, the budget read still reads
    the day's few total rows by primary key (it used to sum the log)."""
    domain: JobDomain = await make_domain()
    await new_job(domain)
    async with domain.sessions() as s, s.begin():
        await s.execute(
            text(
                "INSERT INTO ai_runtime_invocation_logs (id, job_id, job_type, attempt_no,"
                " model_provider, model_name, api_key_mode, prompt_tokens, completion_tokens,"
                " cache_hit_tokens, latency_ms, outcome, cost_usd, created_at)"
                " SELECT CONCAT('i', seq), 'j', 'learning_state_analysis', 1, 'deepseek',"
                " 'deepseek-chat', 'platform_key', 1, 1, 0, 1, 'succeeded', 0.001,"
                " UTC_TIMESTAMP(6) FROM seq_1_to_5000"
            )
        )
        await s.execute(
            text(
                "INSERT INTO ai_runtime_platform_spend (day, shard, cost_usd, calls, updated_at)"
                " SELECT UTC_DATE(), seq, 0.3125, 1000, UTC_TIMESTAMP(6) FROM seq_0_to_15"
            )
        )
        await s.execute(text("ANALYZE TABLE ai_runtime_platform_spend"))
    async with domain.sessions() as s:
        compiled = await s.run_sync(lambda sync: _budget_sql(sync, domain))
        plan = (await s.execute(text("EXPLAIN " + compiled))).mappings().all()
    assert len(plan) == 1, plan
    assert plan[0]["table"] == "ai_runtime_platform_spend", plan
    assert plan[0]["key"] == "PRIMARY", plan
    assert int(plan[0]["rows"]) <= 16, plan


def _budget_sql(sync: Any, domain: JobDomain) -> str:
    """The SQL text of the create path's budget read, as the service sends it."""
    from sqlalchemy import func, select

    from job_service.store.tables import platform_spend

    stmt = select(func.coalesce(func.sum(platform_spend.c.cost_usd), 0)).where(
        platform_spend.c.day == domain.clock.today()
    )
    return str(stmt.compile(dialect=sync.bind.dialect, compile_kwargs={"literal_binds": True}))
