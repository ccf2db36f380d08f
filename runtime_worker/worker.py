"""The worker loop: claim, execute, report (SPEC §2.3, §2.6, §3, §5).

One loop claims as many jobs as there are free slots (long poll with ``wait_ms``; sleeps
``POLL_INTERVAL_MS`` after an empty answer that came back early). The claim also starts the
jobs and carries their snapshots (``with_snapshots``), so a job needs no GetSnapshot of its
own unless its snapshot did not fit in the answer (or job_service only locks; then the
snapshot read is the start). Each claimed job runs in its own task::

    snapshot (from the claim, else GetSnapshot; validated)
        → render prompt ┐
    ResolveCredential (sent at the same time, awaited after) ┴→ model call(s)
    → SubmitResult            (or FailJob with the classified code)

At most ``WORKER_CONCURRENCY`` jobs do their model work at once. With
``WORKER_PREFETCH`` the loop claims that many more and holds them (leased and
started) in line for a slot; a slot is then handed on when a job's model work
ends, so the next job runs while the last one's ending is reported (the line and
its time bound: :mod:`runtime_worker.slots`).

The model work runs in an inner task the lease keeper can cancel: a lost lease
stops it and nothing more is reported; a cancel request stops it and the
worker answers ``FailJob(CANCELLED)``; a shutdown past the grace period stops
it and the worker answers ``FailJob(WORKER_SHUTDOWN)``. Every model call is
logged once: carried by the attempt's SubmitResult or FailJob (same
transaction), or, when that ending is refused or never sent (a lost lease),
by RecordInvocation. The key is kept in local variables only and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from airuntime_common import jobtypes
from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.logs import bind, log_context
from airuntime_common.model_providers import ProviderConfig
from airuntime_common.outputs import CURRENT_OUTPUT_SCHEMA_VERSION
from airuntime_common.timeutil import utcnow
from airuntime_common.tracing import Tracing
from runtime_worker import metrics as worker_metrics
from runtime_worker.client import RuntimeClient
from runtime_worker.generation import ABORTED, Invocation, generate
from runtime_worker.lease_keeper import LeaseKeeper
from runtime_worker.prompt_cache import PromptCache
from runtime_worker.providers.base import ModelError, ModelProvider
from runtime_worker.settings import WorkerSettings
from runtime_worker.slots import PrefetchBound, SlotLine
from runtime_worker.snapshot import normalize_numbers, struct_to_dict, validate_snapshot
from runtime_worker.spans import NO_TRACE, SPAN_FAIL, SPAN_RESULT, AttemptSpans, AttemptTrace
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.deepseek.com"
DEFAULT_TIMEOUT_SECONDS = 120
#: The platform key's ``ApiKeyMode`` number.
PLATFORM_KEY_MODE = API_KEY_MODE.to_proto("platform_key")
#: A job's model when it names none (SPEC §2.2).
DEFAULT_MODEL_NAME = "deepseek-chat"
#: A claimed ``Job`` message's status when the claim also started it.
RUNNING_STATUS = JOB_STATUS.to_proto("running")
#: The most jobs one ClaimJobs returns (SPEC §2.6 limit cap).
MAX_CLAIM_BATCH = 50
#: After the grace period, how long stopped jobs get to report (s).
SHUTDOWN_REPORT_SECONDS = 5.0

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


@dataclass(frozen=True)
class CallWindow:
    """When a claiming call (ClaimJobs, or SubmitResult with ``claimNext``) was out.

    Attributes:
        sent_mono: ``time.monotonic()`` just before the call was sent (s).
        sent_wall: ``time.time()`` at the same moment (s since the epoch, UTC).
        answered_mono: ``time.monotonic()`` when its answer arrived (s).
    """

    sent_mono: float
    sent_wall: float
    answered_mono: float

    def start_of(self, job: Any) -> float:
        """The ``time.monotonic()`` at which the call started ``job`` (its ``startedAt``).

        A long poll waits up to ``waitMs`` before it claims, so the moment the call
        was sent can be seconds before the job even existed: counting the time
        budget (SPEC §2.2: ``timeoutSeconds`` from ``startedAt``) from there would
        time the attempt out early. ``startedAt`` (database clock) is placed on this
        host's clock and kept within the call's window: with clocks in step it is
        the reaper's moment; with a skewed clock it is never before the call was
        sent nor after its answer arrived (then at most the answer's transit late).
        """
        if not job.HasField("started_at"):
            return self.sent_mono
        offset = float(job.started_at.ToMicroseconds()) / 1e6 - self.sent_wall
        return min(max(self.sent_mono + offset, self.sent_mono), self.answered_mono)


@dataclass
class JobRun:
    """One claimed attempt in flight; the lease keeper's handle on it.

    Attributes:
        job: the claimed ``Job`` message.
        snapshot: its ``GetSnapshotResponse`` when the claim answered with it; None:
            read with GetSnapshot (a job past the answer's snapshot budget, or
            one from a job_service that only locks).
        started_mono: ``time.monotonic()`` of the job's ``startedAt`` when the claim
            started it (SPEC §2.3; :meth:`CallWindow.start_of`); None when the job
            is started by its snapshot read.
        reason: why the work was stopped (``lease_lost``, ``cancel_requested``,
            ``shutdown``), or None.
        invocations: model calls made so far (recorded when the attempt ends).
    """

    job: Any
    job_id: str
    attempt_no: int
    job_type: str
    claimed_mono: float
    claimed_wall: datetime
    snapshot: Any = None
    started_mono: float | None = None
    started_wall: datetime | None = None
    reason: str | None = None
    work: asyncio.Task[tuple[str, dict[str, Any]]] | None = None
    task: asyncio.Task[None] | None = None
    invocations: list[Invocation] = field(default_factory=list)
    #: the attempt's spans (SPEC §9.5; a no-op with tracing off)
    trace: AttemptTrace = NO_TRACE
    api_key_mode: int = 0
    credential_id: str | None = None
    model_provider: str = "deepseek"
    model_name: str = ""
    #: while it waits held ahead for a slot (WORKER_PREFETCH): that wait
    slot_wait: asyncio.Future[bool] | None = None

    def _stop_work(self) -> None:
        SlotLine.stop(self)  # a run held ahead stops waiting for a slot
        if self.work is not None and not self.work.done():
            self.work.cancel()

    def interrupt(self, reason: str) -> None:
        """Stop the work for ``reason`` (the first reason wins, except a lost lease)."""
        if self.reason is None or reason == LEASE_LOST:
            self.reason = reason
        self._stop_work()

    def lease_lost(self) -> None:
        """Lease gone: stop at once; nothing more is reported for this attempt."""
        self.interrupt(LEASE_LOST)

    def cancel_requested(self) -> None:
        """Cancel requested: stop the model call; the attempt ends with FailJob(CANCELLED)."""
        self.interrupt(CANCEL_REQUESTED)

    def age_seconds(self) -> float:
        """Seconds since the job was claimed."""
        return time.monotonic() - self.claimed_mono


class Worker:
    """Claims and executes jobs; see the module docstring.

    Args:
        settings: worker settings.
        client: job/credential service client.
        provider: the model provider.
        status_address: returns the address reported in ClaimJobs (may be "").
        on_draining: awaited once when draining starts (health → NOT_SERVING).
        tracing: the worker's tracing: each attempt's spans (:mod:`runtime_worker.spans`)
            join its job's trace. None: no spans.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        client: RuntimeClient,
        provider: ModelProvider,
        *,
        status_address: Callable[[], str] = lambda: "",
        on_draining: Callable[[], Awaitable[None]] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        #: provider name → (its config, the platform key this worker holds for it)
        self.platform: dict[str, tuple[ProviderConfig, str]] = {
            name: (config, key)
            for name, key in settings.platform_keys().items()
            if (config := settings.providers().get(name)) is not None
        }
        self.spans = AttemptSpans(tracing)
        self.client = client
        self.prompts = PromptCache(client.get_prompt_version)  # versions (reference §10.4)
        self.provider = provider
        self.capabilities = settings.capabilities
        self.keeper = LeaseKeeper(client, settings.HEARTBEAT_INTERVAL_SECONDS)
        self.runs: dict[tuple[str, int], JobRun] = {}
        self.counters: Counter[str] = Counter()
        self.draining = False
        self.started_at = utcnow()
        self._status_address = status_address
        self._on_draining = on_draining
        self._slot_freed = asyncio.Event()
        #: the slots for model work; runs held ahead wait in line for one
        self._slots = SlotLine(settings.WORKER_CONCURRENCY)
        #: how many jobs to hold ahead of the slots (WORKER_PREFETCH, bounded by time)
        self.prefetch = PrefetchBound(
            settings.WORKER_CONCURRENCY,
            settings.WORKER_PREFETCH,
            settings.WORKER_PREFETCH_MAX_WAIT_MS / 1000.0,
        )
        self._drain_event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        """Start the lease keeper and the claim loop."""
        self.keeper.start()
        self._loop_task = asyncio.create_task(self._claim_loop(), name="claim-loop")

    async def _wait_or_drain(self, event: asyncio.Event | None, wait_s: float | None) -> None:
        waiters = [asyncio.create_task(self._drain_event.wait())]
        if event is not None:
            waiters.append(asyncio.create_task(event.wait()))
        try:
            await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    @property
    def capacity(self) -> int:
        """Most runs at once: the slots, the jobs held ahead waiting for one
        (:meth:`held_ahead`), and the runs whose work ended reporting their ending."""
        return self.settings.WORKER_CONCURRENCY + self.held_ahead()

    def held_ahead(self) -> int:
        """How many jobs to hold ahead of the slots now (:class:`PrefetchBound`)."""
        return self.prefetch.held_ahead()

    @property
    def work_seconds(self) -> float | None:
        """Mean seconds a slot's model work takes (None: none ended yet)."""
        return self.prefetch.work_seconds

    def claim_batch_target(self) -> int:
        """Free slots worth one claim while jobs are in flight: a quarter of the
        concurrency, at most the claim limit (50), at least 1."""
        return max(1, min(MAX_CLAIM_BATCH, self.settings.WORKER_CONCURRENCY // 4))

    async def _gather_slots(self) -> None:
        """With jobs in flight and few free slots, wait up to ``CLAIM_BATCH_WINDOW_MS``
        for more to free, so one claim takes several jobs (fewer round trips per job)."""
        window = self.settings.CLAIM_BATCH_WINDOW_MS / 1000.0
        if window <= 0 or not self.runs:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window
        target = self.claim_batch_target()
        while not self.draining and self.runs:
            free = self.capacity - len(self.runs)
            remaining = deadline - loop.time()
            if free >= target or remaining <= 0:
                return
            self._slot_freed.clear()
            await self._wait_or_drain(self._slot_freed, remaining)

    async def _claim_loop(self) -> None:
        poll_s = self.settings.POLL_INTERVAL_MS / 1000.0
        while not self.draining:
            free = self.capacity - len(self.runs)
            if free <= 0:
                self._slot_freed.clear()
                await self._wait_or_drain(self._slot_freed, None)
                continue
            await self._gather_slots()
            if self.draining:
                break
            free = self.capacity - len(self.runs)
            if free <= 0:  # the line of held jobs shrank meanwhile (held_ahead)
                continue
            began = time.monotonic()
            began_wall = time.time()
            failed = False
            try:
                jobs, snapshots = await self.client.claim_jobs(
                    self.capabilities,
                    free,
                    self.settings.LONG_POLL_WAIT_MS,
                    self._status_address(),
                )
            except AppError as exc:
                log.warning("claim failed: %s", exc.code, extra={"fields": {"code": exc.code}})
                jobs, snapshots = [], {}
                failed = True
            except Exception:
                log.exception("claim crashed")
                jobs, snapshots = [], {}
                failed = True
            window = CallWindow(began, began_wall, time.monotonic())
            for job in jobs:
                self._launch(job, snapshots.get(job.job_id), window)
            # sleep after a failure, or after an empty answer that came back early
            # (a long poll that waited its time need not sleep again)
            if failed or (not jobs and time.monotonic() - began < poll_s):
                await self._wait_or_drain(None, poll_s)

    def _launch(self, job: Any, snapshot: Any = None, claim: CallWindow | None = None) -> None:
        run = JobRun(
            job=job,
            snapshot=snapshot,
            # a claim with start set startedAt while the call was out: the job's time
            # budget runs from that moment, as the reaper's does
            started_mono=(
                claim.start_of(job) if claim is not None and job.status == RUNNING_STATUS else None
            ),
            job_id=job.job_id,
            attempt_no=job.attempt_no,
            job_type=JOB_TYPE.to_str_or_none(job.job_type) or "",
            claimed_mono=time.monotonic(),
            claimed_wall=utcnow(),
        )
        key = (run.job_id, run.attempt_no)
        if key in self.runs:  # a duplicate answer must not run the attempt twice
            return
        run.trace = self.spans.start(job, claim)
        self.runs[key] = run
        self.keeper.register(run)
        run.task = asyncio.create_task(self._execute(run), name=f"job-{run.job_id}")

    # --------------------------------------------------------------- one job

    async def _execute(self, run: JobRun) -> None:
        with run.trace.activate():
            await self._attempt(run)

    async def _attempt(self, run: JobRun) -> None:
        token = bind(jobId=run.job_id, attemptNo=run.attempt_no, jobType=run.job_type)
        try:
            slot = await self._slots.take(run)  # a job held ahead waits here for a slot
            began = time.monotonic()
            try:
                await self._run_work(run)  # stopped while it waited: ends at once
            finally:
                if slot:
                    self._slots.release()  # a held job runs while this one reports
                    if run.reason is None:  # work that ran its course (not stopped)
                        self.prefetch.observe(time.monotonic() - began)
            self._observe_invocations(run)
            await self._finish(run)
            if run.invocations:  # not logged with the attempt's ending: log them alone
                await self._record_invocations(run)
        finally:
            self.keeper.unregister(run)
            self.runs.pop((run.job_id, run.attempt_no), None)
            self._slot_freed.set()
            log_context.reset(token)

    async def _run_work(self, run: JobRun) -> None:
        """Start ``run``'s model work (after a lease check if it waited long) and wait
        for it to end; its outcome is ``run.work``'s. A run already stopped ends at once
        (its work cancelled before it starts)."""
        if run.reason is None and run.age_seconds() > self.settings.HEARTBEAT_INTERVAL_SECONDS:
            # held a while before starting: make sure the lease is still ours
            try:
                check = await self.keeper.check(run.job_id, run.attempt_no)
            except AppError:
                check = None
            if check is not None and not check.held:
                run.lease_lost()
            elif check is not None and check.cancel_requested:
                run.cancel_requested()
        run.work = asyncio.create_task(self._work(run))
        if run.reason is not None:
            run.work.cancel()
        try:
            await asyncio.wait({run.work})
        except asyncio.CancelledError:
            run.work.cancel()
            raise

    async def _work(self, run: JobRun) -> tuple[str, dict[str, Any]]:
        job = run.job
        if not run.job_type:
            raise AppError(ErrorCode.INVALID_SNAPSHOT, "job has no known jobType")
        # The claim started the job, or reading the snapshot does (SPEC §2.3); the
        # time budget counts from the earlier of the two, as the reaper's does.
        started = run.started_mono if run.started_mono is not None else time.monotonic()
        run.started_wall = utcnow()
        timeout = job.timeout_seconds if job.timeout_seconds > 0 else DEFAULT_TIMEOUT_SECONDS
        job_deadline = started + timeout

        # The key is resolved while the snapshot is read: both only need the lease
        # (locked or running), and neither waits for the other. The snapshot's
        # error, if any, is the one reported, as when they ran one after the other.
        local = self._held_platform_key(job)
        key_call = asyncio.ensure_future(
            _ready(local)
            if local is not None
            else run.trace.resolve(
                lambda: self.client.resolve_credential(run.job_id, run.attempt_no)
            )
        )
        try:
            snap_resp = run.snapshot
            if snap_resp is None:
                try:
                    snap_resp = await self.client.get_snapshot(run.job_id, run.attempt_no)
                except AppError as exc:
                    if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.JOB_NOT_FOUND):
                        raise AppError(
                            ErrorCode.INVALID_SNAPSHOT, "the job's snapshot is missing"
                        ) from None
                    raise
            snapshot = validate_snapshot(
                struct_to_dict(snap_resp.payload),
                schema_version=snap_resp.schema_version,
                job_type=run.job_type,
                user_id=job.user_id or None,
            )
            params = {**snapshot.params, **struct_to_dict(job.params)}
            prompt = await self.prompts.render(run, snapshot, normalize_numbers(params))
            try:
                cred = await key_call
            except AppError as exc:
                if exc.code == ErrorCode.NOT_FOUND:
                    raise AppError(ErrorCode.INVALID_CREDENTIAL, "no usable model key") from None
                raise
        finally:
            if not key_call.done():
                key_call.cancel()
            with contextlib.suppress(BaseException):
                await key_call  # never leave its error unretrieved
        if not cred.api_key:
            raise AppError(ErrorCode.INVALID_CREDENTIAL, "no model key was resolved for this job")
        run.api_key_mode = cred.api_key_mode or job.api_key_mode
        run.credential_id = cred.credential_id or None
        run.model_provider = cred.model_provider or job.model_provider or self.provider.name
        run.model_name = cred.model_name or job.model_name or "deepseek-chat"
        output = await generate(
            run.trace.provider(
                self.provider, model_provider=run.model_provider, model_name=run.model_name
            ),
            job_type=run.job_type,
            prompt=prompt,
            model=run.model_name,
            api_key=cred.api_key,
            base_url=cred.base_url or DEFAULT_BASE_URL,
            job_deadline=job_deadline,
            max_call_seconds=self.settings.MODEL_CALL_MAX_SECONDS,
            invocations=run.invocations,
            max_items=_count_of(run.job_type, params),
        )
        return prompt.prompt_version, output

    def _held_platform_key(self, job: Any) -> HeldKey | None:
        """The platform key this worker holds for ``job``'s provider, as a resolve would
        answer it, or None (a user key, a provider it holds no key for, or a model that
        provider does not serve: then the attempt resolves as usual)."""
        if not self.platform or job.api_key_mode != PLATFORM_KEY_MODE:
            return None
        held = self.platform.get(job.model_provider)
        if held is None:
            return None
        config, key = held
        model = config.model_for(job.model_name or DEFAULT_MODEL_NAME)
        if model is None:
            return None
        return HeldKey(PLATFORM_KEY_MODE, "", key, config.name, model, config.baseUrl)

    async def _finish(self, run: JobRun) -> None:
        work = run.work
        assert work is not None
        if run.reason == LEASE_LOST:
            if not work.cancelled():
                work.exception()  # retrieved: nothing is reported for a lost lease
            run.trace.failed(ErrorCode.LOCK_NOT_HELD)
            self._count(LEASE_LOST)
            log.warning("attempt stopped: lease lost; nothing reported")
            return
        if work.cancelled():
            if run.reason == CANCEL_REQUESTED:
                await self._fail(run, ErrorCode.CANCELLED, "cancel requested; model call aborted")
            else:
                await self._fail(
                    run, ErrorCode.WORKER_SHUTDOWN, "worker shut down before the job finished"
                )
            return
        exc = work.exception()
        if exc is None:
            prompt_version, output = work.result()
            await self._submit(run, prompt_version, output)
        elif isinstance(exc, ModelError):
            await self._fail(run, exc.code, exc.message, exc.retry_after_seconds)
        elif isinstance(exc, AppError):
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
        else:
            log.error("attempt crashed: %s", type(exc).__name__, exc_info=exc)
            await self._fail(run, ErrorCode.INTERNAL, f"worker error: {type(exc).__name__}")

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

    def _claim_next(self) -> rr.ClaimNext | None:
        """What a result claims for the slot it frees (``CLAIM_WITH_RESULT``).

        None while draining, and while other slots are free: the claim loop is then
        gathering freed slots into one ClaimJobs (``CLAIM_BATCH_WINDOW_MS``), which
        this slot joins; a claim per result would take that batch apart.
        """
        if not self.settings.CLAIM_WITH_RESULT or self.draining:
            return None
        if len(self.runs) < self.capacity:
            return None
        return rr.ClaimNext(
            capabilities=cast(Any, [JOB_TYPE.to_proto(c) for c in self.capabilities]),
            limit=1,
            status_address=self._status_address(),
        )

    async def _submit(self, run: JobRun, prompt_version: str, output: dict[str, Any]) -> None:
        began = time.monotonic()
        began_wall = time.time()
        try:
            with run.trace.ending(SPAN_RESULT):
                answer = await self.client.submit_result(
                    run.job_id,
                    run.attempt_no,
                    prompt_version=prompt_version,
                    output_schema_version=CURRENT_OUTPUT_SCHEMA_VERSION,
                    output=output,
                    invocations=self._model_calls(run),
                    claim_next=self._claim_next(),
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
            return
        self._count("succeeded")
        log.info(
            "attempt succeeded",
            extra={"fields": {"resultId": answer.result_id, "replayed": answer.replayed}},
        )
        window = CallWindow(began, began_wall, time.monotonic())
        for job in answer.claimed_jobs:  # this slot's next jobs, claimed with the result
            self._launch(job, answer.snapshots.get(job.job_id), window)

    def _call_code(self, run: JobRun, inv: Invocation) -> str | None:
        code = inv.error_code
        if code == ABORTED:
            code = ABORT_CODES.get(run.reason or SHUTDOWN, ErrorCode.CANCELLED)
        return code or None

    def _observe_invocations(self, run: JobRun) -> None:
        """Feed the model-call metrics, once per call, however the calls get logged."""
        for inv in run.invocations:
            worker_metrics.observe_model_call(
                run.model_name,
                API_KEY_MODE.to_str_or_none(run.api_key_mode) or "unknown",
                inv.outcome,
                inv.latency_ms,
                inv.usage.prompt_tokens,
                inv.usage.completion_tokens,
                inv.usage.cache_hit_tokens,
            )

    def _model_calls(self, run: JobRun) -> list[msg.ModelCall]:
        """The attempt's calls as ``ModelCall`` messages (sent with SubmitResult/FailJob)."""
        out = []
        for inv in run.invocations:
            call = msg.ModelCall(
                model_provider=run.model_provider,
                model_name=run.model_name,
                api_key_mode=cast(Any, run.api_key_mode),
                prompt_tokens=inv.usage.prompt_tokens,
                completion_tokens=inv.usage.completion_tokens,
                cache_hit_tokens=inv.usage.cache_hit_tokens,
                latency_ms=inv.latency_ms,
                outcome=inv.outcome,
            )
            if run.credential_id:
                call.credential_id = run.credential_id
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

    # ---------------------------------------------------------- shutdown

    async def drain(self, grace_seconds: float | None = None) -> int:
        """Stop claiming; in-flight jobs get ``grace_seconds`` (default
        ``SHUTDOWN_GRACE_SECONDS``) to finish, then are stopped and failed with
        ``WORKER_SHUTDOWN``. Returns at once; see :meth:`wait_drained`.

        Returns:
            The number of jobs in flight when the drain began.
        """
        in_flight = len(self.runs)
        if not self.draining:
            self.draining = True
            self._drain_event.set()
            log.info("draining", extra={"fields": {"inFlight": in_flight}})
            if self._loop_task is not None:
                self._loop_task.cancel()
            if self._on_draining is not None:
                await self._on_draining()
            grace = grace_seconds if grace_seconds else self.settings.SHUTDOWN_GRACE_SECONDS
            self._drain_task = asyncio.create_task(self._drain_runs(grace), name="drain")
        return in_flight

    async def _drain_runs(self, grace: float) -> None:
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        # The runs in flight get the grace, and so do the jobs a result sent before
        # the drain claims (claim_next): they join self.runs while we wait.
        await self._wait_runs(grace)
        # Then every run still there (or launched meanwhile) is stopped and reports
        # WORKER_SHUTDOWN (or a result already made) within a bounded time; what is
        # still unreported then is left to lease expiry and the reaper.
        await self._wait_runs(SHUTDOWN_REPORT_SECONDS, interrupt=True)
        pending = [r.task for r in self.runs.values() if r.task is not None and not r.task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    async def _wait_runs(self, seconds: float, *, interrupt: bool = False) -> None:
        """Wait up to ``seconds`` for every run to end, runs launched meanwhile
        included; with ``interrupt``, each is first stopped with ``SHUTDOWN``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            tasks = []
            for run in list(self.runs.values()):
                if interrupt:
                    run.interrupt(SHUTDOWN)  # a no-op for a run already stopped
                if run.task is not None and not run.task.done():
                    tasks.append(run.task)
            remaining = deadline - loop.time()
            if not tasks or remaining <= 0:
                return
            await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)

    async def wait_drained(self) -> None:
        """Wait until a started drain has finished every in-flight job."""
        if self._drain_task is not None:
            await self._drain_task

    async def shutdown(self, grace_seconds: float | None = None) -> None:
        """Drain, wait for it, then stop the lease keeper (SIGTERM path)."""
        await self.drain(grace_seconds)
        await self.wait_drained()
        await self.keeper.stop()

    # ------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """Facts for GetStatus: in-flight jobs with ages, counters, draining."""
        return {
            "in_flight": [
                {
                    "job_id": r.job_id,
                    "attempt_no": r.attempt_no,
                    "job_type": r.job_type,
                    "started_at": r.started_wall or r.claimed_wall,
                    "age_seconds": r.age_seconds(),
                }
                for r in self.runs.values()
            ],
            "counters": dict(self.counters),
            "draining": self.draining,
        }


@dataclass(frozen=True)
class HeldKey:
    """A platform key the worker holds, in the shape of a ResolveCredential answer."""

    api_key_mode: int
    credential_id: str
    api_key: str
    model_provider: str
    model_name: str
    base_url: str


async def _ready(value: HeldKey) -> HeldKey:
    return value


def _count_of(job_type: str, params: dict[str, Any]) -> int | None:
    """The items a job asked for (``params.count`` of a type whose params have a
    count and whose output is a list), or None: a longer answer submits only the
    first ``count`` (SPEC §9.4)."""
    count = params.get("count")
    spec = jobtypes.find(job_type)
    counted = spec is not None and spec.itemized and "count" in spec.params.model_fields
    if counted and isinstance(count, int) and not isinstance(count, bool):
        return count if count >= 1 else None
    return None


__all__ = ["JobRun", "Worker"]
