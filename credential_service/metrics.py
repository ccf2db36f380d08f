"""Prometheus metrics of credential_service (served on ``CREDENTIAL_SERVICE_METRICS_PORT``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RESOLVES = Counter(
    "credential_resolves_total",
    "ResolveCredential answers by key mode and outcome (ok or the error code).",
    ["api_key_mode", "outcome"],
)
ROTATED = Counter("credential_rows_rotated_total", "Rows re-encrypted to the current master key.")
UNDECRYPTABLE = Counter(
    "credential_rows_undecryptable_total", "Rows found undecryptable during rotation."
)
LEASE_CHECKS_PER_CALL = Histogram(
    "credential_lease_checks_per_call",
    "Leases one JobService.VerifyLeases call carried (resolves that arrived together).",
    buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 500),
)
