"""Model answers met in the field (reference §9.4, cases P1–P3), against a raw HTTP server:
a proxy's 408, a provider out of capacity mid-answer, and bodies past the byte cap."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
import zlib
from typing import Any

import pytest

from airuntime_common.errors import BREAKER_FAILURE_CODES, ErrorCode, is_retryable
from model_standin import run_standin
from runtime_worker.providers.base import ModelError, ModelResponse
from runtime_worker.providers.body import BodyTooLarge, BoundedBody, UnsupportedEncoding
from runtime_worker.providers.deepseek import DeepSeekProvider
from tests.unit.runtime_worker.rw_helpers import envelope, write_response
from tests.unit.runtime_worker.test_rw_generation import VALID, run_generate
from tests.unit.runtime_worker.test_rw_provider_deepseek import expect_error, make_request

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


# ------------------------------------------------------------ P3: the byte cap

MiB = 1024 * 1024


async def capped_call(base_url: str, limit: int) -> tuple[ModelResponse | ModelError, int]:
    """One call with a ``limit``-byte cap → (its answer or error, peak bytes traced)."""
    provider = DeepSeekProvider(max_response_bytes=limit)
    tracemalloc.start()
    try:
        try:
            result: ModelResponse | ModelError = await provider.complete(make_request(base_url))
        except ModelError as exc:
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await provider.aclose()
    return result, peak


async def test_p3_endless_answer_stops_at_the_cap_and_closes_the_connection() -> None:
    """200, chunked, 500 MB: the call fails TEMPORARY_PROVIDER_ERROR having read about
    the cap, holding about the cap, and the stand-in sees the connection close."""
    async with run_standin() as standin:
        standin.add_faults([{"kind": "huge_body", "totalBytes": 500_000_000}])
        result, peak = await capped_call(standin.base_url, 2 * MiB)
        assert isinstance(result, ModelError)
        assert (result.code, result.http_status) == (ErrorCode.TEMPORARY_PROVIDER_ERROR, 200)
        assert is_retryable(result.code) and result.code in BREAKER_FAILURE_CODES
        assert "MODEL_MAX_RESPONSE_BYTES" in result.message
        entry = standin.requests()[-1]
        async with asyncio.timeout(5):
            while not entry.get("clientClosed"):  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.01)
        # what left the stand-in: the cap plus what the sockets buffer, not 500 MB
        assert entry["bytesSent"] < 2 * MiB + 32 * MiB
    assert peak < 2 * MiB + 2 * MiB  # the body is never held past the cap


async def test_p3_an_answer_announcing_more_than_the_cap_is_not_read(raw_http: Any) -> None:
    sent: list[int] = []

    async def announce_a_gigabyte(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        w.write(b"Content-Length: 1000000000\r\n\r\n")
        total = 0
        try:
            while total < 1_000_000_000:
                w.write(b" " * 65536)
                await w.drain()
                total += 65536
        except ConnectionError:
            pass
        sent.append(total)

    server = await raw_http(announce_a_gigabyte)
    result, _ = await capped_call(server.base_url, 1 * MiB)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert "Content-Length 1000000000" in result.message
    async with asyncio.timeout(5):
        while not sent:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert sent[0] < 64 * MiB  # the connection was closed, not drained


async def test_p3_a_compressed_bomb_is_inflated_only_up_to_the_cap(raw_http: Any) -> None:
    """A proxy that gzips regardless: 200 MB of JSON whitespace in 200 KB of gzip. It is
    inflated in steps of at most the room left, so the cap bounds memory, not the wire."""
    bomb = gzip.compress(b" " * (200 * MiB) + envelope('{"items": []}'), compresslevel=9)
    assert len(bomb) < 1 * MiB

    async def gzipped(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, bomb, {"Content-Encoding": "gzip"})

    server = await raw_http(gzipped)
    result, peak = await capped_call(server.base_url, 4 * MiB)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert "MODEL_MAX_RESPONSE_BYTES" in result.message
    assert peak < 4 * MiB + 1 * MiB
    assert server.requests[0]["headers"]["accept-encoding"] == "identity"


@pytest.mark.parametrize("encoding", ["", "gzip", "deflate"])
async def test_an_answer_within_the_cap_is_read_whole(raw_http: Any, encoding: str) -> None:
    content = json.dumps({"items": [], "pad": "x" * (MiB // 2)})
    body = envelope(content)
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        body = zlib.compress(body)

    async def ok(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, body, {"Content-Encoding": encoding} if encoding else {})

    server = await raw_http(ok)
    result, _ = await capped_call(server.base_url, MiB)
    assert isinstance(result, ModelResponse)
    assert result.content == content


async def test_an_encoding_that_cannot_be_bounded_is_temporary(raw_http: Any) -> None:
    async def brotli(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, b"\x0b\x02\x80", {"Content-Encoding": "br"})

    server = await raw_http(brotli)
    result, _ = await capped_call(server.base_url, MiB)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert "'br' is not supported" in result.message


async def test_an_error_answer_s_body_is_read_only_in_part(raw_http: Any) -> None:
    """A 503 with a runaway body: the status decides; at most 64 KiB of it is read,
    and the connection is closed under the rest."""
    filler = b"x" * 65536  # the server sends 64 MiB without holding them
    ended: list[str] = []

    async def runaway_503(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 503 X\r\nContent-Type: application/json\r\n")
        w.write(f"Content-Length: {1024 * len(filler) + 23}\r\n\r\n".encode())
        w.write(b'{"error":{"message":"')
        try:
            for _ in range(1024):
                w.write(filler)
                await w.drain()
            w.write(b'"}}')
            await w.drain()
            ended.append("sent it all")
        except ConnectionError:
            ended.append("closed by the client")

    server = await raw_http(runaway_503)
    result, peak = await capped_call(server.base_url, 8 * MiB)
    assert isinstance(result, ModelError)
    assert (result.code, result.http_status) == (ErrorCode.TEMPORARY_PROVIDER_ERROR, 503)
    assert peak < 2 * MiB
    async with asyncio.timeout(5):
        while not ended:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert ended == ["closed by the client"]


def test_bounded_body_refuses_a_byte_past_the_limit() -> None:
    body = BoundedBody(10)
    body.feed(b"0123456789")
    with pytest.raises(BodyTooLarge):
        body.feed(b"x")
    assert len(body) == 10  # nothing of the refused chunk was kept
    cut = BoundedBody(1000, "gzip")
    cut.feed(gzip.compress(b"hello world")[:-8])  # no trailer
    with pytest.raises(zlib.error):
        cut.finish()
    with pytest.raises(UnsupportedEncoding):
        BoundedBody(10, "gzip, gzip")
