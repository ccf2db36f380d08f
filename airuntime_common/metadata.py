"""gRPC metadata keys shared by every service (reference §1, §3)."""

from __future__ import annotations

from typing import Any

INTERNAL_API_KEY = "x-internal-api-key"
RUNTIME_INSTANCE_ID = "x-runtime-instance-id"
REQUEST_ID = "x-request-id"
#: ``RuntimeSession``: "1" in the server's initial metadata (it takes batched calls)
#: and in the caller's (it takes batched answers)
SESSION_BATCH = "x-runtime-session-batch"


def get(context: Any, key: str) -> str | None:
    """Read one invocation metadata value from a servicer context, or None."""
    for item in context.invocation_metadata() or ():
        if item.key == key:
            value = item.value
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def outgoing(
    token: str, instance_id: str | None = None, request_id: str | None = None
) -> tuple[tuple[str, str], ...]:
    """Metadata for an internal call: the service token, and the worker/request ids if given."""
    md: list[tuple[str, str]] = [(INTERNAL_API_KEY, token)]
    if instance_id:
        md.append((RUNTIME_INSTANCE_ID, instance_id))
    if request_id:
        md.append((REQUEST_ID, request_id))
    return tuple(md)
