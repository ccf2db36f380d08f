"""Per-version stats, the guard that rolls a bad variant back, and learners' feedback
(reference §10.4), on SQLite and MariaDB."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import insert, select

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.learning.tables import AiFlashcard
from job_service.lifecycle import Lease
from job_service.prompts.guard import verdict
from job_service.prompts.routing import Guard, Routing, Variant
from job_service.prompts.stats import AttemptCounts
from job_service.prompts.tables import result_feedback
from job_service.services.domain import JobDomain
from job_service.store.records import JobRecord
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job
from tests.unit.job_service.test_invocations_with_ending import call
from tests.unit.job_service.test_prompt_registry import JT, route, upload

CAPS = [JT]
BAD = {**ANALYSIS_OUTPUT, "summary": "forbidden"}  # the fake learning port refuses it


def _rollbacks() -> float:
    return metrics.PROMPT_ROLLBACKS.labels(JT)._value.get()


async def attempt(
    domain: JobDomain, job: JobRecord, *, ok: bool, latency_ms: int = 100, calls: int = 1
) -> None:
    """Claim ``job`` (the oldest pending) and end its attempt: a valid result, or an
    output that fails validation (INVALID_SCHEMA), with ``calls`` model calls."""
    [claimed] = await domain.claim("w1", CAPS, 1, 0)
    assert claimed.job_id == job.job_id
    lease = Lease(job.job_id, "w1", claimed.attempt_no)
    logged = [call(latency_ms=latency_ms + i) for i in range(calls)]
    try:
        await domain.submit_result(
            lease, prompt_version=claimed.prompt_version, output_schema_version="v1",
            output=ANALYSIS_OUTPUT if ok else BAD, calls=logged,
        )  # fmt: skip
    except AppError as exc:
        assert not ok and exc.code == ErrorCode.INVALID_SCHEMA


async def users_on(domain: JobDomain, version: str, n: int, prefix: str = "u") -> list[str]:
    """``n`` users the routing in force gives ``version``."""
    routing = (await domain.prompts.overview(JT, 1)).routing
    assert routing is not None
    out: list[str] = []
    i = 0
    while len(out) < n:
        user = f"{prefix}-{i}"
        if routing.choose(user) == version:
            out.append(user)
        i += 1
    return out


# ------------------------------------------------------------------ the verdict


def _routing(**guard: Any) -> Routing:
    now = datetime(2026, 1, 1)
    return Routing(JT, "rt", (Variant("v1", 1), Variant("v2", 1), Variant("v3", 1)),
                   Guard(**guard), 1, now, now)  # fmt: skip


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({}, None),
        ({"v1": (10, 0), "v2": (4, 4)}, None),  # below minAttempts
        ({"v1": (10, 1), "v2": (5, 1)}, None),  # 20 % vs 10 %: exactly the allowed increase
        ({"v1": (10, 1), "v2": (5, 2)}, "v2"),  # 40 % vs 10 %
        ({"v2": (5, 1)}, "v2"),  # a control with no attempts counts as 0 %
        ({"v1": (10, 0), "v2": (5, 0), "v3": (6, 6)}, "v3"),
    ],
)
def test_the_guard_judges_each_variant_against_the_control(
    counts: dict[str, tuple[int, int]], expected: str | None
) -> None:
    found = verdict(
        _routing(max_invalid_schema_increase=0.1, min_attempts=5),
        {f"{JT}.{v}": AttemptCounts(a, 0, bad) for v, (a, bad) in counts.items()},
    )
    assert (found[0] if found else None) == expected
    if found:
        assert "invalidSchemaRate" in found[1] and "v1" in found[1]


# ------------------------------------------------------------------ stats


async def test_stats_count_attempts_not_calls(domain: JobDomain) -> None:
    await upload(domain, "v2")
    await route(domain, ("v1", 1.0), ("v2", 1.0))
    for user in await users_on(domain, "v1", 4):
        await attempt(domain, await new_job(domain, user_id=user), ok=True, latency_ms=100)
    v2_users = await users_on(domain, "v2", 4)
    for i, user in enumerate(v2_users):
        job = await new_job(domain, user_id=user)
        # two calls per attempt (a re-ask), latencies 1000+
        await attempt(domain, job, ok=i == 0, latency_ms=1000 * (i + 1), calls=2)
    found = await domain.prompts.overview(JT, 24)
    stats = {s.version: s for s in found.stats}
    v1, v2 = stats["v1"], stats["v2"]
    assert (v1.counts.attempts, v1.counts.succeeded, v1.counts.invalid_schema_rate) == (4, 4, 0.0)
    assert (v2.counts.attempts, v2.counts.succeeded, v2.counts.invalid_schema_rate) == (4, 1, 0.75)
    assert v2.mean_prompt_tokens == 1000 and v2.mean_completion_tokens == 100
    # 8 calls: 1000,1001,2000,2001,3000,3001,4000,4001 → nearest rank p50 = 4th, p95 = 8th
    assert (v2.p50_latency_ms, v2.p95_latency_ms) == (2001, 4001)
    assert v1.p50_latency_ms == 100 and v1.p95_latency_ms == 100
    assert v2.cost_per_succeeded_usd is not None and v1.cost_per_succeeded_usd is not None
    assert v2.cost_per_succeeded_usd == pytest.approx(8 * v1.cost_per_succeeded_usd)


# ------------------------------------------------------------------ the guard


async def test_a_bad_variant_is_rolled_back_and_its_waiting_jobs_move(domain: JobDomain) -> None:
    await upload(domain, "v2")
    await route(domain, ("v1", 1.0), ("v2", 1.0), min_attempts=4, increase=0.1)
    for user in await users_on(domain, "v1", 3):
        await attempt(domain, await new_job(domain, user_id=user), ok=True)
    bad_users = await users_on(domain, "v2", 6)
    for user in bad_users[:3]:
        await attempt(domain, await new_job(domain, user_id=user), ok=False)
    assert await domain.prompts.guard.check() == []  # 3 < minAttempts
    await attempt(domain, await new_job(domain, user_id=bad_users[3]), ok=False)
    waiting = [await new_job(domain, user_id=u) for u in bad_users[4:]]
    assert {j.prompt_version for j in waiting} == {f"{JT}.v2"}
    before = _rollbacks()
    [rolled] = await domain.prompts.guard.check()
    assert (rolled.version, rolled.control, rolled.moved) == ("v2", "v1", 2)
    assert _rollbacks() == before + 1
    overview = await domain.prompts.overview(JT, 24)
    routing = overview.routing
    assert routing is not None and routing.rolled_back_at is not None
    assert [v.version for v in routing.variants] == ["v1"]
    assert routing.rollback_reason is not None and "v2" in routing.rollback_reason
    for job in waiting:
        now = await domain.get(job.job_id)
        assert now.prompt_version == f"{JT}.v1" and now.status == "pending"
        assert now.version == job.version + 1
        events, _ = await domain.history(job.job_id)
        assert [(e.from_status, e.to_status) for e in events][-1] == ("pending", "pending")
        assert "prompt-guard" in events[-1].actor
    for user in bad_users[:4]:  # created after: the control
        assert (await new_job(domain, user_id=user)).prompt_version == f"{JT}.v1"
    assert await domain.prompts.guard.check() == []  # rolled back once
    await route(domain, ("v1", 1.0), ("v2", 1.0))  # a new routing clears the rollback
    cleared = (await domain.prompts.overview(JT, 24)).routing
    assert (
        cleared is not None and cleared.rolled_back_at is None and cleared.rollback_reason is None
    )


async def test_replicas_racing_roll_back_once(make_domain: Callable[..., Any]) -> None:
    one: JobDomain = await make_domain()
    two: JobDomain = await make_domain()
    await upload(one, "v2")
    await route(one, ("v1", 1.0), ("v2", 1.0), min_attempts=2)
    for user in await users_on(one, "v2", 2):
        await attempt(one, await new_job(one, user_id=user), ok=False)
    before = _rollbacks()
    results = await asyncio.gather(one.prompts.guard.check(), two.prompts.guard.check())
    assert sum(len(r) for r in results) == 1
    assert _rollbacks() == before + 1


async def test_an_admins_newer_routing_is_never_overwritten(domain: JobDomain) -> None:
    await upload(domain, "v2")
    await route(domain, ("v1", 1.0), ("v2", 1.0))
    seen = (await domain.prompts.overview(JT, 1)).routing
    assert seen is not None
    await route(domain, ("v2", 1.0), ("v1", 1.0))  # the admin changed it meanwhile
    assert await domain.prompts.guard.roll_back(seen, "v2", "stale evidence") is None
    now = (await domain.prompts.overview(JT, 1)).routing
    assert now is not None and now.rolled_back_at is None and now.control == "v2"


async def test_an_attempt_counts_under_the_version_it_ran(domain: JobDomain) -> None:
    """A job that failed on v2, moved to v1 by a rollback and then ran again: its first
    attempt stays v2's, its second is v1's."""
    await upload(domain, "v2")
    await route(domain, ("v1", 1.0), ("v2", 1.0), min_attempts=1)
    [user, other] = await users_on(domain, "v2", 2)
    bad = await new_job(domain, user_id=other)
    job = await new_job(domain, user_id=user)
    await attempt(domain, bad, ok=False)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(Lease(job.job_id, "w1", 1), error_code="MODEL_TIMEOUT", error_message="t",
                      calls=[call("failed", error_code="MODEL_TIMEOUT")])  # fmt: skip
    [rolled] = await domain.prompts.guard.check()
    assert rolled.moved == 1
    await attempt(domain, job, ok=True)
    stats = {s.version: s.counts for s in (await domain.prompts.overview(JT, 24)).stats}
    assert stats["v2"] == AttemptCounts(2, 0, 1)
    assert stats["v1"] == AttemptCounts(1, 1, 0)


async def test_the_guard_loop_runs_until_stopped(domain: JobDomain) -> None:
    await upload(domain, "v2")
    await route(domain, ("v1", 1.0), ("v2", 1.0), min_attempts=1)
    [user] = await users_on(domain, "v2", 1)
    await attempt(domain, await new_job(domain, user_id=user), ok=False)
    domain.prompts.guard.interval = 0.05
    stop = asyncio.Event()
    task = asyncio.create_task(domain.prompts.guard.run(stop))
    for _ in range(100):
        routing = (await domain.prompts.overview(JT, 1)).routing
        if routing is not None and routing.rolled_back_at is not None:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert routing is not None and routing.rolled_back_at is not None


# ------------------------------------------------------------------ feedback


async def _flashcard(domain: JobDomain, user: str) -> tuple[JobRecord, str]:
    job = await new_job(domain, user_id=user, job_type="flashcard_generation")
    item_id = uuid.uuid4().hex
    async with domain.sessions() as s, s.begin():
        await s.execute(
            insert(AiFlashcard.__table__).values(
                id=item_id, user_id=user, job_id=job.job_id, ordinal=0,
                content_hash=uuid.uuid4().hex, created_at=datetime(2026, 1, 1), front="f",
                back="b", knowledge_point_id=None, source_block_ids=["blk"],
            )
        )  # fmt: skip
    return job, item_id


async def _feedback(domain: JobDomain) -> tuple[int, int]:
    found = await domain.prompts.overview("flashcard_generation", 24)
    v1 = found.stats[0]
    return v1.feedback_positive, v1.feedback_negative


async def test_feedback_counts_under_the_items_version(domain: JobDomain) -> None:
    job, item = await _flashcard(domain, "fan")
    assert job.prompt_version == "flashcard_generation.v1"
    await domain.prompts.set_feedback("fan", "flashcards", item, 1)
    assert await _feedback(domain) == (1, 0)
    await domain.prompts.set_feedback("fan", "flashcards", item, -1)  # replaces
    assert await _feedback(domain) == (0, 1)
    for user, kind, item_id, rating, code in (
        ("stranger", "flashcards", item, 1, ErrorCode.NOT_FOUND),  # another user's item
        ("fan", "questions", item, 1, ErrorCode.NOT_FOUND),  # of another kind
        ("fan", "flashcards", "nope", 1, ErrorCode.NOT_FOUND),
        ("fan", "flashcards", item, 2, ErrorCode.INVALID_ARGUMENT),
        ("fan", "flashcards", item, 0, ErrorCode.INVALID_ARGUMENT),
        ("fan", "nonsense", item, 1, ErrorCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(AppError) as caught:
            await domain.prompts.set_feedback(user, kind, item_id, rating)
        assert caught.value.code == code
    assert await _feedback(domain) == (0, 1)


async def test_erasing_a_user_erases_their_ratings(domain: JobDomain) -> None:
    from job_service.learning.port import LearningModulePort

    _, item = await _flashcard(domain, "gone")
    domain.learning = LearningModulePort()
    await domain.prompts.set_feedback("gone", "flashcards", item, 1)
    await domain.erasure.erase_user("gone")
    async with domain.sessions() as s:
        rows = (await s.execute(select(result_feedback))).all()
    assert rows == []
