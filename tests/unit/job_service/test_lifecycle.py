"""Happy path, events and result idempotency on the domain layer (reference §2.3, §2.5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, update

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.store.tables import jobs
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, business_rows, new_job

CAPS = ["learning_state_analysis"]


async def test_create_claim_start_heartbeat_succeed(domain: JobDomain) -> None:
    job = await new_job(domain)
    assert job.status == "pending" and job.attempt_no == 0 and job.retry_count == 0
    assert job.available_at == job.created_at
    assert job.max_retry_count == 3 and job.timeout_seconds == 120
    assert job.model_name == "deepseek-chat" and job.api_key_mode == "platform_key"
    assert job.target_id == "u1"

    [claimed] = await domain.claim("w1", CAPS, 10, 0)
    assert claimed.job_id == job.job_id
    assert claimed.status == "locked" and claimed.locked_by == "w1" and claimed.attempt_no == 1
    assert claimed.lock_until is not None and claimed.locked_at is not None
    lease = Lease(job.job_id, "w1", 1)

    started = await domain.start(lease)
    assert started.status == "running" and started.started_at is not None
    again = await domain.start(lease)
    assert again.started_at == started.started_at

    beat = await domain.heartbeat(lease)
    assert beat.lock_until is not None and beat.lock_until >= claimed.lock_until
    assert beat.cancel_requested is False

    out = await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )
    assert out.status == "succeeded" and not out.replayed
    assert out.output_hash == content_hash(ANALYSIS_OUTPUT)
    done = await domain.get(job.job_id)
    assert done.status == "succeeded" and done.finished_at is not None and done.lock_until is None
    assert done.prompt_version == "learning_state_analysis.v1"
    assert await business_rows(domain, job.job_id) == 1

    evs, _ = await domain.history(job.job_id)
    assert [(e.from_status, e.to_status) for e in evs] == [
        (None, "pending"),
        ("pending", "locked"),
        ("locked", "running"),
        ("running", "succeeded"),
    ]
    assert [e.attempt_no for e in evs] == [0, 1, 1, 1]


async def test_result_replay_conflict_and_lease_order(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    first = await domain.submit_result(
        lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
    )
    # exact replay → 200 replayed, even though the job is terminal; nothing written twice
    replay = await domain.submit_result(
        lease, prompt_version=None, output_schema_version="v1", output=dict(ANALYSIS_OUTPUT)
    )
    assert replay.replayed and replay.result_id == first.result_id
    assert await business_rows(domain, job.job_id) == 1
    # a different output → RESULT_ALREADY_EXISTS (before the lease check)
    other = {**ANALYSIS_OUTPUT, "summary": "different"}
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            lease, prompt_version=None, output_schema_version="v1", output=other
        )
    assert err.value.code == "RESULT_ALREADY_EXISTS"
    # a stranger: RESULT_ALREADY_EXISTS still wins over LOCK_NOT_HELD
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "w2", 1),
            prompt_version=None,
            output_schema_version="v1",
            output=other,
        )
    assert err.value.code == "RESULT_ALREADY_EXISTS"
    # the SAME output under another attempt number is neither a replay (other key) nor
    # another result (same hash): the lease decides (reference §2.5 order)
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "w1", 2),
            prompt_version=None,
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
        )
    assert err.value.code == "LOCK_NOT_HELD"
    assert await business_rows(domain, job.job_id) == 1


async def test_racing_identical_results_are_all_answered_as_one(domain: JobDomain) -> None:
    """The same result sent 3 times at once (a worker retrying while its first send is
    still in flight): one is accepted, the others are replays, none is LOCK_NOT_HELD
    (reference §2.5: the exact replay is checked first). On MariaDB the losers' locking
    read waits for the winner's commit, after which the replay must still be seen."""
    for _ in range(8):
        job = await new_job(domain)
        await domain.claim("w1", CAPS, 1, 0)
        lease = Lease(job.job_id, "w1", 1)
        answers = await asyncio.gather(
            *(
                domain.submit_result(
                    lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
                )
                for _ in range(3)
            )
        )
        assert sorted(a.replayed for a in answers) == [False, True, True]
        assert len({a.result_id for a in answers}) == 1
        assert {a.status for a in answers} == {"succeeded"}
        assert await business_rows(domain, job.job_id) == 1


