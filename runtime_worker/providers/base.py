"""The provider interface: one request in, one answer or one classified error out.

A provider makes exactly one HTTP call per :meth:`ModelProvider.complete` (no
hidden retries); the worker decides about a re-ask. Another OpenAI-compatible
provider is a new class implementing :class:`ModelProvider` (reference §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from airuntime_common.egress import CheckedTarget


@dataclass(frozen=True)
class Usage:
    """Token counts of one call (0 when the provider reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hit_tokens: int = 0


@dataclass(frozen=True)
class ModelRequest:
    """One chat completion request.

    Attributes:
        model: model name, e.g. ``"deepseek-chat"``.
        messages: chat messages ``[{"role": "system"|"user"|"assistant", "content": str}]``.
        max_tokens: output token cap.
        api_key: the plaintext key; lives only in memory, never logged (``repr`` hides it).
        base_url: provider endpoint, e.g. ``"https://api.deepseek.com"``.
        timeout_seconds: OVERALL deadline of the call, connect to last body byte (s).
        timeout_is_job_deadline: the deadline is the job's own remaining time budget,
            so a timeout means ``JOB_TIMEOUT`` rather than ``MODEL_TIMEOUT``.
        pinned: ``base_url`` is a user's own and passed the egress rules (reference
            §10.5): connect to these checked addresses only, never looking the name up
            again, without a proxy. Set by :mod:`runtime_worker.egress` only.
    """

    model: str
    messages: list[dict[str, str]]
    max_tokens: int
    api_key: str = field(repr=False)
    base_url: str
    timeout_seconds: float
    timeout_is_job_deadline: bool = False
    pinned: CheckedTarget | None = None


@dataclass(frozen=True)
class ModelResponse:
    """A well-formed answer envelope.

    Attributes:
        content: ``choices[0].message.content`` (may be blank; the caller validates).
        finish_reason: ``choices[0].finish_reason`` (``"stop"``, ``"length"``…), or None.
        usage: token counts.
        provider_request_id: the envelope's ``id``, or None.
        latency_ms: wall time of the call (ms).
    """

    content: str
    finish_reason: str | None
    usage: Usage
    provider_request_id: str | None
    latency_ms: int


class ModelError(Exception):
    """A model call that failed, classified to a reference §4 code.

    Attributes:
        code: reference §4 code (``MODEL_TIMEOUT``, ``MODEL_RATE_LIMIT``…).
        message: human-readable reason, never containing the key.
        retry_after_seconds: from ``Retry-After`` on 429, else None.
        http_status: the HTTP status when one was received, else None.
        provider_request_id: the provider's request id when known.
        usage: tokens spent when the provider reported them (e.g. a truncated answer).
        latency_ms: wall time until the failure (ms).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retry_after_seconds: float | None = None,
        http_status: int | None = None,
        provider_request_id: str | None = None,
        usage: Usage | None = None,
        latency_ms: int = 0,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after_seconds = retry_after_seconds
        self.http_status = http_status
        self.provider_request_id = provider_request_id
        self.usage = usage or Usage()
        self.latency_ms = latency_ms


@runtime_checkable
class ModelProvider(Protocol):
    """What the worker needs from a model provider."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Make one call.

        Returns:
            The answer envelope, whatever its content (validation is the caller's job).

        Raises:
            ModelError: transport, HTTP or envelope failure, classified by
                :mod:`runtime_worker.providers.classify`.
        """
        ...
