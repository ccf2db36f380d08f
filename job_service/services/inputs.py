"""The shapes that go into and come out of the job operations (after transport decoding).

Servicers (:mod:`job_service.rpc`) build the inputs from protobuf and turn the
answers back into it; the services (:mod:`job_service.services`) take and
return these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airuntime_common.errors import AppError, ErrorCode

if TYPE_CHECKING:
    from job_service.services.claim_round import Claimed

#: Most tokens one model call may log per count (prompt, completion, cache hits):
#: ten million, far above any context window, so a broken count (2^53) cannot be
#: priced into billions of dollars and exhaust the platform budget (reference §5, §6).
MAX_CALL_TOKENS = 10_000_000
#: Longest latency (ms) one model call may log: a day.
MAX_CALL_LATENCY_MS = 86_400_000


@dataclass
class CreateJobInput:
    """A create request after transport decoding (reference §3.1 create / admin create).

    Attributes:
        priority, max_retry_count, timeout_seconds: admin overrides; None = defaults.
        plan: the caller's ``plan`` claim for the per-plan daily quota.
        actor: ``"user:<id>"`` / ``"admin:<id>"``.
        trace_parent: the create request's W3C ``traceparent`` (reference §9.5), or None.
    """

    user_id: str
    job_type: str
    target_type: str
    target_id: str
    params: dict[str, Any] = field(default_factory=dict)
    api_key_mode: str = "platform_key"
    idempotency_key: str | None = None
    priority: int | None = None
    max_retry_count: int | None = None
    timeout_seconds: int | None = None
    plan: str | None = None
    actor: str = ""
    trace_parent: str | None = None


@dataclass
class CreateBatchInput:
    """A batch's create request after transport decoding (reference §10.3).

    Attributes:
        targets: ``(targetType, targetId)`` of each child, in order; None with
            ``targets_of``.
        targets_of: ``(targetType, materialId or None)``: every material of the user,
            or every knowledge point (of one material); None with ``targets``.
        min_success_ratio: 0 < r ≤ 1; None = 1.
        priority, max_retry_count, timeout_seconds: admin overrides; None = defaults.
        plan, actor, trace_parent, idempotency_key: as :class:`CreateJobInput`'s (the
            key's scope is the parent's: user, type, ``user``, the user's id).
    """

    user_id: str
    job_type: str
    targets: list[tuple[str, str]] | None = None
    targets_of: tuple[str, str | None] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    api_key_mode: str = "platform_key"
    min_success_ratio: float | None = None
    idempotency_key: str | None = None
    priority: int | None = None
    max_retry_count: int | None = None
    timeout_seconds: int | None = None
    plan: str | None = None
    actor: str = ""
    trace_parent: str | None = None


@dataclass(frozen=True)
class RetryInput:
    """A re-run of a failed job (reference §2.3 admin re-run, §9.2 user retry).

    Attributes:
        job_id: the failed job.
        rebuild_snapshot: build a new snapshot instead of reusing the job's.
        actor: ``"user:<id>"`` / ``"admin:<id>"`` (the new job's first event).
        user_id: set for a user's retry: the job must be theirs, quota applies.
        idempotency_key: the user retry's ``Idempotency-Key``.
        plan: the caller's ``plan`` claim for the per-plan daily quota.
        trace_parent: the request's W3C ``traceparent``, or None.
    """

    job_id: str
    rebuild_snapshot: bool = False
    actor: str = "admin"
    user_id: str | None = None
    idempotency_key: str | None = None
    plan: str | None = None
    trace_parent: str | None = None


@dataclass(frozen=True)
class LeaseHolderView:
    """A leased job as credential resolution sees it (reference §3 VerifyLease)."""

    user_id: str
    api_key_mode: str
    credential_id: str | None
    model_provider: str
    model_name: str


@dataclass(frozen=True)
class ModelCallInput:
    """One model call of an attempt, as reported by its worker (reference §5 invocation log).

    Attributes:
        model_provider / model_name: empty → the job's.
        api_key_mode: ``platform_key`` / ``user_key``; None → the job's.
        credential_id: the user credential used, if any.
        prompt_tokens / completion_tokens / cache_hit_tokens: token counts (≥ 0).
        latency_ms: wall time of the call in milliseconds (≥ 0).
        outcome: ``succeeded`` or ``failed``.
        error_code: reference §4 code of a failed call.
        provider_request_id: the provider's request id header.
    """

    model_provider: str
    model_name: str
    api_key_mode: str | None
    credential_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cache_hit_tokens: int
    latency_ms: int
    outcome: str
    error_code: str | None = None
    provider_request_id: str | None = None

    def check(self) -> None:
        """Raises AppError(INVALID_ARGUMENT) for a bad outcome, a negative count, a count
        over :data:`MAX_CALL_TOKENS` (latency over :data:`MAX_CALL_LATENCY_MS`) or more
        cache-hit tokens than prompt tokens."""
        if self.outcome not in ("succeeded", "failed"):
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "outcome must be succeeded or failed",
                {"field": "outcome"},
            )
        for name, value in (
            ("promptTokens", self.prompt_tokens),
            ("completionTokens", self.completion_tokens),
            ("cacheHitTokens", self.cache_hit_tokens),
            ("latencyMs", self.latency_ms),
        ):
            if value < 0:
                raise AppError(ErrorCode.INVALID_ARGUMENT, f"{name} must be ≥ 0", {"field": name})
            limit = MAX_CALL_LATENCY_MS if name == "latencyMs" else MAX_CALL_TOKENS
            if value > limit:
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT, f"{name} must be ≤ {limit}", {"field": name}
                )
        if self.cache_hit_tokens > self.prompt_tokens:
            # cache hits are a part of the prompt's tokens (DeepSeek's usage): more is
            # a broken count, and its cost would be a guess
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "cacheHitTokens must be ≤ promptTokens",
                {"field": "cacheHitTokens"},
            )


@dataclass(frozen=True)
class SubmitOutcome:
    """Answer of a result submission (reference §3 result); ``claimed``: the jobs a
    taken result's ``claimNext`` was given, started, with their snapshots."""

    job_id: str
    status: str
    result_id: str
    output_hash: str
    replayed: bool
    claimed: Claimed | None = None


@dataclass(frozen=True)
class LeaseAnswer:
    """One answer of a batched heartbeat (reference §3 leases/heartbeat)."""

    job_id: str
    attempt_no: int
    held: bool
    lock_until: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class AuthorizationView:
    """Per-user AI authorization (reference §6)."""

    granted: bool
    changed_at: datetime | None
    cancelled: int = 0
    cancel_requested: int = 0
