"""The platform circuit breaker shared by two job_service replicas on one database (reference §6).

Each test runs twice: on one SQLite file and on one MariaDB database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import update

from airuntime_common.errors import AppError, ErrorCode
from job_service.store.tables import breaker as breaker_table
from tests.platform.conftest import Replica, Replicas, expect_refused
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

COOLDOWN = 60
OPEN = ErrorCode.PLATFORM_CIRCUIT_OPEN


async def ending(create_on: Replica, end_on: Replica, code: str, mode: str = "platform_key") -> str:
    """Create a job on one replica, then claim it and fail it with ``code`` on the other."""
    created = await create_on.create(mode=mode)
    job = await end_on.claim_one()
    assert job.job_id == created.job.job_id
    await end_on.fail(job, code)
    return str(job.job_id)


async def after_cooldown(r: Replicas) -> None:
    """Let the cool-down pass: move ``openedAt`` a day back (the cool-down is a minute,
    so nothing else in the test can reach half-open by timing)."""
    async with r.a.app.sessions() as session, session.begin():
        await session.execute(
            update(breaker_table)
            .where(breaker_table.c.opened_at.is_not(None))
            .values(opened_at=datetime(2000, 1, 1))
        )


async def both(r: Replicas) -> list[tuple[str, int]]:
    return [await r.a.breaker(), await r.b.breaker()]


async def probe_race(r: Replicas, n: int = 12) -> tuple[list[str], list[str]]:
    """``n`` concurrent platform creates spread over both replicas → (created ids, refusal codes)."""

    async def one(rep: Replica) -> str:
        return str((await rep.create()).job.job_id)

    answers = await asyncio.gather(
        *(one(r.a if i % 2 else r.b) for i in range(n)), return_exceptions=True
    )
    created = [a for a in answers if isinstance(a, str)]
    refused = [a.code for a in answers if isinstance(a, AppError)]
    assert len(created) + len(refused) == n, answers
    return created, refused


async def test_breaker_counts_across_replicas_and_probes_exactly(
    make_replicas: Callable[..., Any],
) -> None:
    r: Replicas = await make_replicas(
        BREAKER_FAILURE_THRESHOLD=3,
        BREAKER_COOLDOWN_SECONDS=COOLDOWN,
        BREAKER_HALF_OPEN_PROBES=2,
        MAX_RETRY_COUNT=0,
    )
    a, b = r.a, r.b
    # A platform job queued before the breaker opens (low priority: claimed last).
    queued = (await a.create(priority=9)).job.job_id
    # A failed platform job for the admin re-run checks later.
    failed_earlier = await ending(a, b, "INVALID_SCHEMA")

    await ending(a, b, "MODEL_TIMEOUT")  # failure 1, reported to B
    assert await both(r) == [("closed", 1), ("closed", 1)]
    # Neutral codes on platform-key attempts never move it, on either replica.
    for i, code in enumerate(["INVALID_SCHEMA", "MODEL_BAD_REQUEST", "WORKER_SHUTDOWN"]):
        await ending(a if i % 2 else b, b if i % 2 else a, code)
    # Failure codes on user-key attempts are not the platform's business.
    for code in ("MODEL_TIMEOUT", "INSUFFICIENT_BALANCE", "INVALID_CREDENTIAL"):
        await ending(b, a, code, mode="user_deepseek_key")
    assert await both(r) == [("closed", 1), ("closed", 1)]

    await ending(b, a, "NETWORK_ERROR")  # failure 2, reported to A
    assert await both(r) == [("closed", 2), ("closed", 2)]
    await ending(a, b, "TEMPORARY_PROVIDER_ERROR")  # failure 3 → open
    assert [s for s, _ in await both(r)] == ["open", "open"]

    # Open: new platform-key jobs and admin re-runs refused on both replicas.
    for rep in (a, b):
        await expect_refused(rep.create(), OPEN)
        await expect_refused(rep.rerun(failed_earlier), OPEN)
        user_job = await rep.create(mode="user_deepseek_key")
        assert user_job.job.job_id
    # Jobs already queued still run while open.
    claimed = await a.claim(limit=50)
    assert queued in {j.job_id for j in claimed}
    for job in claimed:
        await a.fail(job, "CANCELLED")  # neutral: clears the queue for the probe checks
    assert [s for s, _ in await both(r)] == ["open", "open"]

    # After the cool-down: exactly BREAKER_HALF_OPEN_PROBES probes among racing creates.
    await after_cooldown(r)
    probes, refused = await probe_race(r)
    assert len(probes) == 2 and set(refused) == {OPEN}
    assert [s for s, _ in await both(r)] == ["half_open", "half_open"]
    # A probe failure re-opens it.
    first = await b.claim_one()
    # (not a 429: that would also pause the provider for every lease, reference §10.2)
    await b.fail(first, "MODEL_TIMEOUT")
    assert [s for s, _ in await both(r)] == ["open", "open"]
    await expect_refused(a.create(), OPEN)
    for job in await a.claim():
        await a.fail(job, "CANCELLED")

    # Next cool-down: two new probes; a success closes the breaker.
    await after_cooldown(r)
    probes, refused = await probe_race(r)
    assert len(probes) == 2 and set(refused) == {OPEN}
    job = await a.claim_one()
    await a.succeed(job)
    assert await both(r) == [("closed", 0), ("closed", 0)]
    created, refused = await probe_race(r, 6)
    assert len(created) == 6 and not refused


async def test_stalled_half_open_reprobes_and_admin_reset(
    make_replicas: Callable[..., Any],
) -> None:
    r: Replicas = await make_replicas(
        migrate=True,  # the shipped migrations, 0002 included
        BREAKER_FAILURE_THRESHOLD=1,
        BREAKER_COOLDOWN_SECONDS=COOLDOWN,
        BREAKER_HALF_OPEN_PROBES=1,
        MAX_RETRY_COUNT=0,
    )
    a, b = r.a, r.b
    await ending(a, b, "INSUFFICIENT_BALANCE")
    assert (await b.breaker())[0] == "open"
    await expect_refused(a.create(), OPEN)
    await after_cooldown(r)
    probe = (await b.create()).job.job_id
    await expect_refused(a.create(), OPEN)
    # The probe is cancelled before any worker runs it: the breaker must not stay
    # half-open forever; with no probe left alive the next create is a new probe.
    await a.stub.CancelJob(rr.CancelJobRequest(job_id=probe, actor="admin"), metadata=a.md())
    second_probe = (await b.create()).job.job_id
    await expect_refused(a.create(), OPEN)
    assert (await a.breaker())[0] == "half_open"
    # Its failure re-opens the breaker; an admin reset on one replica closes it for both.
    job = await b.claim_one()
    assert job.job_id == second_probe
    await b.fail(job, "INVALID_CREDENTIAL")
    assert (await a.breaker())[0] == "open"
    await expect_refused(a.create(), OPEN)
    assert await b.reset_breaker() == "closed"
    assert await a.breaker() == ("closed", 0)
    assert (await a.create()).job.job_id
