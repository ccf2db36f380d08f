"""Pydantic request and response models of the REST API (reference §3, §3.1).

Field names are the camelCase JSON names themselves. Enumerations are closed
``Literal`` types, so an unknown value is a 400 ``INVALID_ARGUMENT`` and the
OpenAPI document lists every allowed value. Integers that travel in int32
protobuf fields are bounded accordingly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from typing_extensions import TypeAliasType

from airuntime_common import jobtypes
from airuntime_common.states import JobStatus as JobStatusEnum

INT32_MAX = 2**31 - 1
#: Counters (tokens, ms) stay within the integers JSON tools handle exactly.
INT64_MAX = 2**53
ID = Field(min_length=1, max_length=128)
#: An id in a body naming an existing resource (a job, material, block, knowledge
#: point, job target), forwarded as is: ids are opaque, so an unknown one of any
#: length is the backend's 404 (``JOB_NOT_FOUND`` or ``NOT_FOUND``, reference §3 "any
#: unknown id → 404, never 400"), not a length error (the body size limit bounds it).
REF = Field(min_length=1)

#: The characters ``str.strip()`` removes (``str.isspace``), as a character class
#: that JSON Schema (ECMA-262), pydantic (Rust regex) and Python's ``re`` read alike
#: (``\s`` differs between them).
SPACE_CLASS = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: Text that is not blank: it holds a character ``str.strip()`` keeps (a JSON Schema
#: pattern matches anywhere in the string). The services strip titles, names and
#: contents and refuse what is left empty: the document says so too (reference §3.1).
NOT_BLANK = f"[^{SPACE_CLASS}]"
#: A model API key as credential_service takes it: 8..512 printable ASCII characters
#: without spaces, surrounding blanks (a pasted line end) stripped.
API_KEY = r"^[ \t\r\n]*[!-~]{8,512}[ \t\r\n]*$"

# Each enumeration is a named schema of the OpenAPI document (``JobType``,
# ``JobStatus`` …, referenced wherever a field or parameter takes it), so a client
# generated from it has one type per enumeration rather than one per field.
if TYPE_CHECKING:
    JobType = str
    JobStatus = str
else:
    #: The registered job types (:mod:`airuntime_common.jobtypes`) when the gateway starts.
    JobType = TypeAliasType("JobType", Literal[jobtypes.names()])
    #: Every job state (:class:`airuntime_common.states.JobStatus`).
    JobStatus = TypeAliasType("JobStatus", Literal[tuple(s.value for s in JobStatusEnum)])
TargetType = TypeAliasType("TargetType", Literal["user", "material", "knowledge_point"])
#: What a batch's ``targetsOf`` may name (reference §10.3).
TargetsOfType = TypeAliasType("TargetsOfType", Literal["material", "knowledge_point"])
ApiKeyMode = TypeAliasType("ApiKeyMode", Literal["platform_key", "user_deepseek_key"])
QuestionType = TypeAliasType(
    "QuestionType", Literal["single_choice", "multiple_choice", "true_false", "short_answer"]
)
ResultKind = TypeAliasType(
    "ResultKind", Literal["analyses", "weak-points", "recommendations", "questions", "flashcards"]
)
GroupBy = TypeAliasType(
    "GroupBy", Literal["day", "jobType", "modelName", "modelProvider", "apiKeyMode"]
)
BreakerState = TypeAliasType("BreakerState", Literal["closed", "open", "half_open"])
AttemptNo = Field(ge=1, le=INT32_MAX)


class Body(BaseModel):
    """Base of request bodies: closed and strictly typed.

    An unknown key is refused (a misspelt ``timeoutSecond`` must not be silently
    dropped), and values are not coerced across JSON types (``"granted": 0``,
    ``"waitMs": false`` or ``"attemptNo": "1"`` are 400 ``INVALID_ARGUMENT``, not
    ``False`` / ``0`` / ``1``). The document says so too
    (``additionalProperties: false``).
    """

    model_config = ConfigDict(extra="forbid", strict=True)


def _rfc3339_text(value: Any) -> Any:
    """Timestamps in a body are RFC 3339 text only (no numbers read as UNIX seconds)."""
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an RFC 3339 timestamp string")
    return value


def _utc_instant(value: datetime) -> datetime:
    """The instant in UTC; one that UTC cannot hold (``9999-12-31T23:59:59-01:00``,
    ``0001-01-01T00:00:00+01:00``) is refused, as is one without an offset."""
    if value.tzinfo is None:
        raise ValueError("must carry a UTC offset (RFC 3339), e.g. 2026-11-30T08:00:00Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59.999999Z") from None


#: An RFC 3339 timestamp in a body (strict models parse it from its JSON text),
#: normalised to UTC.
Rfc3339 = Annotated[
    datetime, BeforeValidator(_rfc3339_text), AfterValidator(_utc_instant), Field(strict=False)
]


# ---------------------------------------------------------------- public requests


class MaterialCreate(Body):
    """``POST /v1/materials``: plain text or Markdown, content ≤ 1 MiB (UTF-8 bytes)."""

    title: str = Field(min_length=1, max_length=500, pattern=NOT_BLANK)
    content: str = Field(min_length=1, pattern=NOT_BLANK)


class KnowledgePointCreate(Body):
    """``POST /v1/knowledge-points``: a name and 1..500 blocks of one material."""

    materialId: str = REF
    name: str = Field(min_length=1, max_length=500, pattern=NOT_BLANK)
    blockIds: list[str] = Field(min_length=1, max_length=500)


class LearningEventIn(Body):
    """One learning event; ``eventId`` makes a repeat a duplicate, not an error."""

    eventId: str = ID
    type: Literal["reading", "quiz_attempt"]
    materialId: str | None = Field(default=None, min_length=1)  # ids: unknown → 404 (reference §3)
    blockId: str | None = Field(default=None, min_length=1)
    knowledgePointId: str | None = Field(default=None, min_length=1)
    dwellSeconds: float | None = Field(default=None, ge=0, le=86400)  # one day, as job_service
    correct: bool | None = None
    occurredAt: Rfc3339 | None = None


class LearningEventsCreate(Body):
    """``POST /v1/learning-events``: up to 500 events a call (job_service's
    :data:`~job_service.learning.events.MAX_EVENT_BATCH`)."""

    events: list[LearningEventIn] = Field(min_length=1, max_length=500)


class JobCreate(Body):
    """``POST /v1/ai/jobs``. ``targetId`` may be omitted for ``targetType=user``."""

    jobType: JobType
    targetType: TargetType
    targetId: str | None = None  # an id: unknown, of any length → 404 (reference §3)
    params: dict[str, Any] | None = None
    apiKeyMode: ApiKeyMode = "platform_key"


class BatchTargetIn(Body):
    """One target of a batch's child."""

    targetType: TargetType
    targetId: str = REF  # an id: unknown, of any length → 404 (reference §3)


