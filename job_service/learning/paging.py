"""Opaque page tokens and page sizes of the learner's lists (reference §3.1 paging, §9.2).

A token is the url-safe base64 (no padding) of a small JSON object naming the last
row of the page before (its sort key); clients treat it as opaque. A token that
does not decode, or decodes to the wrong shape, is ``INVALID_ARGUMENT`` (field
``pageToken``, or the caller's ``field``).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any, Final

from airuntime_common.errors import invalid_argument

DEFAULT_PAGE_SIZE: Final = 20
MAX_PAGE_SIZE: Final = 100


def page_size(value: int | None, *, field: str = "pageSize", maximum: int = MAX_PAGE_SIZE) -> int:
    """``value`` checked to 1..``maximum``; 0/None → :data:`DEFAULT_PAGE_SIZE`.

    Raises:
        AppError: ``INVALID_ARGUMENT`` (``details.field``) when out of range.
    """
    size = value or DEFAULT_PAGE_SIZE
    if not 1 <= size <= maximum:
        raise invalid_argument(f"{field} must be 1..{maximum}", field=field, value=size)
    return size


def encode_token(data: dict[str, Any]) -> str:
    """A JSON-able dict → an opaque token."""
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, *, field: str = "pageToken") -> dict[str, Any]:
    """An opaque token → its dict.

    Raises:
        AppError: ``INVALID_ARGUMENT`` when it is not one of ours.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        raise invalid_argument(f"{field} is not valid", field=field) from None
    if not isinstance(data, dict):
        raise invalid_argument(f"{field} is not valid", field=field)
    return data


def encode_after(created_at: datetime, row_id: str) -> str:
    """The token of a newest-first list whose page ended at (``created_at``, ``row_id``)."""
    return encode_token({"t": created_at.isoformat(), "i": row_id})


def decode_after(token: str, *, field: str = "pageToken") -> tuple[datetime, str]:
    """(created_at, row id) of the last row of the page before.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for a bad token.
    """
    data = decode_token(token, field=field)
    try:
        return datetime.fromisoformat(str(data["t"])), str(data["i"])
    except (KeyError, ValueError):
        raise invalid_argument(f"{field} is not valid", field=field) from None


def encode_offset(offset: int) -> str:
    """The token of a list paged by position (the next row's index)."""
    return encode_token({"o": offset})


def decode_offset(token: str, *, field: str) -> int:
    """The position a token names (≥ 0).

    Raises:
        AppError: ``INVALID_ARGUMENT`` for a bad token.
    """
    value = decode_token(token, field=field).get("o")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid_argument(f"{field} is not valid", field=field)
    return value
