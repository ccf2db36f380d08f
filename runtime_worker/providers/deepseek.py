"""DeepSeek (OpenAI-compatible) chat completions over httpx (SPEC §5).

One :meth:`DeepSeekProvider.complete` = exactly one HTTP call (no hidden
retries). The whole call — connect, headers and body read — runs under ONE
``asyncio.timeout``: DeepSeek keeps a queued non-streaming request alive by
sending blank lines, which would reset any per-read timeout forever (case D6).
Failures are classified by :mod:`runtime_worker.providers.classify`.
"""

from __future__ import annotations

import asyncio
import json
import time
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from airuntime_common.logs import redact_text
from runtime_worker.providers.base import ModelError, ModelRequest, ModelResponse, Usage
from runtime_worker.providers.classify import Fault, code_for, fault_for_status, parse_retry_after

#: Longest provider error text copied into an error message (chars).
MAX_ERROR_TEXT = 300


def _elapsed_ms(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def _error_text(raw: bytes) -> str:
    """The provider's error message from an error body, redacted and shortened."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"]
        elif isinstance(err, str):
            text = err
    return redact_text(text[:MAX_ERROR_TEXT])


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def parse_envelope(raw: bytes) -> tuple[str, str | None, Usage, str | None]:
    """Parse a chat completion body.

    Leading blank keep-alive lines are allowed (JSON whitespace).

    Returns:
        ``(content, finish_reason, usage, id)``; ``content`` is ``""`` when null.

    Raises:
        ValueError: the body is not a chat completion envelope.
    """
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("envelope is not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("envelope has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ValueError("choice has no message")
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ValueError("message content is not a string")
    finish = choices[0].get("finish_reason")
    usage_raw = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert isinstance(usage_raw, dict)
    cache_hit = usage_raw.get("prompt_cache_hit_tokens")
    if cache_hit is None:  # OpenAI's spelling, for other compatible providers
        details = usage_raw.get("prompt_tokens_details")
        cache_hit = details.get("cached_tokens") if isinstance(details, dict) else 0
    prompt_tokens = _int(usage_raw.get("prompt_tokens"))
    usage = Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=_int(usage_raw.get("completion_tokens")),
        # the hits are a part of the prompt: job_service refuses a log claiming more
        cache_hit_tokens=min(_int(cache_hit), prompt_tokens),
    )
    rid = data.get("id")
    return content, finish if isinstance(finish, str) else None, usage, (str(rid) if rid else None)


#: Connections per httpx pool (see :class:`DeepSeekProvider`).
CONNECTIONS_PER_POOL = 2


class DeepSeekProvider:
    """DeepSeek's ``POST {baseUrl}/chat/completions`` in JSON output mode.

    Args:
        client: an ``httpx.AsyncClient`` to use for every call; when omitted the
            provider makes its own (closed by :meth:`aclose`).
        max_connections: connections the provider's own clients may hold, all kept
            alive between calls. Each in-flight job makes one call at a time, so
            the worker passes its ``WORKER_CONCURRENCY``: fewer would queue calls
            (capping throughput at connections / call time) and keeping fewer
            alive than are open reconnects on almost every call.

    The connections are spread over several ``httpx.AsyncClient`` pools of at most
    :data:`CONNECTIONS_PER_POOL` each, every call going to the pool with the fewest
    calls in flight. httpcore's pool does work quadratic in its concurrent requests
    on every request it finishes (500 calls on one pool cost 15 ms of CPU each,
    under 1 ms on pools of 8; ``python -m bench --scenario worker500``), and on
    every request it checks each of its connections: 16 calls at a time cost
    1.2–1.5 ms of CPU each on pools of 2, 1.9–2.3 ms on pools of 8 (an ad-hoc loop
    against the stand-in, interleaved). The pools share one TLS context: making
    one per client costs about 40 ms each. The provider's own clients keep no cookie
    (a ``Set-Cookie`` from one user's call must not go out with another's) and
    follow no redirect (the key goes to the configured base URL only).
    """

    name = "deepseek"

    def __init__(
        self, client: httpx.AsyncClient | None = None, *, max_connections: int = 100
    ) -> None:
        self._own_client = client is None
        if client is not None:
            self._clients = [client]
        else:
            pools = max(1, -(-max_connections // CONNECTIONS_PER_POOL))
            per_pool = -(-max_connections // pools)
            tls = httpx.create_ssl_context()  # httpx's default (certifi, SSL_CERT_FILE)
            self._clients = [
                httpx.AsyncClient(
                    follow_redirects=False,
                    verify=tls,
                    # no domain may set a cookie: a call carries one user's key, and
                    # nothing the provider answered to it goes out with the next one's
                    cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
                    limits=httpx.Limits(
                        max_connections=per_pool, max_keepalive_connections=per_pool
                    ),
                )
                for _ in range(pools)
            ]
        self._in_flight = [0] * len(self._clients)

    @property
    def http_clients(self) -> tuple[httpx.AsyncClient, ...]:
        """The ``httpx.AsyncClient`` pools the calls go through (to instrument them)."""
        return tuple(self._clients)

    @property
    def pools(self) -> int:
        """How many HTTP connection pools the calls are spread over."""
        return len(self._clients)

    def _least_busy(self) -> int:
        counts = self._in_flight
        return min(range(len(counts)), key=counts.__getitem__)

    async def aclose(self) -> None:
        """Close the HTTP clients if this provider created them."""
        if self._own_client:
            for c in self._clients:
                await c.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One chat completion call under one overall deadline.

        Args:
            request: the call; ``timeout_seconds`` bounds everything incl. the body read.

        Returns:
            The parsed envelope (content not yet validated).

        Raises:
            ModelError: classified failure (see :mod:`runtime_worker.providers.classify`).
        """
        url = request.base_url.rstrip("/") + "/chat/completions"
        body = {
            "model": request.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "response_format": {"type": "json_object"},
            "stream": False,
        }
        headers = {
            "Authorization": f"Bearer {request.api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        start = time.monotonic()
        status = 0
        raw = b""
        body_error: Exception | None = None
        resp_headers: httpx.Headers = httpx.Headers()
        pool = self._least_busy()
        self._in_flight[pool] += 1
        try:
            async with asyncio.timeout(request.timeout_seconds):
                async with self._clients[pool].stream(
                    "POST",
                    url,
                    json=body,
                    headers=headers,
                    timeout=httpx.Timeout(request.timeout_seconds),
                ) as resp:
                    status = resp.status_code
                    resp_headers = resp.headers
                    try:
                        raw = await resp.aread()
                    except httpx.TimeoutException:
                        raise
                    except httpx.HTTPError as exc:
                        body_error = exc
        except (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
            fault = Fault.JOB_DEADLINE if request.timeout_is_job_deadline else Fault.TIMEOUT
            raise ModelError(
                code_for(fault),
                f"model call exceeded its {request.timeout_seconds:g}s deadline"
                + (" (the job's time budget)" if request.timeout_is_job_deadline else ""),
                http_status=status or None,
                latency_ms=_elapsed_ms(start),
            ) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ModelError(
                code_for(Fault.CONNECT_ERROR),
                f"cannot connect to the model endpoint: {type(exc).__name__}",
                latency_ms=_elapsed_ms(start),
            ) from exc
        except httpx.HTTPError as exc:
            raise ModelError(
                code_for(Fault.READ_ERROR),
                f"network error talking to the model: {type(exc).__name__}",
                latency_ms=_elapsed_ms(start),
            ) from exc
        finally:
            self._in_flight[pool] -= 1
        latency = _elapsed_ms(start)
        request_id = resp_headers.get("x-request-id")
        status_fault = fault_for_status(status)
        if status_fault is not None:
            retry_after = (
                parse_retry_after(resp_headers.get("retry-after"))
                if status_fault is Fault.HTTP_429
                else None
            )
            raise ModelError(
                code_for(status_fault),
                f"model answered HTTP {status}: {_error_text(raw)}",
                retry_after_seconds=retry_after,
                http_status=status,
                provider_request_id=request_id,
                latency_ms=latency,
            )
        if body_error is not None:
            raise ModelError(
                code_for(Fault.BAD_ENVELOPE),
                f"model answer was cut off: {type(body_error).__name__}",
                http_status=status,
                provider_request_id=request_id,
                latency_ms=latency,
            )
        try:
            content, finish, usage, envelope_id = parse_envelope(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelError(
                code_for(Fault.BAD_ENVELOPE),
                f"model answer is not a chat completion envelope ({len(raw)} bytes): {exc}",
                http_status=status,
                provider_request_id=request_id,
                latency_ms=latency,
            ) from exc
        return ModelResponse(
            content=content,
            finish_reason=finish,
            usage=usage,
            provider_request_id=envelope_id or request_id,
            latency_ms=latency,
        )
