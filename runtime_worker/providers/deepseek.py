"""DeepSeek (OpenAI-compatible) chat completions over aiohttp (reference §5).

One :meth:`DeepSeekProvider.complete` = exactly one HTTP call (no hidden
retries). The whole call — connect, headers and body read — runs under ONE
``asyncio.timeout``: DeepSeek keeps a queued non-streaming request alive by
sending blank lines, which would reset any per-read timeout forever (case D6).
The body is read with a byte cap (``MODEL_MAX_RESPONSE_BYTES``, case P3;
:mod:`runtime_worker.providers.body`): past it the call fails at once and the
connection is closed, whatever the provider goes on sending.
Failures are classified by :mod:`runtime_worker.providers.classify`.

A request to a user's own base URL comes pinned (``ModelRequest.pinned``, set by
:mod:`runtime_worker.egress` after the egress rules passed, reference §10.5): it goes
through a session of its own, to the checked addresses and nowhere else (the URL's
host is the address; ``Host`` and the TLS server name are the URL's host name; the
session's resolver refuses every lookup), with no proxy from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import certifi
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.helpers import get_env_proxy_for_url

from airuntime_common.egress import CheckedTarget
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


class DeepSeekProvider:
    """DeepSeek's ``POST {baseUrl}/chat/completions`` in JSON output mode.

    Args:
        client: an ``aiohttp.ClientSession`` to use for every call (its caller sets
            its cookies, redirects, TLS, proxies and tracing, and closes it); when
            omitted the provider makes its own on its first call (closed by
            :meth:`aclose`). Pinned calls (users' base URLs) never use it: they go
            through the provider's own pinned session (:meth:`_pinned`).
        max_connections: connections the provider's own session may hold, all kept
            alive between calls. Each in-flight job makes one call at a time, so
            the worker passes its ``WORKER_CONCURRENCY``: fewer would queue calls
            (capping throughput at connections / call time).
        max_response_bytes: most bytes of one answer's body, decoded
            (``MODEL_MAX_RESPONSE_BYTES``, reference §9.4); a longer answer is
            ``TEMPORARY_PROVIDER_ERROR`` and is not read further, so a call holds at
            most this much however much the provider sends.

    The calls go through one ``aiohttp`` session over one connection pool
    (``TCPConnector(limit=max_connections)``). Against the stand-in, 16 calls at a
    time cost 0.75–0.88 ms of the process's CPU each, where httpx cost 3.0–3.8 ms
    (spread over pools of 2 connections, as httpcore's pool does work quadratic in
    its concurrent requests); 500 at a time 0.66–0.68 ms each in the one pool
    (3.05–3.08 ms on httpx pools of 2), so aiohttp's pool needs no spreading.
    Measured with an ad-hoc loop of 3,000 calls (5,000 at 500) through
    :meth:`complete` against the model stand-in in another process, the
    two interleaved (3 rounds; 2 at 500), ``time.process_time`` per call, on a
    2-CPU machine under load.

    The provider's own session reads the body raw (decoded by
    :mod:`runtime_worker.providers.body`, never by aiohttp), keeps no cookie (a
    ``Set-Cookie`` from one user's call must not go out with another's), follows
    no redirect (the key goes to the configured base URL only), verifies TLS with
    one shared context (certifi's roots, or ``SSL_CERT_FILE``) and takes a proxy
    from ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` (read once per endpoint) for a
    configured provider's endpoint, never for a user's (pinned) one.
    """

    name = "deepseek"
    #: honours ``ModelRequest.pinned`` (the egress guard refuses a provider that does not)
    accepts_pinned = True

    def __init__(
        self,
        client: aiohttp.ClientSession | None = None,
        *,
        max_connections: int = 100,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be at least 1")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_response_bytes = max_response_bytes
        self.max_connections = max_connections
        self._own_client = client is None
        self._session = client
        #: the calls to users' own base URLs (reference §10.5): always this provider's own
        self._pinned_session: aiohttp.ClientSession | None = None
        self._trace_configs: list[aiohttp.TraceConfig] = []
        # (scheme, host, port) -> the proxy from the environment, or None
        self._proxies: dict[tuple[str, str | None, int | None], tuple[Any, Any]] = {}

    def add_trace_config(self, config: aiohttp.TraceConfig) -> None:
        """Trace the provider's own session with ``config`` (before its first call).

        Raises:
            RuntimeError: the session was passed in or already made.
        """
        if not self._own_client or self._session is not None:
            raise RuntimeError("the provider's session exists already: trace it where it is made")
        self._trace_configs.append(config)

    def _client(self) -> aiohttp.ClientSession:
        """The session, made on the first call (aiohttp needs the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, ssl=_tls_context()
                ),
                # no cookie is kept: a call carries one user's key, and nothing the
                # provider answered to it goes out with the next one's
                cookie_jar=aiohttp.DummyCookieJar(),
                # the body is decoded here, within its cap (body.py)
                auto_decompress=False,
                # the one deadline is the caller's asyncio.timeout
                timeout=aiohttp.ClientTimeout(total=None),
                trace_configs=self._trace_configs or None,
            )
        return self._session

    def _proxy(self, url: yarl.URL) -> tuple[Any, Any]:
        """The proxy (and its auth) the environment names for ``url``, or ``(None, None)``.

        Looked up once per endpoint (``trust_env`` would look it, and ``~/.netrc``,
        up in a thread on every call)."""
        key = (url.scheme, url.host, url.port)
        found = self._proxies.get(key)
        if found is None:
            try:
                found = get_env_proxy_for_url(url)
            except LookupError:
                found = (None, None)
            self._proxies[key] = found
        return found

    def _pinned(self) -> aiohttp.ClientSession:
        """The session of pinned calls (users' base URLs), made on the first one.

        Its own pool, apart from the providers': a connection is keyed by the address
        it went to and the TLS server name it verified (aiohttp's ``ConnectionKey``), so
        a kept-alive one is reused only for that checked address and that name. No
        proxy, ``~/.netrc`` or cookie is ever taken, no lookup is ever made.
        """
        if self._pinned_session is None:
            self._pinned_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections,
                    limit_per_host=0,
                    ssl=_tls_context(),
                    resolver=_NoLookup(),
                    use_dns_cache=False,
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
                trust_env=False,
                trace_configs=self._trace_configs or None,
            )
        return self._pinned_session

    async def aclose(self) -> None:
        """Close the HTTP session if this provider created it, and the pinned calls' one."""
        if self._own_client and self._session is not None:
            await self._session.close()
            self._session = None
        if self._pinned_session is not None:
            await self._pinned_session.close()
            self._pinned_session = None

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
        data = json.dumps(body).encode()
        answer = _Answer()
        try:
            async with asyncio.timeout(request.timeout_seconds):
                if request.pinned is not None:
                    await self._post_pinned(request.pinned, data, headers, answer)
                else:
                    url = yarl.URL(request.base_url.rstrip("/") + "/chat/completions")
                    proxy, proxy_auth = self._proxy(url) if self._own_client else (None, None)
                    await self._post(
                        self._client(),
                        url,
                        data,
                        headers,
                        answer,
                        proxy=proxy,
                        proxy_auth=proxy_auth,
                    )
        except TimeoutError as exc:  # incl. aiohttp's own (a passed-in session's timeouts)
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                raise _connect_error(exc, start) from exc
            fault = Fault.JOB_DEADLINE if request.timeout_is_job_deadline else Fault.TIMEOUT
            raise ModelError(
                code_for(fault),
                f"model call exceeded its {request.timeout_seconds:g}s deadline"
                + (" (the job's time budget)" if request.timeout_is_job_deadline else ""),
                http_status=answer.status or None,
                latency_ms=_elapsed_ms(start),
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise _connect_error(exc, start) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ModelError(
                code_for(Fault.READ_ERROR),
                f"network error talking to the model: {type(exc).__name__}",
                latency_ms=_elapsed_ms(start),
            ) from exc
        return answer

    async def _post(
        self,
        session: aiohttp.ClientSession,
        url: yarl.URL,
        data: bytes,
        headers: dict[str, str],
        answer: _Answer,
        **options: Any,
    ) -> None:
        """One POST, never following a redirect; its status, headers and capped body
        go into ``answer``."""
        async with session.post(
            url, data=data, headers=headers, allow_redirects=False, **options
        ) as resp:
            answer.status = resp.status
            answer.headers = resp.headers
            await self._read_body(resp, answer)

    async def _post_pinned(
        self, target: CheckedTarget, data: bytes, headers: dict[str, str], answer: _Answer
    ) -> None:
        """The POST to a user's base URL, to its checked addresses only (reference §10.5).

        The addresses are tried in the resolver's order while connecting to one fails
        (nothing was sent to it); TLS is verified against the URL's host name, which
        ``Host`` carries too.

        Raises:
            aiohttp.ClientConnectorError: no checked address could be connected to (the
                last one's error), or TLS failed.
        """
        base = target.base
        headers = {**headers, "Host": base.host_header}
        tls_name = base.host if base.scheme == "https" else None
        session = self._pinned()
        failed: aiohttp.ClientConnectorError | None = None
        for address in target.addresses:
            host = f"[{address}]" if address.version == 6 else str(address)
            url = yarl.URL.build(
                scheme=base.scheme,
                host=host,
                port=base.port,
                path=f"{base.path}/chat/completions",
                encoded=True,
            )
            try:
                await self._post(session, url, data, headers, answer, server_hostname=tls_name)
                return
            except aiohttp.ClientSSLError:
                raise
            except aiohttp.ClientConnectorError as exc:
                failed = exc
        assert failed is not None  # a checked target has at least one address
        raise failed

    async def _read_body(self, resp: aiohttp.ClientResponse, answer: _Answer) -> None:
        """Read the body into ``answer`` within the byte cap: an error answer's
        (non-2xx) at most :data:`MAX_ERROR_BODY_BYTES`, as only its status counts."""
        limit = self.max_response_bytes
        if not 200 <= resp.status < 300:
            limit = min(limit, MAX_ERROR_BODY_BYTES)
        try:
            answer.raw = await read_bounded(
                resp.content.iter_any(),
                limit=limit,
                content_encoding=resp.headers.get("content-encoding", ""),
                content_length=resp.headers.get("content-length"),
            )
        except TimeoutError:
            resp.close()
            raise
        except BodyTooLarge as exc:
            # the rest is left unread: the connection is closed, never pooled
            resp.close()
            answer.too_large = exc
        except UnsupportedEncoding as exc:
            resp.close()
            answer.body_problem = str(exc)
        except (aiohttp.ClientError, OSError, zlib.error) as exc:
            resp.close()
            answer.body_problem = f"it was cut off ({type(exc).__name__})"


def _connect_error(exc: Exception, start: float) -> ModelError:
    return ModelError(
        code_for(Fault.CONNECT_ERROR),
        f"cannot connect to the model endpoint: {type(exc).__name__}",
        latency_ms=_elapsed_ms(start),
    )


class _NoLookup(AbstractResolver):
    """The pinned session's resolver: refuses every name lookup, since a pinned call
    connects to an address checked beforehand and a second lookup could answer
    another (DNS rebinding)."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        raise OSError(f"no name lookup on a pinned call ({host!r})")

    async def close(self) -> None:
        return None


_TLS: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every session (making one costs some 40 ms):
    the roots of ``SSL_CERT_FILE`` when set, else certifi's, as httpx does."""
    global _TLS
    if _TLS is None:
        cafile = os.environ.get("SSL_CERT_FILE") or certifi.where()
        _TLS = ssl.create_default_context(cafile=cafile)
    return _TLS


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
    headers: Mapping[str, str] = field(default_factory=dict)
    raw: bytes = b""
    too_large: BodyTooLarge | None = None
    body_problem: str | None = None


def _classify(answer: _Answer, latency: int) -> ModelResponse:
    """An answer with a status as a :class:`ModelResponse`, or its classified failure.

    Raises:
        ModelError: a non-2xx status, a body past the cap, cut off or no envelope, or a
            ``finish_reason`` that is the provider's failure (:mod:`~runtime_worker.providers.classify`).
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
