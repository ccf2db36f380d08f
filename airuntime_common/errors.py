"""Error codes of reference §4 and the exception every layer raises.

Every error body, REST and gRPC, is ``{"code", "message", "details"}``; over
gRPC the code travels as ``google.rpc.ErrorInfo.reason`` (see
:mod:`airuntime_common.grpc_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc


class ErrorCode(StrEnum):
    """Every error code of reference §4 and §9, spelled exactly as the reference spells it."""

    MODEL_TIMEOUT = "MODEL_TIMEOUT"
    MODEL_RATE_LIMIT = "MODEL_RATE_LIMIT"
    NETWORK_ERROR = "NETWORK_ERROR"
    TEMPORARY_PROVIDER_ERROR = "TEMPORARY_PROVIDER_ERROR"
    JOB_TIMEOUT = "JOB_TIMEOUT"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    INVALID_SNAPSHOT = "INVALID_SNAPSHOT"
    INVALID_SCHEMA = "INVALID_SCHEMA"
    INVALID_CREDENTIAL = "INVALID_CREDENTIAL"
    INSUFFICIENT_BALANCE = "INSUFFICIENT_BALANCE"
    MODEL_BAD_REQUEST = "MODEL_BAD_REQUEST"
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"
    CANCELLED = "CANCELLED"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    JOB_ALREADY_LOCKED = "JOB_ALREADY_LOCKED"
    INVALID_JOB_STATE = "INVALID_JOB_STATE"
    LOCK_NOT_HELD = "LOCK_NOT_HELD"
    RESULT_ALREADY_EXISTS = "RESULT_ALREADY_EXISTS"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    AI_NOT_AUTHORIZED = "AI_NOT_AUTHORIZED"
    NOT_FOUND = "NOT_FOUND"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    PLATFORM_BUDGET_EXCEEDED = "PLATFORM_BUDGET_EXCEEDED"
    PLATFORM_CIRCUIT_OPEN = "PLATFORM_CIRCUIT_OPEN"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
    #: An upload names a prompt version that holds another template, or ``v1``
    #: (reference §10.4).
    PROMPT_VERSION_EXISTS = "PROMPT_VERSION_EXISTS"
    #: A prompt template breaks the sandbox's rules or does not render (reference
    #: §10.4); the message names the line. Also a job ending (final) in the worker.
    INVALID_PROMPT_TEMPLATE = "INVALID_PROMPT_TEMPLATE"
    #: A user's base URL broke a rule of reference §10.5 when stored (the message
    #: names the rule; nothing is stored).
    INVALID_BASE_URL = "INVALID_BASE_URL"
    #: A job ending, final: the user's base URL was refused at call time (reference
    #: §10.5), no connection opened; the credential is not marked invalid.
    EGRESS_BLOCKED = "EGRESS_BLOCKED"
    #: No provider has room for the job now (its limits, a pause after a 429; reference
    #: §10.2): a lock of it is refused, with ``details.retryAfterSeconds``.
    NO_PROVIDER_CAPACITY = "NO_PROVIDER_CAPACITY"
    #: A batch's parent ending, final: its last child ended and fewer than
    #: ``minSuccessRatio`` of its children succeeded (reference §10.3).
    CHILD_JOBS_FAILED = "CHILD_JOBS_FAILED"


#: Fail codes after which a job is retried while retries remain (reference §2.4, §4).
#: Any other fail code, including unknown free text, is final.
RETRYABLE_FAIL_CODES: frozenset[str] = frozenset(
    {
        ErrorCode.MODEL_TIMEOUT,
        ErrorCode.MODEL_RATE_LIMIT,
        ErrorCode.NETWORK_ERROR,
        ErrorCode.TEMPORARY_PROVIDER_ERROR,
        ErrorCode.JOB_TIMEOUT,
        ErrorCode.LEASE_EXPIRED,
        ErrorCode.WORKER_SHUTDOWN,
    }
)

#: Endings of platform-key attempts that count as breaker failures (reference §6).
BREAKER_FAILURE_CODES: frozenset[str] = frozenset(
    {
        ErrorCode.MODEL_TIMEOUT,
        ErrorCode.MODEL_RATE_LIMIT,
        ErrorCode.NETWORK_ERROR,
        ErrorCode.TEMPORARY_PROVIDER_ERROR,
        ErrorCode.INSUFFICIENT_BALANCE,
        ErrorCode.INVALID_CREDENTIAL,
    }
)

#: code → (HTTP status, gRPC status code), reference §4 and §9 ("New codes"). Fail-only
#: codes are absent.
TRANSPORT: dict[str, tuple[int, grpc.StatusCode]] = {
    ErrorCode.INVALID_SCHEMA: (422, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.INVALID_CREDENTIAL: (422, grpc.StatusCode.FAILED_PRECONDITION),
    ErrorCode.JOB_NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    ErrorCode.JOB_ALREADY_LOCKED: (409, grpc.StatusCode.ABORTED),
    ErrorCode.INVALID_JOB_STATE: (409, grpc.StatusCode.FAILED_PRECONDITION),
    ErrorCode.LOCK_NOT_HELD: (409, grpc.StatusCode.FAILED_PRECONDITION),
    ErrorCode.RESULT_ALREADY_EXISTS: (409, grpc.StatusCode.ALREADY_EXISTS),
    ErrorCode.INVALID_ARGUMENT: (400, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.UNAUTHENTICATED: (401, grpc.StatusCode.UNAUTHENTICATED),
    ErrorCode.PERMISSION_DENIED: (403, grpc.StatusCode.PERMISSION_DENIED),
    ErrorCode.AI_NOT_AUTHORIZED: (403, grpc.StatusCode.PERMISSION_DENIED),
    ErrorCode.NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    ErrorCode.QUOTA_EXCEEDED: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ErrorCode.NO_PROVIDER_CAPACITY: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ErrorCode.PLATFORM_BUDGET_EXCEEDED: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ErrorCode.PLATFORM_CIRCUIT_OPEN: (503, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    ErrorCode.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.METHOD_NOT_ALLOWED: (405, grpc.StatusCode.UNIMPLEMENTED),
    ErrorCode.TOO_MANY_STREAMS: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ErrorCode.PROMPT_VERSION_EXISTS: (409, grpc.StatusCode.ALREADY_EXISTS),
    ErrorCode.INVALID_PROMPT_TEMPLATE: (422, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.INVALID_BASE_URL: (422, grpc.StatusCode.INVALID_ARGUMENT),
    # a job ending; as a resolve's refusal (a base URL stored while USER_BASE_URLS was
    # on, resolved after it was turned off) it answers as INVALID_CREDENTIAL does
    ErrorCode.EGRESS_BLOCKED: (422, grpc.StatusCode.FAILED_PRECONDITION),
}


def is_retryable(code: str | None) -> bool:
    """Whether a fail code sends a job back to pending (reference §2.4).

    Args:
        code: the ``errorCode`` a worker reported, free text.

    Returns:
        True only for the retryable codes of reference §4; unknown codes are final.
    """
    return code in RETRYABLE_FAIL_CODES


def http_status(code: str) -> int:
    """HTTP status for an error code (reference §4); 500 for codes with none."""
    return TRANSPORT.get(code, (500, grpc.StatusCode.INTERNAL))[0]


def grpc_status(code: str) -> grpc.StatusCode:
    """gRPC status code for an error code (reference §4); INTERNAL for codes with none."""
    return TRANSPORT.get(code, (500, grpc.StatusCode.INTERNAL))[1]


@dataclass
class AppError(Exception):
    """A refusal with a reference §4 code; every layer raises this, never a bare error.

    Attributes:
        code: the reference §4 code, e.g. ``"LOCK_NOT_HELD"``.
        message: a human-readable sentence; never contains secrets.
        details: JSON-serialisable extra facts (offending fields, current state).
    """

    code: str
    message: str
    details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__init__(f"{self.code}: {self.message}")

    def body(self) -> dict[str, Any]:
        """The error body of reference §4: ``{"code", "message", "details"}``."""
        return {"code": self.code, "message": self.message, "details": self.details or {}}

    @property
    def http_status(self) -> int:
        """HTTP status of this error's code."""
        return http_status(self.code)


def invalid_argument(message: str, **details: Any) -> AppError:
    """Shorthand for a 400 ``INVALID_ARGUMENT`` with the offending fields in details."""
    return AppError(ErrorCode.INVALID_ARGUMENT, message, details or None)