class TargetsOfIn(Body):
    """A batch's targets by rule (reference §10.3): every material of the caller, or
    every knowledge point (of ``materialId`` when given), oldest first."""

    targetType: TargetsOfType
    materialId: str | None = Field(default=None, min_length=1)


class JobBatchCreate(Body):
    """``POST /v1/ai/job-batches`` (reference §10.3): either ``targets`` or ``targetsOf``.

    At most ``BATCH_MAX_CHILDREN`` targets (job_service's setting, 200 by default); more,
    none, one named twice, or both ``targets`` and ``targetsOf`` are 400
    ``INVALID_ARGUMENT`` and nothing is created.
    """

    jobType: JobType
    targets: list[BatchTargetIn] | None = Field(default=None, max_length=10_000)
    targetsOf: TargetsOfIn | None = None
    params: dict[str, Any] | None = None
    apiKeyMode: ApiKeyMode = "platform_key"
    minSuccessRatio: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="the share of children that must succeed for the parent to succeed "
        "(0 < r ≤ 1, default 1)",
    )


class AdminJobCreate(JobCreate):
    """``POST /admin/ai/jobs``: the user create plus the admin overrides."""

    userId: str = ID
    priority: int | None = Field(default=None, ge=0, le=1000)
    maxRetryCount: int | None = Field(default=None, ge=0, le=10)
    timeoutSeconds: int | None = Field(default=None, ge=10, le=3600)


