"""Prometheus metrics of job_service, served on ``JOB_SERVICE_METRICS_PORT`` (0 = off).

Counters and histograms are updated where the event happens; the gauges
(queue depth, breaker state) are database-wide numbers refreshed by
:meth:`job_service.services.views.Views.refresh_gauges` every
``METRICS_REFRESH_SECONDS`` (every replica reports the same values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram

JOBS_CREATED = Counter(
    "airt_jobs_created_total",
    "Jobs created (including admin re-runs)",
    ["job_type", "api_key_mode"],
)
JOBS_FINISHED = Counter(
    "airt_jobs_finished_total", "Jobs reaching a terminal state", ["job_type", "outcome"]
)
PICKUP_LATENCY = Histogram(
    "airt_job_pickup_latency_seconds",
    "Seconds from availableAt to lock (availableAt = createdAt for a new job)",
    ["job_type"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
RESULT_GROUP_SIZE = Histogram(
    "airt_result_group_size",
    "Reports (results and fails) ended per completer transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 200),
)
RUN_TIME = Histogram(
    "airt_job_run_seconds",
    "Seconds from an attempt's startedAt to the job's finishedAt, by job type and outcome",
    ["job_type", "outcome"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
LEASE_LOSSES = Counter(
    "airt_lease_losses_total", "Leases lost: refused holder calls and reaper expiries", ["where"]
)
REAPED = Counter("airt_reaper_expired_total", "Jobs expired by the reaper", ["code", "outcome"])
QUEUE_DEPTH = Gauge(
    "airt_jobs_queue_depth",
    "Non-terminal jobs in the database by state and job type",
    ["state", "job_type"],
)
BREAKER_STATE = Gauge(
    "airt_platform_breaker_state",
    "Platform-key circuit breaker of each model provider: 1 for the current state, "
    "0 for the others",
    ["provider", "state"],
)
BREAKER_FAILURES = Gauge(
    "airt_platform_breaker_consecutive_failures",
    "Consecutive platform-key failures counted by the breaker of the first provider "
    "(MODEL_PROVIDERS)",
)

OLDEST_PENDING_AGE = Gauge(
    "airt_jobs_oldest_pending_age_seconds",
    "Seconds since availableAt of the pending job next in line (the one a claim would pick), "
    "by job type; 0 when none is waiting",
    ["job_type"],
)
PLATFORM_SPEND = Gauge(
    "airt_platform_spend_usd",
    "Platform-key model cost of the database's current UTC day (what create admission "
    "compares with the budget)",
)
PLATFORM_BUDGET = Gauge("airt_platform_budget_usd", "PLATFORM_DAILY_BUDGET_USD")
PROMPT_ROLLBACKS = Counter(
    "ai_runtime_prompt_rollbacks",
    "Prompt routings the guard rolled back to their control, by job type (reference §10.4); "
    "counted by the replica whose rollback committed",
    ["job_type"],
)
WORKERS_LIVE = Gauge(
    "airt_runtime_workers_live",
    "Runtime instances the registry counts alive (seen within the alive window)",
)
MODEL_COST = Counter(
    "airt_model_cost_usd_total",
    "USD cost (MODEL_PRICES) of the model calls logged by this replica",
    ["model_provider", "model_name", "api_key_mode"],
)

WATCHERS = Gauge(
    "airt_job_watchers",
    "WatchJobs streams open on this replica (gateways waiting on job changes, reference §9.1)",
)
CHANGES_DELIVERED = Counter(
    "airt_job_changes_delivered_total",
    "Job changes this replica's change poller handed to its watchers (reference §9.1)",
)

BREAKER_STATES = ("closed", "open", "half_open")


class _BreakerLike(Protocol):
    @property
    def provider(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def consecutive_failures(self) -> int: ...


def set_breakers(views: Sequence[_BreakerLike]) -> None:
    """Publish each provider's breaker state (one-hot, labelled by provider) and the
    first provider's failure count (``views`` in ``MODEL_PROVIDERS`` order)."""
    for view in views:
        for name in BREAKER_STATES:
            BREAKER_STATE.labels(view.provider, name).set(1 if name == view.state else 0)
    if views:
        BREAKER_FAILURES.set(views[0].consecutive_failures)


PROVIDER_REQUESTS = Gauge(
    "airt_provider_requests_last_minute",
    "Platform-key attempts leased to the provider in the last 60 s (reference §10.2)",
    ["provider"],
)
PROVIDER_TOKENS = Gauge(
    "airt_provider_tokens_last_minute",
    "Tokens of those attempts: used where settled, else their estimate",
    ["provider"],
)
PROVIDER_IN_FLIGHT = Gauge(
    "airt_provider_in_flight", "Platform-key attempts holding a lease on the provider", ["provider"]
)
PROVIDER_PAUSED = Gauge(
    "airt_provider_paused", "1 while the provider is paused after a 429", ["provider"]
)
PROVIDER_LIMIT = Gauge(
    "airt_provider_limit",
    "The provider's limits (requests_per_minute, tokens_per_minute, max_concurrent); "
    "absent where it has none",
    ["provider", "limit"],
)


def set_providers(views: Sequence[Any]) -> None:
    """Publish each provider's usage, pause and limits (each a
    :class:`~job_service.services.views.ProviderStateView`)."""
    for view in views:
        PROVIDER_REQUESTS.labels(view.name).set(view.requests_last_minute)
        PROVIDER_TOKENS.labels(view.name).set(view.tokens_last_minute)
        PROVIDER_IN_FLIGHT.labels(view.name).set(view.in_flight)
        PROVIDER_PAUSED.labels(view.name).set(1 if view.paused_until is not None else 0)
        for name, value in (
            ("requests_per_minute", view.limits.requestsPerMinute),
            ("tokens_per_minute", view.limits.tokensPerMinute),
            ("max_concurrent", view.limits.maxConcurrent),
        ):
            if value is not None:
                PROVIDER_LIMIT.labels(view.name, name).set(value)
