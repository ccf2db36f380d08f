"""``Retry-After`` on every 429 and 503 answer (reference §9.3).

How long a refused client should wait, in whole seconds (RFC 9110 §10.2.3's
delay-seconds form), decided in this order:

1. the refusal's own ``details.retryAfterSeconds``, when it is a finite number
   ≥ 0 (job_service puts one on ``PLATFORM_CIRCUIT_OPEN``: the seconds until the
   breaker goes half-open); rounded up, at most a day;
2. the rule of its code (:data:`RULES`): ``QUOTA_EXCEEDED`` and
   ``PLATFORM_BUDGET_EXCEEDED`` until the next UTC midnight (the quota and the
   budget are per UTC day, reference §6); ``PLATFORM_CIRCUIT_OPEN`` without a hint
   the breaker's default cool-down; ``UNAVAILABLE`` and ``TOO_MANY_STREAMS`` a few
   seconds;
3. any other code on a 429 or 503: :data:`DEFAULT_SECONDS`.

A new refusal code gets its rule by one entry in :data:`RULES`; without one it
still carries the default, and the gateway's middleware adds the default to
any 429/503 that leaves a handler without the header.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from airuntime_common.errors import ErrorCode
from airuntime_common.settings import DAY
from airuntime_common.timeutil import as_utc, utcnow

#: Statuses whose answers always carry ``Retry-After``.
STATUSES = frozenset({429, 503})
#: "A few seconds": a backend that is down or slow, a stream slot, any other 429/503.
DEFAULT_SECONDS = 5
#: ``PLATFORM_CIRCUIT_OPEN`` without ``details.retryAfterSeconds``: the default
#: ``BREAKER_COOLDOWN_SECONDS`` (reference §7).
BREAKER_FALLBACK_SECONDS = 60
#: The key of a backend's own hint in an error's ``details``.
HINT_KEY = "retryAfterSeconds"
#: The header as the OpenAPI document declares it on every 429 and 503 answer.
RETRY_AFTER_HEADER: dict[str, Any] = {
    "Retry-After": {
        "description": "Seconds to wait before trying again (quota and budget: until the "
        "next UTC midnight; breaker: until half-open; a backend down: a few seconds).",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
}


def seconds_until_next_utc_midnight(now: datetime) -> int:
    """Whole seconds from ``now`` to the next 00:00 UTC, rounded up (1..86400).

    Args:
        now: an aware datetime (a naive one is taken as UTC).
    """
    now = as_utc(now)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return max(1, math.ceil((midnight - now).total_seconds()))


def _fixed(seconds: int) -> Callable[[datetime], int]:
    return lambda _now: seconds


#: code → seconds to wait, given the current UTC time.
RULES: Mapping[str, Callable[[datetime], int]] = {
    ErrorCode.QUOTA_EXCEEDED: seconds_until_next_utc_midnight,
    ErrorCode.PLATFORM_BUDGET_EXCEEDED: seconds_until_next_utc_midnight,
    ErrorCode.PLATFORM_CIRCUIT_OPEN: _fixed(BREAKER_FALLBACK_SECONDS),
    ErrorCode.UNAVAILABLE: _fixed(DEFAULT_SECONDS),
    ErrorCode.TOO_MANY_STREAMS: _fixed(DEFAULT_SECONDS),
}


def hinted_seconds(details: Mapping[str, Any] | None) -> int | None:
    """``details.retryAfterSeconds`` as whole seconds (rounded up, at most a day), or
    None when absent or not a finite number ≥ 0 (a bool is not a number here)."""
    value = (details or {}).get(HINT_KEY)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(DAY, math.ceil(value))


def retry_after_seconds(
    code: str,
    status: int,
    details: Mapping[str, Any] | None = None,
    *,
    now: datetime | None = None,
) -> int | None:
    """Seconds for the ``Retry-After`` of an error answer, or None when it takes none.

    Args:
        code: the reference §4/§9 error code of the answer.
        status: its HTTP status; only 429 and 503 get a value.
        details: the error's details (a backend's ``retryAfterSeconds`` hint wins).
        now: the current time (UTC); the wall clock by default.

    Returns:
        Whole seconds ≥ 0, or None for a status other than 429/503.
    """
    if status not in STATUSES:
        return None
    hinted = hinted_seconds(details)
    if hinted is not None:
        return hinted
    rule = RULES.get(code)
    if rule is None:
        return DEFAULT_SECONDS
    return rule(now or utcnow())
