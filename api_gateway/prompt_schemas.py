"""Request and response models of the prompt registry's REST API and of learners'
feedback (reference §10.4). Conventions as :mod:`api_gateway.schemas`: camelCase field
names, closed strictly-typed bodies, every response field present (null when absent)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StrictInt

from api_gateway.schemas import Body, JobType

#: A bare version as the admin endpoints name it (``v2``).
VERSION_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
Version = Annotated[str, Field(pattern=VERSION_PATTERN, min_length=1, max_length=64)]


class PromptVersionIn(Body):
    """``POST /admin/ai/prompts/{jobType}/versions``: a new version of the type's prompt.

    ``template`` is Jinja2 source with the blocks ``system`` and ``user``, given the
    variables ``job_type``, ``snapshot_json``, ``params_json`` and ``truncation_note``;
    self-contained (no include, import or extends).
    """

    version: Version
    template: str = Field(min_length=1)
    description: str | None = Field(default=None, max_length=1000)


class PromptVersionOut(BaseModel):
    """One version; ``template`` is the whole source (a shipped one with its includes
    inlined), ``createdAt`` null for the shipped ``v1``."""

    version: str
    template: str
    description: str | None
    createdAt: str | None
    builtin: bool


class PromptVersionSummary(BaseModel):
    """One version in a list (no template)."""

    version: str
    description: str | None
    createdAt: str | None
    builtin: bool


class PromptVariantIn(Body):
    """One version of a routing and its weight (≥ 0)."""

    version: Version
    weight: float = Field(ge=0, le=1_000_000)


class PromptGuardIn(Body):
    """The guard's thresholds; an absent one takes its default (0.10, 50)."""

    maxInvalidSchemaIncrease: float | None = Field(default=None, ge=0, le=1)
    minAttempts: int | None = Field(default=None, ge=1, le=1_000_000)


class PromptRoutingIn(Body):
    """``PUT /admin/ai/prompts/{jobType}/routing``: the first variant is the control;
    weights ≥ 0, not all 0; one variant is allowed."""

    variants: list[PromptVariantIn] = Field(min_length=1, max_length=20)
    guard: PromptGuardIn | None = None


class PromptVariantOut(BaseModel):
    """One version of a routing and its weight."""

    version: str
    weight: float


class PromptGuardOut(BaseModel):
    """The guard's thresholds in force."""

    maxInvalidSchemaIncrease: float
    minAttempts: int


class PromptRoutingOut(BaseModel):
    """The routing in force: ``rolledBackAt`` / ``rollbackReason`` set once the guard
    rolled a variant back (a new routing clears them); ``startedAt`` is when it came
    into force (null for a type that never had a routing: every job gets ``v1``)."""

    variants: list[PromptVariantOut]
    guard: PromptGuardOut
    rolledBackAt: str | None
    rollbackReason: str | None
    startedAt: str | None


class PromptFeedbackOut(BaseModel):
    """Ratings given in the window on items of the version."""

    positive: int
    negative: int


class PromptVersionStatsOut(BaseModel):
    """One version's stats over the window; null rates and latencies when it had no
    attempts (``invalidSchemaRate`` = attempts ending INVALID_SCHEMA / attempts)."""

    version: str
    attempts: int
    succeeded: int
    invalidSchemaRate: float | None
    meanPromptTokens: float | None
    meanCompletionTokens: float | None
    p50LatencyMs: int | None
    p95LatencyMs: int | None
    costPerSucceededUsd: float | None
    feedback: PromptFeedbackOut


class PromptsOut(BaseModel):
    """``GET /admin/ai/prompts/{jobType}``: versions, the routing and per-version stats."""

    jobType: JobType
    hours: int
    versions: list[PromptVersionSummary]
    routing: PromptRoutingOut
    stats: list[PromptVersionStatsOut]


def _one(value: int) -> int:
    if value not in (1, -1):
        raise ValueError("must be 1 or -1")
    return value


class FeedbackIn(Body):
    """``POST /v1/ai/results/{kind}/{itemId}/feedback``: 1 (helpful) or -1 (not)."""

    #: a JSON integer (``true`` and ``1.0`` are not ratings)
    rating: Annotated[StrictInt, AfterValidator(_one), Field(json_schema_extra={"enum": [1, -1]})]
