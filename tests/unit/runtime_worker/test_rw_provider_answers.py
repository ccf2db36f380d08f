"""Model answers met in the field (SPEC §9.4, cases P1–P3), against a raw HTTP server:
a proxy's 408, a provider out of capacity mid-answer, and bodies past the byte cap."""

from __future__ import annotations

import asyncio
from typing import Any

from airuntime_common.errors import BREAKER_FAILURE_CODES, ErrorCode, is_retryable
from runtime_worker.providers.base import ModelError
from tests.unit.runtime_worker.rw_helpers import envelope, write_response
from tests.unit.runtime_worker.test_rw_generation import VALID, run_generate
from tests.unit.runtime_worker.test_rw_provider_deepseek import expect_error

#: An nginx-style proxy timeout in OpenAI's error shape.
PROXY_408 = (
    b'{"error":{"message":"request_timeout","type":"request_timeout","code":"request_timeout"}}'
)


async def test_p1_http_408_from_a_proxy_is_model_timeout_and_retried(raw_http: Any) -> None:
    async def proxy_timeout(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 408, PROXY_408)

    server = await raw_http(proxy_timeout)
    err = await expect_error(server)
    assert (err.code, err.http_status) == (ErrorCode.MODEL_TIMEOUT, 408)
    assert is_retryable(err.code)
    assert "request_timeout" in err.message
    assert len(server.requests) == 1  # retried by job_service, not by a hidden loop


#: Half a JSON object, as a provider out of capacity leaves it.
HALF_ANSWER = '{"items": [{"questionType": "single_choice", "stem": "What st'


async def test_p2_out_of_capacity_mid_answer_is_temporary_not_invalid_schema(
    raw_http: Any,
) -> None:
    async def out_of_capacity(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(
            w, 200, envelope(HALF_ANSWER, "insufficient_system_resource", rid="req-cap")
        )

    server = await raw_http(out_of_capacity)
    err = await expect_error(server)
    assert err.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert is_retryable(err.code) and err.code in BREAKER_FAILURE_CODES
    assert "insufficient_system_resource" in err.message
    assert err.provider_request_id == "req-cap"
    assert err.usage.completion_tokens == 20  # the tokens spent are still logged
    assert HALF_ANSWER not in err.message  # the cut-off text goes nowhere


async def test_p2_the_attempt_ends_temporary_without_a_reask(raw_http: Any) -> None:
    """Through generate(): one call, logged as TEMPORARY_PROVIDER_ERROR; the cut-off
    answer is neither re-asked (that is for our own bad output) nor INVALID_SCHEMA."""
    answers = [(HALF_ANSWER, "insufficient_system_resource"), (VALID, "stop")]

    async def respond(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        content, finish = answers.pop(0)
        await write_response(w, 200, envelope(content, finish))

    server = await raw_http(respond)
    result, invocations = await run_generate(server)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert len(server.requests) == 1
    assert [(i.outcome, i.error_code) for i in invocations] == [
        ("failed", ErrorCode.TEMPORARY_PROVIDER_ERROR)
    ]
