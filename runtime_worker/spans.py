"""The spans of one attempt, in the trace of the job's create (reference §9.5).

::

    <the create's span, from the claimed Job's trace_parent>
    └── attempt                      claim → the attempt's last report
        ├── claim                    the job was locked (started) → the claim's answer arrived
        ├── resolve                  ResolveCredential (its gRPC client span below)
        ├── model call               one per provider call (the aiohttp span below)
        └── result | fail            SubmitResult | FailJob

Every span carries :data:`JOB_ID`, :data:`JOB_ATTEMPT`, :data:`JOB_TYPE`,
:data:`PROMPT_VERSION` (the version the attempt renders, reference §10.4) and, once
known, :data:`MODEL_PROVIDER`. A claimed job without ``trace_parent`` (a job_service
that stores none, a create that carried no trace) gets an ``attempt`` root, so
the attempt's spans still form one trace. Errors are recorded as ``error.type``
(a reference §4 code) and the span's status; never an exception's text, which could
quote a provider's answer. Nothing here sees the key, the prompt or any body.

With tracing off, :class:`AttemptSpans` hands out :data:`NO_TRACE`, whose every
method does nothing and allocates nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from airuntime_common.enums import JOB_TYPE
from airuntime_common.errors import AppError
from airuntime_common.tracing import Tracing
from runtime_worker.providers.base import ModelError, ModelProvider, ModelRequest, ModelResponse

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from runtime_worker.attempt import CallWindow

T = TypeVar("T")

#: The job's id.
JOB_ID = "job.id"
#: The attempt number (``attemptNo``, 1..maxRetryCount+1).
JOB_ATTEMPT = "job.attempt"
#: The job type (``quiz_generation``…).
JOB_TYPE_ATTR = "job.type"
#: The job's ``promptVersion`` (``quiz_generation.v2``): the template the attempt renders.
PROMPT_VERSION = "job.prompt_version"
#: The model provider the attempt runs on (``deepseek``…; reference §9.4).
MODEL_PROVIDER = "model.provider"
#: On ``fail``: the reference §4 code the attempt is failed with.
JOB_ERROR_CODE = "job.error_code"
#: Why a span failed: a reference §4 code (OpenTelemetry's ``error.type``).
ERROR_TYPE = "error.type"
#: ``error.type`` of a model call the worker stopped (cancel, lease loss, shutdown).
ABORTED = "ABORTED"

SPAN_ATTEMPT = "attempt"
SPAN_CLAIM = "claim"
SPAN_RESOLVE = "resolve"
SPAN_MODEL_CALL = "model call"
SPAN_RESULT = "result"
SPAN_FAIL = "fail"

_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()


class AttemptTrace:
    """One attempt's spans; this base class is the no-op used when tracing is off."""

    def activate(self) -> AbstractContextManager[None]:
        """Make the attempt span current while the attempt runs; ends it on exit."""
        return _NOTHING

    def resolve(self, start: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """``start()`` (the ResolveCredential call) inside a ``resolve`` span.

        ``start`` is called inside the span, so a task cancelled before it ran
        leaves no un-awaited call behind.
        """
        return start()

    def provider(
        self, provider: ModelProvider, *, model_provider: str, model_name: str
    ) -> ModelProvider:
        """``provider`` with a ``model call`` span around each of its calls."""
        return provider

    def ending(self, name: str, error_code: str | None = None) -> AbstractContextManager[None]:
        """A ``result`` or ``fail`` span around the report; a refusal is recorded.

        Args:
            name: :data:`SPAN_RESULT` or :data:`SPAN_FAIL`.
            error_code: the code a ``fail`` reports.
        """
        return _NOTHING

    def failed(self, code: str) -> None:
        """Mark the attempt as ended without success for ``code`` (reference §4)."""


#: The attempt trace of a worker without tracing.
NO_TRACE = AttemptTrace()


def _ns(wall_seconds: float) -> int:
    return int(wall_seconds * 1e9)


class _TracedAttempt(AttemptTrace):
    def __init__(self, tracer: Tracer, attempt: Span, attributes: dict[str, Any]) -> None:
        self._tracer = tracer
        self._attempt = attempt
        self._attributes = attributes
        self._error: str | None = None

    def _set_error(self, span: Span, code: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute(ERROR_TYPE, str(code))
        span.set_status(Status(StatusCode.ERROR, str(code)))

    def _span(self, name: str, **extra: Any) -> AbstractContextManager[Span]:
        return self._tracer.start_as_current_span(
            name,
            attributes={**self._attributes, **extra},
            record_exception=False,
            set_status_on_exception=False,
        )

    @contextlib.contextmanager
    def _activate(self) -> Iterator[None]:
        from opentelemetry import trace

        try:
            with trace.use_span(
                self._attempt,
                end_on_exit=False,
                record_exception=False,
                set_status_on_exception=False,
            ):
                yield
        finally:
            if self._error is not None:
                self._set_error(self._attempt, self._error)
            self._attempt.end()

    def activate(self) -> AbstractContextManager[None]:
        return self._activate()

    async def _resolve(self, start: Callable[[], Awaitable[T]]) -> T:
        with self._span(SPAN_RESOLVE) as span:
            try:
                answer = await start()
            except AppError as exc:
                self._set_error(span, exc.code)
                raise
            except asyncio.CancelledError:
                span.set_attribute(ERROR_TYPE, ABORTED)
                raise
            provider = getattr(answer, "model_provider", "")
            if provider:
                span.set_attribute(MODEL_PROVIDER, provider)
            return answer

    def resolve(self, start: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        return self._resolve(start)

    def provider(
        self, provider: ModelProvider, *, model_provider: str, model_name: str
    ) -> ModelProvider:
        self._attributes[MODEL_PROVIDER] = model_provider
        self._attempt.set_attribute(MODEL_PROVIDER, model_provider)
        return _TracedProvider(provider, self, model_name)

    @contextlib.contextmanager
    def _ending(self, name: str, error_code: str | None) -> Iterator[None]:
        extra = {JOB_ERROR_CODE: str(error_code)} if error_code else {}
        with self._span(name, **extra) as span:
            try:
                yield
            except AppError as exc:
                self._set_error(span, exc.code)
                self._error = exc.code
                raise
        if error_code:
            self._error = error_code

    def ending(self, name: str, error_code: str | None = None) -> AbstractContextManager[None]:
        return self._ending(name, error_code)

    def failed(self, code: str) -> None:
        self._error = code


class _TracedProvider:
    """A :class:`ModelProvider` whose every call is a ``model call`` span (GenAI
    semantic conventions for the model and token counts; never content)."""

    def __init__(self, inner: ModelProvider, attempt: _TracedAttempt, model_name: str) -> None:
        self.name = inner.name
        self._inner = inner
        self._attempt = attempt
        self._model_name = model_name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call of the wrapped provider inside a ``model call`` span.

        Raises:
            ModelError: as the wrapped provider (recorded as ``error.type``).
        """
        attempt = self._attempt
        with attempt._span(
            SPAN_MODEL_CALL,
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": request.model or self._model_name,
                "gen_ai.request.max_tokens": request.max_tokens,
            },
        ) as span:
            try:
                response = await self._inner.complete(request)
            except ModelError as exc:
                attempt._set_error(span, exc.code)
                if exc.usage.prompt_tokens or exc.usage.completion_tokens:
                    span.set_attribute("gen_ai.usage.input_tokens", exc.usage.prompt_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", exc.usage.completion_tokens)
                raise
            except asyncio.CancelledError:
                span.set_attribute(ERROR_TYPE, ABORTED)
                raise
            span.set_attribute("gen_ai.usage.input_tokens", response.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", response.usage.completion_tokens)
            if response.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
            if response.provider_request_id:
                span.set_attribute("gen_ai.response.id", response.provider_request_id[:128])
            return response


def _claim_times(job: Any, claim: CallWindow | None) -> tuple[float, float]:
    """(claimed, answered) on this host's wall clock (s): the claim began when
    job_service started (or locked) the job, kept within the call's window (a long
    poll may have waited before the job existed; the database's clock may be skewed)."""
    if claim is None:
        now = time.time()
        return now, now
    answered = claim.sent_wall + (claim.answered_mono - claim.sent_mono)
    for name in ("started_at", "locked_at"):
        if job.HasField(name):
            at = float(getattr(job, name).ToMicroseconds()) / 1e6
            return min(max(at, claim.sent_wall), answered), answered
    return claim.sent_wall, answered


def _prompt_version(job: Any, job_type: str) -> str:
    """The job's ``promptVersion``; ``<jobType>.v1`` for a job that carries none."""
    if job.HasField("prompt_version") and job.prompt_version:
        return str(job.prompt_version)
    return f"{job_type}.v1"


class AttemptSpans:
    """Starts an :class:`AttemptTrace` for each claimed job.

    Args:
        tracing: the worker's tracing; None: every attempt gets :data:`NO_TRACE`.
    """

    def __init__(self, tracing: Tracing | None) -> None:
        self._tracing = tracing
        self._tracer = tracing.tracer(__name__) if tracing is not None else None

    def start(self, job: Any, claim: CallWindow | None) -> AttemptTrace:
        """Open the ``attempt`` span of a claimed ``job`` and record its ``claim``.

        Args:
            job: the claimed ``Job`` message (its ``trace_parent`` names the parent).
            claim: when the claiming call was out; the claim span runs from the moment
                job_service started the job (kept within the call) to its answer.

        Returns:
            The attempt's trace (:data:`NO_TRACE` with tracing off).
        """
        if self._tracer is None or self._tracing is None:
            return NO_TRACE
        from opentelemetry import trace
        from opentelemetry.context import Context

        stored = job.trace_parent if job.HasField("trace_parent") else None
        # never the current context: a job claimed by a result would hang under
        # the previous job's ``result`` span
        parent = self._tracing.parent_context(stored) or Context()
        attributes: dict[str, Any] = {
            JOB_ID: job.job_id,
            JOB_ATTEMPT: job.attempt_no,
            JOB_TYPE_ATTR: JOB_TYPE.to_str_or_none(job.job_type) or "",
        }
        if job.model_provider:
            attributes[MODEL_PROVIDER] = job.model_provider
        attributes[PROMPT_VERSION] = _prompt_version(job, attributes[JOB_TYPE_ATTR])
        began, answered = _claim_times(job, claim)
        attempt = self._tracer.start_span(
            SPAN_ATTEMPT, context=parent, attributes=attributes, start_time=_ns(began)
        )
        claimed = self._tracer.start_span(
            SPAN_CLAIM,
            context=trace.set_span_in_context(attempt),
            attributes=attributes,
            start_time=_ns(began),
        )
        claimed.end(end_time=_ns(answered))
        return _TracedAttempt(self._tracer, attempt, dict(attributes))


__all__ = [
    "JOB_ATTEMPT",
    "JOB_ERROR_CODE",
    "JOB_ID",
    "JOB_TYPE_ATTR",
    "MODEL_PROVIDER",
    "NO_TRACE",
    "PROMPT_VERSION",
    "AttemptSpans",
    "AttemptTrace",
]
