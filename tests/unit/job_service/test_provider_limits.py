"""Provider rate limits and pauses at lease grant (reference §10.2), on SQLite and MariaDB."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.maintenance import breaker as breaker_mod
from job_service.maintenance.parking import ParkingLot
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput, ModelCallInput
from job_service.store.records import JobRecord
from job_service.store.tables import breaker, credential_pauses, grants, jobs
from tests.unit.job_service.batch_support import make_batch
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT

CAPS = ["learning_state_analysis"]
ESTIMATE = jobtypes.get("learning_state_analysis").token_estimate


def providers(*entries: dict[str, Any]) -> str:
    return json.dumps(
        [{"baseUrl": "https://p.example.com", "apiKeyEnv": "P_KEY", **e} for e in entries]
    )


async def limited(make_domain: Callable[..., Any], *entries: dict[str, Any]) -> JobDomain:
    domain: JobDomain = await make_domain(
        MODEL_PROVIDERS=providers(*entries), USER_DAILY_JOB_QUOTA=0
    )
    async with domain.sessions() as s, s.begin():
        await breaker_mod.ensure_rows(s, domain.clock, [e["name"] for e in entries])
    return domain


async def create(domain: JobDomain, user: str = "u1", **kw: Any) -> JobRecord:
    job, _ = await domain.create(
        CreateJobInput(user, "learning_state_analysis", "user", user, **kw)
    )
    return job


def call(tokens: int = 100, **kw: Any) -> ModelCallInput:
    return ModelCallInput(
        model_provider=kw.get("model_provider", ""),
        model_name="deepseek-chat",
        api_key_mode=kw.get("api_key_mode", "platform_key"),
        credential_id=kw.get("credential_id"),
        prompt_tokens=tokens,
        completion_tokens=0,
        cache_hit_tokens=0,
        latency_ms=10,
        outcome=kw.get("outcome", "succeeded"),
    )


async def parked(domain: JobDomain) -> dict[str, Any]:
    async with domain.sessions() as s:
        rows = await s.execute(
            select(jobs.c.job_id, jobs.c.parked_until).where(jobs.c.parked_until.is_not(None))
        )
        return {str(j): u for j, u in rows.all()}


async def test_requests_per_minute_bound_the_grants(make_domain: Callable[..., Any]) -> None:
    domain = await limited(make_domain, {"name": "p1", "limits": {"requestsPerMinute": 3}})
    made = [await create(domain) for _ in range(5)]
    got = await domain.claim("w", CAPS, 5, 0)
    assert [j.job_id for j in got] == [j.job_id for j in made[:3]]
    assert all(j.model_provider == "p1" for j in got)
    waiting = await parked(domain)
    assert set(waiting) == {made[3].job_id, made[4].job_id}
    now = await db_now(domain)
    for until in waiting.values():  # until the window's oldest grant ages out
        assert now + timedelta(seconds=50) < until <= now + timedelta(seconds=63)
    assert await domain.claim("w", CAPS, 5, 0) == []  # none claimable: no scan past them
    async with domain.sessions() as s:
        rows = (await s.execute(select(grants.c.job_id, grants.c.tokens_reserved))).all()
    assert sorted(r[0] for r in rows) == sorted(j.job_id for j in got)
    assert {r[1] for r in rows} == {ESTIMATE}
    for job in (made[3], made[4]):  # no attempt, no retry, no error
        after = await domain.get(job.job_id)
        assert (after.status, after.attempt_no, after.retry_count, after.error_code) == (
            "pending",
            0,
            0,
            None,
        )


async def test_at_most_max_concurrent_hold_a_lease(make_domain: Callable[..., Any]) -> None:
    domain = await limited(make_domain, {"name": "p1", "limits": {"maxConcurrent": 2}})
    made = [await create(domain) for _ in range(4)]
    first = await domain.claim("w", CAPS, 4, 0)
    assert len(first) == 2
    await domain.submit_result(
        Lease(first[0].job_id, "w", 1),
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call(500)],
    )
    await _due(domain)
    assert await ParkingLot(domain.core).run_once() == 2
    second = await domain.claim("w", CAPS, 4, 0)
    assert [j.job_id for j in second] == [made[2].job_id]  # one slot freed, one taken
    async with domain.sessions() as s:
        ended = (
            await s.execute(
                select(grants.c.tokens_used, grants.c.ended_at).where(
                    grants.c.job_id == first[0].job_id
                )
            )
        ).one()
    assert ended[0] == 500 and ended[1] is not None  # settled with what the calls used


async def test_tokens_per_minute_count_reserved_then_used_tokens(
    make_domain: Callable[..., Any],
) -> None:
    tpm = 2 * ESTIMATE + 10
    domain = await limited(make_domain, {"name": "p1", "limits": {"tokensPerMinute": tpm}})
    for _ in range(4):
        await create(domain)
    first = await domain.claim("w", CAPS, 4, 0)
    assert len(first) == 2  # two estimates fit, a third would not
    for job in first:
        await domain.submit_result(
            Lease(job.job_id, "w", 1),
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[call(5)],
        )
    await _due(domain)
    await ParkingLot(domain.core).run_once()
    assert len(await domain.claim("w", CAPS, 4, 0)) == 2  # settled at 10 tokens: room again


async def test_a_full_provider_is_skipped_for_the_next(make_domain: Callable[..., Any]) -> None:
    domain = await limited(
        make_domain,
        {"name": "p1", "limits": {"requestsPerMinute": 1}},
        {"name": "p2"},
    )
    for _ in range(3):
        await create(domain)
    got = await domain.claim("w", CAPS, 3, 0)
    assert [j.model_provider for j in got] == ["p1", "p2", "p2"]
    assert await parked(domain) == {}


async def test_a_429_pauses_its_provider_for_every_lease(make_domain: Callable[..., Any]) -> None:
    domain = await limited(make_domain, {"name": "p1"}, {"name": "p2"})
    made = [await create(domain) for _ in range(3)]
    [job] = await domain.claim("w", CAPS, 1, 0)
    assert job.model_provider == "p1"
    await domain.fail(
        Lease(job.job_id, "w", 1),
        error_code="MODEL_RATE_LIMIT",
        error_message="429",
        retry_after_seconds=20,
        calls=[call(outcome="failed")],
    )
    async with domain.sessions() as s:
        until = (
            await s.execute(select(breaker.c.paused_until).where(breaker.c.provider == "p1"))
        ).scalar_one()
    now = await db_now(domain)
    assert now + timedelta(seconds=19) < until <= now + timedelta(seconds=21)
    got = await domain.claim("w", CAPS, 2, 0)
    assert [j.model_provider for j in got] == ["p2", "p2"]  # failover around the pause
    assert {j.job_id for j in got} == {made[1].job_id, made[2].job_id}


async def test_a_paused_provider_with_no_other_parks_its_jobs(
    make_domain: Callable[..., Any],
) -> None:
    domain = await limited(make_domain, {"name": "p1"})
    for _ in range(3):
        await create(domain)
    [job] = await domain.claim("w", CAPS, 1, 0)
    await domain.fail(
        Lease(job.job_id, "w", 1), error_code="MODEL_RATE_LIMIT", error_message="429"
    )  # no Retry-After: 10 s
    assert await domain.claim("w", CAPS, 3, 0) == []
    waiting = await parked(domain)
    now = await db_now(domain)
    assert len(waiting) == 3  # the retried one too (its backoff here is 0)
    assert all(
        now + timedelta(seconds=8) < u <= now + timedelta(seconds=11) for u in waiting.values()
    )
    with pytest.raises(AppError) as refused:  # the shim's lock answers 429 with a wait
        await domain.lock(next(iter(waiting)), "w")
    assert refused.value.code == ErrorCode.NO_PROVIDER_CAPACITY
    assert 1 <= refused.value.details["retryAfterSeconds"] <= 11


async def test_a_user_keys_429_pauses_that_key_only(make_domain: Callable[..., Any]) -> None:
    domain = await limited(make_domain, {"name": "p1"})
    a = await create(domain, "ua", api_key_mode="user_deepseek_key")
    b = await create(domain, "ua", api_key_mode="user_deepseek_key")
    other = await create(domain, "ub", api_key_mode="user_deepseek_key")
    platform = await create(domain, "uc")
    async with domain.sessions() as s, s.begin():
        await s.execute(update(jobs).where(jobs.c.user_id == "ua").values(credential_id="cred-a"))
        await s.execute(update(jobs).where(jobs.c.user_id == "ub").values(credential_id="cred-b"))
    [first] = await domain.claim("w", CAPS, 1, 0)
    assert first.job_id == a.job_id
    await domain.fail(
        Lease(a.job_id, "w", 1),
        error_code="MODEL_RATE_LIMIT",
        error_message="429",
        retry_after_seconds=30,
        calls=[call(outcome="failed", api_key_mode="user_deepseek_key", credential_id="cred-a")],
    )
    got = await domain.claim("w", CAPS, 3, 0)
    assert {j.job_id for j in got} == {other.job_id, platform.job_id}
    assert set(await parked(domain)) == {b.job_id, a.job_id}  # a: its retry's backoff too
    async with domain.sessions() as s:
        rows = (await s.execute(select(credential_pauses.c.credential_id))).all()
    assert [r[0] for r in rows] == ["cred-a"]


async def db_now(domain: JobDomain) -> Any:
    async with domain.sessions() as s:
        return await domain.clock.read(s)


async def _due(domain: JobDomain) -> None:
    """Every parked job's time has come."""
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.parked_until.is_not(None))
            .values(parked_until=domain.clock.plus(-1))
        )


