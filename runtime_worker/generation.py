"""One attempt's model work: call, parse, validate, and at most one re-ask (reference §5).

Inside a well-formed envelope, blank content, ``finish_reason=length`` or
content that is not JSON / fails the output schema is ``INVALID_SCHEMA``
(cases D1, D2). Such a fault may be answered by ONE re-ask within the same
attempt; the re-ask never contains the model's previous text. Every call,
finished or aborted, is recorded as an :class:`Invocation`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from airuntime_common.errors import AppError
from airuntime_common.outputs import CURRENT_OUTPUT_SCHEMA_VERSION, validate_output
from runtime_worker.prompts import RenderedPrompt, reask_messages
from runtime_worker.providers.base import (
    ModelError,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Usage,
)
from runtime_worker.providers.classify import REASKABLE, Fault, code_for

#: Placeholder code of a call aborted by cancel/lease loss/shutdown; the worker
#: replaces it with the reason's code before recording.
ABORTED = "ABORTED"

#: A re-ask is only tried with at least this much of the job's budget left (s).
MIN_REASK_SECONDS = 2.0

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\r?\n(.*?)\r?\n?```$", re.DOTALL)


@dataclass
class Invocation:
    """One model call, as RecordInvocation records it (reference §5 invocation logs).

    Attributes:
        outcome: ``"succeeded"`` or ``"failed"``.
        error_code: reference §4 code of a failed call (or :data:`ABORTED`), else None.
        latency_ms: wall time of the call (ms).
    """

    outcome: str
    error_code: str | None
    usage: Usage
    latency_ms: int
    provider_request_id: str | None = None


class ContentFault(Exception):
    """Content of a well-formed envelope that cannot be used."""

    def __init__(self, fault: Fault, problem: str, details: dict[str, Any] | None = None):
        super().__init__(problem)
        self.fault = fault
        self.problem = problem
        self.details = details


def parse_content(
    job_type: str, content: str, finish_reason: str | None, max_items: int | None = None
) -> dict[str, Any]:
    """Turn an answer's content into a validated output object.

    A single Markdown code fence around the JSON is accepted.

    Args:
        job_type: the job's type (selects the output schema v1).
        content: ``choices[0].message.content``.
        finish_reason: ``choices[0].finish_reason``.
        max_items: the job's ``count``: of a longer ``items`` list only the first
            ``max_items`` are kept, and validated (reference §9.4); None keeps them all.

    Returns:
        The parsed JSON object (as the model wrote it, ``items`` cut to
        ``max_items``), valid for the schema.

    Raises:
        ContentFault: ``TRUNCATED``, ``BLANK_CONTENT`` or ``SCHEMA_MISMATCH``.
    """
    if finish_reason == "length":
        raise ContentFault(Fault.TRUNCATED, "it was cut off at the token limit")
    text = content.strip()
    if not text:
        raise ContentFault(Fault.BLANK_CONTENT, "it was empty")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ContentFault(Fault.SCHEMA_MISMATCH, "it was not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ContentFault(Fault.SCHEMA_MISMATCH, "it was not a JSON object")
    items = parsed.get("items")
    if max_items is not None and isinstance(items, list) and len(items) > max_items:
        parsed["items"] = items[:max_items]  # a result writes only the first count
    try:
        validate_output(job_type, CURRENT_OUTPUT_SCHEMA_VERSION, parsed)
    except AppError as exc:
        errors = (exc.details or {}).get("errors") or []
        where = "; ".join(f"{e.get('loc')}: {e.get('msg')}" for e in errors[:5])
        raise ContentFault(
            Fault.SCHEMA_MISMATCH,
            f"it did not match the required shape ({where or exc.message})",
            exc.details,
        ) from None
    return parsed


async def generate(
    provider: ModelProvider,
    *,
    job_type: str,
    prompt: RenderedPrompt,
    model: str,
    api_key: str,
    base_url: str,
    job_deadline: float,
    max_call_seconds: float,
    invocations: list[Invocation],
    allow_reask: bool = True,
    max_items: int | None = None,
) -> dict[str, Any]:
    """Get a valid output for one attempt.

    Args:
        provider: the model provider.
        job_type: the job's type.
        prompt: the rendered prompt.
        model: model name.
        api_key: plaintext key (memory only).
        base_url: provider endpoint.
        job_deadline: ``time.monotonic()`` value at which the attempt's time budget
            (``timeoutSeconds`` from start) is used up.
        max_call_seconds: cap of one call (``MODEL_CALL_MAX_SECONDS``).
        invocations: list every call is appended to (kept by the caller so aborted
            calls are recorded too).
        allow_reask: whether one in-attempt re-ask is allowed.
        max_items: the job's ``count`` (see :func:`parse_content`), or None.

    Returns:
        The validated output object.

    Raises:
        ModelError: the classified failure (``INVALID_SCHEMA`` after the re-ask failed,
            ``JOB_TIMEOUT`` when no budget is left, transport/HTTP codes…).
    """
    messages = prompt.messages
    reasked = False
    while True:
        remaining = job_deadline - time.monotonic()
        if remaining <= 0:
            raise ModelError(code_for(Fault.JOB_DEADLINE), "the attempt's time budget is used up")
        request = ModelRequest(
            model=model, messages=messages, max_tokens=prompt.max_tokens, api_key=api_key,
            base_url=base_url, timeout_seconds=min(max_call_seconds, remaining),
            timeout_is_job_deadline=remaining <= max_call_seconds,
        )  # fmt: skip
        response = await _call(provider, request, invocations)
        try:
            output = parse_content(job_type, response.content, response.finish_reason, max_items)
        except ContentFault as fault:
            code = code_for(fault.fault)
            invocations.append(
                Invocation(
                    "failed",
                    code,
                    response.usage,
                    response.latency_ms,
                    response.provider_request_id,
                )
            )
            if allow_reask and not reasked and _reaskable(fault, job_deadline):
                reasked = True
                messages = reask_messages(prompt, fault.problem)
                continue
            raise ModelError(
                code,
                f"model output unusable: {fault.problem}",
                provider_request_id=response.provider_request_id,
                usage=response.usage,
                latency_ms=response.latency_ms,
            ) from None
        invocations.append(
            Invocation(
                "succeeded", None, response.usage, response.latency_ms, response.provider_request_id
            )
        )
        return output


def _reaskable(fault: ContentFault, job_deadline: float) -> bool:
    """Whether an unusable answer may be asked for once more: a kind a re-ask can fix,
    with at least :data:`MIN_REASK_SECONDS` of the attempt's budget left."""
    return fault.fault in REASKABLE and job_deadline - time.monotonic() >= MIN_REASK_SECONDS


async def _call(
    provider: ModelProvider, request: ModelRequest, invocations: list[Invocation]
) -> ModelResponse:
    """One model call; a failed or aborted one is logged in ``invocations`` and raised."""
    start = time.monotonic()
    try:
        return await provider.complete(request)
    except ModelError as exc:
        invocations.append(
            Invocation("failed", exc.code, exc.usage, exc.latency_ms, exc.provider_request_id)
        )
        raise
    except asyncio.CancelledError:
        invocations.append(
            Invocation("failed", ABORTED, Usage(), int((time.monotonic() - start) * 1000))
        )
        raise


__all__ = [
    "ABORTED",
    "ContentFault",
    "Invocation",
    "generate",
    "parse_content",
]
