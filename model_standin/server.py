"""A local HTTP/1.1 server speaking DeepSeek's chat-completions protocol.

Built directly on :func:`asyncio.start_server` with a small HTTP/1.1 parser
(Content-Length and chunked request bodies, keep-alive, ``Expect:
100-continue``) so that faults are real on the wire: headers without a body,
blank keep-alive lines, connections closed mid-body, requests never answered.
Used only where configured explicitly (launcher dev mode, demo, tests;
SPEC §5).

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
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError

from model_standin import answers
from model_standin.faults import FAULT_LIST, RANDOM_500, Fault, FaultBook, error_body

log = logging.getLogger("model_standin")

#: Pending connections the listening socket queues (the kernel caps it at somaxconn).
LISTEN_BACKLOG = 4096
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Default ``max_tokens`` of deepseek-chat.
DEFAULT_MAX_TOKENS = 4096
#: The models a stand-in serves when given none: DeepSeek's (any ``deepseek-*`` name
#: is accepted, as aliases come and go).
DEEPSEEK_MODELS = ("deepseek-chat", "deepseek-reasoner")
REQUEST_LOG_SIZE = 200
#: Chunk size of a ``huge_body`` answer (bytes).
HUGE_BODY_CHUNK = 64 * 1024
CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
CONTENT_FAULTS = frozenset(
    {
        "empty_content",
        "truncated",
        "out_of_capacity",
        "invalid_json",
        "schema_violation",
        "foreign_ids",
        "content",
        "close_mid_body",
    }
)


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """One parsed HTTP/1.1 request."""

    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept open after the answer."""
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


def estimate_tokens(text: str) -> int:
    """DeepSeek's rule of thumb: ≈0.3 token per ASCII char, ≈0.6 per other char."""
    ascii_chars = sum(1 for c in text if ord(c) < 128)
    return max(1, math.ceil(ascii_chars * 0.3 + (len(text) - ascii_chars) * 0.6))


def mask_key(key: str) -> str:
    """``****`` plus the last four characters of a key, as DeepSeek shows it."""
    return "****" + key[-4:]