async def test_a_results_claim_of_its_slots_next_job_keeps_the_limits(
    make_domain: Callable[..., Any],
) -> None:
    """The claim a result makes for the slot it frees is a lease grant like any other:
    with its provider's minute used up, the result is taken, it claims nothing, and the
    job it read is parked (no attempt, no retry)."""
    domain = await limited(make_domain, {"name": "p1", "limits": {"requestsPerMinute": 2}})
    made = [await create(domain) for _ in range(3)]
    got = await domain.claim("w", CAPS, 2, 0)
    assert [j.job_id for j in got] == [j.job_id for j in made[:2]]
    started = await domain.start(Lease(got[0].job_id, "w", 1))
    outcome = await domain.submit_result(
        Lease(started.job_id, "w", 1),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call()],
        claim_next=(CAPS, 1),
    )
    assert outcome.status == "succeeded"
    assert outcome.claimed is not None and outcome.claimed.jobs == []
    assert set(await parked(domain)) == {made[2].job_id}
    after = await domain.get(made[2].job_id)
    assert (after.status, after.attempt_no, after.retry_count) == ("pending", 0, 0)


async def test_a_running_batch_parent_holds_no_provider_room(
    make_domain: Callable[..., Any],
) -> None:
    """A batch's parent is running while a child runs, but it is no attempt: with
    ``maxConcurrent`` 1 the first child's result claims the next child (the attempt the
    result ends frees its room in the same transaction), and the provider's in-flight
    count is its children's leases only (reference §10.2, §10.3)."""
    domain = await limited(make_domain, {"name": "p1", "limits": {"maxConcurrent": 1}})
    parent = await make_batch(domain, 2)
    first = await domain.claim("w", CAPS, 1, 0)
    assert len(first) == 1
    assert (await domain.get(parent.job_id)).status == "running"
    rooms = await _rooms(domain)
    assert rooms["p1"].in_flight == 1
    outcome = await domain.submit_result(
        Lease(first[0].job_id, "w", 1),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call()],
        claim_next=(CAPS, 1),
    )
    assert outcome.claimed is not None and len(outcome.claimed.jobs) == 1  # the other child
    second = outcome.claimed.jobs[0]
    assert second.parent_job_id == parent.job_id
    assert (await _rooms(domain))["p1"].in_flight == 1


async def _rooms(domain: JobDomain) -> dict[str, Any]:
    from job_service.maintenance import limits

    configs = [c for c in (domain.core.provider("p1"),) if c is not None]
    async with domain.sessions() as s, s.begin():
        return await limits.read_rooms(s, domain.clock, configs)


async def test_a_results_claim_counts_the_attempt_it_ends_as_done(
    make_domain: Callable[..., Any],
) -> None:
    """With ``maxConcurrent`` 1, the result of the one attempt in flight claims the next
    job in its own transaction: the lease it ends frees the room it takes."""
    domain = await limited(make_domain, {"name": "p1", "limits": {"maxConcurrent": 1}})
    made = [await create(domain) for _ in range(2)]
    got = await domain.claim("w", CAPS, 1, 0)
    assert [j.job_id for j in got] == [made[0].job_id]
    outcome = await domain.submit_result(
        Lease(got[0].job_id, "w", 1),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call()],
        claim_next=(CAPS, 1),
    )
    assert outcome.claimed is not None
    assert [j.job_id for j in outcome.claimed.jobs] == [made[1].job_id]
    assert (await _rooms(domain))["p1"].in_flight == 1
