"""Retry rules, backoff, Retry-After, WORKER_SHUTDOWN and cancellation (reference §2.3, §2.4; case C1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease, RetryPolicy, backoff_seconds
from job_service.services.domain import JobDomain
from job_service.store.tables import jobs
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, business_rows, new_job

CAPS = ["learning_state_analysis"]


async def _seconds_until_available(domain: JobDomain, job_id: str) -> float:
    async with domain.sessions() as s:
        available = (
            await s.execute(select(jobs.c.available_at).where(jobs.c.job_id == job_id))
        ).scalar_one()
        now = await domain.clock.read(s)
    return float((available - now).total_seconds())


def test_backoff_formula() -> None:
    s = RetryPolicy(base_seconds=5, max_seconds=300)  # RETRY_BACKOFF_*_SECONDS
    mid = lambda: 0.5  # noqa: E731  (no jitter)
    assert backoff_seconds(s, 1, "MODEL_TIMEOUT", None, mid) == pytest.approx(5)
    assert backoff_seconds(s, 2, "MODEL_TIMEOUT", None, mid) == pytest.approx(10)
    assert backoff_seconds(s, 3, "MODEL_TIMEOUT", None, mid) == pytest.approx(20)
    assert backoff_seconds(s, 10, "MODEL_TIMEOUT", None, mid) == pytest.approx(300)
    assert backoff_seconds(s, 1, "MODEL_TIMEOUT", None, lambda: 0.0) == pytest.approx(4.5)
    assert backoff_seconds(s, 1, "MODEL_TIMEOUT", None, lambda: 1.0) == pytest.approx(5.5)
    assert backoff_seconds(s, 1, "MODEL_RATE_LIMIT", 7, mid) == pytest.approx(7)
    assert backoff_seconds(s, 3, "MODEL_RATE_LIMIT", 7, mid) == pytest.approx(20)
    assert backoff_seconds(s, 3, "WORKER_SHUTDOWN", None, mid) == 0.0
    # retryAfterSeconds belongs to MODEL_RATE_LIMIT alone (reference §2.4)
    assert backoff_seconds(s, 1, "MODEL_TIMEOUT", 100, mid) == pytest.approx(5)
    assert backoff_seconds(s, 1, "TEMPORARY_PROVIDER_ERROR", 100, mid) == pytest.approx(5)


async def test_retryable_fail_requeues_with_backoff(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=30, RETRY_BACKOFF_MAX_SECONDS=300
    )
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(
        Lease(job.job_id, "w1", 1), error_code="MODEL_TIMEOUT", error_message="slow"
    )
    assert after.status == "pending" and after.retry_count == 1
    assert after.locked_by is None and after.lock_until is None and after.attempt_no == 1
    wait = await _seconds_until_available(domain, job.job_id)
    assert 26 <= wait <= 34
    # not pollable during the backoff
    assert await domain.poll("w1", CAPS, 10, 0) == []
    assert await domain.claim("w2", CAPS, 10, 0) == []


async def test_retry_after_wins_when_longer(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=1, RETRY_BACKOFF_MAX_SECONDS=300
    )
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(
        Lease(job.job_id, "w1", 1),
        error_code="MODEL_RATE_LIMIT",
        error_message="429",
        retry_after_seconds=7,
    )
    wait = await _seconds_until_available(domain, job.job_id)
    assert 6.5 <= wait <= 7.5


async def test_retry_after_is_ignored_on_other_codes(make_domain: Callable[..., Any]) -> None:
    """Only a MODEL_RATE_LIMIT fail carries the provider's Retry-After (reference §2.4): a
    timeout claiming 100 s waits the ordinary backoff."""
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=2, RETRY_BACKOFF_MAX_SECONDS=300
    )
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(
        Lease(job.job_id, "w1", 1),
        error_code="MODEL_TIMEOUT",
        error_message="slow",
        retry_after_seconds=100,
    )
    assert after.status == "pending" and after.retry_count == 1
    wait = await _seconds_until_available(domain, job.job_id)
    assert 1.5 <= wait <= 2.5


async def test_worker_shutdown_retries_at_once_but_counts(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=60, RETRY_BACKOFF_MAX_SECONDS=300
    )
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(
        Lease(job.job_id, "w1", 1), error_code="WORKER_SHUTDOWN", error_message="drain"
    )
    assert after.status == "pending" and after.retry_count == 1
    [again] = await domain.claim("w2", CAPS, 1, 0)
    assert again.attempt_no == 2 and again.locked_by == "w2"


@pytest.mark.parametrize(
    "code", ["INSUFFICIENT_BALANCE", "MODEL_BAD_REQUEST", "SOMETHING_ELSE", "INVALID_SCHEMA"]
)
async def test_non_retryable_and_unknown_codes_fail_at_once(domain: JobDomain, code: str) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(Lease(job.job_id, "w1", 1), error_code=code, error_message="boom")
    assert after.status == "failed" and after.error_code == code and after.retry_count == 0
    assert after.error_message == "boom" and after.finished_at is not None


async def test_retries_exhaust_then_fail(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(MAX_RETRY_COUNT=2)
    job = await new_job(domain)
    for attempt in (1, 2, 3):
        [claimed] = await domain.claim("w1", CAPS, 1, 0)
        assert claimed.attempt_no == attempt
        after = await domain.fail(
            Lease(job.job_id, "w1", attempt), error_code="NETWORK_ERROR", error_message="x"
        )
    assert (
        after.status == "failed" and after.retry_count == 2 and after.error_code == "NETWORK_ERROR"
    )
    assert await domain.claim("w1", CAPS, 1, 0) == []


async def test_repeat_fail_answers_current_state(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    first = await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="x")
    again = await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="x")
    assert (again.status, again.retry_count) == (first.status, first.retry_count) == ("pending", 1)
    # a different code, or another worker, is not a repeat
    with pytest.raises(AppError) as err:
        await domain.fail(lease, error_code="NETWORK_ERROR", error_message="x")
    assert err.value.code == "LOCK_NOT_HELD"
    with pytest.raises(AppError) as err:
        await domain.fail(Lease(job.job_id, "w9", 1), error_code="MODEL_TIMEOUT", error_message="x")
    assert err.value.code == "LOCK_NOT_HELD"


async def test_c1_cancel_running_job(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    await domain.start(lease)
    flagged = await domain.cancel(job.job_id, user_id="u1", actor="user:u1")
    assert flagged.status == "running" and flagged.cancel_requested
    assert (await domain.heartbeat(lease)).cancel_requested is True
    # a retryable error after the cancel request still ends as cancelled
    after = await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="aborted")
    assert after.status == "cancelled" and after.cancelled_at is not None and after.retry_count == 0
    assert await domain.poll("w1", CAPS, 10, 0) == []
    assert await business_rows(domain, job.job_id) == 0
    with pytest.raises(AppError) as err:
        await domain.cancel(job.job_id, user_id="u1", actor="user:u1")
    assert err.value.code == "INVALID_JOB_STATE"


async def test_cancelled_code_acknowledges(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(Lease(job.job_id, "w1", 1), error_code="CANCELLED", error_message="")
    assert after.status == "cancelled"


async def test_result_before_cancel_ack_wins(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.cancel(job.job_id, user_id=None, actor="admin:a")
    out = await domain.submit_result(
        Lease(job.job_id, "w1", 1),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )
    assert out.status == "succeeded"


async def test_cancel_pending_and_ownership(domain: JobDomain) -> None:
    job = await new_job(domain)
    with pytest.raises(AppError) as err:
        await domain.cancel(job.job_id, user_id="u2", actor="user:u2")
    assert err.value.code == "JOB_NOT_FOUND"
    done = await domain.cancel(job.job_id, user_id="u1", actor="user:u1")
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert await domain.poll("w1", CAPS, 10, 0) == []
    with pytest.raises(AppError) as err:
        await domain.lock(job.job_id, "w1")
    assert err.value.code == "INVALID_JOB_STATE"


async def test_revoke_authorization(domain: JobDomain) -> None:
    pending = await new_job(domain, target_type="user", idempotency_key="a")
    leased = await new_job(domain, idempotency_key="b")
    await domain.lock(leased.job_id, "w1")
    other = await new_job(domain, user_id="u2")
    view = await domain.set_authorization("u1", False)
    assert (view.granted, view.cancelled, view.cancel_requested) == (False, 1, 1)
    assert (await domain.get(pending.job_id)).status == "cancelled"
    assert (await domain.get(leased.job_id)).cancel_requested is True
    assert (await domain.get(other.job_id)).status == "pending"
    with pytest.raises(AppError) as err:
        await new_job(domain)
    assert err.value.code == "AI_NOT_AUTHORIZED"
    await domain.set_authorization("u1", True)
    assert (await new_job(domain)).status == "pending"
    assert (await domain.get_authorization("u1")).granted is True
    assert (await domain.get_authorization("nobody")).granted is True


async def test_rerun_only_from_failed(domain: JobDomain) -> None:
    job = await new_job(domain)
    with pytest.raises(AppError) as err:
        await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert err.value.code == "INVALID_JOB_STATE"
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(Lease(job.job_id, "w1", 1), error_code="MODEL_BAD_REQUEST", error_message="x")
    new = await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert new.job_id != job.job_id and new.retried_from_job_id == job.job_id
    assert new.snapshot_id == job.snapshot_id and new.status == "pending" and new.attempt_no == 0
    rebuilt = await domain.rerun(job.job_id, rebuild_snapshot=True, actor="admin:a")
    assert rebuilt.snapshot_id != job.snapshot_id
    with pytest.raises(AppError) as err:
        await domain.rerun("nope", rebuild_snapshot=False, actor="admin:a")
    assert err.value.code == "JOB_NOT_FOUND"


class KeyRing:
    """A credential checker whose users' current key ids the test sets (None: no usable key)."""

    def __init__(self) -> None:
        self.current: dict[str, str | None] = {}

    async def check(self, user_id: str, api_key_mode: str) -> str | None:
        if api_key_mode == "platform_key":
            return None
        cred = self.current.get(user_id)
        if cred is None:
            raise AppError(ErrorCode.INVALID_CREDENTIAL, "no usable model credential", None)
        return cred

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        pass


