"""Fault injection for the DeepSeek stand-in.

Two sources of faults:

* start-up settings (CLI / env): ``fault_rate`` — the probability that an
  otherwise healthy chat request answers HTTP 500 — and ``delay_ms`` added
  before every answer;
* scripted faults (``POST /_standin/faults`` or :meth:`StandIn.add_faults`),
  consumed in order: each applies to the next ``count`` chat requests whose
  task matches ``match`` (any task when ``match`` is null). A request takes
  the first queued fault that matches it.

Fault kinds (``kind``):

====================  =========================================================
``status``            HTTP ``status`` with DeepSeek's error body; 429 carries
                      ``Retry-After`` (``retryAfter``, default 1), a 3xx the
                      ``Location`` of ``location`` (a redirect)
``delay``             wait ``ms`` milliseconds, then answer normally
``empty_content``     200, ``finish_reason=stop``, content of only spaces
``truncated``         200, ``finish_reason=length``, content cut mid-JSON
``out_of_capacity``   200, ``finish_reason=insufficient_system_resource``, content
                      cut at ``fraction`` (DeepSeek out of capacity mid-answer)
``invalid_json``      200, content that is not JSON
``schema_violation``  200, valid JSON missing a required field
``foreign_ids``       200, schema-valid JSON citing an id not in the snapshot
``content``           200, ``content`` verbatim (any text)
``keepalive_forever`` 200 headers, then a blank line every ``intervalMs``
                      (default 1000) and never the body, until the client
                      disconnects
``close_mid_body``    200 headers announcing the full length, part of the
                      body, then the connection is closed
``blank_then_close``  200 headers, ``lines`` blank lines, then close
``huge_body``         200, chunked: a chat completion whose content is
                      ``totalBytes`` bytes (default 500 MB), streamed in 64 KiB
                      chunks as the client reads them, never built in memory;
                      ``intervalMs`` (default 0) between chunks
``hang``              read the request and never answer
====================  =========================================================
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

FaultKind = Literal[
    "status",
    "delay",
    "empty_content",
    "truncated",
    "out_of_capacity",
    "invalid_json",
    "schema_violation",
    "foreign_ids",
    "content",
    "keepalive_forever",
    "close_mid_body",
    "blank_then_close",
    "huge_body",
    "hang",
]

#: DeepSeek's documented error messages by HTTP status (error-codes page).
ERROR_MESSAGES: dict[int, tuple[str, str]] = {
    400: ("Invalid request body format.", "invalid_request_error"),
    401: ("Authentication Fails (no such user)", "authentication_error"),
    402: ("Insufficient Balance", "unknown_error"),
    403: ("Permission denied", "permission_error"),
    404: ("Not Found", "invalid_request_error"),
    422: ("Invalid Parameters", "invalid_request_error"),
    429: ("Rate Limit Reached", "rate_limit_error"),
    500: ("Server Error", "server_error"),
    502: ("Bad Gateway", "server_error"),
    503: ("Server Overloaded", "server_error"),
    504: ("Gateway Timeout", "server_error"),
}


def error_body(status: int, message: str | None = None) -> dict[str, Any]:
    """DeepSeek's error body for an HTTP status.

    Args:
        status: HTTP status code.
        message: overrides the documented message.

    Returns:
        ``{"error": {"message", "type", "param": null, "code"}}``.
    """
    default, etype = ERROR_MESSAGES.get(
        status, ("Server Error" if status >= 500 else "Bad Request", "invalid_request_error")
    )
    return {
        "error": {
            "message": message or default,
            "type": etype,
            "param": None,
            "code": "invalid_request_error",
        }
    }


class Fault(BaseModel):
    """One scripted fault (JSON keys camelCase).

    Attributes:
        kind: the fault kind (see module doc).
        count: how many matching requests it applies to (≥ 1).
        match: a jobType; the fault only applies to requests with that TASK.
        status: HTTP status for ``status`` (default 500).
        message: error message for ``status`` (default: DeepSeek's).
        retryAfter: ``Retry-After`` header value (seconds or HTTP date);
            default "1" for 429, none otherwise.
        ms: milliseconds for ``delay``.
        intervalMs: blank-line interval in ms for ``keepalive_forever``
            (default 1000) and ``blank_then_close`` (default 100); pause between
            the chunks of ``huge_body`` (default none).
        lines: blank lines for ``blank_then_close``.
        fraction: share of the body sent by ``close_mid_body``, of the content
            kept by ``out_of_capacity`` (0..1).
        content: verbatim content for ``content``.
        location: the ``Location`` header of a ``status`` answer (a redirect).
        foreignId: id cited by ``foreign_ids``.
        totalBytes: size of the content ``huge_body`` sends (bytes).
    """

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    count: int = Field(default=1, ge=1, le=1_000_000)
    match: str | None = None
    status: int = Field(default=500, ge=200, le=599)
    message: str | None = None
    retryAfter: float | str | None = None
    ms: int = Field(default=1000, ge=0, le=3_600_000)
    intervalMs: int | None = Field(default=None, ge=1, le=60_000)
    lines: int = Field(default=3, ge=0, le=10_000)
    fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    content: str = ""
    location: str | None = Field(default=None, max_length=2048, pattern=r"^[!-~]+$")
    foreignId: str = "blk-not-in-snapshot"
    totalBytes: int = Field(default=500_000_000, ge=1, le=1_000_000_000_000)

    def interval_seconds(self) -> float:
        """The blank-line interval of this fault, in seconds."""
        if self.intervalMs is not None:
            return self.intervalMs / 1000
        if self.kind == "huge_body":
            return 0.0
        return 1.0 if self.kind == "keepalive_forever" else 0.1

    def retry_after_header(self) -> str | None:
        """The ``Retry-After`` header for a status fault, if any."""
        if self.retryAfter is not None:
            if isinstance(self.retryAfter, float) and self.retryAfter.is_integer():
                return str(int(self.retryAfter))
            return str(self.retryAfter)
        return "1" if self.status == 429 else None


FAULT_LIST = TypeAdapter(list[Fault])

#: The fault returned for a random failure (``fault_rate``); compared by identity.
RANDOM_500 = Fault(kind="status", status=500)


@dataclass
class _Queued:
    fault: Fault
    remaining: int


@dataclass
class FaultBook:
    """The queue of scripted faults plus the start-up random faults.

    Not thread-safe; used from the server's event loop only.
    """

    fault_rate: float = 0.0
    delay_ms: int = 0
    seed: int | None = None
    _queue: deque[_Queued] = field(default_factory=deque)
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def add(self, faults: list[Fault]) -> int:
        """Queue faults after those already queued; returns how many are queued now."""
        for f in faults:
            self._queue.append(_Queued(f, f.count))
        return len(self._queue)

    def clear(self) -> None:
        """Drop every queued fault and restart the random sequence."""
        self._queue.clear()
        self._rng = random.Random(self.seed)

    def pending(self) -> list[dict[str, Any]]:
        """Queued faults as JSON, with ``remaining`` uses."""
        return [
            {
                **q.fault.model_dump(exclude_defaults=True),
                "kind": q.fault.kind,
                "remaining": q.remaining,
            }
            for q in self._queue
        ]

    def take(self, task: str | None) -> Fault | None:
        """The fault for the next chat request with this task, if any.

        The first queued fault whose ``match`` is null or equals ``task`` is
        used (and dropped once its ``count`` is spent); otherwise, with
        probability ``fault_rate``, a random HTTP 500.
        """
        for q in self._queue:
            if q.fault.match is None or q.fault.match == task:
                q.remaining -= 1
                if q.remaining <= 0:
                    self._queue.remove(q)
                return q.fault
        if self.fault_rate > 0 and self._rng.random() < self.fault_rate:
            return RANDOM_500
        return None
