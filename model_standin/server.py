"""A local HTTP/1.1 server speaking DeepSeek's chat-completions protocol.

Built directly on :func:`asyncio.start_server` with a small HTTP/1.1 parser of
its own (:mod:`model_standin.wire`) so that faults are real on the wire: headers
without a body, blank keep-alive lines, connections closed mid-body, requests
never answered (:mod:`model_standin.wire_faults`). The answers are
:mod:`model_standin.completions` of :mod:`model_standin.answers`. Used only where
configured explicitly (launcher dev mode, demo, tests; reference §5).

Endpoints:

* ``POST /chat/completions`` (also ``/v1/chat/completions``) — DeepSeek's
  OpenAI-compatible chat completion; ``Authorization: Bearer <key>`` required
  (keys starting ``sk-invalid`` → 401); JSON answers built by
  :mod:`model_standin.answers`; ``"stream": true`` answers as SSE.
* ``GET /models`` (also ``/v1/models``).
* ``POST /_standin/faults`` (a JSON list of faults, or
  ``{"faults": [...], "faultRate": x, "delayMs": n}``), ``GET /_standin/faults``,
  ``GET /_standin/stats``, ``GET /_standin/requests``, ``GET /_standin/seen``,
  ``POST /_standin/reset``, ``GET /_standin/health`` — test controls, no
  authentication.

One stand-in plays one provider (``name``): several started side by side, one port
each (:func:`model_standin.providers.run_standins`, ``python -m model_standin
--providers a=8600,b=8601``),
each with its own faults, statistics and record of the keys and models it was sent
(``/_standin/seen``: a key by its SHA-256 and mask, never in clear), show a
failover and that no key reaches another provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import ssl
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from model_standin import answers
from model_standin.completions import (
    CONTENT_FAULTS,
    completion,
    fault_content,
    send_cut,
    send_stream,
    within_max_tokens,
)
from model_standin.faults import FAULT_LIST, Fault, FaultBook, error_body
from model_standin.wire import MAX_HEADER_BYTES, HttpError, Request, read_request, send_json
from model_standin.wire_faults import outcome_of, send_wire_fault

log = logging.getLogger("model_standin")

#: Pending connections the listening socket queues (the kernel caps it at somaxconn).
LISTEN_BACKLOG = 4096
#: Default ``max_tokens`` of deepseek-chat.
DEFAULT_MAX_TOKENS = 4096
#: The models a stand-in serves when given none: DeepSeek's (any ``deepseek-*`` name
#: is accepted, as aliases come and go).
DEEPSEEK_MODELS = ("deepseek-chat", "deepseek-reasoner")
REQUEST_LOG_SIZE = 200
CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class _Refusal:
    """A chat request refused before any answer: its statistics outcome, HTTP status
    and message (None: DeepSeek's message for the status)."""

    outcome: str
    status: int
    message: str | None = None


@dataclass(frozen=True)
class _ChatCall:
    """What a well-formed chat request asks for."""

    model: str
    messages: list[Any]
    max_tokens: int
    stream: bool
    task: str | None


def mask_key(key: str) -> str:
    """``****`` plus the last four characters of a key, as DeepSeek shows it."""
    return "****" + key[-4:]


def key_fingerprint(key: str) -> str:
    """How the stand-in records a key it was sent: its SHA-256 (hex)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class MinuteLimit:
    """A provider's own per-minute request limit, over a sliding 60-second window.

    Args:
        per_minute: requests admitted in any 60 s (0: no limit).
    """

    WINDOW = 60.0

    def __init__(self, per_minute: int = 0) -> None:
        self.per_minute = per_minute
        self._admitted: deque[float] = deque()  # monotonic, those of the window
        self._history: list[float] = []  # wall, every one since start or reset

    def reset(self) -> None:
        """Forget every admitted request."""
        self._admitted.clear()
        self._history.clear()

    def admit(self, now: float) -> int | None:
        """Admit a request at ``now`` (``time.monotonic()``): None when admitted, else
        the whole seconds until the window has room (its ``Retry-After``)."""
        while self._admitted and self._admitted[0] <= now - self.WINDOW:
            self._admitted.popleft()
        if self.per_minute and len(self._admitted) >= self.per_minute:
            return max(1, math.ceil(self._admitted[0] + self.WINDOW - now))
        self._admitted.append(now)
        self._history.append(time.time())
        return None

    def admitted(self) -> list[float]:
        """The wall times (s since the epoch) of every request admitted since start or
        the last reset, in order."""
        return list(self._history)


class StandIn:
    """The stand-in server: state, fault book and the asyncio server.

    Args:
        host: interface to bind.
        port: TCP port; 0 picks a free one (see :attr:`port` after start).
        fault_rate: probability of a random HTTP 500 per chat request.
        delay_ms: added before every chat answer (ms).
        seed: seed of the random faults (None: unseeded).
        faults: scripted faults queued at start.
        name: the provider it plays (reported by ``/_standin/stats`` and ``/seen``).
        models: the model names it serves, exactly; None: DeepSeek's (any
            ``deepseek-*``). Any other model is answered 400 ``Model Not Exist``.
        tls: serve HTTPS with this server context (certificate loaded); None: HTTP.
        requests_per_minute: its own limit: a chat request past this many in the last
            60 s is answered 429 with ``Retry-After`` (0: none), as a provider's is.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8600,
        *,
        fault_rate: float = 0.0,
        delay_ms: int = 0,
        seed: int | None = None,
        faults: list[Fault] | list[dict[str, Any]] | None = None,
        name: str = "deepseek",
        models: Sequence[str] | None = None,
        tls: ssl.SSLContext | None = None,
        requests_per_minute: int = 0,
    ) -> None:
        self.host = host
        self.limiter = MinuteLimit(requests_per_minute)
        self.tls = tls
        self.name = name
        self.models = tuple(models) if models is not None else None
        self._seen_keys: Counter[str] = Counter()
        self._key_masks: dict[str, str] = {}
        self._seen_models: Counter[str] = Counter()
        self._port = port
        self._initial = (fault_rate, delay_ms)
        self.book = FaultBook(fault_rate=fault_rate, delay_ms=delay_ms, seed=seed)
        self._initial_faults = [
            f if isinstance(f, Fault) else Fault.model_validate(f) for f in faults or []
        ]
        self.book.add(self._initial_faults)
        self._outcomes: Counter[str] = Counter()
        self._tasks: Counter[str] = Counter()
        self._requests = 0
        self._log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_SIZE)
        self._seen_prefixes: set[str] = set()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The bound port (the real one once started with port 0)."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://host:port`` (``https://`` with ``tls``) — use it as DeepSeek's base URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self._port}"

    async def start(self) -> None:
        """Bind and start serving."""
        self._stopping.clear()
        self._server = await asyncio.start_server(
            self._on_connection,
            self.host,
            self._port,
            limit=MAX_HEADER_BYTES,
            # a 500-slot worker opens hundreds of connections at once; asyncio's
            # default backlog of 100 drops the rest's SYNs (a 1 s retransmit each)
            backlog=LISTEN_BACKLOG,
            ssl=self.tls,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("stand-in listening on %s", self.base_url)

    async def stop(self) -> None:
        """Stop accepting, end every open connection (hung ones too), and wait."""
        self._stopping.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def serve_forever(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, then stop."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ------------------------------------------------------------------ controls

    def add_faults(self, faults: list[Fault] | list[dict[str, Any]]) -> int:
        """Queue scripted faults (models or their JSON); returns the queue length.

        Raises:
            pydantic.ValidationError: a fault is malformed.
        """
        parsed = [f if isinstance(f, Fault) else Fault.model_validate(f) for f in faults]
        return self.book.add(parsed)

    def reset(self) -> None:
        """Clear faults, statistics, the request log and the prompt cache;
        restore the start-up fault rate, delay and scripted faults."""
        self.book.clear()
        self.book.add(self._initial_faults)
        self.book.fault_rate, self.book.delay_ms = self._initial
        self.limiter.reset()
        self._outcomes.clear()
        self._tasks.clear()
        self._requests = 0
        self._log.clear()
        self._seen_prefixes.clear()
        self._seen_keys.clear()
        self._key_masks.clear()
        self._seen_models.clear()

    def stats(self) -> dict[str, Any]:
        """Chat requests served: total, by outcome, by task, and the fault settings.

        Outcomes: ``ok``, ``auth_error``, ``bad_request``, ``random_500``
        (``fault_rate``), ``status_<code>`` (scripted), ``length_limit``
        (answer cut at the request's ``max_tokens``), or the fault kind
        (``delay``, ``hang``, ``truncated``, …).
        """
        return {
            "provider": self.name,
            "requests": self._requests,
            "byOutcome": dict(self._outcomes),
            "byTask": dict(self._tasks),
            "pendingFaults": len(self.book.pending()),
            "openConnections": len(self._conns),
            "faultRate": self.book.fault_rate,
            "delayMs": self.book.delay_ms,
            "requestsPerMinute": self.limiter.per_minute,
            "admittedAt": self.limiter.admitted(),
        }

    def seen(self) -> dict[str, Any]:
        """Every key and model the chat requests carried, since start or reset.

        Returns:
            ``{"provider": name, "keys": [{"sha256", "mask", "calls"}…],
            "models": {model: calls}}``; keys by :func:`key_fingerprint`, in the
            order first seen (invalid ones too: what was *sent* here).
        """
        return {
            "provider": self.name,
            "keys": [
                {"sha256": fp, "mask": self._key_masks[fp], "calls": calls}
                for fp, calls in self._seen_keys.items()
            ],
            "models": dict(self._seen_models),
        }

    def seen_keys(self) -> set[str]:
        """The fingerprints (:func:`key_fingerprint`) of the keys sent here."""
        return set(self._seen_keys)

    def serves(self, model: str) -> bool:
        """Whether a chat request naming ``model`` is answered (see ``models``)."""
        if self.models is None:
            return model.startswith("deepseek-")
        return model in self.models

    def requests(self) -> list[dict[str, Any]]:
        """The last chat requests (oldest first): path, model, task, masked key,
        outcome, max_tokens, response_format and the messages."""
        return list(self._log)

    # ------------------------------------------------------------------ connection

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while not self._stopping.is_set():
                try:
                    req = await read_request(reader, writer)
                except HttpError as exc:
                    await send_json(
                        writer, exc.status, error_body(exc.status, exc.message), keep_alive=False
                    )
                    break
                if req is None:
                    break
                keep = await self._dispatch(req, reader, writer)
                if not (keep and req.keep_alive):
                    break
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # never let one bad request kill the server
            log.exception("stand-in connection failed")
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # ------------------------------------------------------------------ routing

    async def _dispatch(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if req.path in CHAT_PATHS:
            if req.method != "POST":
                return await send_json(writer, 405, error_body(405, "Method Not Allowed"))
            return await self._chat(req, reader, writer)
        if req.path in ("/models", "/v1/models") and req.method == "GET":
            return await send_json(
                writer,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "owned_by": self.name}
                        for m in (self.models if self.models is not None else DEEPSEEK_MODELS)
                    ],
                },
            )
        if req.path.startswith("/_standin/"):
            return await self._admin(req, writer)
        return await send_json(writer, 404, error_body(404, f"Not Found: {req.path}"))

    async def _admin(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        name = req.path.removeprefix("/_standin/").rstrip("/")
        if name == "health" and req.method == "GET":
            return await send_json(writer, 200, {"status": "ok"})
        if name == "stats" and req.method == "GET":
            return await send_json(writer, 200, self.stats())
        if name == "requests" and req.method == "GET":
            return await send_json(writer, 200, {"requests": self.requests()})
        if name == "seen" and req.method == "GET":
            return await send_json(writer, 200, self.seen())
        if name == "reset" and req.method == "POST":
            self.reset()
            return await send_json(writer, 200, {"reset": True})
        if name == "faults" and req.method == "GET":
            return await send_json(writer, 200, {"faults": self.book.pending()})
        if name == "faults" and req.method == "POST":
            try:
                data = json.loads(req.body or b"[]")
                raw = data.get("faults", []) if isinstance(data, dict) else data
                faults = FAULT_LIST.validate_python(raw)
                if isinstance(data, dict):
                    if "faultRate" in data:
                        rate = float(data["faultRate"])
                        if not 0.0 <= rate <= 1.0:
                            raise ValueError("faultRate must be within 0..1")
                        self.book.fault_rate = rate
                    if "delayMs" in data:
                        self.book.delay_ms = max(0, int(data["delayMs"]))
                    if "requestsPerMinute" in data:
                        self.limiter.per_minute = max(0, int(data["requestsPerMinute"] or 0))
            except (ValueError, TypeError, ValidationError) as exc:
                return await send_json(writer, 400, error_body(400, f"Invalid faults: {exc}"))
            queued = self.book.add(faults)
            return await send_json(writer, 200, {"added": len(faults), "queued": queued})
        return await send_json(writer, 404, error_body(404, f"Not Found: {req.path}"))

    # ------------------------------------------------------------------ chat

    def _record(self, entry: dict[str, Any], outcome: str) -> None:
        entry["outcome"] = outcome
        self._outcomes[outcome] += 1
        log.info(
            "chat request",
            extra={
                "fields": {
                    "task": entry.get("task"),
                    "model": entry.get("model"),
                    "outcome": outcome,
                    "keyMask": entry.get("keyMask"),
                }
            },
        )

    def _check_key(self, req: Request, entry: dict[str, Any]) -> _Refusal | None:
        """The bearer key, recorded (masked and fingerprinted); refused when missing
        or invalid (``sk-invalid…``)."""
        scheme, _, key = req.headers.get("authorization", "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return _Refusal("auth_error", 401)
        entry["keyMask"] = mask_key(key)
        fingerprint = key_fingerprint(key)
        self._seen_keys[fingerprint] += 1
        self._key_masks.setdefault(fingerprint, mask_key(key))
        if key.startswith("sk-invalid"):
            message = f"Authentication Fails, Your api key: {mask_key(key)} is invalid"
            return _Refusal("auth_error", 401, message)
        return None

    def _chat_call(self, req: Request, entry: dict[str, Any]) -> _ChatCall | _Refusal:
        """The request's body read as DeepSeek reads it (recorded in ``entry`` and
        the statistics), or its refusal (400 / 422, as DeepSeek answers)."""
        try:
            body = json.loads(req.body)
        except ValueError:
            return _Refusal("bad_request", 400, "Invalid request body format: not JSON")
        if not isinstance(body, dict):
            return _Refusal("bad_request", 400)
        messages = body.get("messages")
        model = body.get("model")
        entry.update(
            model=model,
            maxTokens=body.get("max_tokens"),
            responseFormat=body.get("response_format"),
            stream=bool(body.get("stream")),
            messages=messages,
        )
        if isinstance(model, str) and model:
            self._seen_models[model[:128]] += 1
        task = answers.find_task(messages)
        entry["task"] = task
        if task:
            self._tasks[task] += 1
        if not isinstance(model, str) or not model:
            return _Refusal("bad_request", 422, "Invalid Parameters: model is required")
        if not self.serves(model):
            return _Refusal("bad_request", 400, "Model Not Exist")
        if not isinstance(messages, list) or not messages:
            return _Refusal(
                "bad_request", 422, "Invalid Parameters: messages must be a non-empty list"
            )
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _Refusal("bad_request", 422, "Invalid Parameters: max_tokens")
        return _ChatCall(model, messages, max_tokens, bool(body.get("stream")), task)

    async def _refuse(
        self, writer: asyncio.StreamWriter, entry: dict[str, Any], refusal: _Refusal
    ) -> bool:
        self._record(entry, refusal.outcome)
        return await send_json(writer, refusal.status, error_body(refusal.status, refusal.message))

    async def _take_fault(self, task: str | None) -> tuple[Fault | None, str]:
        """The scripted or random fault for this request (a ``delay`` is served here),
        after the stand-in's own delay; and the outcome so far."""
        fault = self.book.take(task)
        if self.book.delay_ms:
            await asyncio.sleep(self.book.delay_ms / 1000)
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(fault.ms / 1000)
            return None, "delay"
        return fault, "ok"

    def _completion_of(
        self, call: _ChatCall, prompt: answers.Prompt, fault: Fault | None, outcome: str
    ) -> tuple[dict[str, Any], str]:
        """The completion answering ``prompt`` (spoiled by a content fault, cut at
        ``max_tokens``) and the request's outcome."""
        answer = answers.build_answer(prompt)
        content = json.dumps(answer, ensure_ascii=False)
        finish = "stop"
        if fault is not None:
            outcome = fault.kind
            content, finish = fault_content(fault, prompt, answer, content)
        content, cut_finish, tokens = within_max_tokens(content, finish, call.max_tokens)
        if cut_finish != finish:
            outcome = "length_limit"
        payload = completion(
            call.model, call.messages, content, cut_finish, tokens, self._seen_prefixes
        )
        return payload, outcome

    async def _chat(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """One chat completion: the key, the body, a fault if one is due, the answer."""
        self._requests += 1
        entry: dict[str, Any] = {
            "at": time.time(),
            "path": req.path,
            "host": req.headers.get("host"),
        }
        self._log.append(entry)
        refusal = self._check_key(req, entry)
        if refusal is not None:
            return await self._refuse(writer, entry, refusal)
        call = self._chat_call(req, entry)
        if isinstance(call, _Refusal):
            return await self._refuse(writer, entry, call)
        prompt: answers.Prompt | None = None
        prompt_error: str | None = None
        try:
            prompt = answers.parse_prompt(call.messages)
        except answers.PromptError as exc:
            prompt_error = str(exc)
        fault, outcome = await self._take_fault(call.task)
        over = self.limiter.admit(time.monotonic()) if fault is None else None
        if over is not None:  # past its own per-minute limit: 429, as a provider answers
            fault = Fault(kind="status", status=429, retryAfter=str(over))
        if fault is not None and fault.kind not in CONTENT_FAULTS:
            self._record(entry, outcome_of(fault))
            return await send_wire_fault(fault, entry, reader, writer, self._stopping)
        if prompt is None:
            return await self._refuse(writer, entry, _Refusal("bad_request", 400, prompt_error))
        payload, outcome = self._completion_of(call, prompt, fault, outcome)
        self._record(entry, outcome)
        if call.stream:
            return await send_stream(writer, payload)
        if fault is not None and fault.kind == "close_mid_body":
            return await send_cut(writer, payload, fault.fraction)
        return await send_json(writer, 200, payload, headers=[("x-ds-trace-id", uuid.uuid4().hex)])


@contextlib.asynccontextmanager
async def run_standin(
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    fault_rate: float = 0.0,
    delay_ms: int = 0,
    seed: int | None = None,
    faults: list[Fault] | list[dict[str, Any]] | None = None,
) -> AsyncIterator[StandIn]:
    """Run a stand-in in this event loop for the duration of the block.

    Example::

        async with run_standin(port=0) as standin:
            standin.add_faults([{"kind": "status", "status": 429, "retryAfter": 7}])
            ... use standin.base_url as DeepSeek's base URL ...
            assert standin.stats()["byOutcome"]["status_429"] == 1

    Args:
        port: TCP port; 0 for a free one.
        host: interface to bind.
        fault_rate: probability of a random HTTP 500 per chat request.
        delay_ms: delay before every chat answer (ms).
        seed: seed of the random faults.
        faults: scripted faults queued at start.

    Yields:
        The running :class:`StandIn`; stopped (all connections closed) on exit.
    """
    server = StandIn(host, port, fault_rate=fault_rate, delay_ms=delay_ms, seed=seed, faults=faults)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
