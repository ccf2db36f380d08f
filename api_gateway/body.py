"""Reading a request body within the gateway's limits (reference §3.1, §4).

:func:`read_body` reads the whole body of a request whose caller is already known
(the route gate, :mod:`api_gateway.gate`, calls it after the access checks) and
refuses

* a body over ``MAX_BODY_BYTES`` with 413 ``PAYLOAD_TOO_LARGE``, by
  ``Content-Length`` and by the bytes actually streamed;
* a JSON body that is not UTF-8, nests deeper than ``MAX_JSON_DEPTH`` or holds a
  NUL character in a string with 400 ``INVALID_ARGUMENT`` (before any parser
  recurses into it; NUL has no place in ids or text and some databases truncate
  at it), naming the fields as validation does.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive

from airuntime_common.errors import AppError, ErrorCode
from api_gateway.errors import validation_details


def json_depth_ok(text: str, limit: int) -> bool:
    """Whether the nesting of JSON ``text`` stays within ``limit`` levels.

    Scans brackets outside string literals; does not validate the JSON itself.
    """
    if text.count("[") + text.count("{") <= limit:
        return True  # cannot nest deeper than the number of openers
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _nul_fields(text: str) -> list[tuple[str, ...]]:
    """Locations (``("body", "events", "0", "eventId")``, as validation errors give
    them) of the strings and keys of a JSON document that hold a NUL character; for
    a key, the location of the object holding it.

    Invalid JSON answers []: the route's own parser refuses it with 400.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return []
    found: set[tuple[str, ...]] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [(("body",), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                found.add(loc)
        elif isinstance(item, dict):
            if any("\x00" in key for key in item):
                found.add(loc)
            stack.extend(((*loc, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(((*loc, str(i)), v) for i, v in enumerate(item))
    return sorted(found)


def _nul_refusal(locations: list[tuple[str, ...]]) -> AppError:
    """400 ``INVALID_ARGUMENT`` naming the fields (reference §3.1), as validation does."""
    return AppError(
        ErrorCode.INVALID_ARGUMENT,
        "text must not contain NUL characters",
        validation_details(
            {"loc": loc, "msg": "must not contain NUL characters", "type": "string_nul"}
            for loc in locations
        ),
    )


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that first hands out ``messages`` in order, then defers to ``receive``."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed


def check_json_text(body: bytes, max_depth: int) -> None:
    """Refuse a JSON body that is not UTF-8, nests deeper than ``max_depth`` or holds a
    NUL character.

    Raises:
        AppError: 400 ``INVALID_ARGUMENT``; for NUL characters ``details.fields`` names
            each string or object holding one (none for a raw NUL byte, not JSON).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "request body is not valid UTF-8") from None
    if not json_depth_ok(text, max_depth):
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"JSON nests deeper than {max_depth} levels",
            {"maxDepth": max_depth},
        )
    if "\x00" in text:  # a raw NUL: not even JSON, no field to name
        raise _nul_refusal([])
    if "\\u0000" in text.lower() and (locations := _nul_fields(text)):
        raise _nul_refusal(locations)


async def read_body(
    receive: Receive, headers: dict[str, str], *, max_bytes: int, max_depth: int
) -> Receive:
    """Read a request's whole body (bounded) and return a receive that replays it.

    Args:
        receive: the request's ASGI receive.
        headers: its headers, names lower-cased.
        max_bytes: ``MAX_BODY_BYTES``.
        max_depth: ``MAX_JSON_DEPTH``, for a body sent as JSON (or with no
            content type).

    Returns:
        A receive handing out the body as one message, then what ``receive`` gives;
        a client that went away is handed on as the disconnect.

    Raises:
        AppError: 413 ``PAYLOAD_TOO_LARGE`` over ``max_bytes``; 400
            ``INVALID_ARGUMENT`` for a bad ``Content-Length`` or as
            :func:`check_json_text`.
    """
    too_large = AppError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"request body exceeds {max_bytes} bytes",
        {"maxBytes": max_bytes},
    )
    length = headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "invalid Content-Length") from None
        if declared > max_bytes:
            raise too_large
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return replay([message], receive)  # the client went away: the app sees it
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    body = b"".join(chunks)
    content_type = headers.get("content-type", "")
    if body and ("json" in content_type or not content_type):
        check_json_text(body, max_depth)
    return replay([{"type": "http.request", "body": body, "more_body": False}], receive)
