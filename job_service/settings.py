"""job_service configuration from the environment (SPEC §7)."""

from __future__ import annotations

import json
from typing import Annotated, Any

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
    """Every variable job_service reads (SPEC §7, §9.4); names are the env var names.

    ``MODEL_PROVIDERS`` (the same list credential_service and the workers read) names
    the providers a platform-key attempt may run on, in order of preference, and so
    the per-provider breakers (SPEC §9.4); its ``apiKeyEnv`` variables are read by
    credential_service only.

    Times are seconds unless the name says ``_MS``. ``RUNTIME_SERVICE_TOKEN``
    is required: :func:`job_service.app.serve` refuses to start without it.
    """

    DATABASE_URL: DatabaseUrl = DEFAULT_JOB_DB
    JOB_SERVICE_LISTEN: ListenAddress = "[::]:50051"
    JOB_SERVICE_METRICS_PORT: int = Field(default=9101, ge=0, le=65535)
    LOCK_LEASE_SECONDS: float = Field(default=60, gt=0, le=DAY)
    REAPER_INTERVAL_SECONDS: float = Field(default=5, gt=0, le=DAY)
    POLL_INTERVAL_MS: int = Field(default=1000, ge=1, le=DAY * 1000)
    RETRY_BACKOFF_BASE_SECONDS: float = Field(default=5, ge=0, le=DAY)
    RETRY_BACKOFF_MAX_SECONDS: float = Field(default=300, ge=0, le=DAY)
    MAX_RETRY_COUNT: int = Field(default=3, ge=0, le=10)
    #: At most an hour, the longest ``timeoutSeconds`` a create may ask for.
    JOB_TIMEOUT_SECONDS: int = Field(default=120, ge=1, le=3600)
    DEFAULT_PRIORITY: int = Field(default=0, ge=0, le=1000)
    BREAKER_FAILURE_THRESHOLD: int = Field(default=5, ge=1, le=COUNT_MAX)
    BREAKER_COOLDOWN_SECONDS: float = Field(default=60, ge=0, le=DAY)
    BREAKER_HALF_OPEN_PROBES: int = Field(default=1, ge=1, le=COUNT_MAX)
    PLATFORM_DAILY_BUDGET_USD: float = Field(default=50, ge=0, le=1e9)
    USER_DAILY_JOB_QUOTA: int = Field(default=200, ge=0, le=COUNT_MAX)
    PLAN_DAILY_JOB_QUOTAS: dict[str, Annotated[int, Field(ge=0, le=COUNT_MAX)]] = Field(
        default_factory=dict
    )
    #: Most children of one batch (reference §10.3): more targets, or a ``targetsOf``
    #: matching more, is 400 ``INVALID_ARGUMENT`` and creates nothing.
    BATCH_MAX_CHILDREN: int = Field(default=200, ge=1, le=10_000)
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
    #: quota use are kept under (SPEC §9.2). Unset: derived from RUNTIME_SERVICE_TOKEN
    #: (then rotating the token changes the pseudonyms: an erased user's day of quota
    #: use is forgotten, nothing else).
    ERASURE_PSEUDONYM_KEY: str = ""
    #: How often the queue-depth and breaker gauges are re-read from the database.
    METRICS_REFRESH_SECONDS: float = Field(default=5, gt=0, le=DAY)
    #: How often the one change poller of the process reads the job changes every
    #: replica committed, while someone watches (``WatchJobs``, SPEC §9.1).
    WATCH_POLL_INTERVAL_MS: int = Field(default=100, ge=5, le=60_000)
    #: How long a hole in the event sequence (a transaction still to commit) is
    #: looked for again before it counts as rolled back (SPEC §9.1).
    WATCH_GAP_SECONDS: float = Field(default=5, ge=0, le=600)

    @field_validator("PLAN_DAILY_JOB_QUOTAS", "MODEL_PRICES", mode="before")
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

        Three poll intervals (SPEC §3), but at least ``WORKER_ALIVE_MIN_SECONDS``
        (30 s): a worker in a 20 s long poll is not seen between its calls.
        """
        return max(3 * self.POLL_INTERVAL_MS / 1000.0, self.WORKER_ALIVE_MIN_SECONDS)
