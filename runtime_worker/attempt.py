"""One claimed attempt, from its snapshot to its report (reference §2.3, §3, §5).

Every claimed job comes started by its claim, with its snapshot in the claim's
answer (unless the answer was full: then it is read with GetSnapshot). Its
attempt runs in its own task::

    snapshot (validated) → render prompt ┐
    model key (held, or ResolveCredential sent at once) ┴→ model call(s)
    → SubmitResult        (or FailJob with the classified code)

The model work runs in an inner task the lease keeper can cancel: a lost lease
stops it and nothing more is reported; a cancel request stops it and the
attempt ends ``FailJob(CANCELLED)``; a shutdown past the grace period stops it
and the attempt ends ``FailJob(WORKER_SHUTDOWN)``. Every model call is logged
once: carried by the attempt's SubmitResult or FailJob (same transaction), or,
when that report is refused or never sent (a lost lease), by RecordInvocation.
The key is kept in local variables only and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from airuntime_common import jobtypes
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.model_providers import DEFAULT_DEEPSEEK_BASE_URL, ProviderConfig
from airuntime_common.outputs import CURRENT_OUTPUT_SCHEMA_VERSION
from runtime_worker import metrics as worker_metrics
from runtime_worker.client import RuntimeClient
from runtime_worker.egress import guard
from runtime_worker.generation import ABORTED, Invocation, generate
from runtime_worker.prompt_cache import PromptCache
from runtime_worker.providers.base import ModelError, ModelProvider
from runtime_worker.settings import WorkerSettings
from runtime_worker.snapshot import normalize_numbers, struct_to_dict, validate_snapshot
from runtime_worker.spans import NO_TRACE, SPAN_FAIL, SPAN_RESULT, AttemptTrace
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

log = logging.getLogger("runtime_worker.worker")

DEFAULT_TIMEOUT_SECONDS = 120
#: The platform key's ``ApiKeyMode`` number.
PLATFORM_KEY_MODE = API_KEY_MODE.to_proto("platform_key")
#: A job's model when it names none (reference §2.2).
DEFAULT_MODEL_NAME = "deepseek-chat"

LEASE_LOST = "lease_lost"
CANCEL_REQUESTED = "cancel_requested"
SHUTDOWN = "shutdown"

#: Code recorded for a model call aborted for each stop reason.
ABORT_CODES = {
    CANCEL_REQUESTED: ErrorCode.CANCELLED,
    SHUTDOWN: ErrorCode.WORKER_SHUTDOWN,
    LEASE_LOST: ErrorCode.LOCK_NOT_HELD,
}

#: Backend codes after which the worker abandons the attempt (its lease then
#: expires and job_service retries the job): job_service is unreachable, so
#: a FailJob would not get through either.
ABANDON_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL})


#: What a result asks to claim with it: ``(capabilities, limit, statusAddress)``.
ClaimNext = tuple[Sequence[str], int, str]


@dataclass(frozen=True)
class Handoff:
    """The jobs a result's report was given for the slot it freed (``Job`` messages,
    leased and started) and their snapshots by job id."""

    jobs: list[Any] = field(default_factory=list)
    snapshots: dict[str, Any] = field(default_factory=dict)


#: A report that claimed nothing.
NO_HANDOFF = Handoff()


@dataclass(frozen=True)
class CallWindow:
    """When a ClaimJobs call was out.

    Attributes:
        sent_mono: ``time.monotonic()`` just before the call was sent (s).
        sent_wall: ``time.time()`` at the same moment (s since the epoch, UTC).
        answered_mono: ``time.monotonic()`` when its answer arrived (s).
    """

    sent_mono: float
    sent_wall: float
    answered_mono: float

    def start_of(self, job: Any) -> float:
        """The ``time.monotonic()`` at which the claim started ``job`` (its ``startedAt``).

        A long poll waits up to ``waitMs`` before it claims, so the moment the call
        was sent can be seconds before the job even existed: counting the time
        budget (reference §2.2: ``timeoutSeconds`` from ``startedAt``) from there would
        time the attempt out early. ``startedAt`` (database clock) is placed on this
        host's clock and kept within the call's window: with clocks in step it is
        the reaper's moment; with a skewed clock it is never before the call was
        sent nor after its answer arrived (then at most the answer's transit late).
        """
        if not job.HasField("started_at"):
            return self.sent_mono
        offset = float(job.started_at.ToMicroseconds()) / 1e6 - self.sent_wall
        return min(max(self.sent_mono + offset, self.sent_mono), self.answered_mono)


@dataclass(frozen=True)
class ModelKey:
    """The key an attempt's model calls use, in the shape of a ResolveCredential answer:
    a platform key the worker holds, or the resolved one (never logged)."""

    api_key_mode: int
    credential_id: str
    api_key: str
    model_provider: str
    model_name: str
    base_url: str
    #: ``base_url`` is the user's own (reference §10.5): every call passes the egress guard
    user_base_url: bool = False


@dataclass
class JobRun:
    """One claimed attempt in flight; the lease keeper's handle on it.

    Attributes:
        job: the claimed ``Job`` message (running: its claim started it).
        snapshot: its ``GetSnapshotResponse`` from the claim's answer; None when the
            answer had no room for it (read with GetSnapshot).
        started_mono: ``time.monotonic()`` of the job's ``startedAt``
            (:meth:`CallWindow.start_of`): the attempt's time budget runs from it.
        trace: the attempt's spans (reference §9.5; a no-op with tracing off).
        reason: why the work was stopped (``lease_lost``, ``cancel_requested``,
            ``shutdown``), or None.
        key: the key the model calls use, once known (its facts are logged with
            each call; never the key itself).
        invocations: model calls made so far (logged when the attempt ends).
    """

    job: Any
    job_id: str
    attempt_no: int
    snapshot: Any
    started_mono: float
    trace: AttemptTrace = NO_TRACE
    reason: str | None = None
    work: asyncio.Task[tuple[str, dict[str, Any]]] | None = None
    task: asyncio.Task[None] | None = None
    key: ModelKey | None = None
    invocations: list[Invocation] = field(default_factory=list)

    @property
    def job_type(self) -> str:
        """The job's type (empty for a type this worker does not know)."""
        return JOB_TYPE.to_str_or_none(self.job.job_type) or ""

    def interrupt(self, reason: str) -> None:
        """Stop the work for ``reason`` (the first reason wins, except a lost lease)."""
        if self.reason is None or reason == LEASE_LOST:
            self.reason = reason
        if self.work is not None and not self.work.done():
            self.work.cancel()

    def lease_lost(self) -> None:
        """Lease gone: stop at once; nothing more is reported for this attempt."""
        self.interrupt(LEASE_LOST)

    def cancel_requested(self) -> None:
        """Cancel requested: stop the model call; the attempt ends with FailJob(CANCELLED)."""
        self.interrupt(CANCEL_REQUESTED)

    def age_seconds(self) -> float:
        """Seconds since the job was started."""
        return time.monotonic() - self.started_mono


class Attempts:
    """Runs attempts: model work, then the report (module doc).

    Args:
        client: the job/credential service client.
        provider: the model provider.
        platform: provider name → (its config, the platform key this worker holds).
        settings: the worker's settings (``MODEL_CALL_MAX_SECONDS``, the egress rules).
        counters: the worker's outcome counters (GetStatus, metrics).
    """

    def __init__(
        self,
        client: RuntimeClient,
        provider: ModelProvider,
        platform: dict[str, tuple[ProviderConfig, str]],
        settings: WorkerSettings,
        counters: Counter[str],
    ) -> None:
        self.client = client
        self.provider = provider
        self.platform = platform
        self.settings = settings
        self.counters = counters
        #: each job's own prompt version, fetched once per version (reference §10.4)
        self.prompts = PromptCache(client.get_prompt_version)

    async def work(self, run: JobRun) -> tuple[str, dict[str, Any]]:
        """The model work of ``run``: snapshot, prompt, key, model call(s), the validated
        output. Returns ``(promptVersion, output)``.

        Raises:
            AppError: INVALID_SNAPSHOT, INVALID_CREDENTIAL, a backend's refusal.
            ModelError: the model call's classified failure.
        """
        job = run.job
        if not run.job_type:
            raise AppError(ErrorCode.INVALID_SNAPSHOT, "job has no known jobType")
        timeout = job.timeout_seconds if job.timeout_seconds > 0 else DEFAULT_TIMEOUT_SECONDS
        job_deadline = run.started_mono + timeout
        # The key is resolved while the snapshot is read: both only need the lease, and
        # neither waits for the other. The snapshot's error, if any, is the one reported.
        held = self.held_key(job)
        key_call = asyncio.ensure_future(
            _ready(held)
            if held is not None
            else run.trace.resolve(lambda: self._resolve(run.job_id, run.attempt_no))
        )
        try:
            prompt, params = await self._prompt(run)
            try:
                key = await key_call
            except AppError as exc:
                if exc.code == ErrorCode.NOT_FOUND:
                    raise AppError(ErrorCode.INVALID_CREDENTIAL, "no usable model key") from None
                raise
        finally:
            if not key_call.done():
                key_call.cancel()
            with contextlib.suppress(BaseException):
                await key_call  # never leave its error unretrieved
        if not key.api_key:
            raise AppError(ErrorCode.INVALID_CREDENTIAL, "no model key was resolved for this job")
        key = run.key = replace(  # what the answer left out is the job's
            key,
            api_key_mode=key.api_key_mode or job.api_key_mode,
            model_provider=key.model_provider or job.model_provider or self.provider.name,
            model_name=key.model_name or job.model_name or DEFAULT_MODEL_NAME,
        )
        output = await generate(
            run.trace.provider(  # a user's own base URL: checked before every call
                guard(self.provider, self.settings, key),
                model_provider=key.model_provider,
                model_name=key.model_name,
            ),
            job_type=run.job_type,
            prompt=prompt,
            model=key.model_name,
            api_key=key.api_key,
            base_url=key.base_url or DEFAULT_DEEPSEEK_BASE_URL,
            job_deadline=job_deadline,
            max_call_seconds=self.settings.MODEL_CALL_MAX_SECONDS,
            invocations=run.invocations,
            max_items=_count_of(run.job_type, params),
        )
        return prompt.prompt_version, output

    async def _prompt(self, run: JobRun) -> tuple[Any, dict[str, Any]]:
        """The attempt's snapshot (from the claim, else read), validated, and its prompt."""
        snap = run.snapshot
        if snap is None:
            try:
                snap = await self.client.get_snapshot(run.job_id, run.attempt_no)
            except AppError as exc:
                if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.JOB_NOT_FOUND):
                    raise AppError(
                        ErrorCode.INVALID_SNAPSHOT, "the job's snapshot is missing"
                    ) from None
                raise
        snapshot = validate_snapshot(
            struct_to_dict(snap.payload),
            schema_version=snap.schema_version,
            job_type=run.job_type,
            user_id=run.job.user_id or None,
        )
        params = {**snapshot.params, **struct_to_dict(run.job.params)}
        return await self.prompts.render(run, snapshot, normalize_numbers(params)), params

    async def _resolve(self, job_id: str, attempt_no: int) -> ModelKey:
        answer = await self.client.resolve_credential(job_id, attempt_no)
        return ModelKey(
            answer.api_key_mode,
            answer.credential_id,
            answer.api_key,
            answer.model_provider,
            answer.model_name,
            answer.base_url,
            answer.user_base_url,
        )

    def held_key(self, job: Any) -> ModelKey | None:
        """The platform key this worker holds for ``job``'s provider, as a resolve would
        answer it, or None (a user key, a provider it holds no key for, or a model that
        provider does not serve: then the attempt resolves its key)."""
        if job.api_key_mode != PLATFORM_KEY_MODE:
            return None
        held = self.platform.get(job.model_provider)
        if held is None:
            return None
        config, key = held
        model = config.model_for(job.model_name or DEFAULT_MODEL_NAME)
        if model is None:
            return None
        return ModelKey(PLATFORM_KEY_MODE, "", key, config.name, model, config.baseUrl)

    async def report(self, run: JobRun, claim_next: ClaimNext | None = None) -> Handoff:
        """Report how ``run``'s work ended: its result, its fail, or nothing (a lost lease,
        job_service unreachable); then any model call not logged with that report.

        With ``claim_next`` a result asks, in its own transaction, for the next jobs of
        the slot it frees: the jobs it was given and their snapshots (none for a
        fail, a refusal or a replay)."""
        handoff = await self._finish(run, claim_next)
        if run.invocations:  # not logged with the attempt's ending: log them alone
            await self._record_invocations(run)
        return handoff

    def submits(self, run: JobRun) -> bool:
        """Whether ``run``'s report will be a result (its work ended with an output)."""
        work = run.work
        return (
            work is not None
            and work.done()
            and not work.cancelled()
            and run.reason is None
            and work.exception() is None
        )

    async def _finish(self, run: JobRun, claim_next: ClaimNext | None) -> Handoff:
        work = run.work
        assert work is not None
        if run.reason == LEASE_LOST:
            if not work.cancelled():
                work.exception()  # retrieved: nothing is reported for a lost lease
            run.trace.failed(ErrorCode.LOCK_NOT_HELD)
            self._count(LEASE_LOST)
            log.warning("attempt stopped: lease lost; nothing reported")
            return NO_HANDOFF
        if work.cancelled():
            if run.reason == CANCEL_REQUESTED:
                await self._fail(run, ErrorCode.CANCELLED, "cancel requested; model call aborted")
            else:
                await self._fail(
                    run, ErrorCode.WORKER_SHUTDOWN, "worker shut down before the job finished"
                )
            return NO_HANDOFF
        exc = work.exception()
        if exc is None:
            prompt_version, output = work.result()
            return await self._submit(run, prompt_version, output, claim_next)
        if isinstance(exc, ModelError):
            await self._fail(run, exc.code, exc.message, exc.retry_after_seconds)
        elif isinstance(exc, AppError):
            await self._backend_refused(run, exc)
        else:
            log.error("attempt crashed: %s", type(exc).__name__, exc_info=exc)
            await self._fail(run, ErrorCode.INTERNAL, f"worker error: {type(exc).__name__}")
        return NO_HANDOFF

    async def _backend_refused(self, run: JobRun, exc: AppError) -> None:
        """The work stopped on a backend's refusal: a lost lease or an unreachable
        job_service reports nothing (the lease expires); anything else fails the attempt."""
        if exc.code in ABANDON_CODES or exc.code == ErrorCode.LOCK_NOT_HELD:
            run.trace.failed(exc.code)  # not reported: the attempt still did not succeed
        if exc.code == ErrorCode.LOCK_NOT_HELD:
            self._count(LEASE_LOST)
            log.warning("attempt stopped: job_service says the lease is not held")
        elif exc.code in ABANDON_CODES:
            self._count("abandoned")
            log.error(
                "attempt abandoned, job_service unreachable: %s",
                exc.message,
                extra={"fields": {"code": exc.code}},
            )
        else:
            await self._fail(run, exc.code, exc.message)

    async def _fail(
        self, run: JobRun, code: str, message: str, retry_after: float | None = None
    ) -> None:
        try:
            with run.trace.ending(SPAN_FAIL, code):
                await self.client.fail_job(
                    run.job_id,
                    run.attempt_no,
                    code,
                    message,
                    retry_after,
                    invocations=self._model_calls(run),
                )
            run.invocations.clear()  # logged with the fail
        except AppError as exc:
            if exc.code == ErrorCode.LOCK_NOT_HELD:
                self._count(LEASE_LOST)
            else:
                self._count("report_failed")
            log.warning("FailJob refused: %s", exc.code, extra={"fields": {"errorCode": code}})
            return
        self._count(f"failed:{code}")
        log.info("attempt failed: %s", code, extra={"fields": {"errorCode": code}})

    async def _submit(
        self,
        run: JobRun,
        prompt_version: str,
        output: dict[str, Any],
        claim_next: ClaimNext | None,
    ) -> Handoff:
        try:
            with run.trace.ending(SPAN_RESULT):
                answer = await self.client.submit_result(
                    run.job_id,
                    run.attempt_no,
                    prompt_version=prompt_version,
                    output_schema_version=CURRENT_OUTPUT_SCHEMA_VERSION,
                    output=output,
                    invocations=self._model_calls(run),
                    claim_next=claim_next,
                )
            run.invocations.clear()  # logged with the result (or by the replayed original)
        except AppError as exc:
            if exc.code == ErrorCode.INVALID_SCHEMA:
                run.invocations.clear()  # the job was failed, and the calls logged, in one tx
            if exc.code == ErrorCode.LOCK_NOT_HELD:
                self._count(LEASE_LOST)
            elif exc.code == ErrorCode.INVALID_SCHEMA:
                self._count(f"failed:{exc.code}")
            elif exc.code in ABANDON_CODES:
                self._count("abandoned")  # the lease expires; job_service retries the job
            else:
                self._count(f"submit_refused:{exc.code}")
            log.warning("SubmitResult refused: %s", exc.code, extra={"fields": {"code": exc.code}})
            return NO_HANDOFF
        self._count("succeeded")
        log.info(
            "attempt succeeded",
            extra={"fields": {"resultId": answer.result_id, "replayed": answer.replayed}},
        )
        return Handoff(list(answer.claimed_jobs), dict(answer.snapshots))

    def _call_code(self, run: JobRun, inv: Invocation) -> str | None:
        code = inv.error_code
        if code == ABORTED:
            code = ABORT_CODES.get(run.reason or SHUTDOWN, ErrorCode.CANCELLED)
        return code or None

    def observe_invocations(self, run: JobRun) -> None:
        """Feed the model-call metrics, once per call, however the calls get logged."""
        key = run.key
        for inv in run.invocations:
            worker_metrics.observe_model_call(
                key.model_name if key is not None else "",
                API_KEY_MODE.to_str_or_none(key.api_key_mode if key is not None else 0)
                or "unknown",
                inv.outcome,
                inv.latency_ms,
                inv.usage.prompt_tokens,
                inv.usage.completion_tokens,
                inv.usage.cache_hit_tokens,
            )

    def _model_calls(self, run: JobRun) -> list[msg.ModelCall]:
        """The attempt's calls as ``ModelCall`` messages (sent with SubmitResult/FailJob)."""
        key = run.key
        out = []
        for inv in run.invocations:
            call = msg.ModelCall(
                model_provider=key.model_provider if key is not None else "",
                model_name=key.model_name if key is not None else "",
                api_key_mode=cast(Any, key.api_key_mode if key is not None else 0),
                prompt_tokens=inv.usage.prompt_tokens,
                completion_tokens=inv.usage.completion_tokens,
                cache_hit_tokens=inv.usage.cache_hit_tokens,
                latency_ms=inv.latency_ms,
                outcome=inv.outcome,
            )
            if key is not None and key.credential_id:
                call.credential_id = key.credential_id
            code = self._call_code(run, inv)
            if code:
                call.error_code = code
            if inv.provider_request_id:
                # the provider's header is untrusted: keep the log within its column
                call.provider_request_id = inv.provider_request_id[:128]
            out.append(call)
        return out

    async def _record_invocations(self, run: JobRun) -> None:
        """RecordInvocation per call: for an attempt whose ending carried no calls
        (a lost lease, a refused result or fail)."""
        for call in self._model_calls(run):
            # RecordInvocation's body is a ModelCall's fields plus the job and attempt
            request = rr.RecordInvocationRequest(job_id=run.job_id, attempt_no=run.attempt_no)
            for descriptor, value in call.ListFields():
                setattr(request, descriptor.name, value)
            try:
                await self.client.record_invocation(request)
            except AppError as exc:
                log.warning(
                    "RecordInvocation failed: %s", exc.code, extra={"fields": {"code": exc.code}}
                )
        run.invocations.clear()

    def _count(self, key: str) -> None:
        self.counters[key] += 1


async def _ready(value: ModelKey) -> ModelKey:
    return value


def _count_of(job_type: str, params: dict[str, Any]) -> int | None:
    """The items a job asked for (``params.count`` of a type whose params have a
    count and whose output is a list), or None: a longer answer submits only the
    first ``count`` (reference §9.4)."""
    count = params.get("count")
    spec = jobtypes.find(job_type)
    counted = spec is not None and spec.itemized and "count" in spec.params.model_fields
    if counted and isinstance(count, int) and not isinstance(count, bool):
        return count if count >= 1 else None
    return None
