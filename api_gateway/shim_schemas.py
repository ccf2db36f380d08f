"""Pydantic request and response models of the runtime shim (``/internal/runtime/*``,
reference §3): what a runtime other than ours sends and is answered, in the JSON the
shim speaks. The public and admin models are :mod:`api_gateway.schemas`'.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api_gateway.schemas import (
    INT32_MAX,
    INT64_MAX,
    REF,
    ApiKeyMode,
    AttemptNo,
    Body,
    JobOut,
    JobStatus,
    JobType,
    TargetType,
)

# ---------------------------------------------------------------- requests


class PollBody(Body):
    """Poll / claim (reference §2.6): ``limit`` ≥ 1 (capped at 50 by the server), ``waitMs`` 0..20000."""

    capabilities: list[JobType] = Field(min_length=1, max_length=10)
    limit: int = Field(default=10, ge=1, le=INT32_MAX)
    waitMs: int = Field(default=0, ge=0, le=20000)
    statusAddress: str | None = Field(default=None, max_length=255)


class ClaimBody(PollBody):
    """Claim (reference §3): a poll body; ``withSnapshots`` also starts each claimed job
    (locked → running, the start a snapshot read implies) and answers its snapshot."""

    withSnapshots: bool = False


class AttemptBody(Body):
    """Body of start and heartbeat: the attempt whose lease the caller holds."""

    attemptNo: int = AttemptNo


class LeaseRefIn(Body):
    """One lease of a batched heartbeat."""

    jobId: str = REF
    attemptNo: int = AttemptNo


class LeasesBody(Body):
    """``POST /internal/runtime/leases/heartbeat``: at most 500 leases."""

    leases: list[LeaseRefIn] = Field(max_length=500)


class ResolveBody(Body):
    """``POST /internal/runtime/model-credentials/resolve``."""

    jobId: str = REF
    attemptNo: int = AttemptNo


class ResultBody(Body):
    """``POST /internal/runtime/jobs/{jobId}/result``."""

    attemptNo: int = AttemptNo
    promptVersion: str = Field(default="", max_length=128)
    outputSchemaVersion: str = Field(default="v1", max_length=16)
    output: dict[str, Any]


class FailBody(Body):
    """``POST /internal/runtime/jobs/{jobId}/fail``; ``errorCode`` is free text."""

    attemptNo: int = AttemptNo
    errorCode: str = Field(min_length=1, max_length=64)
    errorMessage: str = Field(default="", max_length=4000)
    retryAfterSeconds: float | None = Field(default=None, ge=0, le=86400)


class InvocationBody(Body):
    """``POST /internal/runtime/invocation-logs``: one model call, never the key."""

    jobId: str = REF
    attemptNo: int = AttemptNo
    modelProvider: str = Field(min_length=1, max_length=32)
    modelName: str = Field(min_length=1, max_length=64)
    apiKeyMode: ApiKeyMode
    credentialId: str | None = Field(default=None, max_length=64)
    promptTokens: int = Field(default=0, ge=0, le=INT64_MAX)
    completionTokens: int = Field(default=0, ge=0, le=INT64_MAX)
    cacheHitTokens: int = Field(default=0, ge=0, le=INT64_MAX)
    latencyMs: int = Field(default=0, ge=0, le=INT64_MAX)
    outcome: Literal["succeeded", "failed"]
    errorCode: str | None = Field(default=None, max_length=64)
    providerRequestId: str | None = Field(default=None, max_length=128)


# ---------------------------------------------------------------- responses


class LockOut(BaseModel):
    """The lease granted by a lock."""

    jobId: str
    status: JobStatus | None
    lockedBy: str
    lockUntil: str | None
    attemptNo: int


class StartOut(BaseModel):
    """A started attempt."""

    status: JobStatus | None
    startedAt: str | None


class LeaseStateOut(BaseModel):
    """One answer of a batched heartbeat."""

    jobId: str
    attemptNo: int
    held: bool
    lockUntil: str | None
    cancelRequested: bool


class LeasesOut(BaseModel):
    """One answer per lease, in order."""

    leases: list[LeaseStateOut]


class PolledJobs(BaseModel):
    """Poll / claim answer."""

    jobs: list[JobOut]


class SnapshotOut(BaseModel):
    """An immutable snapshot (reference §5, COMMON payload v1)."""

    snapshotId: str
    schemaVersion: str
    targetType: TargetType | None
    targetId: str
    payload: dict[str, Any]
    contentHash: str


class ClaimedJobs(PolledJobs):
    """Claim answer; with ``withSnapshots``, also ``snapshots`` by job id (a job
    missing there, e.g. past the answer's size budget, is read with GET …/snapshot)."""

    snapshots: dict[str, SnapshotOut] | None = None


class ResolvedCredential(BaseModel):
    """The key of a leased job, for the lease holder only (``Cache-Control: no-store``)."""

    apiKeyMode: ApiKeyMode | None
    credentialId: str | None
    apiKey: str
    modelProvider: str
    modelName: str
    baseUrl: str
    userBaseUrl: bool = Field(
        description="baseUrl is the user's own endpoint (USER_BASE_URLS), not a configured "
        "provider's: before EVERY call to it the caller resolves its host again and checks "
        "the egress rules (as for PUT /v1/me/model-credential's baseUrl), connects only to "
        "an address it checked (TLS verified against the host name, no proxy), follows no "
        "redirect (3xx: TEMPORARY_PROVIDER_ERROR), sends it this key only, and ends the "
        "attempt EGRESS_BLOCKED (final) when a rule refuses it"
    )


class ResultOut(BaseModel):
    """An accepted (or replayed) result."""

    jobId: str
    status: JobStatus | None
    resultId: str
    outputHash: str
    replayed: bool


class FailOut(BaseModel):
    """The job's state after a fail."""

    jobId: str
    status: JobStatus | None
    retryCount: int


class CreatedId(BaseModel):
    """``{"id"}`` of a stored row."""

    id: str
