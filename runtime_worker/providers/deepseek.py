"""DeepSeek (OpenAI-compatible) chat completions over httpx (SPEC §5).

One :meth:`DeepSeekProvider.complete` = exactly one HTTP call (no hidden
retries). The whole call — connect, headers and body read — runs under ONE
``asyncio.timeout``: DeepSeek keeps a queued non-streaming request alive by
sending blank lines, which would reset any per-read timeout forever (case D6).
The body is read with a byte cap (``MODEL_MAX_RESPONSE_BYTES``, case P3;
:mod:`runtime_worker.providers.body`): past it the call fails at once and the
connection is closed, whatever the provider goes on sending.
Failures are classified by :mod:`runtime_worker.providers.classify`.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from airuntime_common.logs import redact_text
from runtime_worker.providers.base import ModelError, ModelRequest, ModelResponse, Usage
from runtime_worker.providers.body import (
    DEFAULT_MAX_RESPONSE_BYTES,
    BodyTooLarge,
    UnsupportedEncoding,
    read_bounded,
)
from runtime_worker.providers.classify import (
    Fault,
    code_for,
    fault_for_finish_reason,
    fault_for_status,
    parse_retry_after,
)

#: Longest provider error text copied into an error message (chars).
MAX_ERROR_TEXT = 300
#: Most bytes of an error answer (non-2xx) read: its status decides, the text only explains.
MAX_ERROR_BODY_BYTES = 64 * 1024


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
        max_response_bytes: most bytes of one answer's body, decoded
            (``MODEL_MAX_RESPONSE_BYTES``, SPEC §9.4); a longer answer is
            ``TEMPORARY_PROVIDER_ERROR`` and is not read further, so a call holds at
            most this much however much the provider sends.

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
        self,
        client: httpx.AsyncClient | None = None,
        *,
        max_connections: int = 100,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be at least 1")
        self.max_response_bytes = max_response_bytes
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
        start = time.monotonic()
        answer = await self._exchange(request, start)
        return _classify(answer, _elapsed_ms(start))

    async def _exchange(self, request: ModelRequest, start: float) -> _Answer:
        """Send the request and read the answer's status, headers and (capped) body.

        Raises:
            ModelError: the call timed out, could not connect, or broke before a status.
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
            # the body is counted as it arrives: compressed, its size says nothing
            "Accept-Encoding": "identity",
        }
        answer = _Answer()
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
                    answer.status = resp.status_code
                    answer.headers = resp.headers
                    await self._read_body(resp, answer)
        except (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
            fault = Fault.JOB_DEADLINE if request.timeout_is_job_deadline else Fault.TIMEOUT
            raise ModelError(
                code_for(fault),
                f"model call exceeded its {request.timeout_seconds:g}s deadline"
                + (" (the job's time budget)" if request.timeout_is_job_deadline else ""),
                http_status=answer.status or None,
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
        return answer

    async def _read_body(self, resp: httpx.Response, answer: _Answer) -> None:
        """Read the body into ``answer`` within the byte cap: an error answer's
        (non-2xx) at most :data:`MAX_ERROR_BODY_BYTES`, as only its status counts."""
        limit = self.max_response_bytes
        if not 200 <= resp.status_code < 300:
            limit = min(limit, MAX_ERROR_BODY_BYTES)
        try:
            answer.raw = await read_bounded(
                resp.aiter_raw(),
                limit=limit,
                content_encoding=resp.headers.get("content-encoding", ""),
                content_length=resp.headers.get("content-length"),
            )
        except httpx.TimeoutException:
            raise
        except BodyTooLarge as exc:
            # leaving the stream unread closes the connection (it is never pooled)
            answer.too_large = exc
        except UnsupportedEncoding as exc:
            answer.body_problem = str(exc)
        except (httpx.HTTPError, zlib.error) as exc:
            answer.body_problem = f"it was cut off ({type(exc).__name__})"


@dataclass
class _Answer:
    """What came back from one call before it is classified.

    Attributes:
        status: HTTP status (0 before one arrived).
        raw: the decoded body, or what could be read of it.
        too_large: set when the body passed the byte cap (reading stopped).
        body_problem: why the body could not be read whole, or None.
    """

    status: int = 0
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    raw: bytes = b""
    too_large: BodyTooLarge | None = None
    body_problem: str | None = None


def _classify(answer: _Answer, latency: int) -> ModelResponse:
    """An answer with a status as a :class:`ModelResponse`, or its classified failure.

    Raises:
        ModelError: a non-2xx status, a body past the cap, cut off or no envelope, or a
            ``finish_reason`` that is the provider's failure (:mod:`classify`).
    """
    status = answer.status
    request_id = answer.headers.get("x-request-id")

    def error(fault: Fault, message: str, **extra: Any) -> ModelError:
        return ModelError(
            code_for(fault),
            message,
            http_status=status,
            provider_request_id=extra.pop("provider_request_id", request_id),
            latency_ms=latency,
            **extra,
        )

    status_fault = fault_for_status(status)
    if status_fault is not None:
        retry_after = (
            parse_retry_after(answer.headers.get("retry-after"))
            if status_fault is Fault.HTTP_429
            else None
        )
        raise error(
            status_fault,
            f"model answered HTTP {status}: {_error_text(answer.raw)}",
            retry_after_seconds=retry_after,
        )
    if answer.too_large is not None:
        announced = answer.too_large.announced
        raise error(
            Fault.BODY_TOO_LARGE,
            f"model answer is over MODEL_MAX_RESPONSE_BYTES ({answer.too_large.limit} bytes"
            + (f"; Content-Length {announced}" if announced is not None else "")
            + "): not read further",
        )
    if answer.body_problem is not None:
        raise error(Fault.BAD_ENVELOPE, f"model answer unusable: {answer.body_problem}")
    raw = answer.raw
    try:
        content, finish, usage, envelope_id = parse_envelope(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(
            Fault.BAD_ENVELOPE,
            f"model answer is not a chat completion envelope ({len(raw)} bytes): {exc}",
        ) from exc
    finish_fault = fault_for_finish_reason(finish)
    if finish_fault is not None:
        # the provider gave up mid-answer (case P2): its failure, not our output's;
        # the cut-off content is dropped, never validated nor fed back
        raise error(
            finish_fault,
            f"model stopped mid-answer: finish_reason={finish}",
            provider_request_id=envelope_id or request_id,
            usage=usage,
        )
    return ModelResponse(
        content=content,
        finish_reason=finish,
        usage=usage,
        provider_request_id=envelope_id or request_id,
        latency_ms=latency,
    )
