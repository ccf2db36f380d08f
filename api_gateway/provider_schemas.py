"""The shapes of ``GET /admin/ai/providers`` (reference §10.2)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from airuntime_common.enums import BREAKER_STATE
from api_gateway.convert import ts
from api_gateway.schemas import ProviderBreakerOut


class ProviderLimitsOut(BaseModel):
    """A provider's limits; null where it has none."""

    requestsPerMinute: int | None
    tokensPerMinute: int | None
    maxConcurrent: int | None


class ProviderUsageOut(BaseModel):
    """What the platform-key attempts leased to it used of the last 60 seconds, and the
    attempts holding a lease on it now."""

    requestsLastMinute: int
    tokensLastMinute: int
    inFlight: int


class ProviderOut(BaseModel):
    """One provider: limits, usage, pause after a 429 (UTC, or null), breaker."""

    name: str
    limits: ProviderLimitsOut
    usage: ProviderUsageOut
    pausedUntil: str | None
    breaker: ProviderBreakerOut


class ProvidersOut(BaseModel):
    """Every configured provider, in ``MODEL_PROVIDERS`` order."""

    providers: list[ProviderOut]


def provider_json(state: Any) -> dict[str, Any]:
    """A ``ProviderState`` message → its JSON."""

    def opt(name: str) -> int | None:
        return int(getattr(state, name)) if state.HasField(name) else None

    b = state.breaker
    return {
        "name": state.name,
        "limits": {
            "requestsPerMinute": opt("requests_per_minute"),
            "tokensPerMinute": opt("tokens_per_minute"),
            "maxConcurrent": opt("max_concurrent"),
        },
        "usage": {
            "requestsLastMinute": state.requests_last_minute,
            "tokensLastMinute": state.tokens_last_minute,
            "inFlight": state.in_flight,
        },
        "pausedUntil": ts(state, "paused_until"),
        "breaker": {
            "name": b.name,
            "state": BREAKER_STATE.to_str_or_none(b.state),
            "consecutiveFailures": b.consecutive_failures,
            "openedAt": ts(b, "opened_at"),
            "halfOpenAt": ts(b, "half_open_at"),
        },
    }
