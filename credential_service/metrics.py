"""Prometheus metrics of credential_service (served on ``CREDENTIAL_SERVICE_METRICS_PORT``)."""

from __future__ import annotations

from prometheus_client import Counter

RESOLVES = Counter(
    "credential_resolves_total",
    "ResolveCredential answers by key mode and outcome (ok or the error code).",
    ["api_key_mode", "outcome"],
)
ROTATED = Counter("credential_rows_rotated_total", "Rows re-encrypted to the current master key.")
UNDECRYPTABLE = Counter(
    "credential_rows_undecryptable_total", "Rows found undecryptable during rotation."
)
