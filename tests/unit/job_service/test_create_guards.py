"""Create: params, idempotency (M3), authorization, quota, budget, breaker, credentials (reference §2.5, §6)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.services.accounting import cost_usd
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput
from job_service.services.params import normalize_params
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job


def test_params_defaults_and_ranges() -> None:
    assert normalize_params("quiz_generation", None) == {
        "count": 5,
        "difficulty": "medium",
        "questionTypes": ["single_choice"],
    }
    assert normalize_params("quiz_generation", {"count": 20.0})["count"] == 20
    assert normalize_params("flashcard_generation", {}) == {"count": 5}
    assert normalize_params("flashcard_generation", {"count": 50}) == {"count": 50}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("quiz_generation", {"count": 0}),
        ("quiz_generation", {"count": 21}),
        ("quiz_generation", {"count": 2.5}),
        ("quiz_generation", {"difficulty": "brutal"}),
        ("quiz_generation", {"questionTypes": ["essay"]}),
        ("quiz_generation", {"questionTypes": []}),
        ("quiz_generation", {"colour": "red"}),
        ("flashcard_generation", {"count": 51}),
    ]
    for job_type, bad in cases:
        with pytest.raises(AppError) as err:
            normalize_params(job_type, bad)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
        assert err.value.details and err.value.details["fields"][0]["field"].startswith("params")


async def test_admin_override_ranges(domain: JobDomain) -> None:
    job = await new_job(domain, priority=5, max_retry_count=0, timeout_seconds=3600)
    assert (job.priority, job.max_retry_count, job.timeout_seconds) == (5, 0, 3600)
    for kw in (
        {"max_retry_count": 11},
        {"timeout_seconds": 9},
        {"timeout_seconds": 3601},
        {"max_retry_count": -1},
    ):
        with pytest.raises(AppError) as err:
            await new_job(domain, **kw)
        assert err.value.code == "INVALID_ARGUMENT"


async def test_target_checks(domain: JobDomain) -> None:
    with pytest.raises(AppError) as err:
        await new_job(domain, target_type="user", target_id="someone-else")
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(AppError) as err:
        await new_job(domain, target_type="material", target_id="missing-1")
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(AppError) as err:
        await new_job(domain, job_type="poetry")
    assert err.value.code == "INVALID_ARGUMENT"


async def test_generation_plan_written_for_generation_jobs(domain: JobDomain) -> None:
    quiz = await new_job(domain, job_type="quiz_generation", target_type="material", target_id="m1")
    await new_job(domain)
    assert domain.learning.plans == [quiz.job_id]  # type: ignore[attr-defined]
    assert quiz.params["difficulty"] == "medium"


async def test_idempotent_replay_whatever_params(domain: JobDomain) -> None:
    a = await new_job(
        domain,
        job_type="quiz_generation",
        target_type="material",
        target_id="m1",
        idempotency_key="k",
    )
    b, replayed = await domain.create(
        CreateJobInput(
            user_id="u1",
            job_type="quiz_generation",
            target_type="material",
            target_id="m1",
            params={"count": 9},
            idempotency_key="k",
        )
    )
    assert replayed and b.job_id == a.job_id and b.params["count"] == 5
    # params a new job would be refused for do not stop the replay either
    bad = CreateJobInput(
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id="m1",
        params={"count": 99, "questionTypes": ["essay"]},
        idempotency_key="k",
    )
    again, replayed = await domain.create(bad)
    assert replayed and again.job_id == a.job_id
    with pytest.raises(AppError) as err:
        await domain.create(replace(bad, idempotency_key="fresh"))
    assert err.value.code == "INVALID_ARGUMENT"
    # different scope (another target, another user) → new jobs
    c = await new_job(
        domain,
        job_type="quiz_generation",
        target_type="material",
        target_id="m2",
        idempotency_key="k",
    )
    d = await new_job(
        domain,
        user_id="u2",
        job_type="quiz_generation",
        target_type="material",
        target_id="m1",
        idempotency_key="k",
    )
    assert len({a.job_id, c.job_id, d.job_id}) == 3
    # without a key every create is new
    assert (await new_job(domain)).job_id != (await new_job(domain)).job_id


async def test_m3_racing_idempotent_creates_make_one_job(domain: JobDomain) -> None:
    async def one() -> tuple[str, bool]:
        job, replayed = await domain.create(
            CreateJobInput(
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="u1",
                idempotency_key="race",
            )
        )
        return job.job_id, replayed

    answers = await asyncio.gather(*(one() for _ in range(50)))
    assert len({job_id for job_id, _ in answers}) == 1
    assert sum(1 for _, replayed in answers if not replayed) == 1
    rows, _ = await domain.list_jobs(
        user_id="u1", status=None, job_type=None, page_size=100, page_token=""
    )
    assert len(rows) == 1


async def test_daily_quota_and_plan(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(USER_DAILY_JOB_QUOTA=2, PLAN_DAILY_JOB_QUOTAS={"pro": 3})
    await new_job(domain)
    await new_job(domain, api_key_mode="user_deepseek_key")  # every key mode counts
    with pytest.raises(AppError) as err:
        await new_job(domain)
    assert err.value.code == "QUOTA_EXCEEDED"
    assert (await new_job(domain, plan="pro")).status == "pending"
    with pytest.raises(AppError):
        await new_job(domain, plan="pro")
    assert (await new_job(domain, user_id="u2")).status == "pending"


async def test_platform_budget(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(
        PLATFORM_DAILY_BUDGET_USD=0.01,
        MODEL_PRICES={"deepseek-chat": {"cacheHitInput": 0, "cacheMissInput": 1000, "output": 0}},
    )
    job = await new_job(domain)
    await domain.claim("w", ["learning_state_analysis"], 1, 0)
    await domain.record_invocation(
        job_id=job.job_id,
        attempt_no=1,
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode="platform_key",
        credential_id=None,
        prompt_tokens=20,
        completion_tokens=0,
        cache_hit_tokens=0,
        latency_ms=5,
        outcome="succeeded",
        error_code=None,
        provider_request_id="r",
    )  # 20 tokens × $1000/M = $0.02
    with pytest.raises(AppError) as err:
        await new_job(domain)
    assert err.value.code == "PLATFORM_BUDGET_EXCEEDED"
    assert (await new_job(domain, api_key_mode="user_deepseek_key")).status == "pending"
    _, invs = await domain.history(job.job_id)
    assert float(invs[0].cost_usd) == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cache_hit_tokens": 21}, "cacheHitTokens"),  # more hits than prompt tokens
        ({"prompt_tokens": -1}, "promptTokens"),
        ({"completion_tokens": 2**53}, "completionTokens"),  # would price at billions
        ({"prompt_tokens": 10_000_001, "cache_hit_tokens": 0}, "promptTokens"),
        ({"latency_ms": 86_400_001}, "latencyMs"),
        ({"outcome": "maybe"}, "outcome"),
        ({"attempt_no": 2}, "attemptNo"),  # the job has had one attempt
        ({"api_key_mode": "user_deepseek_key"}, "apiKeyMode"),  # would dodge the budget
    ],
)
async def test_inconsistent_call_logs_are_refused_and_change_nothing(
    domain: JobDomain, change: dict[str, Any], field: str
) -> None:
    job = await new_job(domain)
    await domain.claim("w", ["learning_state_analysis"], 1, 0)
    call: dict[str, Any] = {
        "job_id": job.job_id,
        "attempt_no": 1,
        "model_provider": "deepseek",
        "model_name": "deepseek-chat",
        "api_key_mode": "platform_key",
        "credential_id": None,
        "prompt_tokens": 20,
        "completion_tokens": 0,
        "cache_hit_tokens": 20,
        "latency_ms": 5,
        "outcome": "succeeded",
        "error_code": None,
        "provider_request_id": "r",
    }
    with pytest.raises(AppError) as err:
        await domain.record_invocation(**{**call, **change})
    assert err.value.code == "INVALID_ARGUMENT"
    assert err.value.details == {"field": field}
    assert (await domain.history(job.job_id))[1] == []
    await domain.record_invocation(**call)  # the consistent one, at the bounds, is taken
    assert len((await domain.history(job.job_id))[1]) == 1


def test_cost_formula() -> None:
    prices = {"m": {"cacheHitInput": 0.028, "cacheMissInput": 0.28, "output": 0.42}}
    cost = cost_usd(
        prices, "m", prompt_tokens=1_000_000, completion_tokens=1_000_000, cache_hit_tokens=500_000
    )
    assert float(cost) == pytest.approx(0.014 + 0.14 + 0.42)
    assert float(cost_usd(prices, "unknown", 10, 10, 0)) == 0.0


async def test_breaker_opens_half_opens_and_closes(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(
        BREAKER_FAILURE_THRESHOLD=2, BREAKER_COOLDOWN_SECONDS=0.3, BREAKER_HALF_OPEN_PROBES=1
    )
    caps = ["learning_state_analysis"]

    async def run_and_fail(code: str) -> None:
        job = await new_job(domain)
        [c] = await domain.claim("w", caps, 1, 0)
        await domain.fail(Lease(c.job_id, "w", c.attempt_no), error_code=code, error_message="")
        assert job.job_id == c.job_id

    await run_and_fail("INSUFFICIENT_BALANCE")
    await run_and_fail("MODEL_BAD_REQUEST")  # neutral: does not reset, does not count
    assert (await domain.breaker_view()).consecutive_failures == 1
    await run_and_fail("INVALID_CREDENTIAL")
    assert (await domain.breaker_view()).state == "open"
    with pytest.raises(AppError) as err:
        await new_job(domain)
    assert err.value.code == "PLATFORM_CIRCUIT_OPEN"
    assert (await new_job(domain, api_key_mode="user_deepseek_key")).status == "pending"
    opened = await domain.breaker_view()
    assert opened.half_open_at is None
    await asyncio.sleep(0.35)
    # the cool-down ran out: shown half-open before any create writes it (reference §6)
    due = opened.opened_at + timedelta(seconds=0.3)
    shown = await domain.breaker_view()
    assert (shown.state, shown.half_open_at) == ("half_open", due)
    probe = await new_job(domain)  # half-open: one probe passes
    written = await domain.breaker_view()
    assert (written.state, written.half_open_at) == ("half_open", due)  # the same moment
    with pytest.raises(AppError):
        await new_job(domain)
    c = await domain.lock(probe.job_id, "w")
    await domain.fail(
        Lease(c.job_id, "w", 1), error_code="TEMPORARY_PROVIDER_ERROR", error_message=""
    )
    assert (await domain.breaker_view()).state == "open"
    await asyncio.sleep(0.35)
    probe = await new_job(domain)
    c = await domain.lock(probe.job_id, "w")

    await domain.submit_result(
        Lease(c.job_id, "w", c.attempt_no),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )
    view = await domain.breaker_view()
    assert (view.state, view.consecutive_failures) == ("closed", 0)
    assert (await domain.breaker_reset()).state == "closed"


async def test_credential_check_and_mark_invalid(domain: JobDomain) -> None:
    class NoKey:
        def __init__(self) -> None:
            self.marked: list[str] = []

        async def check(self, user_id: str, api_key_mode: str) -> str | None:
            if api_key_mode == "user_deepseek_key" and user_id == "nokey":
                raise AppError(ErrorCode.INVALID_CREDENTIAL, "no key", None)
            return "cred-1" if api_key_mode == "user_deepseek_key" else None

        async def mark_invalid(self, credential_id: str, reason: str) -> None:
            self.marked.append(credential_id)

    fake = NoKey()
    domain.credentials = fake
    with pytest.raises(AppError) as err:
        await new_job(domain, user_id="nokey", api_key_mode="user_deepseek_key")
    assert err.value.code == "INVALID_CREDENTIAL"
    job = await new_job(domain, api_key_mode="user_deepseek_key")
    assert job.credential_id == "cred-1"
    [c] = await domain.claim("w", ["learning_state_analysis"], 1, 0)
    await domain.fail(Lease(c.job_id, "w", 1), error_code="INVALID_CREDENTIAL", error_message="401")
    assert fake.marked == ["cred-1"]
    assert (await domain.breaker_view()).consecutive_failures == 0  # user keys never feed it
