"""Create's admission on MariaDB, where it is one batched read (the user's lock, the
idempotency re-check, the AI switch, the quota count, the day's spend, the breaker):
the create guards' tests again, racing creates included.

Skipped without TEST_MYSQL_URL. Each test gets its own database.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event

from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput
from tests.integration.job_service.conftest import *  # noqa: F403
from tests.unit.job_service.conftest import new_job
from tests.unit.job_service.test_create_guards import (  # noqa: F401
    test_breaker_opens_half_opens_and_closes,
    test_credential_check_and_mark_invalid,
    test_daily_quota_and_plan,
    test_idempotent_replay_whatever_params,
    test_m3_racing_idempotent_creates_make_one_job,
    test_platform_budget,
)
from tests.unit.job_service.test_retry_cancel import test_revoke_authorization  # noqa: F401

pytestmark = pytest.mark.mysql


async def test_admission_is_one_round_trip(make_domain: Callable[..., Any]) -> None:
    """Lock, scope, switch, count, spend, breaker and the job's place in the fair order
    (reference §10.1) go to the server as one query."""
    domain: JobDomain = await make_domain(USER_DAILY_JOB_QUOTA=5)
    await new_job(domain)  # the user's admission row exists from here on
    sent: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sync = domain.store.engine.sync_engine
    event.listen(sync, "before_cursor_execute", seen)
    batched: list[str] = []
    real_query = None
    try:
        driver: Any = (
            importlib.import_module("aiomysql.connection")
            if domain.store.engine.dialect.driver == "aiomysql"
            else importlib.import_module("asyncmy.connection")
        )
        real_query = driver.Connection.query

        async def query(self: Any, sql: str, unbuffered: bool = False) -> Any:
            batched.append(sql)
            return await real_query(self, sql, unbuffered)  # type: ignore[misc]

        driver.Connection.query = query  # type: ignore[method-assign]
        job, replayed = await domain.create(
            CreateJobInput(
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="u1",
                idempotency_key="once",
            )
        )
    finally:
        event.remove(sync, "before_cursor_execute", seen)
        if real_query is not None:
            driver.Connection.query = real_query  # type: ignore[method-assign]
    assert not replayed and job.status == "pending"
    # the lock is a write (UPDATE … changes + 1), so Galera nodes certify against it
    [admission] = [q for q in batched if "UPDATE ai_user_admission_locks" in q]
    for table in (
        "ai_runtime_jobs",
        "ai_authorizations",
        "ai_runtime_platform_spend",
        "ai_circuit_breaker",
    ):
        assert table in admission, table
    assert admission.count(";") == 6  # seven statements, one query
    assert "vstart" in admission.split(";")[-1]  # the fair order's read, after the lock
    assert not [q for q in sent if "ai_authorizations" in q or "ai_runtime_platform_spend" in q]


async def test_creates_of_one_user_are_admitted_one_at_a_time(
    make_domain: Callable[..., Any],
) -> None:
    """30 racing creates against a quota of 7: exactly 7 admitted (the batched read
    counts after taking the user's lock)."""
    domain: JobDomain = await make_domain(USER_DAILY_JOB_QUOTA=7)
    results = await asyncio.gather(*(new_job(domain) for _ in range(30)), return_exceptions=True)
    made = [r for r in results if not isinstance(r, BaseException)]
    refused = {getattr(r, "code", repr(r)) for r in results if isinstance(r, BaseException)}
    assert len(made) == 7 and refused == {"QUOTA_EXCEEDED"}
