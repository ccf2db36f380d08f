"""job_service configuration from the environment (reference §7)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from airuntime_common.model_providers import ModelProvidersSettings
from airuntime_common.settings import (
    COUNT_MAX,
    DAY,
    DEFAULT_JOB_DB,
    CommonSettings,
    DatabaseUrl,
    ListenAddress,
)

#: USD per million tokens: cache-hit input, cache-miss input, output (DeepSeek's list prices).
PRICE_KEYS = frozenset({"cacheHitInput", "cacheMissInput", "output"})

DEFAULT_MODEL_PRICES: dict[str, dict[str, float]] = {
    "deepseek-chat": {"cacheHitInput": 0.028, "cacheMissInput": 0.28, "output": 0.42},
    "deepseek-reasoner": {"cacheHitInput": 0.028, "cacheMissInput": 0.28, "output": 0.42},
}


class JobServiceSettings(ModelProvidersSettings, CommonSettings):
    """Every variable job_service reads (reference §7, §9.4); names are the env var names.

    ``MODEL_PROVIDERS`` (the same list credential_service and the workers read) names
    the providers a platform-key attempt may run on, in order of preference, and so
    the per-provider breakers (reference §9.4); its ``apiKeyEnv`` variables are read by
    credential_service only.

    Times are seconds unless the name says ``_MS``. ``RUNTIME_SERVICE_TOKEN``
    is required: :func:`job_service.app.serve` refuses to start without it.
    """

    #: The job database (SQLAlchemy async URL; ``mysql://`` runs on asyncmy).
    DATABASE_URL: DatabaseUrl = DEFAULT_JOB_DB
    #: gRPC listen address; port 0 picks a free port.
    JOB_SERVICE_LISTEN: ListenAddress = "[::]:50051"
    #: Prometheus port, on every interface; 0 turns metrics off.
    JOB_SERVICE_METRICS_PORT: int = Field(default=9101, ge=0, le=65535)
    #: Lease length: a lock, claim or heartbeat holds the job this long.
    LOCK_LEASE_SECONDS: float = Field(default=60, gt=0, le=DAY)
    #: How often the reaper sweeps expired leases and timed-out attempts.
    REAPER_INTERVAL_SECONDS: float = Field(default=5, gt=0, le=DAY)
    #: The workers' poll interval (ms), for the health view only: a worker counts as
    #: alive for three of them (at least ``WORKER_ALIVE_MIN_SECONDS``).
    POLL_INTERVAL_MS: int = Field(default=1000, ge=1, le=DAY * 1000)
    #: Retry backoff: base × 2^(retryCount − 1), ±10 % jitter.
    RETRY_BACKOFF_BASE_SECONDS: float = Field(default=5, ge=0, le=DAY)
    #: Retry backoff cap (before the jitter).
    RETRY_BACKOFF_MAX_SECONDS: float = Field(default=300, ge=0, le=DAY)
    #: Default ``maxRetryCount`` of a new job (an admin may set 0..10 per job).
    MAX_RETRY_COUNT: int = Field(default=3, ge=0, le=10)
    #: Default ``timeoutSeconds`` of a new job: one attempt's time budget, from its start.
    #: At most an hour, the longest ``timeoutSeconds`` a create may ask for.
    JOB_TIMEOUT_SECONDS: int = Field(default=120, ge=1, le=3600)
    #: Default ``priority`` of a new job (0 = highest).
    DEFAULT_PRIORITY: int = Field(default=0, ge=0, le=1000)
    #: Consecutive failing platform-key attempts that open a provider's breaker.
    BREAKER_FAILURE_THRESHOLD: int = Field(default=5, ge=1, le=COUNT_MAX)
    #: How long a breaker stays open before it goes half-open.
    BREAKER_COOLDOWN_SECONDS: float = Field(default=60, ge=0, le=DAY)
    #: Attempts a half-open breaker lets through as probes.
    BREAKER_HALF_OPEN_PROBES: int = Field(default=1, ge=1, le=COUNT_MAX)
    #: Platform-key spend cap per UTC day (USD); past it creates are refused.
    PLATFORM_DAILY_BUDGET_USD: float = Field(default=50, ge=0, le=1e9)
    #: Jobs one user may create per UTC day (0 = unlimited).
    USER_DAILY_JOB_QUOTA: int = Field(default=200, ge=0, le=COUNT_MAX)
    #: Per-plan daily quotas by the token's ``plan`` claim, JSON (``{"pro":1000}``).
    PLAN_DAILY_JOB_QUOTAS: dict[str, Annotated[int, Field(ge=0, le=COUNT_MAX)]] = Field(
        default_factory=dict
    )
    #: Most children of one batch (reference §10.3): more targets, or a ``targetsOf``
    #: matching more, is 400 ``INVALID_ARGUMENT`` and creates nothing.
    BATCH_MAX_CHILDREN: int = Field(default=200, ge=1, le=10_000)
    #: USD per million tokens per provider model name, JSON; an unlisted model costs 0.
    MODEL_PRICES: dict[str, dict[str, float]] = Field(
        default_factory=lambda: dict(DEFAULT_MODEL_PRICES)
    )
    #: Run ``alembic upgrade head`` before serving (tests may turn it off).
    JOB_SERVICE_MIGRATE_ON_START: bool = True
    #: Minimum age (seconds) under which a worker still counts as alive for health.
    WORKER_ALIVE_MIN_SECONDS: float = Field(default=30, ge=0, le=DAY)
    #: Seconds after its last call that a runtime instance's ``ai_runtime_workers`` row
    #: is deleted by the reaper (unless it still holds a lease); one week by default.
    WORKER_RETENTION_SECONDS: float = Field(default=7 * DAY, ge=60, le=365 * DAY)
    #: Key of the one-way pseudonym (HMAC-SHA256) an erased user's cost and day's
    #: quota use are kept under (reference §9.2). Unset: derived from RUNTIME_SERVICE_TOKEN
    #: (then rotating the token changes the pseudonyms: an erased user's day of quota
    #: use is forgotten, nothing else).
    ERASURE_PSEUDONYM_KEY: str = ""
    #: How often the prompt guard of each replica compares the variants of every
    #: routing with its control and rolls a bad one back (reference §10.4: within
    #: 10 s of the variant's ``minAttempts``th attempt).
    PROMPT_GUARD_INTERVAL_SECONDS: float = Field(default=2, gt=0, le=3600)
    #: How often the queue-depth and breaker gauges are re-read from the database.
    METRICS_REFRESH_SECONDS: float = Field(default=5, gt=0, le=DAY)
    #: How often the one change poller of the process reads the job changes every
    #: replica committed, while someone watches (``WatchJobs``, reference §9.1).
    WATCH_POLL_INTERVAL_MS: int = Field(default=100, ge=5, le=60_000)
    #: How long a hole in the event sequence (a transaction still to commit) is
    #: looked for again before it counts as rolled back (reference §9.1).
    WATCH_GAP_SECONDS: float = Field(default=5, ge=0, le=600)

    #: ``fair`` (default): within one priority, jobs are taken in fair order across
    #: users, each user in proportion to their weight; ``fifo``: oldest first, as
    #: reference §2.6 orders them (reference §10.1).
    SCHEDULING_POLICY: Literal["fair", "fifo"] = "fair"
    #: The token's ``plan`` → the user's weight in the fair order (JSON object, each
    #: weight > 0); a plan not listed, a token with no plan and an admin's job weigh 1.
    PLAN_SCHEDULING_WEIGHTS: dict[str, Annotated[float, Field(gt=0, le=1_000_000)]] = Field(
        default_factory=dict
    )

    @field_validator(
        "PLAN_DAILY_JOB_QUOTAS", "PLAN_SCHEDULING_WEIGHTS", "MODEL_PRICES", mode="before"
    )
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("MODEL_PRICES")
    @classmethod
    def _price_keys(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """Each model's prices are exactly ``cacheHitInput``, ``cacheMissInput`` and
        ``output`` (USD per million tokens, ≥ 0): a misspelt key would price tokens at 0."""
        for model, prices in value.items():
            if set(prices) != PRICE_KEYS:
                raise ValueError(
                    f"MODEL_PRICES[{model!r}] must have exactly the keys {sorted(PRICE_KEYS)}"
                )
            if any(v < 0 for v in prices.values()):
                raise ValueError(f"MODEL_PRICES[{model!r}] prices must be >= 0")
        return value

    def worker_alive_seconds(self) -> float:
        """How recently an instance must have been seen for health to be SERVING.

        Three poll intervals (reference §3), but at least ``WORKER_ALIVE_MIN_SECONDS``
        (30 s): a worker in a 20 s long poll is not seen between its calls.
        """
        return max(3 * self.POLL_INTERVAL_MS / 1000.0, self.WORKER_ALIVE_MIN_SECONDS)
