"""Model calls carried by SubmitResult / FailJob: logged in the ending's transaction, once."""

from __future__ import annotations

import pytest

from airuntime_common.errors import AppError
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.inputs import ModelCallInput
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]


def call(outcome: str = "succeeded", **kw: object) -> ModelCallInput:
    args: dict[str, object] = {
        "model_provider": "deepseek",
        "model_name": "deepseek-chat",
        "api_key_mode": "platform_key",
        "credential_id": None,
        "prompt_tokens": 1000,
        "completion_tokens": 100,
        "cache_hit_tokens": 0,
        "latency_ms": 250,
        "outcome": outcome,
    }
    args.update(kw)
    return ModelCallInput(**args)  # type: ignore[arg-type]


async def logged(domain: JobDomain, job_id: str) -> list[tuple[int, str, str | None]]:
    _, invocations = await domain.history(job_id)
    return [(i.attempt_no, i.outcome, i.error_code) for i in invocations]


async def test_result_logs_its_calls_once_and_a_replay_adds_none(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    calls = [call("failed", error_code="INVALID_SCHEMA"), call()]
    first = await domain.submit_result(
        lease, prompt_version="p", output_schema_version="v1", output=ANALYSIS_OUTPUT, calls=calls
    )
    again = await domain.submit_result(
        lease, prompt_version="p", output_schema_version="v1", output=ANALYSIS_OUTPUT, calls=calls
    )
    assert (first.replayed, again.replayed) == (False, True)
    assert sorted(await logged(domain, job.job_id)) == [
        (1, "failed", "INVALID_SCHEMA"),
        (1, "succeeded", None),
    ]
    _, invocations = await domain.history(job.job_id)
    assert all(i.cost_usd > 0 for i in invocations)


async def test_a_refused_result_logs_nothing(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "stranger", 1),
            prompt_version=None,
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[call()],
        )
    assert err.value.code == "LOCK_NOT_HELD"
    assert await logged(domain, job.job_id) == []


async def test_an_invalid_output_fails_the_job_and_logs_its_calls(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "w1", 1),
            prompt_version=None,
            output_schema_version="v1",
            output={**ANALYSIS_OUTPUT, "summary": "forbidden"},
            calls=[call()],
        )
    assert err.value.code == "INVALID_SCHEMA"
    assert (await domain.get(job.job_id)).status == "failed"
    assert await logged(domain, job.job_id) == [(1, "succeeded", None)]


async def test_fail_logs_its_calls_once_and_a_repeat_adds_none(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    calls = [call("failed", error_code="MODEL_TIMEOUT")]
    after = await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="t", calls=calls)
    repeat = await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="t", calls=calls)
    assert after.status == repeat.status == "pending"
    assert await logged(domain, job.job_id) == [(1, "failed", "MODEL_TIMEOUT")]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"outcome": "maybe"}, "outcome"),
        ({"prompt_tokens": -1}, "promptTokens"),
        ({"latency_ms": -5}, "latencyMs"),
    ],
)
async def test_a_bad_call_is_refused_and_changes_nothing(
    domain: JobDomain, bad: dict[str, object], field: str
) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    for attempt in ("result", "fail"):
        with pytest.raises(AppError) as err:
            if attempt == "result":
                await domain.submit_result(
                    lease,
                    prompt_version=None,
                    output_schema_version="v1",
                    output=ANALYSIS_OUTPUT,
                    calls=[call(), call(**bad)],
                )
            else:
                await domain.fail(
                    lease, error_code="MODEL_TIMEOUT", error_message="", calls=[call(**bad)]
                )
        assert err.value.code == "INVALID_ARGUMENT"
        assert err.value.details == {"field": field}
    after = await domain.get(job.job_id)
    assert (after.status, after.attempt_no) == ("locked", 1)
    assert await logged(domain, job.job_id) == []


async def test_a_repeated_fail_after_the_job_moved_on_answers_200_and_logs_nothing_more(
    domain: JobDomain,
) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    first = Lease(job.job_id, "w1", 1)
    calls = [call("failed", error_code="WORKER_SHUTDOWN")]
    await domain.fail(first, error_code="WORKER_SHUTDOWN", error_message="", calls=calls)
    [again] = await domain.claim("w2", CAPS, 1, 0)
    assert again.attempt_no == 2
    # w1's retry of the same FailJob: the fail that ended attempt 1, so 200
    current = await domain.fail(first, error_code="WORKER_SHUTDOWN", error_message="", calls=calls)
    assert (current.status, current.attempt_no, current.locked_by) == ("locked", 2, "w2")
    assert await logged(domain, job.job_id) == [(1, "failed", "WORKER_SHUTDOWN")]
    # a different code from w1 for attempt 1 is not a repeat
    with pytest.raises(AppError) as err:
        await domain.fail(first, error_code="MODEL_TIMEOUT", error_message="")
    assert err.value.code == "LOCK_NOT_HELD"


async def test_an_invalid_result_while_cancel_is_requested_ends_cancelled(
    domain: JobDomain,
) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.cancel(job.job_id, user_id=None, actor="user:u1")
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            Lease(job.job_id, "w1", 1),
            prompt_version=None,
            output_schema_version="v1",
            output={"foo": 1},
        )
    assert err.value.code == "INVALID_SCHEMA"
    after = await domain.get(job.job_id)
    assert (after.status, after.error_code) == ("cancelled", "INVALID_SCHEMA")
    assert after.cancelled_at is not None


async def test_a_call_in_another_key_mode_refuses_the_ending_and_writes_nothing(
    domain: JobDomain,
) -> None:
    """A platform-key job's call logged as a user-key one would escape the daily
    budget (reference §6): the result or fail carrying it is refused whole."""
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    stray = [call(), call(api_key_mode="user_deepseek_key")]
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            lease,
            prompt_version="p",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=stray,
        )
    assert (err.value.code, err.value.details) == ("INVALID_ARGUMENT", {"field": "apiKeyMode"})
    with pytest.raises(AppError) as err:
        await domain.fail(lease, error_code="MODEL_TIMEOUT", error_message="", calls=stray)
    assert err.value.code == "INVALID_ARGUMENT"
    after = await domain.get(job.job_id)
    assert (after.status, after.locked_by) == ("locked", "w1")
    assert await logged(domain, job.job_id) == []
    # the same ending with the job's own key mode goes through
    done = await domain.submit_result(
        lease,
        prompt_version="p",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call()],
    )
    assert done.status == "succeeded" and await logged(domain, job.job_id) == [
        (1, "succeeded", None)
    ]