def key_fingerprint(key: str) -> str:
    """How the stand-in records a key it was sent: its SHA-256 (hex)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


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
    ) -> None:
        self.host = host
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
                    req = await self._read_request(reader, writer)
                except _HttpError as exc:
                    await self._send_json(
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

    async def _read_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            raise _HttpError(431, "Request header fields too large") from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _HttpError(400, "Malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise _HttpError(400, "Malformed header line")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size_line = await reader.readuntil(b"\r\n")
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _HttpError(400, "Malformed chunk size") from None
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    break
                total += size
                if total > MAX_BODY_BYTES:
                    raise _HttpError(413, "Request body too large")
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(chunks)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise _HttpError(400, "Malformed Content-Length") from None
            if length < 0 or length > MAX_BODY_BYTES:
                raise _HttpError(413, "Request body too large")
            body = await reader.readexactly(length)
        path = target.split("?", 1)[0]
        if path.startswith("http://") or path.startswith("https://"):
            path = "/" + path.split("/", 3)[-1] if path.count("/") >= 3 else "/"
        return Request(method.upper(), path, version, headers, body)

    # ------------------------------------------------------------------ responses

    @staticmethod
    def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [
            f"HTTP/1.1 {status} {reason}",
            f"Date: {formatdate(usegmt=True)}",
            "Server: deepseek-standin",
        ]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
        keep_alive: bool = True,
    ) -> bool:
        all_headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "keep-alive" if keep_alive else "close"),
            *(headers or []),
        ]
        writer.write(self._head(status, all_headers) + body)
        await writer.drain()
        return keep_alive

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: Any,
        *,
        headers: list[tuple[str, str]] | None = None,
        keep_alive: bool = True,
    ) -> bool:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        return await self._send(
            writer,
            status,
            body,
            content_type="application/json",
            headers=headers,
            keep_alive=keep_alive,
        )

    async def _until_client_gone(self, reader: asyncio.StreamReader) -> None:
        """Return when the client closed its side (or the server stops)."""

        async def eof() -> None:
            while await reader.read(4096):
                pass

        eof_task = asyncio.ensure_future(eof())
        stop_task = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({eof_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (eof_task, stop_task):
                t.cancel()
            await asyncio.gather(eof_task, stop_task, return_exceptions=True)

    # ------------------------------------------------------------------ routing

    async def _dispatch(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if req.path in CHAT_PATHS:
            if req.method != "POST":
                return await self._send_json(writer, 405, error_body(405, "Method Not Allowed"))
            return await self._chat(req, reader, writer)
        if req.path in ("/models", "/v1/models") and req.method == "GET":
            return await self._send_json(
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
        return await self._send_json(writer, 404, error_body(404, f"Not Found: {req.path}"))

    async def _admin(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        name = req.path.removeprefix("/_standin/").rstrip("/")
        if name == "health" and req.method == "GET":
            return await self._send_json(writer, 200, {"status": "ok"})
        if name == "stats" and req.method == "GET":
            return await self._send_json(writer, 200, self.stats())
        if name == "requests" and req.method == "GET":
            return await self._send_json(writer, 200, {"requests": self.requests()})
        if name == "seen" and req.method == "GET":
            return await self._send_json(writer, 200, self.seen())
        if name == "reset" and req.method == "POST":
            self.reset()
            return await self._send_json(writer, 200, {"reset": True})
        if name == "faults" and req.method == "GET":
            return await self._send_json(writer, 200, {"faults": self.book.pending()})
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
            except (ValueError, TypeError, ValidationError) as exc:
                return await self._send_json(writer, 400, error_body(400, f"Invalid faults: {exc}"))
            queued = self.book.add(faults)
            return await self._send_json(writer, 200, {"added": len(faults), "queued": queued})
        return await self._send_json(writer, 404, error_body(404, f"Not Found: {req.path}"))

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

    async def _chat(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        self._requests += 1
        entry: dict[str, Any] = {
            "at": time.time(),
            "path": req.path,
            "host": req.headers.get("host"),
        }
        self._log.append(entry)
        auth = req.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            self._record(entry, "auth_error")
            return await self._send_json(writer, 401, error_body(401))
        entry["keyMask"] = mask_key(key)
        fingerprint = key_fingerprint(key)
        self._seen_keys[fingerprint] += 1
        self._key_masks.setdefault(fingerprint, mask_key(key))
        if key.startswith("sk-invalid"):
            self._record(entry, "auth_error")
            return await self._send_json(
                writer,
                401,
                error_body(401, f"Authentication Fails, Your api key: {mask_key(key)} is invalid"),
            )
        try:
            body = json.loads(req.body)
        except ValueError:
            self._record(entry, "bad_request")
            return await self._send_json(
                writer, 400, error_body(400, "Invalid request body format: not JSON")
            )
        if not isinstance(body, dict):
            self._record(entry, "bad_request")
            return await self._send_json(writer, 400, error_body(400))
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
            self._record(entry, "bad_request")
            return await self._send_json(
                writer, 422, error_body(422, "Invalid Parameters: model is required")
            )
        if not self.serves(model):
            self._record(entry, "bad_request")
            return await self._send_json(writer, 400, error_body(400, "Model Not Exist"))
        if not isinstance(messages, list) or not messages:
            self._record(entry, "bad_request")
            return await self._send_json(
                writer,
                422,
                error_body(422, "Invalid Parameters: messages must be a non-empty list"),
            )
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            self._record(entry, "bad_request")
            return await self._send_json(
                writer, 422, error_body(422, "Invalid Parameters: max_tokens")
            )

        prompt: answers.Prompt | None = None
        prompt_error: str | None = None
        try:
            prompt = answers.parse_prompt(messages)
        except answers.PromptError as exc:
            prompt_error = str(exc)

        fault = self.book.take(task)
        if self.book.delay_ms:
            await asyncio.sleep(self.book.delay_ms / 1000)
        outcome = "ok"
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(fault.ms / 1000)
            fault, outcome = None, "delay"
        if fault is not None and fault.kind not in CONTENT_FAULTS:
            return await self._wire_fault(fault, entry, reader, writer)
        if prompt is None:
            self._record(entry, "bad_request")
            return await self._send_json(writer, 400, error_body(400, prompt_error))

        answer = answers.build_answer(prompt)
        content = json.dumps(answer, ensure_ascii=False)
        finish = "stop"
        if fault is not None:
            outcome = fault.kind
            content, finish = self._fault_content(fault, prompt, answer, content)
        completion_tokens = estimate_tokens(content)
        if completion_tokens > max_tokens and finish == "stop":
            keep = max(1, int(len(content) * max_tokens / completion_tokens) - 1)
            content, finish, outcome = content[:keep], "length", "length_limit"
            completion_tokens = min(max_tokens, estimate_tokens(content))
        payload = self._completion(model, messages, content, finish, completion_tokens)
        self._record(entry, outcome)
        if body.get("stream"):
            return await self._stream(writer, payload)
        if fault is not None and fault.kind == "close_mid_body":
            raw = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            head = self._head(
                200,
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(raw))),
                    ("Connection", "keep-alive"),
                ],
            )
            part = raw[: int(len(raw) * fault.fraction)]
            if len(part) >= len(raw):
                part = raw[:-1]
            writer.write(head + part)
            await writer.drain()
            return False
        return await self._send_json(
            writer, 200, payload, headers=[("x-ds-trace-id", uuid.uuid4().hex)]
        )

    @staticmethod
    def _fault_content(
        fault: Fault, prompt: answers.Prompt, answer: dict[str, Any], content: str
    ) -> tuple[str, str]:
        if fault.kind == "empty_content":
            return " " * 8, "stop"
        if fault.kind == "truncated":
            return content[: max(1, int(len(content) * 0.6))], "length"
        if fault.kind == "out_of_capacity":
            return content[: int(len(content) * fault.fraction)], "insufficient_system_resource"
        if fault.kind == "invalid_json":
            return content[:-1] + ",}", "stop"
        if fault.kind == "schema_violation":
            return json.dumps(
                answers.schema_violation(prompt.task, answer), ensure_ascii=False
            ), "stop"
        if fault.kind == "foreign_ids":
            bad = answers.foreign_ids(prompt.task, answer, fault.foreignId)
            return json.dumps(bad, ensure_ascii=False), "stop"
        if fault.kind == "content":
            return fault.content, "stop"
        return content, "stop"  # close_mid_body: the body itself is cut

    def _completion(
        self, model: str, messages: list[Any], content: str, finish: str, completion_tokens: int
    ) -> dict[str, Any]:
        prompt_tokens = 0
        system = ""
        for m in messages:
            if isinstance(m, dict):
                text = answers._content_text(m.get("content"))
                prompt_tokens += estimate_tokens(text) + 4
                if m.get("role") == "system" and not system:
                    system = text
        hit = 0
        if system:
            if system in self._seen_prefixes:
                hit = min(prompt_tokens, estimate_tokens(system) + 4)
            else:
                self._seen_prefixes.add(system)
        return {
            "id": str(uuid.uuid4()),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": hit},
                "prompt_cache_hit_tokens": hit,
                "prompt_cache_miss_tokens": prompt_tokens - hit,
            },
            "system_fingerprint": "fp_standin",
        }

    async def _stream(self, writer: asyncio.StreamWriter, payload: dict[str, Any]) -> bool:
        """Send a completion as server-sent events (``stream: true``)."""
        head = self._head(
            200,
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Transfer-Encoding", "chunked"),
                ("Cache-Control", "no-cache"),
                ("Connection", "keep-alive"),
            ],
        )
        writer.write(head)
        content: str = payload["choices"][0]["message"]["content"]
        base = {k: payload[k] for k in ("id", "created", "model", "system_fingerprint")}
        base["object"] = "chat.completion.chunk"
        pieces = [content[i : i + 64] for i in range(0, len(content), 64)] or [""]
        events: list[dict[str, Any]] = [
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        ]
        events += [
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}
                ],
            }
            for p in pieces
        ]
        events.append(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": ""},
                        "logprobs": None,
                        "finish_reason": payload["choices"][0]["finish_reason"],
                    }
                ],
                "usage": payload["usage"],
            }
        )
        for ev in events:
            writer.write(_chunk(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()))
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _wire_fault(
        self,
        fault: Fault,
        entry: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if fault.kind == "status":
            self._record(entry, "random_500" if fault is RANDOM_500 else f"status_{fault.status}")
            headers: list[tuple[str, str]] = []
            retry_after = fault.retry_after_header()
            if retry_after is not None:
                headers.append(("Retry-After", retry_after))
            if fault.location is not None:
                headers.append(("Location", fault.location))
            return await self._send_json(
                writer, fault.status, error_body(fault.status, fault.message), headers=headers
            )
        if fault.kind == "hang":
            self._record(entry, "hang")
            await self._until_client_gone(reader)
            return False
        chunked_head = self._head(
            200,
            [
                ("Content-Type", "application/json"),
                ("Transfer-Encoding", "chunked"),
                ("Connection", "keep-alive"),
            ],
        )
        if fault.kind == "huge_body":
            self._record(entry, "huge_body")
            await _send_huge_body(fault, entry, writer, chunked_head)
            return False
        if fault.kind == "keepalive_forever":
            self._record(entry, "keepalive_forever")
            writer.write(chunked_head)
            await writer.drain()
            gone = asyncio.ensure_future(self._until_client_gone(reader))
            try:
                while not gone.done():
                    writer.write(_chunk(b"\n"))
                    await writer.drain()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(gone), fault.interval_seconds())
            finally:
                gone.cancel()
                await asyncio.gather(gone, return_exceptions=True)
            return False
        # blank_then_close
        self._record(entry, "blank_then_close")
        writer.write(chunked_head)
        await writer.drain()
        for _ in range(fault.lines):
            writer.write(_chunk(b"\n"))
            await writer.drain()
            await asyncio.sleep(fault.interval_seconds())
        return False


async def _send_huge_body(
    fault: Fault, entry: dict[str, Any], writer: asyncio.StreamWriter, head: bytes
) -> None:
    """Stream a chat completion with ``fault.totalBytes`` bytes of content.

    Each chunk is written once the previous one left (``drain``), so the stand-in
    holds one chunk however big the answer; ``entry["bytesSent"]`` counts the body
    bytes handed to the socket, and ``entry["clientClosed"]`` tells whether the
    client went away before the end (the connection then breaks on a write).
    """
    prefix = (
        '{"id":"' + uuid.uuid4().hex + '","object":"chat.completion","model":"deepseek-chat",'
        '"choices":[{"index":0,"message":{"role":"assistant","content":"'
    ).encode()
    suffix = b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    filler = b"a" * HUGE_BODY_CHUNK
    pause = fault.interval_seconds()
    entry["bytesSent"] = 0
    entry["clientClosed"] = False
    try:
        writer.write(head + _chunk(prefix))
        await writer.drain()
        entry["bytesSent"] = len(prefix)
        left = fault.totalBytes
        while left > 0:
            piece = filler if left >= len(filler) else filler[:left]
            writer.write(_chunk(piece))
            await writer.drain()
            entry["bytesSent"] += len(piece)
            left -= len(piece)
            if pause:
                await asyncio.sleep(pause)
        writer.write(_chunk(suffix) + b"0\r\n\r\n")
        await writer.drain()
        entry["bytesSent"] += len(suffix)
    except (ConnectionError, OSError):
        entry["clientClosed"] = True


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


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
