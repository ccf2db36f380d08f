"""The worker's egress guard: a user's own base URL is checked before every call
(reference §10.5).

A resolve answer flagged ``user_base_url`` carries the user's own endpoint. Every
call of such an attempt (the re-ask too) goes through :class:`GuardedProvider`,
which, before any connection:

* refuses unless ``USER_BASE_URLS`` is on here, the key is the user's own (a platform
  key never goes to a user's URL) and the provider can pin (``accepts_pinned``);
* resolves the host again with the system resolver and runs every rule of
  :func:`airuntime_common.egress.check_base_url` (the same code credential_service ran
  when the URL was stored: whatever the name answered then, what it answers now is
  judged);
* hands the provider the checked addresses (``ModelRequest.pinned``), which it
  connects to without another lookup.

A refusal is ``ModelError(EGRESS_BLOCKED)``: the attempt ends, finally, with no
connection opened and the credential left valid. A resolver that fails for now is
``NETWORK_ERROR`` (retried).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from airuntime_common.egress import (
    EgressPolicy,
    EgressRefused,
    EgressSettings,
    ResolutionUnavailable,
    Resolver,
    check_base_url,
)
from airuntime_common.enums import API_KEY_MODE
from runtime_worker.providers.base import ModelError, ModelProvider, ModelRequest, ModelResponse
from runtime_worker.providers.classify import Fault, code_for

log = logging.getLogger(__name__)

#: The key mode whose keys alone may go to a user's base URL.
USER_KEY_MODE = "user_deepseek_key"


def guard(provider: ModelProvider, settings: EgressSettings, key: Any) -> ModelProvider:
    """The provider an attempt's calls go through.

    Args:
        provider: the worker's model provider.
        settings: ``USER_BASE_URLS``, ``USER_BASE_URL_PORTS``, ``EGRESS_ALLOW_CIDRS``.
        key: the attempt's key (a resolve answer, or the worker's own platform key in
            its shape): its ``user_base_url`` flag and ``api_key_mode``.

    Returns:
        ``provider`` itself for a configured provider's endpoint; for a user's own
        (``key.user_base_url``) a :class:`GuardedProvider` around it.
    """
    if not getattr(key, "user_base_url", False):
        return provider
    return GuardedProvider(
        provider,
        settings.egress_policy(),
        enabled=settings.USER_BASE_URLS,
        user_key=API_KEY_MODE.to_str_or_none(key.api_key_mode) == USER_KEY_MODE,
    )


class GuardedProvider:
    """A provider whose every call first passes the egress rules (see the module doc).

    Args:
        inner: the provider that makes the call; it must honour
            ``ModelRequest.pinned`` (``accepts_pinned = True``).
        policy: ``USER_BASE_URL_PORTS`` and ``EGRESS_ALLOW_CIDRS``.
        enabled: ``USER_BASE_URLS``.
        user_key: the attempt's key is the user's own (not a platform key).
        resolver: how the host is resolved; None: the system resolver.
    """

    def __init__(
        self,
        inner: ModelProvider,
        policy: EgressPolicy,
        *,
        enabled: bool,
        user_key: bool,
        resolver: Resolver | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.policy = policy
        self.enabled = enabled
        self.user_key = user_key
        self.resolver = resolver

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Check ``request.base_url`` now, then make the call to a checked address.

        Raises:
            ModelError: ``EGRESS_BLOCKED`` (refused: nothing was sent anywhere),
                ``NETWORK_ERROR`` (the resolver failed for now), ``JOB_TIMEOUT`` /
                ``NETWORK_ERROR`` (no answer from the resolver within the call's
                deadline), or the inner provider's classified failure.
        """
        start = time.monotonic()
        if not self.enabled:
            raise _blocked("user base URLs are turned off on this worker (USER_BASE_URLS)", start)
        if not self.user_key:
            raise _blocked("only the user's own key is ever sent to a user's base URL", start)
        if not getattr(self.inner, "accepts_pinned", False):
            raise _blocked("the model provider cannot connect to a checked address", start)
        try:
            async with asyncio.timeout(request.timeout_seconds):
                target = await check_base_url(request.base_url, self.policy, resolver=self.resolver)
        except EgressRefused as exc:
            log.warning(
                "model call refused by the egress rules",
                extra={"fields": {"rule": str(exc.rule), "errorCode": "EGRESS_BLOCKED"}},
            )
            raise _blocked(f"base URL refused ({exc.rule}): {exc.message}", start) from None
        except ResolutionUnavailable as exc:
            raise ModelError(
                code_for(Fault.CONNECT_ERROR), str(exc), latency_ms=_ms(start)
            ) from None
        except TimeoutError:
            raise _late(request, start) from None
        left = request.timeout_seconds - (time.monotonic() - start)
        if left <= 0:
            raise _late(request, start)
        return await self.inner.complete(replace(request, pinned=target, timeout_seconds=left))


def _ms(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def _blocked(message: str, start: float) -> ModelError:
    return ModelError(code_for(Fault.EGRESS_REFUSED), message, latency_ms=_ms(start))


def _late(request: ModelRequest, start: float) -> ModelError:
    """The call's deadline passed while the base URL's host was being resolved."""
    fault = Fault.JOB_DEADLINE if request.timeout_is_job_deadline else Fault.CONNECT_ERROR
    return ModelError(
        code_for(fault),
        f"the base URL's host was not resolved within the call's {request.timeout_seconds:g}s",
        latency_ms=_ms(start),
    )


__all__ = ["GuardedProvider", "guard"]
