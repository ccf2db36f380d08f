"""Claim with start (``ClaimJobs.with_snapshots``): pending → locked → running and the
snapshots, in the claim's one transaction (reference §2.3, §3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import update

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease, Op
from job_service.services.domain import JobDomain
from job_service.store.clock import DbClock
from job_service.store.tables import jobs
from job_service.store.transitions import transition_many_sql
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]


async def _history(domain: JobDomain, job_id: str) -> list[tuple[str | None, str, int, Any]]:
    evs, _ = await domain.history(job_id)
    return [(e.from_status, e.to_status, e.attempt_no, e.at) for e in evs]


async def test_claim_with_start_runs_each_job_and_answers_its_snapshot(
    domain: JobDomain,
) -> None:
    made = [await new_job(domain) for _ in range(3)]
    claimed, snapshots = await domain.claim_started("w1", CAPS, 3, 0)
    assert [j.job_id for j in claimed] == [j.job_id for j in made]
    for job in claimed:
        fresh = await domain.get(job.job_id)
        assert job == fresh
        assert job.status == "running"
        assert job.locked_by == "w1"
        assert job.attempt_no == 1
        assert job.locked_at is not None and job.started_at is not None
        assert job.started_at >= job.locked_at
        assert snapshots[job.job_id].snapshot_id == job.snapshot_id
        assert await _history(domain, job.job_id) == [
            (None, "pending", 0, job.created_at),
            ("pending", "locked", 1, job.locked_at),
            ("locked", "running", 1, job.started_at),
        ]


async def test_the_holder_s_snapshot_read_after_it_changes_nothing(domain: JobDomain) -> None:
    job = await new_job(domain)
    [claimed], snapshots = await domain.claim_started("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    view = await domain.snapshot(lease)
    assert view.snapshot_id == snapshots[job.job_id].snapshot_id
    again = await domain.get(job.job_id)
    assert again.started_at == claimed.started_at
    assert len(await _history(domain, job.job_id)) == 3
    with pytest.raises(AppError) as caught:
        await domain.snapshot(Lease(job.job_id, "intruder", 1))
    assert caught.value.code == ErrorCode.LOCK_NOT_HELD


async def test_a_started_job_heartbeats_and_succeeds(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim_started("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    await domain.heartbeat(lease)
    outcome = await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )
    assert outcome.status == "succeeded"
    assert [(f, t) for f, t, _, _ in await _history(domain, job.job_id)] == [
        (None, "pending"),
        ("pending", "locked"),
        ("locked", "running"),
        ("running", "succeeded"),
    ]


async def test_a_job_the_lock_guard_skips_is_neither_started_nor_logged(
    domain: JobDomain,
) -> None:
    skipped = await new_job(domain)
    taken = await new_job(domain)
    # pending, but an old lease has not lapsed: the pick sees it, the lock refuses it
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == skipped.job_id)
            .values(lock_until=domain.clock.plus(60))
        )
    claimed, snapshots = await domain.claim_started("w1", CAPS, 2, 0)
    assert [j.job_id for j in claimed] == [taken.job_id]
    assert set(snapshots) == {taken.job_id}
    left = await domain.get(skipped.job_id)
    assert (left.status, left.attempt_no, left.started_at) == ("pending", 0, None)
    assert len(await _history(domain, skipped.job_id)) == 1


async def test_nothing_to_claim_answers_empty(domain: JobDomain) -> None:
    assert await domain.claim_started("w1", CAPS, 5, 0) == ([], {})


async def test_a_long_poll_with_start_takes_a_job_created_while_it_waits(
    domain: JobDomain,
) -> None:
    waiting = asyncio.ensure_future(domain.claim_started("w1", CAPS, 5, 3000))
    await asyncio.sleep(0.2)
    job = await new_job(domain)  # the create wakes the waiting claim
    claimed, snapshots = await asyncio.wait_for(waiting, 5)
    assert [j.job_id for j in claimed] == [job.job_id]
    assert claimed[0].status == "running"
    assert job.job_id in snapshots


async def test_plain_claim_still_only_locks(domain: JobDomain) -> None:
    job = await new_job(domain)
    [claimed] = await domain.claim("w1", CAPS, 1, 0)
    assert (claimed.status, claimed.started_at) == ("locked", None)
    assert len(await _history(domain, job.job_id)) == 2


def test_a_holder_transition_of_many_jobs_needs_the_holder() -> None:
    clock = DbClock("sqlite")
    with pytest.raises(ValueError, match="needs a lease"):
        transition_many_sql(clock, Op.START, job_ids=["j"], values={})
    sql = transition_many_sql(clock, Op.START, job_ids=["j"], values={}, holder="w1")
    assert sql.params["m_instance_id"] == "w1"
