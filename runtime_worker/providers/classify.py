"""How every way a model call can fail maps to a reference §4 code: ONE table.

Each :class:`Fault` is a kind of failure the provider can observe; :data:`TABLE`
gives its code. Retryability and breaker effect follow from the code alone
(:func:`airuntime_common.errors.is_retryable`, ``BREAKER_FAILURE_CODES``).

| fault | code |
|---|---|
| overall call deadline hit, job still has budget | MODEL_TIMEOUT |
| overall call deadline hit = the job's own budget | JOB_TIMEOUT |
| HTTP 408 (a proxy's ``request_timeout`` in front of the model; reference §9.4) | MODEL_TIMEOUT |
| connect error / read error / connection reset before a status | NETWORK_ERROR |
| HTTP 429 | MODEL_RATE_LIMIT (+ retryAfterSeconds from Retry-After) |
| HTTP 500/502/503/504, any other 5xx | TEMPORARY_PROVIDER_ERROR |
| HTTP 200 whose body is no parseable envelope (blank lines then close, cut off) | TEMPORARY_PROVIDER_ERROR |
| HTTP 200 whose body is over MODEL_MAX_RESPONSE_BYTES (not read further; reference §9.4) | TEMPORARY_PROVIDER_ERROR |
| envelope OK, finish_reason=insufficient_system_resource (out of capacity mid-answer; reference §9.4) | TEMPORARY_PROVIDER_ERROR |
| HTTP 401/403 | INVALID_CREDENTIAL |
| HTTP 402 | INSUFFICIENT_BALANCE |
| HTTP 400/422, any other 4xx | MODEL_BAD_REQUEST |
| HTTP 3xx (a redirect is never followed: reference §10.5) | TEMPORARY_PROVIDER_ERROR |
| a user's base URL refused by the egress rules, no connection opened (reference §10.5) | EGRESS_BLOCKED |
| envelope OK, content blank | INVALID_SCHEMA |
| envelope OK, finish_reason=length | INVALID_SCHEMA |
| envelope OK, content not JSON / fails the output schema | INVALID_SCHEMA |
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime
from enum import StrEnum

from airuntime_common.errors import ErrorCode


class Fault(StrEnum):
    """Observable failure kinds of one model call."""

    TIMEOUT = "timeout"
    JOB_DEADLINE = "job_deadline"
    HTTP_408 = "http_408"
    CONNECT_ERROR = "connect_error"
    READ_ERROR = "read_error"
    HTTP_429 = "http_429"
    HTTP_500 = "http_500"
    HTTP_502 = "http_502"
    HTTP_503 = "http_503"
    HTTP_504 = "http_504"
    HTTP_OTHER_5XX = "http_other_5xx"
    BAD_ENVELOPE = "bad_envelope"
    OUT_OF_CAPACITY = "out_of_capacity"
    BODY_TOO_LARGE = "body_too_large"
    HTTP_401 = "http_401"
    HTTP_403 = "http_403"
    HTTP_402 = "http_402"
    HTTP_400 = "http_400"
    HTTP_422 = "http_422"
    HTTP_OTHER_4XX = "http_other_4xx"
    REDIRECT = "redirect"
    EGRESS_REFUSED = "egress_refused"
    BLANK_CONTENT = "blank_content"
    TRUNCATED = "truncated"
    SCHEMA_MISMATCH = "schema_mismatch"


#: The classification table (see the module docstring).
TABLE: dict[Fault, ErrorCode] = {
    Fault.TIMEOUT: ErrorCode.MODEL_TIMEOUT,
    Fault.JOB_DEADLINE: ErrorCode.JOB_TIMEOUT,
    Fault.HTTP_408: ErrorCode.MODEL_TIMEOUT,
    Fault.CONNECT_ERROR: ErrorCode.NETWORK_ERROR,
    Fault.READ_ERROR: ErrorCode.NETWORK_ERROR,
    Fault.HTTP_429: ErrorCode.MODEL_RATE_LIMIT,
    Fault.HTTP_500: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.HTTP_502: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.HTTP_503: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.HTTP_504: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.HTTP_OTHER_5XX: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.BAD_ENVELOPE: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.OUT_OF_CAPACITY: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.BODY_TOO_LARGE: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.HTTP_401: ErrorCode.INVALID_CREDENTIAL,
    Fault.HTTP_403: ErrorCode.INVALID_CREDENTIAL,
    Fault.HTTP_402: ErrorCode.INSUFFICIENT_BALANCE,
    Fault.HTTP_400: ErrorCode.MODEL_BAD_REQUEST,
    Fault.HTTP_422: ErrorCode.MODEL_BAD_REQUEST,
    Fault.HTTP_OTHER_4XX: ErrorCode.MODEL_BAD_REQUEST,
    Fault.REDIRECT: ErrorCode.TEMPORARY_PROVIDER_ERROR,
    Fault.EGRESS_REFUSED: ErrorCode.EGRESS_BLOCKED,
    Fault.BLANK_CONTENT: ErrorCode.INVALID_SCHEMA,
    Fault.TRUNCATED: ErrorCode.INVALID_SCHEMA,
    Fault.SCHEMA_MISMATCH: ErrorCode.INVALID_SCHEMA,
}

_STATUS_FAULTS: dict[int, Fault] = {
    408: Fault.HTTP_408,
    429: Fault.HTTP_429,
    500: Fault.HTTP_500,
    502: Fault.HTTP_502,
    503: Fault.HTTP_503,
    504: Fault.HTTP_504,
    401: Fault.HTTP_401,
    403: Fault.HTTP_403,
    402: Fault.HTTP_402,
    400: Fault.HTTP_400,
    422: Fault.HTTP_422,
}

#: ``finish_reason`` values that say the provider, not the answer, failed: whatever
#: content came with them is cut off by the provider and never validated.
_FINISH_FAULTS: dict[str, Fault] = {
    "insufficient_system_resource": Fault.OUT_OF_CAPACITY,
}

#: Faults the worker may answer with one in-attempt re-ask (cases D1, D2).
REASKABLE: frozenset[Fault] = frozenset(
    {Fault.BLANK_CONTENT, Fault.TRUNCATED, Fault.SCHEMA_MISMATCH}
)


def fault_for_status(status: int) -> Fault | None:
    """The fault of a non-2xx HTTP status; None for 2xx (not a fault by itself).

    Unknown 4xx → ``HTTP_OTHER_4XX``, 3xx → ``REDIRECT`` (never followed), unknown 5xx
    (and any other non-2xx) → ``HTTP_OTHER_5XX`` (a provider answering oddly is
    treated as temporary).
    """
    if 200 <= status < 300:
        return None
    if status in _STATUS_FAULTS:
        return _STATUS_FAULTS[status]
    if 300 <= status < 400:
        return Fault.REDIRECT
    if 400 <= status < 500:
        return Fault.HTTP_OTHER_4XX
    return Fault.HTTP_OTHER_5XX


def fault_for_finish_reason(finish_reason: str | None) -> Fault | None:
    """The fault of an envelope's ``finish_reason`` that is the provider's failure
    (``insufficient_system_resource`` → ``OUT_OF_CAPACITY``); None for every other
    value (``stop``, ``length``… are judged with the content)."""
    return _FINISH_FAULTS.get(finish_reason) if finish_reason else None


def code_for(fault: Fault) -> ErrorCode:
    """reference §4 code of a fault (the table lookup)."""
    return TABLE[fault]


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date; None if absent/garbled.

    Args:
        value: the header value.
        now: current UTC time for the HTTP-date form (default: now).

    Returns:
        Seconds ≥ 0, or None.
    """
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)
