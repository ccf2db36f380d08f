"""Case N7: a job leased when its user was erased goes, with its events, once its last
attempt ends, whichever way it ends (a result, a fail, a lapsed lease); its model calls
keep their tokens and cost under the pseudonym (reference §9.2)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.domain import JobDomain
from job_service.services.inputs import ModelCallInput
from job_service.store.tables import events, invocations, jobs
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]


def _call() -> ModelCallInput:
    return ModelCallInput(
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode="platform_key",
        credential_id=None,
        prompt_tokens=1000,
        completion_tokens=100,
        cache_hit_tokens=0,
        latency_ms=250,
        outcome="succeeded",
    )


async def _rows(domain: JobDomain, table: Any, job_id: str) -> int:
    async with domain.sessions() as s:
        return len((await s.execute(select(table).where(table.c.job_id == job_id))).all())


async def _erased_while_leased(domain: JobDomain) -> Lease:
    await new_job(domain, user_id="u-gone", target_id="u-gone")
    [job], _ = await domain.claim_started("w1", CAPS, 1, 0)
    await domain.erase_user("u-gone")
    kept = await domain.get(job.job_id)
    assert kept.cancel_requested and kept.user_id.startswith("erased-")
    return Lease(job.job_id, "w1", 1)


async def _gone(domain: JobDomain, lease: Lease) -> None:
    assert await _rows(domain, jobs, lease.job_id) == 0
    assert await _rows(domain, events, lease.job_id) == 0
    assert await _rows(domain, invocations, lease.job_id) == 0
    async with domain.sessions() as s:
        kept = (
            await s.execute(
                select(invocations.c.job_id).where(invocations.c.job_id.like("erased-%"))
            )
        ).all()
    assert kept, "the attempt's model call keeps its cost under the pseudonym"


async def test_a_result_of_an_erased_users_job_ends_it_and_it_goes(domain: JobDomain) -> None:
    lease = await _erased_while_leased(domain)
    with pytest.raises(AppError) as refused:
        await domain.submit_result(
            lease,
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[_call()],
        )
    assert refused.value.code == ErrorCode.INVALID_JOB_STATE
    await _gone(domain, lease)


async def test_a_fail_of_an_erased_users_job_ends_it_and_it_goes(domain: JobDomain) -> None:
    lease = await _erased_while_leased(domain)
    job = await domain.fail(lease, error_code="CANCELLED", error_message="ack", calls=[_call()])
    assert job.status == "cancelled"
    await _gone(domain, lease)


async def test_an_erased_users_job_whose_lease_lapses_goes(domain: JobDomain) -> None:
    lease = await _erased_while_leased(domain)
    await domain.record_invocation(
        job_id=lease.job_id,
        attempt_no=1,
        **{k: v for k, v in vars(_call()).items()},
    )
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == lease.job_id)
            .values(lock_until=domain.clock.plus(-1))
        )
    assert await Reaper(domain.core).sweep() == 1
    await _gone(domain, lease)
