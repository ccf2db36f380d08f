"""Canonical JSON (RFC 8785, JCS) and content hashes (reference §2.5, §5)."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of a JSON value (keys sorted, no whitespace).

    Integral floats serialise as integers (``3.0`` → ``3``), so a value that
    travelled through ``google.protobuf.Struct`` hashes like the original.
    """
    return rfc8785.dumps(value)


def content_hash(value: Any) -> str:
    """sha256 hex of :func:`canonical_json` — the ``outputHash`` of reference §2.5."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