#: ``baseUrl``'s rules, as the OpenAPI document shows them (reference §10.5).
BASE_URL_DESCRIPTION = (
    "Optional (only when the deployment sets USER_BASE_URLS=true; otherwise a baseUrl is "
    "400 INVALID_ARGUMENT): the user's own OpenAI-compatible endpoint for this key; the "
    "worker sends POST {baseUrl}/chat/completions with this key and no other. A path such "
    "as /v1 is allowed. Rules, each refused 422 INVALID_BASE_URL with details.rule naming "
    "it and nothing stored: printable ASCII only (syntax); scheme https, http only for "
    "addresses inside EGRESS_ALLOW_CIDRS (scheme); no user info (user_info), query (query) "
    "or fragment (fragment); port 443 or one of USER_BASE_URL_PORTS (port); the host must "
    "resolve (unresolvable) and EVERY address it resolves to must be globally routable: "
    "never loopback, private, link-local (cloud metadata included), shared (100.64/10), "
    "multicast, reserved, unspecified or documentation space, in any notation (decimal, "
    "octal, hex and short IPv4; IPv4-mapped, -compatible, NAT64 and 6to4 IPv6), unless "
    "inside EGRESS_ALLOW_CIDRS (address). The same rules run again before every model "
    "call; a URL refused then ends the job EGRESS_BLOCKED (final; the key stays valid). "
    "A PUT replaces the credential whole: without baseUrl, no base URL is kept."
)


class CredentialPut(Body):
    """``PUT /v1/me/model-credential``.

    ``provider`` is any provider the deployment configures (``MODEL_PROVIDERS``,
    reference §9.4); credential_service, which knows them, refuses another with 400
    ``INVALID_ARGUMENT`` naming the field. Omitted: the first configured provider.
    """

    provider: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="a configured provider's name, e.g. deepseek; omitted: the first configured",
    )
    apiKey: str = Field(min_length=1, max_length=512, pattern=API_KEY)
    baseUrl: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description=BASE_URL_DESCRIPTION,
        examples=["https://llm.example.com/v1"],
    )


class AuthorizationPut(Body):
    """``PUT /v1/me/ai-authorization``."""

    granted: bool


class RerunBody(Body):
    """``POST /admin/ai/jobs/{jobId}/rerun`` and ``POST /v1/ai/jobs/{jobId}/retry``."""

    rebuildSnapshot: bool = False


# ---------------------------------------------------------------- responses


class JobBatchOut(BaseModel):
    """A batch parent's children by state (reference §10.3); the counts sum to ``total``."""

    total: int
    pending: int
    running: int = Field(description="leased children: locked or running")
    succeeded: int
    failed: int
    cancelled: int
    minSuccessRatio: float


class JobOut(BaseModel):
    """The ``Job`` JSON (reference §3): every field present, absent values null."""

    jobId: str
    userId: str
    jobType: JobType | None
    targetType: TargetType | None
    targetId: str
    snapshotId: str | None
    status: JobStatus | None
    priority: int
    params: dict[str, Any]
    apiKeyMode: ApiKeyMode | None
    credentialId: str | None
    modelProvider: str
    modelName: str
    promptVersion: str | None
    outputSchemaVersion: str | None
    attemptNo: int
    retryCount: int
    maxRetryCount: int
    timeoutSeconds: int
    lockedBy: str | None
    lockUntil: str | None
    availableAt: str | None
    cancelRequested: bool
    errorCode: str | None = Field(
        description="how the latest attempt ended, when it failed: MODEL_TIMEOUT, "
        "MODEL_RATE_LIMIT, NETWORK_ERROR, TEMPORARY_PROVIDER_ERROR (a model 5xx, or a 3xx: "
        "redirects are never followed), JOB_TIMEOUT, LEASE_EXPIRED and WORKER_SHUTDOWN are "
        "retried; any other code is final, e.g. INVALID_SCHEMA, INVALID_CREDENTIAL, "
        "INSUFFICIENT_BALANCE, MODEL_BAD_REQUEST, CANCELLED, EGRESS_BLOCKED (the user's "
        "own baseUrl was refused by the egress rules before the call; no connection was "
        "opened and the key stays valid)"
    )
    errorMessage: str | None
    retriedFromJobId: str | None
    createdAt: str | None
    updatedAt: str | None
    startedAt: str | None
    finishedAt: str | None
    parentJobId: str | None = Field(
        description="a batch's child: its parent job (reference §10.3); null otherwise"
    )
    batch: JobBatchOut | None = Field(
        description="a batch's parent: its children by state (reference §10.3); null on "
        "every other job. A parent is pending until a child is leased, then running; when "
        "its last child ends it is succeeded if succeeded/total ≥ minSuccessRatio, else "
        "failed with errorCode CHILD_JOBS_FAILED; every change of a count changes its "
        "version (ETag, event stream)"
    )


