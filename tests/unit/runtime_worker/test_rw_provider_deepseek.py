"""DeepSeekProvider against a raw HTTP server: every classification row with its
real fault, the code, its retryability and the number of HTTP calls (cases D3–D8)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import aiohttp
import pytest

from airuntime_common.errors import ErrorCode, is_retryable
from runtime_worker.providers.base import ModelError, ModelRequest, ModelResponse
from runtime_worker.providers.deepseek import DeepSeekProvider, parse_envelope
from tests.unit.runtime_worker.rw_helpers import RawHttpServer, envelope, write_response

DEEPSEEK_402 = b'{"error":{"message":"Insufficient Balance","type":"unknown_error","param":null,"code":"invalid_request_error"}}'


def make_request(base_url: str, timeout: float = 3.0, job_deadline: bool = False) -> ModelRequest:
    return ModelRequest(
        model="deepseek-chat",
        messages=[{"role": "system", "content": "TASK: quiz_generation\njson"}],
        max_tokens=512,
        api_key="sk-testkey12345678",
        base_url=base_url,
        timeout_seconds=timeout,
        timeout_is_job_deadline=job_deadline,
    )


async def call(server: RawHttpServer, **kw: Any) -> ModelResponse:
    provider = DeepSeekProvider()
    try:
        return await provider.complete(make_request(server.base_url, **kw))
    finally:
        await provider.aclose()


async def expect_error(server: RawHttpServer, **kw: Any) -> ModelError:
    with pytest.raises(ModelError) as info:
        await call(server, **kw)
    return info.value


async def test_success_parses_envelope_and_sends_json_mode(raw_http: Any) -> None:
    async def ok(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope('{"items": []}'))

    server = await raw_http(ok)
    response = await call(server)
    assert response.content == '{"items": []}'
    assert response.finish_reason == "stop"
    assert response.usage.prompt_tokens == 100
    assert response.usage.completion_tokens == 20
    assert response.usage.cache_hit_tokens == 64
    assert response.provider_request_id == "req-abc"
    assert len(server.requests) == 1
    sent = server.requests[0]
    assert sent["method"] == "POST"
    assert sent["path"] == "/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer sk-testkey12345678"
    assert sent["json"]["response_format"] == {"type": "json_object"}
    assert sent["json"]["max_tokens"] == 512
    assert sent["json"]["model"] == "deepseek-chat"


async def test_blank_keepalive_lines_before_body_are_accepted(raw_http: Any) -> None:
    body = b"\n\n\n" + envelope('{"items": []}')

    async def slow(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, body)

    server = await raw_http(slow)
    response = await call(server)
    assert response.content == '{"items": []}'


STATUS_ROWS = [
    (429, ErrorCode.MODEL_RATE_LIMIT, True),
    (500, ErrorCode.TEMPORARY_PROVIDER_ERROR, True),
    (502, ErrorCode.TEMPORARY_PROVIDER_ERROR, True),
    (503, ErrorCode.TEMPORARY_PROVIDER_ERROR, True),
    (504, ErrorCode.TEMPORARY_PROVIDER_ERROR, True),
    (401, ErrorCode.INVALID_CREDENTIAL, False),
    (403, ErrorCode.INVALID_CREDENTIAL, False),
    (402, ErrorCode.INSUFFICIENT_BALANCE, False),
    (400, ErrorCode.MODEL_BAD_REQUEST, False),
    (422, ErrorCode.MODEL_BAD_REQUEST, False),
    (404, ErrorCode.MODEL_BAD_REQUEST, False),
    (599, ErrorCode.TEMPORARY_PROVIDER_ERROR, True),
]


@pytest.mark.parametrize(("status", "code", "retryable"), STATUS_ROWS)
async def test_http_status_rows(raw_http: Any, status: int, code: str, retryable: bool) -> None:
    async def fail(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        headers = {"Retry-After": "7"} if status == 429 else {}
        await write_response(
            w, status, DEEPSEEK_402 if status == 402 else b'{"error":{"message":"nope"}}', headers
        )

    server = await raw_http(fail)
    err = await expect_error(server)
    assert err.code == code
    assert err.http_status == status
    assert is_retryable(err.code) is retryable
    assert len(server.requests) == 1  # no hidden retries
    assert "sk-testkey" not in err.message


async def test_d7_rate_limit_carries_retry_after(raw_http: Any) -> None:
    async def limited(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(
            w, 429, b'{"error":{"message":"Rate limit reached"}}', {"Retry-After": "7"}
        )

    server = await raw_http(limited)
    err = await expect_error(server)
    assert err.code == ErrorCode.MODEL_RATE_LIMIT
    assert err.retry_after_seconds == 7.0
    assert is_retryable(err.code)


async def test_d3_out_of_balance_message_kept(raw_http: Any) -> None:
    async def broke(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 402, DEEPSEEK_402)

    server = await raw_http(broke)
    err = await expect_error(server)
    assert err.code == ErrorCode.INSUFFICIENT_BALANCE
    assert "Insufficient Balance" in err.message
    assert not is_retryable(err.code)
    assert len(server.requests) == 1


async def keepalive_forever(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
    w.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    while True:
        w.write(b"1\r\n\n\r\n")  # one blank line per chunk
        await w.drain()
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("job_deadline", "code"),
    [(False, ErrorCode.MODEL_TIMEOUT), (True, ErrorCode.JOB_TIMEOUT)],
)
async def test_d6_keepalive_forever_abandoned_at_deadline(
    raw_http: Any, job_deadline: bool, code: str
) -> None:
    server = await raw_http(keepalive_forever)
    began = time.monotonic()
    err = await expect_error(server, timeout=0.4, job_deadline=job_deadline)
    elapsed = time.monotonic() - began
    assert err.code == code
    assert is_retryable(err.code)
    assert 0.35 <= elapsed < 1.5  # blank lines did not extend the deadline
    assert len(server.requests) == 1


async def test_blank_lines_then_close_is_temporary(raw_http: Any) -> None:
    async def blanks(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(3):
            w.write(b"1\r\n\n\r\n")
        w.write(b"0\r\n\r\n")
        await w.drain()
        w.close()

    server = await raw_http(blanks)
    err = await expect_error(server)
    assert err.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert is_retryable(err.code)
    assert len(server.requests) == 1


async def test_cut_off_body_is_temporary(raw_http: Any) -> None:
    async def cut(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        body = envelope('{"items": []}')
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body) + 50}\r\n\r\n".encode()
            + body[:40]
        )
        await w.drain()
        w.close()

    server = await raw_http(cut)
    err = await expect_error(server)
    assert err.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert len(server.requests) == 1


async def test_200_garbage_is_temporary(raw_http: Any) -> None:
    async def html(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, b"<html>gateway</html>")

    server = await raw_http(html)
    err = await expect_error(server)
    assert err.code == ErrorCode.TEMPORARY_PROVIDER_ERROR


async def test_connect_refused_is_network_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    provider = DeepSeekProvider()
    try:
        with pytest.raises(ModelError) as info:
            await provider.complete(make_request(f"http://127.0.0.1:{port}"))
    finally:
        await provider.aclose()
    assert info.value.code == ErrorCode.NETWORK_ERROR
    assert is_retryable(info.value.code)


async def test_connection_dropped_before_status_is_network_error(raw_http: Any) -> None:
    async def drop(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        w.close()

    server = await raw_http(drop)
    err = await expect_error(server)
    assert err.code == ErrorCode.NETWORK_ERROR
    assert len(server.requests) == 1


async def test_error_body_key_is_redacted(raw_http: Any) -> None:
    async def leak(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        body = json.dumps({"error": {"message": "bad key sk-testkey12345678"}}).encode()
        await write_response(w, 401, body)

    server = await raw_http(leak)
    err = await expect_error(server)
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert "sk-testkey12345678" not in err.message


def test_cache_hits_are_capped_at_the_prompt_tokens() -> None:
    """A provider claiming more cache hits than prompt tokens does not get the
    attempt's result refused (job_service refuses such a call log): the hits are
    read as at most the prompt."""
    raw = json.dumps(
        {
            "id": "r",
            "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_cache_hit_tokens": 99},
        }
    ).encode()
    _, _, usage, _ = parse_envelope(raw)
    assert (usage.prompt_tokens, usage.cache_hit_tokens) == (10, 10)


async def test_http_proxy_from_the_environment_is_used(
    raw_http: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY reaches the model through the proxy (absolute-form request line);
    NO_PROXY sends the call straight to the endpoint."""

    async def ok(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope('{"items": []}'))

    proxy = await raw_http(ok)
    for var in ("NO_PROXY", "no_proxy", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
    provider = DeepSeekProvider()
    try:
        response = await provider.complete(make_request("http://model.example.invalid/v1"))
    finally:
        await provider.aclose()
    assert response.content == '{"items": []}'
    assert proxy.requests[0]["path"] == "http://model.example.invalid/v1/chat/completions"
    assert proxy.requests[0]["headers"]["authorization"] == "Bearer sk-testkey12345678"

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    direct = await raw_http(ok)
    await call(direct)
    assert len(direct.requests) == 1 and direct.requests[0]["path"] == "/chat/completions"
    assert len(proxy.requests) == 1


async def test_no_cookie_follows_one_call_to_the_next(raw_http: Any) -> None:
    """A cookie the provider sets is not sent back: calls carry different users' keys."""

    async def sets_cookie(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(
            w, 200, envelope('{"items": []}'), {"Set-Cookie": "session=abc; Path=/"}
        )

    server = await raw_http(sets_cookie)
    by_name = server.base_url.replace("127.0.0.1", "localhost")  # jars may refuse an IP's
    provider = DeepSeekProvider()
    try:
        for _ in range(2):
            await provider.complete(make_request(by_name))
    finally:
        await provider.aclose()
    assert [r["headers"].get("cookie") for r in server.requests] == [None, None]


async def test_no_redirect_is_followed(raw_http: Any) -> None:
    """A 3xx is the provider's answer, not a hop: the key is never sent elsewhere."""

    async def moved(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 307, b"", {"Location": "http://elsewhere.invalid/x"})

    server = await raw_http(moved)
    err = await expect_error(server)
    # any other non-2xx is a provider answering oddly: temporary (classify.py)
    assert (err.code, err.http_status) == (ErrorCode.TEMPORARY_PROVIDER_ERROR, 307)
    assert len(server.requests) == 1


async def test_a_session_passed_in_is_used_and_left_open(raw_http: Any) -> None:
    """``client=``: the calls go through the caller's session, which the provider
    neither closes nor instruments (its maker does)."""

    async def ok(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope('{"items": []}'))

    server = await raw_http(ok)
    async with aiohttp.ClientSession() as session:
        provider = DeepSeekProvider(session)
        response = await provider.complete(make_request(server.base_url))
        await provider.aclose()
        assert not session.closed
        with pytest.raises(RuntimeError):
            provider.add_trace_config(aiohttp.TraceConfig())
    assert response.content == '{"items": []}'
    assert len(server.requests) == 1
