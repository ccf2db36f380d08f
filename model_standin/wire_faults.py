"""Faults on the wire: answers that break HTTP rather than the model's content.

A status with DeepSeek's error body (``Retry-After`` when the fault has one, and
``Location`` for a redirect), a
request never answered (``hang``), an endless chunked body (``huge_body``), blank
keep-alive lines forever (``keepalive_forever``) or a few of them before the
connection closes (``blank_then_close``). Content faults (a cut answer, invalid
JSON…) are :mod:`model_standin.completions`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from model_standin.faults import RANDOM_500, Fault, error_body
from model_standin.wire import chunk, head, send_json, until_client_gone

#: Chunk size of a ``huge_body`` answer (bytes).
HUGE_BODY_CHUNK = 64 * 1024


def outcome_of(fault: Fault) -> str:
    """How a wire fault is counted in the stand-in's statistics."""
    if fault.kind == "status":
        return "random_500" if fault is RANDOM_500 else f"status_{fault.status}"
    return fault.kind


async def send_wire_fault(
    fault: Fault,
    entry: dict[str, Any],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stopping: asyncio.Event,
) -> bool:
    """Answer a chat request with ``fault``; returns whether the connection goes on.

    Args:
        entry: the request's record (a ``huge_body`` notes what it sent there).
        stopping: set when the stand-in stops (a held answer ends then).
    """
    if fault.kind == "status":
        headers: list[tuple[str, str]] = []
        retry_after = fault.retry_after_header()
        if retry_after is not None:
            headers.append(("Retry-After", retry_after))
        if fault.location is not None:
            headers.append(("Location", fault.location))
        return await send_json(
            writer, fault.status, error_body(fault.status, fault.message), headers=headers
        )
    if fault.kind == "hang":
        await until_client_gone(reader, stopping)
        return False
    chunked_head = head(
        200,
        [
            ("Content-Type", "application/json"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive"),
        ],
    )
    if fault.kind == "huge_body":
        await _send_huge_body(fault, entry, writer, chunked_head)
    elif fault.kind == "keepalive_forever":
        await _keep_alive_forever(fault, reader, writer, chunked_head, stopping)
    else:  # blank_then_close
        writer.write(chunked_head)
        await writer.drain()
        for _ in range(fault.lines):
            writer.write(chunk(b"\n"))
            await writer.drain()
            await asyncio.sleep(fault.interval_seconds())
    return False


async def _keep_alive_forever(
    fault: Fault,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    chunked_head: bytes,
    stopping: asyncio.Event,
) -> None:
    """A blank line every ``fault.interval_seconds()`` until the client goes away."""
    writer.write(chunked_head)
    await writer.drain()
    gone = asyncio.ensure_future(until_client_gone(reader, stopping))
    try:
        while not gone.done():
            writer.write(chunk(b"\n"))
            await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(gone), fault.interval_seconds())
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)


async def _send_huge_body(
    fault: Fault, entry: dict[str, Any], writer: asyncio.StreamWriter, chunked_head: bytes
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
        writer.write(chunked_head + chunk(prefix))
        await writer.drain()
        entry["bytesSent"] = len(prefix)
        left = fault.totalBytes
        while left > 0:
            piece = filler if left >= len(filler) else filler[:left]
            writer.write(chunk(piece))
            await writer.drain()
            entry["bytesSent"] += len(piece)
            left -= len(piece)
            if pause:
                await asyncio.sleep(pause)
        writer.write(chunk(suffix) + b"0\r\n\r\n")
        await writer.drain()
        entry["bytesSent"] += len(suffix)
    except (ConnectionError, OSError):
        entry["clientClosed"] = True
