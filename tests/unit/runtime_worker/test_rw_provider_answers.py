"""Model answers met in the field (SPEC §9.4, cases P1–P3), against a raw HTTP server:
a proxy's 408, a provider out of capacity mid-answer, and bodies past the byte cap."""

from __future__ import annotations

import asyncio
from typing import Any

from airuntime_common.errors import ErrorCode, is_retryable
from tests.unit.runtime_worker.rw_helpers import write_response
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
