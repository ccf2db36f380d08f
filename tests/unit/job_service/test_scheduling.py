"""Poll / claim ordering, filters, limits, long poll and the worker registry (reference §2.6, §3)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import pytest

from airuntime_common.errors import AppError
from job_service.services.domain import JobDomain
from tests.unit.job_service.conftest import new_job

ALL = ["learning_state_analysis", "quiz_generation"]


async def test_order_priority_then_creation(domain: JobDomain) -> None:
    low = await new_job(domain, priority=5)
    first = await new_job(domain)
    second = await new_job(domain)
    quiz = await new_job(domain, job_type="quiz_generation", target_type="material", target_id="m")
    polled = await domain.poll("w", ALL, 10, 0)
    assert [j.job_id for j in polled] == [first.job_id, second.job_id, quiz.job_id, low.job_id]
    only_quiz = await domain.poll("w", ["quiz_generation"], 10, 0)
    assert [j.job_id for j in only_quiz] == [quiz.job_id]
    claimed = await domain.claim("w", ALL, 2, 0)
    assert [j.job_id for j in claimed] == [first.job_id, second.job_id]
    # leased jobs never appear again
    assert [j.job_id for j in await domain.poll("w", ALL, 10, 0)] == [quiz.job_id, low.job_id]


async def test_limit_defaults_and_cap(domain: JobDomain) -> None:
    for i in range(55):
        await new_job(domain, idempotency_key=str(i))
    assert len(await domain.poll("w", ALL, 0, 0)) == 10
    assert len(await domain.poll("w", ALL, 500, 0)) == 50
    assert len(await domain.claim("w", ALL, 500, 0)) == 50


@pytest.mark.parametrize(
    ("caps", "limit", "wait"),
    [([], 1, 0), (["poetry"], 1, 0), (ALL, -1, 0), (ALL, 1, 20001), (ALL, 1, -1)],
)
async def test_bad_poll_arguments(
    domain: JobDomain, caps: list[str], limit: int, wait: int
) -> None:
    with pytest.raises(AppError) as err:
        await domain.poll("w", caps, limit, wait)
    assert err.value.code == "INVALID_ARGUMENT"


async def test_long_poll_wakes_on_create(domain: JobDomain) -> None:
    loop = asyncio.get_running_loop()
    waiter = asyncio.create_task(domain.claim("w", ALL, 1, 5000))
    await asyncio.sleep(0.1)
    job = await new_job(domain)
    created = loop.time()
    [got] = await asyncio.wait_for(waiter, 2)
    assert got.job_id == job.job_id and got.status == "locked"
    # Woken by the create, far sooner than the 5 s wait.
    assert loop.time() - created < 1.0


async def test_long_poll_finds_jobs_from_another_replica(make_domain: Callable[..., Any]) -> None:
    a: JobDomain = await make_domain()
    b: JobDomain = await make_domain()  # another process: its signal does not reach `a`
    waiter = asyncio.create_task(a.poll("w", ALL, 1, 3000))
    await asyncio.sleep(0.1)
    job = await new_job(b)
    [got] = await asyncio.wait_for(waiter, 2)
    assert got.job_id == job.job_id


async def test_long_poll_times_out_empty(domain: JobDomain) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await domain.poll("w", ALL, 1, 300) == []
    assert 0.25 <= loop.time() - started < 1.5


async def test_lock_errors(domain: JobDomain) -> None:
    job = await new_job(domain)
    with pytest.raises(AppError) as err:
        await domain.lock("missing", "w")
    assert err.value.code == "JOB_NOT_FOUND"
    locked = await domain.lock(job.job_id, "w1")
    assert locked.attempt_no == 1 and locked.locked_by == "w1"
    with pytest.raises(AppError) as err:
        await domain.lock(job.job_id, "w2")
    assert err.value.code == "JOB_ALREADY_LOCKED"
    assert (await domain.get(job.job_id)).locked_by == "w1"


async def test_registry_and_health(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(WORKER_ALIVE_MIN_SECONDS=0, POLL_INTERVAL_MS=100)
    serving, found = await domain.health()
    assert not serving and found == []
    await domain.seen("w1", ["quiz_generation"], "10.0.0.1:50053")
    job = await new_job(domain)
    await domain.lock(job.job_id, "w1")
    serving, found = await domain.health()
    assert serving
    [w] = found
    assert (w.instance_id, w.capabilities, w.in_flight, w.status, w.status_address) == (
        "w1",
        ["quiz_generation"],
        1,
        "alive",
        "10.0.0.1:50053",
    )
    await asyncio.sleep(0.35)  # > 3 poll intervals
    serving, found = await domain.health()
    assert not serving and found[0].status == "stale"


async def test_heartbeat_leases_batch(domain: JobDomain) -> None:
    a = await new_job(domain)
    b = await new_job(domain)
    await domain.claim("w", ALL, 10, 0)
    await domain.cancel(b.job_id, user_id=None, actor="admin:x")
    answers = await domain.heartbeat_leases(
        "w", [(a.job_id, 1), (b.job_id, 1), (a.job_id, 2), ("zzz", 1)]
    )
    assert [(x.job_id, x.held, x.cancel_requested) for x in answers] == [
        (a.job_id, True, False),
        (b.job_id, True, True),
        (a.job_id, False, False),
        ("zzz", False, False),
    ]
    assert (await domain.get(a.job_id)).status == "running"
    with pytest.raises(AppError) as err:
        await domain.heartbeat_leases("w", [("x", 1)] * 501)
    assert err.value.code == "INVALID_ARGUMENT"


async def test_list_paging(domain: JobDomain) -> None:
    ids = [(await new_job(domain)).job_id for _ in range(5)]
    await new_job(domain, user_id="u2")
    page1, token = await domain.list_jobs(
        user_id="u1", status=None, job_type=None, page_size=2, page_token=""
    )
    page2, token2 = await domain.list_jobs(
        user_id="u1", status=None, job_type=None, page_size=2, page_token=token
    )
    page3, token3 = await domain.list_jobs(
        user_id="u1", status=None, job_type=None, page_size=2, page_token=token2
    )
    assert [j.job_id for j in page1 + page2 + page3] == ids[::-1]
    assert token and token2 and token3 == ""
    for size in (101, -1):
        with pytest.raises(AppError):
            await domain.list_jobs(
                user_id=None, status=None, job_type=None, page_size=size, page_token=""
            )
    with pytest.raises(AppError):
        await domain.list_jobs(
            user_id=None, status=None, job_type=None, page_size=1, page_token="!!!"
        )


@pytest.mark.parametrize(
    "raw",
    [
        "t:2026-12-02T05:25:44.728000|9223372036854775808",  # past BIGINT
        "s:9223372036854775808",
        "s:-1",
        "t:2026-12-02T05:25:44+08:00|5",  # the database's times are naive UTC
        "t:2026-12-02T05:25:44",  # no seq
        "x",
    ],
)
async def test_a_crafted_page_token_is_refused_not_a_500(domain: JobDomain, raw: str) -> None:
    """Opaque tokens come back from callers (reference §3.1): anything the server did not
    write is INVALID_ARGUMENT naming ``pageToken``, for a user's list and for all jobs."""
    await new_job(domain)
    token = base64.urlsafe_b64encode(raw.encode()).decode()
    for user_id in ("u1", None):
        with pytest.raises(AppError) as err:
            await domain.list_jobs(
                user_id=user_id, status=None, job_type=None, page_size=5, page_token=token
            )
        assert (err.value.code, err.value.details) == ("INVALID_ARGUMENT", {"field": "pageToken"})


def test_registry_writes_on_change_or_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy worker's claims do not each upsert its registry row; new facts do at once."""
    from job_service.maintenance import workers as scheduler
    from job_service.store.clock import DbClock

    now = [100.0]
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: now[0])
    reg = scheduler.WorkerRegistry(DbClock("sqlite"))
    caps = ["quiz_generation", "flashcard_generation"]
    assert reg.due("w1", caps, "10.0.0.1:50053")  # first sight
    assert not reg.due("w1", caps, "10.0.0.1:50053")  # same facts, same second
    assert not reg.due("w1")  # a heartbeat brings no facts
    assert reg.due("w1", ["quiz_generation"], None)  # capabilities changed
    assert not reg.due("w1", ["quiz_generation"], "10.0.0.1:50053")
    assert reg.due("w1", ["quiz_generation"], "10.0.0.2:50053")  # address changed
    assert reg.due("w2", caps)  # another instance
    now[0] += scheduler.TOUCH_EVERY_SECONDS
    assert reg.due("w1")  # a second later: written again (last_seen_at)
    assert not reg.due("w1", ["quiz_generation"], "10.0.0.2:50053")  # facts were remembered