async def test_invalid_schema_fails_job_and_rolls_back_rows(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    bad = {**ANALYSIS_OUTPUT, "summary": "forbidden"}
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            lease, prompt_version=None, output_schema_version="v1", output=bad
        )
    assert err.value.code == "INVALID_SCHEMA"
    after = await domain.get(job.job_id)
    assert after.status == "failed" and after.error_code == "INVALID_SCHEMA"
    assert after.error_message == "cites a block outside the snapshot"
    assert after.retry_count == 0
    assert await business_rows(domain, job.job_id) == 0


async def test_schema_mismatch_is_invalid_schema(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "w1", 1),
            prompt_version=None,
            output_schema_version="v1",
            output={"items": []},
        )
    assert err.value.code == "INVALID_SCHEMA"
    assert (await domain.get(job.job_id)).status == "failed"


async def test_lapsed_lease_is_dead_before_the_reaper(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    # Move lockUntil into the past (as if time passed) — the reaper has not run.
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs).where(jobs.c.job_id == job.job_id).values(lock_until=domain.clock.plus(-1))
        )
    for call in (domain.heartbeat(lease), domain.start(lease)):
        with pytest.raises(AppError) as err:
            await call
        assert err.value.code == "LOCK_NOT_HELD"
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
        )
    assert err.value.code == "LOCK_NOT_HELD"
    with pytest.raises(AppError) as err:
        await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="x")
    assert err.value.code == "LOCK_NOT_HELD"
    async with domain.sessions() as s:
        status = (
            await s.execute(select(jobs.c.status).where(jobs.c.job_id == job.job_id))
        ).scalar_one()
    assert status == "locked"


async def test_every_change_of_the_row_moves_its_version(domain: JobDomain) -> None:
    """The ETag of reference §9.1 follows every UPDATE of a job: lock, start, a lease renewal,
    a cancel request, the ending."""
    job = await new_job(domain)
    seen = [job.version]
    await domain.claim("w1", ["learning_state_analysis"], 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    for step in (
        lambda: domain.get(job.job_id),
        lambda: domain.start(lease),
        lambda: domain.heartbeat(lease),
        lambda: domain.cancel(job.job_id, user_id="u1", actor="user:u1"),
    ):
        await step()
        seen.append((await domain.get(job.job_id)).version)
    await domain.fail(lease, error_code="CANCELLED", error_message="stopped")
    seen.append((await domain.get(job.job_id)).version)
    assert seen == [0, 1, 2, 3, 4, 5]


async def test_the_gauges_show_queue_age_spend_budget_and_live_workers(
    make_domain: Callable[..., Any],
) -> None:
    """The gauges the alert rules read (deploy/prometheus/alerts.yml)."""
    from prometheus_client import REGISTRY

    domain: JobDomain = await make_domain(PLATFORM_DAILY_BUDGET_USD=12.5)
    await new_job(domain)
    await domain.seen("w-live", ["learning_state_analysis"])
    await asyncio.sleep(0.05)
    await domain.refresh_gauges()
    get = REGISTRY.get_sample_value
    age = get("airt_jobs_oldest_pending_age_seconds", {"job_type": "learning_state_analysis"})
    assert age is not None and 0 < age < 60
    assert get("airt_jobs_oldest_pending_age_seconds", {"job_type": "quiz_generation"}) == 0
    assert get("airt_platform_budget_usd") == 12.5
    assert get("airt_platform_spend_usd") == 0
    assert get("airt_runtime_workers_live") == 1
