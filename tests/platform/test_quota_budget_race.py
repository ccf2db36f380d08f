"""Daily quota and platform budget under concurrent creates on two replicas (reference §6).

Each test runs on one SQLite file and on one MariaDB database shared by both replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from airuntime_common.enums import JOB_STATUS
from airuntime_common.errors import AppError, ErrorCode
from job_service.store.tables import jobs
from tests.platform.conftest import Replicas, expect_refused, unique_user

N = 50


async def race(r: Replicas, n: int, **kw: Any) -> tuple[list[str], list[str]]:
    """``n`` concurrent creates alternating between the replicas → (job ids, refusal codes)."""

    async def one(i: int) -> str:
        rep = r.a if i % 2 else r.b
        return str((await rep.create(**kw)).job.job_id)

    answers = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    created = [a for a in answers if isinstance(a, str)]
    refused = [a.code for a in answers if isinstance(a, AppError)]
    assert len(created) + len(refused) == n, [a for a in answers if not isinstance(a, str)]
    return created, refused


async def statuses_of(r: Replicas, user_id: str) -> list[str]:
    """The status of every job of ``user_id``."""
    async with r.a.app.sessions() as session:
        stmt = select(jobs.c.status).where(jobs.c.user_id == user_id)
        return list((await session.execute(stmt)).scalars().all())


async def jobs_of(r: Replicas, user_id: str) -> int:
    async with r.a.app.sessions() as session:
        stmt = select(func.count()).select_from(jobs).where(jobs.c.user_id == user_id)
        return int((await session.execute(stmt)).scalar_one())


async def test_daily_quota_is_exact_under_concurrent_creates(
    make_replicas: Callable[..., Any],
) -> None:
    r: Replicas = await make_replicas(USER_DAILY_JOB_QUOTA=5, PLAN_DAILY_JOB_QUOTAS={"pro": 8})
    # Default quota, both key modes counting: exactly 5 of 50 racing creates.
    user = unique_user()
    created, refused = await race(r, N // 2, user_id=user)
    more, refused2 = await race(r, N // 2, user_id=user, mode="user_deepseek_key")
    assert len(created) + len(more) == 5
    assert set(refused + refused2) == {ErrorCode.QUOTA_EXCEEDED}
    assert await jobs_of(r, user) == 5
    # The token's plan picks its own quota.
    pro = unique_user()
    created, refused = await race(r, N, user_id=pro, plan="pro")
    assert len(created) == 8 and set(refused) == {ErrorCode.QUOTA_EXCEEDED}
    assert await jobs_of(r, pro) == 8
    # Another user is not affected; an unknown plan falls back to the default.
    other = unique_user()
    created, _ = await race(r, 10, user_id=other, plan="gold")
    assert len(created) == 5


async def test_idempotent_repeats_get_the_original_even_at_the_quota(
    make_replicas: Callable[..., Any],
) -> None:
    r: Replicas = await make_replicas(USER_DAILY_JOB_QUOTA=1)
    user = unique_user()
    created, refused = await race(r, 20, user_id=user, key="same-key")
    assert not refused and len(set(created)) == 1
    assert await jobs_of(r, user) == 1
    await expect_refused(r.a.create(user_id=user, key="another-key"), ErrorCode.QUOTA_EXCEEDED)


async def test_platform_budget_refuses_platform_creates_on_both_replicas(
    make_replicas: Callable[..., Any],
) -> None:
    r: Replicas = await make_replicas(
        USER_DAILY_JOB_QUOTA=0,  # unlimited
        PLATFORM_DAILY_BUDGET_USD=0.05,
        MODEL_PRICES={"deepseek-chat": {"cacheHitInput": 0, "cacheMissInput": 1000, "output": 0}},
    )
    jobs = {
        mode: (await r.a.create(mode=mode)).job for mode in ("platform_key", "user_deepseek_key")
    }
    assert len(await r.a.claim(limit=2)) == 2  # the calls below are of their first attempts

    async def spend(tokens: int, mode: str = "platform_key") -> None:
        await r.b.app.domain.record_invocation(
            job_id=jobs[mode].job_id,
            attempt_no=1,
            model_provider="deepseek",
            model_name="deepseek-chat",
            api_key_mode=mode,
            credential_id=None,
            prompt_tokens=tokens,
            completion_tokens=0,
            cache_hit_tokens=0,
            latency_ms=1,
            outcome="succeeded",
            error_code=None,
            provider_request_id=None,
        )

    await spend(49)  # $0.049 of $0.05
    await spend(500, mode="user_deepseek_key")  # users' own keys never count
    created, refused = await race(r, N)
    assert len(created) == N and not refused
    await spend(1)  # $0.050: the cap is reached
    created, refused = await race(r, N)
    assert not created and set(refused) == {ErrorCode.PLATFORM_BUDGET_EXCEEDED}
    user_jobs, refused = await race(r, 10, mode="user_deepseek_key")
    assert len(user_jobs) == 10 and not refused


async def test_revoke_racing_creates_leaves_no_pending_job(
    make_replicas: Callable[..., Any],
) -> None:
    """reference §6: after a revoke commits, none of the user's jobs is pending, even with
    creates racing it on both replicas (creates and the revoke share the user's lock)."""
    r: Replicas = await make_replicas(USER_DAILY_JOB_QUOTA=0)
    user = unique_user()

    async def revoke() -> None:
        await asyncio.sleep(0.02)
        await r.b.app.domain.set_authorization(user, False)

    created_task = asyncio.ensure_future(race(r, 30, user_id=user))
    await revoke()
    created, refused = await created_task
    assert set(refused) <= {ErrorCode.AI_NOT_AUTHORIZED}
    statuses = await statuses_of(r, user)
    assert len(statuses) == len(created)
    assert "pending" not in statuses, statuses
    # New creates stay refused until granted again.
    await expect_refused(r.a.create(user_id=user), ErrorCode.AI_NOT_AUTHORIZED)


async def test_revoke_racing_reruns_leaves_no_pending_job(
    make_replicas: Callable[..., Any],
) -> None:
    """reference §6 with §2.3: an admin re-run makes a new job, so it is refused once a
    revoke has committed, like a create; re-runs racing the revoke on both replicas
    leave none of the user's jobs pending (they take the user's lock as creates do)."""
    r: Replicas = await make_replicas(USER_DAILY_JOB_QUOTA=0, MAX_RETRY_COUNT=0)
    user = unique_user()
    for _ in range(20):
        await r.a.create(user_id=user)
    mine = [job for job in await r.a.claim(limit=100) if job.user_id == user]
    assert len(mine) == 20
    for job in mine:
        assert JOB_STATUS.to_str((await r.a.fail(job, "MODEL_BAD_REQUEST")).status) == "failed"
    failed_ids = [job.job_id for job in mine]

    first_answer = asyncio.Event()

    async def rerun(i: int) -> str:
        rep = r.a if i % 2 else r.b
        try:
            return str((await rep.rerun(failed_ids[i])).job.job_id)
        finally:
            first_answer.set()

    async def revoke() -> None:  # once one re-run is in, while the others are in flight
        await first_answer.wait()
        await r.b.app.domain.set_authorization(user, False)

    reruns = asyncio.ensure_future(
        asyncio.gather(*(rerun(i) for i in range(len(failed_ids))), return_exceptions=True)
    )
    await revoke()
    answers = await reruns
    created = [a for a in answers if isinstance(a, str)]
    refused = [a.code for a in answers if isinstance(a, AppError)]
    assert len(created) + len(refused) == len(failed_ids), answers
    assert set(refused) <= {ErrorCode.AI_NOT_AUTHORIZED}
    statuses = await statuses_of(r, user)
    assert len(statuses) == len(failed_ids) + len(created)
    assert "pending" not in statuses, statuses
    await expect_refused(r.a.rerun(failed_ids[0]), ErrorCode.AI_NOT_AUTHORIZED)