async def _jobs_of(domain: JobDomain, user_id: str) -> int:
    async with domain.sessions() as session:
        rows = await session.execute(select(jobs.c.job_id).where(jobs.c.user_id == user_id))
        return len(rows.all())


async def test_rerun_passes_the_checks_of_a_create(domain: JobDomain) -> None:
    """reference §6: a re-run is a new job, refused like a create when the user turned AI off
    or has no usable key, and it runs on the user's current key, not the failed job's."""
    keys = KeyRing()
    keys.current["u1"] = "cred-old"
    domain.credentials = keys
    job = await new_job(domain, api_key_mode="user_deepseek_key")
    assert job.credential_id == "cred-old"
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(
        Lease(job.job_id, "w1", 1), error_code="INVALID_CREDENTIAL", error_message="x"
    )
    keys.current["u1"] = None  # marked invalid, or deleted: no usable key
    with pytest.raises(AppError) as err:
        await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert err.value.code == "INVALID_CREDENTIAL"
    assert await _jobs_of(domain, "u1") == 1
    keys.current["u1"] = "cred-new"  # the user stored a new key
    await domain.set_authorization("u1", False)
    with pytest.raises(AppError) as err:
        await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert err.value.code == "AI_NOT_AUTHORIZED"
    assert await _jobs_of(domain, "u1") == 1
    await domain.set_authorization("u1", True)
    new = await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert (new.status, new.credential_id, new.retried_from_job_id) == (
        "pending",
        "cred-new",
        job.job_id,
    )


