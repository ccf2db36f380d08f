"""Reaper and lease cases L1–L3, L5–L7, timeouts (reference §2.3, §2.4; docs/reference/cases.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, update

from airuntime_common.errors import AppError
from job_service.lifecycle import Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.domain import JobDomain
from job_service.store.tables import jobs, workers
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, business_rows, new_job

CAPS = ["learning_state_analysis"]


async def _age_lease(domain: JobDomain, job_id: str, seconds_ago: float = 1) -> None:
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == job_id)
            .values(lock_until=domain.clock.plus(-seconds_ago))
        )


async def test_l1_long_job_with_heartbeats_is_never_relocked(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=1.0)
    reaper = Reaper(domain.core)
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    for _ in range(9):  # ~2.3 s of work: more than twice the lease
        await asyncio.sleep(0.25)
        await domain.heartbeat(lease)
        assert await reaper.sweep() == 0
    out = await domain.submit_result(
        lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
    )
    assert out.status == "succeeded"
    final = await domain.get(job.job_id)
    assert final.attempt_no == 1 and final.retry_count == 0


async def test_l2_l3_paused_worker_loses_to_the_next(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=5)
    reaper = Reaper(domain.core)
    job = await new_job(domain)
    await domain.claim("A", CAPS, 1, 0)
    a = Lease(job.job_id, "A", 1)
    await domain.start(a)
    assert await reaper.sweep() == 0
    await _age_lease(domain, job.job_id)  # A pauses past lockUntil
    assert await reaper.sweep() == 1
    mid = await domain.get(job.job_id)
    assert mid.status == "pending" and mid.retry_count == 1 and mid.error_code == "LEASE_EXPIRED"
    assert mid.expired_at is not None and mid.locked_by is None
    [b_job] = await domain.claim("B", CAPS, 1, 0)
    assert b_job.attempt_no == 2
    b = Lease(job.job_id, "B", 2)
    # A wakes: heartbeat and result refused
    with pytest.raises(AppError) as err:
        await domain.heartbeat(a)
    assert err.value.code == "LOCK_NOT_HELD"
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            a, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
        )
    assert err.value.code == "LOCK_NOT_HELD"
    out = await domain.submit_result(
        b, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
    )
    assert out.status == "succeeded"
    assert await business_rows(domain, job.job_id) == 1
    evs, _ = await domain.history(job.job_id)
    assert [(e.from_status, e.to_status, e.error_code) for e in evs] == [
        (None, "pending", None),
        ("pending", "locked", None),
        ("locked", "running", None),
        ("running", "expired", "LEASE_EXPIRED"),
        ("expired", "pending", "LEASE_EXPIRED"),
        ("pending", "locked", None),
        ("locked", "succeeded", None),
    ]
    assert all(e.actor == "reaper" for e in evs[3:5])


async def test_l5_hard_kill_batch_returns_to_pending(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=0.3)
    ids = {(await new_job(domain, idempotency_key=str(i))).job_id for i in range(5)}
    claimed = await domain.claim("killed", CAPS, 10, 0)
    assert {j.job_id for j in claimed} == ids
    await asyncio.sleep(0.4)
    assert await Reaper(domain.core).sweep() == 5
    for job_id in ids:
        j = await domain.get(job_id)
        assert (j.status, j.retry_count) == ("pending", 1)
    again = await domain.claim("survivor", CAPS, 10, 0)
    assert {j.job_id for j in again} == ids and all(j.attempt_no == 2 for j in again)


async def test_l6_poison_job_attempted_max_plus_one_times(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=0.2, MAX_RETRY_COUNT=2)
    reaper = Reaper(domain.core)
    job = await new_job(domain)
    attempts = 0
    for _ in range(6):
        got = await domain.claim("w", CAPS, 1, 0)
        if not got:
            break
        attempts += 1
        assert got[0].retry_count <= got[0].max_retry_count
        if attempts == 2:  # a failure report shares the counter with lease expiries
            await domain.fail(
                Lease(job.job_id, "w", got[0].attempt_no),
                error_code="NETWORK_ERROR",
                error_message="",
            )
            continue
        await _age_lease(domain, job.job_id)
        assert await reaper.sweep() == 1
    final = await domain.get(job.job_id)
    assert attempts == 3
    assert (
        final.status == "failed" and final.retry_count == 2 and final.error_code == "LEASE_EXPIRED"
    )


async def test_job_timeout_from_started_at(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=30, MAX_RETRY_COUNT=0)
    job = await new_job(domain, timeout_seconds=10)
    await domain.claim("w", CAPS, 1, 0)
    lease = Lease(job.job_id, "w", 1)
    await domain.start(lease)
    reaper = Reaper(domain.core)
    assert await reaper.sweep() == 0
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(started_at=domain.clock.plus(-11))
        )
    await domain.heartbeat(lease)  # heartbeats do not extend the attempt's time budget
    assert await reaper.sweep() == 1
    final = await domain.get(job.job_id)
    assert final.status == "failed" and final.error_code == "JOB_TIMEOUT"


@pytest.mark.parametrize("relock", ["claim", "lock"])
async def test_retry_is_timed_from_its_own_start_not_the_last_attempts(
    make_domain: Callable[..., Any], relock: str
) -> None:
    """A lock opens a new attempt with no ``startedAt``: the reaper's JOB_TIMEOUT
    (``startedAt + timeoutSeconds < now``) cannot fire on attempt 2 from attempt 1's
    start while attempt 2 sits locked before its start call (reference §2.3)."""
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=30, MAX_RETRY_COUNT=2)
    job = await new_job(domain, timeout_seconds=10)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.start(Lease(job.job_id, "w1", 1))
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(started_at=domain.clock.plus(-11))
        )
    reaper = Reaper(domain.core)
    assert await reaper.sweep() == 1  # attempt 1 timed out: retried
    async with domain.sessions() as s, s.begin():  # its backoff has passed
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(available_at=domain.clock.plus(-1))
        )
    if relock == "claim":
        [locked] = await domain.claim("w2", CAPS, 1, 0)
    else:
        locked = await domain.lock(job.job_id, "w2")
    assert locked.status == "locked" and locked.attempt_no == 2
    assert locked.started_at is None
    assert await reaper.sweep() == 0  # attempt 2 has not started: only its lease counts
    started = await domain.start(Lease(job.job_id, "w2", 2))
    assert started.started_at is not None
    assert (await domain.get(job.job_id)).status == "running"


async def test_expiry_with_cancel_requested_ends_cancelled(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w", CAPS, 1, 0)
    await domain.cancel(job.job_id, user_id="u1", actor="user:u1")
    await _age_lease(domain, job.job_id)
    assert await Reaper(domain.core).sweep() == 1
    final = await domain.get(job.job_id)
    assert final.status == "cancelled" and final.retry_count == 0


async def test_reaper_leaves_a_renewed_lease_alone(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w", CAPS, 1, 0)
    reaper = Reaper(domain.core)
    # the reaper saw a candidate, but the job moved before its guarded UPDATE
    async with domain.sessions() as s, s.begin():
        assert await reaper._expire(s, job_id=job.job_id) is None
    assert (await domain.get(job.job_id)).status == "locked"


async def test_l7_worker_clock_skew_does_not_matter(
    domain: JobDomain, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 90)
    job = await new_job(domain)
    [claimed] = await domain.claim("fast-clock", CAPS, 1, 0)
    async with domain.sessions() as s:
        db_now = await domain.clock.read(s)
    assert claimed.lock_until is not None
    remaining = (claimed.lock_until - db_now).total_seconds()
    assert 29 <= remaining <= 30.5  # LOCK_LEASE_SECONDS=30 on the database clock
    await domain.heartbeat(Lease(job.job_id, "fast-clock", 1))
    assert await Reaper(domain.core).sweep() == 0
    assert (await domain.get(job.job_id)).status == "running"


async def test_reaper_task_runs_on_interval(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=0.2, REAPER_INTERVAL_SECONDS=0.1)
    job = await new_job(domain)
    await domain.claim("w", CAPS, 1, 0)
    stop = asyncio.Event()
    task = asyncio.create_task(Reaper(domain.core).run(stop))
    try:
        for _ in range(40):
            await asyncio.sleep(0.05)
            if (await domain.get(job.job_id)).status == "pending":
                break
        assert (await domain.get(job.job_id)).retry_count == 1
    finally:
        stop.set()
        await task
    async with domain.sessions() as s:
        status = (await s.execute(select(jobs.c.status))).scalars().all()
    assert "expired" not in status


async def test_departed_workers_are_purged_unless_they_hold_a_lease(
    make_domain: Callable[..., Any],
) -> None:
    """``ai_runtime_workers`` does not grow with every restarted instance: rows unseen
    for ``WORKER_RETENTION_SECONDS`` go, except an instance still holding a lease."""
    domain: JobDomain = await make_domain(WORKER_RETENTION_SECONDS=3600)
    reaper = Reaper(domain.core)
    job = await new_job(domain)
    await domain.claim("holder", CAPS, 1, 0)  # leases the job
    for instance in ("holder", "gone", "fresh"):
        await domain.seen(instance, CAPS)
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(workers)
            .where(workers.c.instance_id.in_(["holder", "gone"]))
            .values(last_seen_at=domain.clock.plus(-7200))
        )
    assert await reaper.purge_workers() == 1
    async with domain.sessions() as s:
        left = set((await s.execute(select(workers.c.instance_id))).scalars())
    assert left == {"holder", "fresh"}
    await _age_lease(domain, job.job_id)
    assert await reaper.sweep() == 1  # the lease lapses, the job goes back to pending
    assert await reaper.purge_workers() == 1
    async with domain.sessions() as s:
        left = set((await s.execute(select(workers.c.instance_id))).scalars())
    assert left == {"fresh"}
    assert await reaper.purge_workers() == 0