class JobList(BaseModel):
    """A page of jobs; ``nextPageToken`` null on the last page."""

    jobs: list[JobOut]
    nextPageToken: str | None


class JobEventOut(BaseModel):
    """One row of a job's history (oldest first)."""

    jobId: str
    fromStatus: JobStatus | None
    toStatus: JobStatus | None
    errorCode: str | None
    actor: str
    attemptNo: int
    at: str | None
    #: The provider a lease grant gave the attempt (its ``locked`` event; reference §9.4).
    modelProvider: str | None = None


class InvocationOut(BaseModel):
    """One model call of a job."""

    id: str
    jobId: str
    attemptNo: int
    modelProvider: str
    modelName: str
    apiKeyMode: ApiKeyMode | None
    credentialId: str | None
    promptTokens: int
    completionTokens: int
    cacheHitTokens: int
    latencyMs: int
    outcome: str
    errorCode: str | None
    providerRequestId: str | None
    costUsd: float
    createdAt: str | None
    #: the prompt version the call's attempt ran (reference §10.4)
    promptVersion: str | None = None


class AdminJobOut(JobOut):
    """The admin's single-job view: the job, its events (oldest first) and invocations."""

    events: list[JobEventOut]
    invocations: list[InvocationOut]


class AdminJobList(JobList):
    """``GET /admin/ai/jobs``: a page, and with ``includeCounts`` the exact number of
    jobs in each state matching every filter but ``status`` (reference §9.5 console)."""

    counts: dict[JobStatus, int] | None = None


class AttemptOut(BaseModel):
    """One attempt of a job: who ran it, how it ended, its events and model calls."""

    attemptNo: int
    runtimeInstanceId: str | None
    startedAt: str | None
    endedAt: str | None
    outcome: JobStatus | None
    errorCode: str | None
    latencyMs: int
    costUsd: float
    events: list[JobEventOut]
    invocations: list[InvocationOut]


class SnapshotSummaryOut(BaseModel):
    """What a job's snapshot holds, without its text."""

    snapshotId: str
    schemaVersion: str
    targetType: str
    targetId: str
    contentHash: str
    payloadBytes: int
    materialCount: int
    blockCount: int
    knowledgePointCount: int
    stats: dict[str, Any]


class AdminJobDetailOut(AdminJobOut):
    """``GET /admin/ai/jobs/{jobId}``: the job, its events and model calls, the same
    grouped by attempt (oldest first), and its snapshot's summary (null without one)."""

    attempts: list[AttemptOut]
    snapshot: SnapshotSummaryOut | None


class ThroughputMinuteOut(BaseModel):
    """Jobs that ended in one UTC minute, by outcome."""

    minute: str | None
    succeeded: int
    failed: int
    cancelled: int


class ThroughputOut(BaseModel):
    """``GET /admin/ai/throughput``: jobs ended per minute over ``[from, to)`` (only
    minutes in which one ended) and ``failureRate = failed / (succeeded + failed)``
    over the window (null when neither happened)."""

    hours: int
    from_: str | None = Field(alias="from")
    to: str | None
    minutes: list[ThroughputMinuteOut]
    succeeded: int
    failed: int
    cancelled: int
    failureRate: float | None

    model_config = ConfigDict(populate_by_name=True)


class BlockOut(BaseModel):
    """One block of a material."""

    blockId: str
    ordinal: int
    text: str


class MaterialOut(BaseModel):
    """A material with its blocks (a page of them with ``blocksPageSize``, reference §9.2)."""

    materialId: str
    title: str
    blocks: list[BlockOut]
    blockCount: int = Field(description="How many blocks the material has in all.")
    createdAt: str | None
    nextBlocksPageToken: str | None = Field(
        description="The next page of blocks; null on the last page or without paging."
    )


class MaterialSummaryOut(BaseModel):
    """A material in a list (no blocks)."""

    materialId: str
    title: str
    blockCount: int
    createdAt: str | None


class MaterialList(BaseModel):
    """A page of the caller's materials, newest first; ``nextPageToken`` null on the last."""

    materials: list[MaterialSummaryOut]
    nextPageToken: str | None