async def test_jittered_backoffs_share_one_compiled_statement(
    make_domain: Callable[..., Any],
) -> None:
    """Every retry has its own jittered delay; it must be a bound value, not SQL text.

    Otherwise each retry compiles a new statement and the engine's compiled
    cache (and the process's memory) grows with the number of retries.
    """
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=40,
        RETRY_BACKOFF_MAX_SECONDS=300,
        BREAKER_FAILURE_THRESHOLD=1000,
    )
    engine = domain.sessions.kw["bind"].sync_engine
    waits: list[float] = []
    sizes: list[int] = []
    for n in range(24):
        job = await new_job(domain, user_id=f"jitter-{n}")
        [claimed] = await domain.claim("w1", CAPS, 1, 0)
        assert claimed.job_id == job.job_id
        after = await domain.fail(
            Lease(job.job_id, "w1", 1), error_code="NETWORK_ERROR", error_message="reset"
        )
        assert after.status == "pending" and after.retry_count == 1
        waits.append(await _seconds_until_available(domain, job.job_id))
        sizes.append(len(engine._compiled_cache))
    # ±10 % jitter around 40 s, and really jittered (distinct delays)
    assert all(35 <= w <= 45 for w in waits), waits
    assert len({round(w, 2) for w in waits}) > 12
    # the first jobs warm the cache; later retries add no compiled statement
    assert sizes[-1] == sizes[3], sizes
