"""Per-provider breakers and platform failover (reference §6, §9.4), on SQLite and MariaDB.

Two providers, ``primary`` then ``backup`` (which calls the job's model
``backup-chat``): a platform-key attempt gets its provider when its lease is
granted, the first whose breaker admits it; each attempt's ending feeds the breaker
of the provider it ran on; a create is refused only while every breaker is open."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.store.records import JobRecord
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]
PROVIDERS = json.dumps(
    [
        {"name": "primary", "baseUrl": "http://primary.test", "apiKeyEnv": "PRIMARY_KEY"},
        {
            "name": "backup",
            "baseUrl": "http://backup.test/v1",
            "apiKeyEnv": "BACKUP_KEY",
            "models": {"deepseek-chat": "backup-chat"},
        },
    ]
)
COOLDOWN = 0.3


@pytest.fixture
async def failover(make_domain: Callable[..., Any]) -> JobDomain:
    domain: JobDomain = await make_domain(
        MODEL_PROVIDERS=PROVIDERS,
        BREAKER_FAILURE_THRESHOLD=2,
        BREAKER_COOLDOWN_SECONDS=COOLDOWN,
        BREAKER_HALF_OPEN_PROBES=1,
        MAX_RETRY_COUNT=10,
    )
    return domain


async def claim_one(domain: JobDomain, worker: str = "w") -> JobRecord:
    [job] = await domain.claim(worker, CAPS, 1, 0)
    return job


async def fail(domain: JobDomain, job: JobRecord, code: str, worker: str = "w") -> None:
    await domain.fail(Lease(job.job_id, worker, job.attempt_no), error_code=code, error_message="")


async def succeed(domain: JobDomain, job: JobRecord, worker: str = "w") -> None:
    await domain.submit_result(
        Lease(job.job_id, worker, job.attempt_no),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )


async def states(domain: JobDomain) -> dict[str, tuple[str, int]]:
    return {v.provider: (v.state, v.consecutive_failures) for v in await domain.breaker_views()}


async def open_primary(domain: JobDomain) -> JobRecord:
    """Two platform attempts on the primary fail TEMPORARY_PROVIDER_ERROR: its breaker
    opens. Returns the job (pending again, retries left)."""
    job = await new_job(domain)
    assert job.model_provider == "primary"  # the preferred provider until leased
    for _ in range(2):
        leased = await claim_one(domain)
        assert leased.model_provider == "primary"
        await fail(domain, leased, "TEMPORARY_PROVIDER_ERROR")
    assert (await states(domain))["primary"] == ("open", 2)
    return job


async def test_an_open_primary_sends_the_next_attempt_to_the_backup(failover: JobDomain) -> None:
    job = await open_primary(failover)
    leased = await claim_one(failover)
    assert leased.job_id == job.job_id
    # the latest attempt's provider; the job keeps the model it asked for
    assert (leased.model_provider, leased.model_name) == ("backup", "deepseek-chat")
    held = await failover.verify_lease(Lease(leased.job_id, "w", leased.attempt_no))
    assert held.model_provider == "backup"  # what credential_service resolves the key for
    await succeed(failover, leased)
    done = await failover.get(job.job_id)
    assert (done.status, done.model_provider, done.model_name) == (
        "succeeded",
        "backup",
        "deepseek-chat",
    )
    events, _ = await failover.history(job.job_id)
    granted = [(e.attempt_no, e.model_provider) for e in events if e.to_status == "locked"]
    assert granted == [(1, "primary"), (2, "primary"), (3, "backup")]
    assert all(e.model_provider is None for e in events if e.to_status != "locked")
    # the success counted for the backup only; the primary stays open
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 0)}


async def test_each_ending_counts_against_the_provider_it_ran_on(failover: JobDomain) -> None:
    await open_primary(failover)
    leased = await claim_one(failover)
    await fail(failover, leased, "MODEL_TIMEOUT")
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 1)}
    # creates pass while the backup admits them
    assert (await new_job(failover)).status == "pending"
    leased = await claim_one(failover)
    assert leased.model_provider == "backup"
    await fail(failover, leased, "NETWORK_ERROR")
    assert (await states(failover))["backup"] == ("open", 2)
    # every breaker open: platform creates refused, user-key creates not
    with pytest.raises(AppError) as err:
        await new_job(failover)
    assert err.value.code == ErrorCode.PLATFORM_CIRCUIT_OPEN
    assert err.value.details and err.value.details["retryAfterSeconds"] >= 1
    assert (await new_job(failover, api_key_mode="user_deepseek_key")).status == "pending"


async def test_after_the_cooldown_a_probe_goes_back_to_the_primary(failover: JobDomain) -> None:
    await open_primary(failover)
    await asyncio.sleep(COOLDOWN + 0.05)
    # the primary half-opens at the lease grant: one probe; the next attempts fail over
    others = [await new_job(failover) for _ in range(2)]
    leased = await failover.claim("w", CAPS, 3, 0)
    assert [j.model_provider for j in leased] == ["primary", "backup", "backup"]
    assert {j.job_id for j in leased} >= {o.job_id for o in others}
    views = {v.provider: v for v in await failover.breaker_views()}
    assert views["primary"].state == "half_open"
    assert views["primary"].half_open_at is not None
    await succeed(failover, leased[0])  # the probe succeeds: the primary closes
    assert (await states(failover))["primary"] == ("closed", 0)
    nxt = await new_job(failover)
    assert (await claim_one(failover)).job_id == nxt.job_id
    assert (await failover.get(nxt.job_id)).model_provider == "primary"


async def test_a_failed_probe_opens_the_primary_again(failover: JobDomain) -> None:
    await open_primary(failover)
    await asyncio.sleep(COOLDOWN + 0.05)
    probe = await claim_one(failover)
    assert probe.model_provider == "primary"
    await fail(failover, probe, "TEMPORARY_PROVIDER_ERROR")
    assert (await states(failover))["primary"] == ("open", 3)
    again = await claim_one(failover)
    assert (again.job_id, again.model_provider) == (probe.job_id, "backup")


async def test_a_lock_chooses_the_provider_too(failover: JobDomain) -> None:
    job = await open_primary(failover)
    locked = await failover.lock(job.job_id, "w")
    assert locked.model_provider == "backup"
    # a refused lock writes nothing (the job is leased): not to the breaker either
    with pytest.raises(AppError) as err:
        await failover.lock(job.job_id, "w2")
    assert err.value.code == ErrorCode.JOB_ALREADY_LOCKED
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 0)}


async def test_user_key_jobs_never_fail_over_nor_feed_a_breaker(failover: JobDomain) -> None:
    await open_primary(failover)
    user = await new_job(failover, api_key_mode="user_deepseek_key")
    leased = await failover.lock(user.job_id, "w")
    assert leased.model_provider == user.model_provider == "primary"
    await fail(failover, leased, "MODEL_TIMEOUT")
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 0)}


async def test_reset_one_provider_or_all(failover: JobDomain) -> None:
    await open_primary(failover)
    leased = await claim_one(failover)
    await fail(failover, leased, "MODEL_TIMEOUT")
    with pytest.raises(AppError) as err:
        await failover.breaker_reset("nosuch")
    assert (err.value.code, err.value.details) == (
        ErrorCode.INVALID_ARGUMENT,
        {"field": "provider", "value": "nosuch"},
    )
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 1)}
    first = await failover.breaker_reset("backup")
    assert (first.provider, first.state) == ("primary", "open")  # the first provider's view
    assert await states(failover) == {"primary": ("open", 2), "backup": ("closed", 0)}
    assert (await failover.breaker_reset()).state == "closed"
    assert await states(failover) == {"primary": ("closed", 0), "backup": ("closed", 0)}


async def test_costs_by_provider(failover: JobDomain) -> None:
    job = await new_job(failover)
    for provider, model in (("primary", "deepseek-chat"), ("backup", "backup-chat")):
        await failover.record_invocation(
            job_id=job.job_id,
            attempt_no=0,
            model_provider=provider,
            model_name=model,
            api_key_mode="platform_key",
            credential_id=None,
            prompt_tokens=1_000_000,
            completion_tokens=0,
            cache_hit_tokens=0,
            latency_ms=5,
            outcome="succeeded",
            error_code=None,
            provider_request_id=None,
        )
    rows = await failover.costs("2000-01-01", "2999-12-31", "modelProvider")
    by_key = {r["key"]: (r["calls"], r["costUsd"]) for r in rows}
    # MODEL_PRICES is keyed by the provider's model name: backup-chat has none → 0
    assert by_key == {"primary": (1, pytest.approx(0.28)), "backup": (1, 0.0)}


async def test_one_provider_keeps_the_first_release_breaker(
    make_domain: Callable[..., Any],
) -> None:
    """The default MODEL_PROVIDERS: one ``deepseek`` breaker; an open one refuses
    creates (no failover), and the admin view lists that one provider."""
    domain: JobDomain = await make_domain(BREAKER_FAILURE_THRESHOLD=1, MAX_RETRY_COUNT=5)
    await new_job(domain)
    leased = await claim_one(domain)
    assert leased.model_provider == "deepseek"
    await fail(domain, leased, "TEMPORARY_PROVIDER_ERROR")
    assert await states(domain) == {"deepseek": ("open", 1)}
    with pytest.raises(AppError) as err:
        await new_job(domain)
    assert err.value.code == ErrorCode.PLATFORM_CIRCUIT_OPEN
    again = await claim_one(domain)  # queued jobs still run, on the only provider
    assert again.model_provider == "deepseek"


async def test_a_user_key_job_follows_the_key_and_provider_it_ran_on(
    failover: JobDomain,
) -> None:
    """The job's credentialId and modelProvider follow the attempt's model call (the
    user's current key, resolved for its own provider), and a refusal by the model
    marks that key invalid, not the one stored at create (reference §9.4)."""
    from job_service.services.inputs import ModelCallInput

    fake = failover.credentials
    job = await new_job(failover, api_key_mode="user_deepseek_key")
    assert job.credential_id == "cred-u1"
    leased = await failover.lock(job.job_id, "w")
    call = ModelCallInput(
        "backup", "backup-chat", "user_deepseek_key", "cred-new", 1, 1, 0, 5, "failed",
        "INVALID_CREDENTIAL", None,
    )  # fmt: skip
    await failover.fail(
        Lease(job.job_id, "w", leased.attempt_no),
        error_code="INVALID_CREDENTIAL",
        error_message="401",
        calls=[call],
    )
    done = await failover.get(job.job_id)
    assert (done.status, done.credential_id, done.model_provider) == (
        "failed",
        "cred-new",
        "backup",
    )
    assert [c for c, _ in fake.marked] == ["cred-new"]  # type: ignore[attr-defined]
    assert await states(failover) == {"primary": ("closed", 0), "backup": ("closed", 0)}