class KnowledgePointOut(BaseModel):
    """A knowledge point."""

    knowledgePointId: str
    materialId: str
    name: str
    blockIds: list[str]
    createdAt: str | None


class KnowledgePointList(BaseModel):
    """A page of the caller's knowledge points, newest first."""

    knowledgePoints: list[KnowledgePointOut]
    nextPageToken: str | None


class EventsAccepted(BaseModel):
    """How many events were new and how many repeats."""

    accepted: int
    duplicates: int


ITEMS_DESCRIPTION = (
    "Business items; each carries its `itemId` (for `DELETE /v1/ai/results/{kind}/{itemId}`),"
    " the same id under its kind's key, its fields, `jobId` and `createdAt`."
)


class JobResultOut(BaseModel):
    """The business rows a succeeded job wrote."""

    jobId: str
    jobType: JobType | None
    outputSchemaVersion: str
    items: list[dict[str, Any]] = Field(description=ITEMS_DESCRIPTION)


class ResultItems(BaseModel):
    """A page of accumulated business rows."""

    items: list[dict[str, Any]] = Field(description=ITEMS_DESCRIPTION)
    nextPageToken: str | None


class CredentialOut(BaseModel):
    """The masked view of the user's model key (never the key)."""

    credentialId: str
    provider: str
    maskedKey: str
    status: Literal["valid", "invalid"] | None
    createdAt: str | None
    baseUrl: str | None = Field(
        description="the user's own endpoint for this key as stored (normalized), or null: "
        "the provider's configured one"
    )


class AuthorizationOut(BaseModel):
    """The user's AI authorization."""

    granted: bool
    changedAt: str | None


class RevokeOut(AuthorizationOut):
    """What a revoke did."""

    cancelled: int
    cancelRequested: int


class CostRowOut(BaseModel):
    """One cost rollup row; ``costUsd`` a JSON number."""

    key: str
    calls: int
    promptTokens: int
    completionTokens: int
    cacheHitTokens: int
    costUsd: float


class CostsOut(BaseModel):
    """``GET /admin/ai/costs``."""

    rows: list[CostRowOut]


class ProviderBreakerOut(BaseModel):
    """One model provider's platform-key breaker (reference §9.4)."""

    name: str
    state: BreakerState | None
    consecutiveFailures: int
    openedAt: str | None
    halfOpenAt: str | None


class BreakerOut(BaseModel):
    """The platform circuit breaker (reference §6): the first provider's fields, and every
    provider's in ``providers``, in ``MODEL_PROVIDERS`` order (reference §9.4)."""

    state: BreakerState | None
    consecutiveFailures: int
    openedAt: str | None
    halfOpenAt: str | None
    providers: list[ProviderBreakerOut] = []


class RuntimeWorkerOut(BaseModel):
    """A runtime instance in job_service's registry."""

    instanceId: str
    capabilities: list[JobType]
    inFlight: int
    lastSeenAt: str | None
    status: str


class RuntimeHealthOut(BaseModel):
    """``GET /internal/runtime/health``."""

    status: str
    workers: list[RuntimeWorkerOut]


class InFlightOut(BaseModel):
    """A job a worker is executing."""

    jobId: str
    attemptNo: int
    jobType: JobType | None
    startedAt: str | None
    ageSeconds: float


class WorkerStatusOut(BaseModel):
    """A worker's own status (``WorkerStatusService.GetStatus``)."""

    instanceId: str
    version: str
    capabilities: list[JobType]
    inFlight: list[InFlightOut]
    counters: dict[str, int]
    draining: bool
    concurrency: int
    startedAt: str | None


class AdminWorkerOut(RuntimeWorkerOut):
    """A registry entry plus its live status when reachable (best effort)."""

    statusAddress: str | None
    live: WorkerStatusOut | None
    liveError: str | None


class ConfiguredWorkerOut(BaseModel):
    """A worker from ``RUNTIME_WORKER_ADDRS`` no registry entry reported."""

    statusAddress: str
    live: WorkerStatusOut | None
    liveError: str | None


class AdminRuntimeOut(BaseModel):
    """``GET /admin/ai/runtime``."""

    status: str
    workers: list[AdminWorkerOut]
    configuredWorkers: list[ConfiguredWorkerOut]


class ErrorBody(BaseModel):
    """Every error answer (reference §4)."""

    code: str
    message: str
    details: dict[str, Any]
