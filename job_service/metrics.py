"""Prometheus metrics of job_service, served on ``JOB_SERVICE_METRICS_PORT`` (0 = off)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
    "Seconds from availableAt to lock",
    ["job_type"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
LEASE_LOSSES = Counter(
    "airt_lease_losses_total", "Leases lost: refused holder calls and reaper expiries", ["where"]
)
REAPED = Counter("airt_reaper_expired_total", "Jobs expired by the reaper", ["code", "outcome"])
