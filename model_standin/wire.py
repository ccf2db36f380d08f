"""HTTP/1.1 on the stand-in's sockets: reading a request, writing an answer.

A small parser of its own (Content-Length and chunked request bodies, keep-alive,
``Expect: 100-continue``) rather than a framework, so that the stand-in's faults
are real on the wire: headers without a body, blank keep-alive lines, connections
closed mid-body, requests never answered (:mod:`model_standin.wire_faults`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024


class HttpError(Exception):
    """A request the parser refuses: answered with ``status`` and the connection closed."""

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


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """Method, target, version and headers (names lower-cased, repeats joined)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "Malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(400, "Malformed header line")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return method, target, version, headers


async def _chunked_body(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise HttpError(400, "Malformed chunk size") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(chunks)
        total += size
        if total > MAX_BODY_BYTES:
            raise HttpError(413, "Request body too large")
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _sized_body(reader: asyncio.StreamReader, value: str) -> bytes:
    try:
        length = int(value)
    except ValueError:
        raise HttpError(400, "Malformed Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise HttpError(413, "Request body too large")
    return await reader.readexactly(length)


def _path_of(target: str) -> str:
    """The path of a request target (an absolute-form ``http://host/path`` too)."""
    path = target.split("?", 1)[0]
    if path.startswith("http://") or path.startswith("https://"):
        path = "/" + path.split("/", 3)[-1] if path.count("/") >= 3 else "/"
    return path


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    """The next request of a connection, or None when the client closed it.

    Raises:
        HttpError: 431 for a head over the reader's limit, 400 for a malformed
            request line, header, chunk size or ``Content-Length``, 413 for a body
            over :data:`MAX_BODY_BYTES`.
    """
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "Request header fields too large") from None
    method, target, version, headers = _parse_head(head)
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _chunked_body(reader)
    elif "content-length" in headers:
        body = await _sized_body(reader, headers["content-length"])
    return Request(method.upper(), _path_of(target), version, headers, body)


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """An answer's status line and headers (with ``Date`` and ``Server``), ending
    in the blank line."""
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


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def send(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    headers: list[tuple[str, str]] | None = None,
    keep_alive: bool = True,
) -> bool:
    """Write a whole answer; returns ``keep_alive`` (whether the connection goes on)."""
    all_headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "keep-alive" if keep_alive else "close"),
        *(headers or []),
    ]
    writer.write(head(status, all_headers) + body)
    await writer.drain()
    return keep_alive


async def send_json(
    writer: asyncio.StreamWriter,
    status: int,
    payload: Any,
    *,
    headers: list[tuple[str, str]] | None = None,
    keep_alive: bool = True,
) -> bool:
    """Write ``payload`` as a JSON answer (see :func:`send`)."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    return await send(
        writer,
        status,
        body,
        content_type="application/json",
        headers=headers,
        keep_alive=keep_alive,
    )


async def until_client_gone(reader: asyncio.StreamReader, stopping: asyncio.Event) -> None:
    """Return when the client closed its side, or ``stopping`` is set."""

    async def eof() -> None:
        while await reader.read(4096):
            pass

    eof_task = asyncio.ensure_future(eof())
    stop_task = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({eof_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (eof_task, stop_task):
            t.cancel()
        await asyncio.gather(eof_task, stop_task, return_exceptions=True)
