"""The console's reads on MariaDB (reference §9.5): on a table of a month of ended jobs, the
jobs-per-minute GROUP BY and the counts of a creation range read one range of their
index (``ix_jobs_finished_status``, ``ix_jobs_created_status``), and count right."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, text

from job_service.services.core import new_id
from job_service.services.domain import JobDomain
from job_service.store import statements
from job_service.store.tables import jobs

pytestmark = pytest.mark.mysql
STATES = ("succeeded", "failed", "cancelled")


async def _month_of_jobs(domain: JobDomain, n: int) -> datetime:
    """``n`` ended jobs, one every ~15 minutes back over a month; returns the DB's now."""
    async with domain.sessions() as s:
        now = await domain.clock.read(s)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        at = now - timedelta(minutes=15 * i + 1)
        rows.append(
            {
                "job_id": new_id(),
                "user_id": f"u{i % 40}",
                "job_type": "learning_state_analysis",
                "target_type": "user",
                "target_id": f"u{i % 40}",
                "status": STATES[i % 3],
                "params": {},
                "available_at": at,
                "created_at": at,
                "updated_at": at,
                "finished_at": at,
            }
        )
    async with domain.sessions() as s, s.begin():
        for chunk in range(0, n, 1000):
            await s.execute(insert(jobs), rows[chunk : chunk + 1000])
        await s.execute(text("ANALYZE TABLE ai_runtime_jobs"))
    return now


async def _plan(domain: JobDomain, stmt: Any) -> list[Any]:
    async with domain.sessions() as s:
        compiled = stmt.compile(s.bind, compile_kwargs={"literal_binds": True})
        return list((await s.execute(text(f"EXPLAIN {compiled}"))).mappings().all())


async def test_jobs_per_minute_read_their_index(domain: JobDomain) -> None:
    now = await _month_of_jobs(domain, 3000)
    since = now - timedelta(hours=6)
    plan = await _plan(domain, statements.throughput(since))
    assert plan[0]["key"] == "ix_jobs_finished_status", plan
    view = await domain.throughput(6)
    # one job every 15 minutes from 1 minute ago: 24 of them in 6 hours
    assert view.succeeded + view.failed + view.cancelled == 24
    assert len(view.minutes) == 24 and all(sum(m[1:]) == 1 for m in view.minutes)
    assert view.failure_rate == pytest.approx(view.failed / (view.succeeded + view.failed))


async def test_counts_of_a_creation_range_read_their_index(domain: JobDomain) -> None:
    now = await _month_of_jobs(domain, 3000)
    lo, hi = now - timedelta(days=1), now
    plan = await _plan(
        domain, statements.job_counts(user_id=None, job_type=None, created_from=lo, created_to=hi)
    )
    assert plan[0]["key"] == "ix_jobs_created_status", plan
    counts = await domain.job_counts(user_id=None, job_type=None, created_from=lo, created_to=hi)
    assert sum(counts.values()) == 96  # 4 an hour
    assert counts["succeeded"] == counts["failed"] == counts["cancelled"] == 32
