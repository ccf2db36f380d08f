"""Request headers the API reads, declared once for routes and the OpenAPI document.

reference §9.3: the OpenAPI document declares every header the API reads, so a
generated client sends them. A route (or dependency) takes one by naming its
alias here as a parameter type, e.g. ``idempotency_key: IdempotencyKeyHeader = None``;
FastAPI then reads it and lists it among the operation's ``in: header``
parameters. The two tokens are security schemes instead (``deps``):
``Authorization: Bearer`` (:data:`BEARER_SCHEME`) and ``x-internal-api-key``
(:data:`SERVICE_TOKEN_SCHEME`).

Every constraint on a header is given to ``Header()`` itself, so the document
states exactly what FastAPI enforces (400 ``INVALID_ARGUMENT`` naming the header in
``details.fields``) and a generated client or a fuzzer agrees with the server
(reference §9.3); no code re-checks a header with rules of its own.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header

#: The longest ``Idempotency-Key`` a create takes (reference §2.5).
IDEMPOTENCY_KEY_MAX = 200
#: The longest ``X-Runtime-Instance-Id`` (it travels on as gRPC metadata).
INSTANCE_ID_MAX = 128
#: Printable ASCII without surrounding spaces: what gRPC metadata can carry, and what
#: an HTTP field value carries unambiguously (a server strips surrounding spaces).
PRINTABLE_ASCII = r"^[!-~]([ -~]*[!-~])?$"
#: An event id of the streams: a version or a cursor, decimal, below 2^63 (int64).
EVENT_ID = r"^[0-9]{1,18}$"

#: Security scheme names in the OpenAPI document (a generated client's auth settings).
BEARER_SCHEME = "UserBearerToken"
SERVICE_TOKEN_SCHEME = "RuntimeServiceToken"

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        pattern=PRINTABLE_ASCII,
        description=(
            "Makes the create idempotent (reference §2.5): a repeat with the same key, job "
            "type and target returns the original job (200, Idempotent-Replayed: true). "
            "1..200 printable ASCII characters, no surrounding spaces."
        ),
    ),
]

_INSTANCE_ID_DOC = (
    "The calling runtime instance; with jobId and attemptNo it is the lease holder's "
    "fencing token (reference §3). 1..128 printable ASCII characters."
)

RuntimeInstanceIdHeader = Annotated[
    str,
    Header(
        alias="X-Runtime-Instance-Id",
        description=_INSTANCE_ID_DOC,
        min_length=1,
        max_length=INSTANCE_ID_MAX,
        pattern=PRINTABLE_ASCII,
    ),
]

OptionalRuntimeInstanceIdHeader = Annotated[
    str | None,
    Header(
        alias="X-Runtime-Instance-Id",
        description=_INSTANCE_ID_DOC + " Optional here.",
        min_length=1,
        max_length=INSTANCE_ID_MAX,
        pattern=PRINTABLE_ASCII,
    ),
]

#: reference §9.1 (waiting for a job): ``GET /v1/ai/jobs/{jobId}`` answers 304 while the
#: job's ETag still equals this.
IfNoneMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-None-Match",
        description="The job's last ETag: the answer is 304 (or held) while it is current.",
    ),
]

#: reference §9.1: an event stream resumes after this event id.
LastEventIdHeader = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=EVENT_ID,
        description="Resume an event stream after this event id (the standard reconnect): "
        "the decimal id of an event the stream sent.",
    ),
]
