"""The worker loop: claim jobs for free slots, run each attempt, drain (reference §2.6, §3).

One loop claims as many jobs as there are free slots (``ClaimJobs`` with start and
snapshots, a long poll of ``LONG_POLL_WAIT_MS``; it sleeps ``POLL_INTERVAL_MS``
after an empty answer that came back early). Each claimed job runs its attempt in
its own task (:mod:`runtime_worker.attempt`).

``WORKER_CONCURRENCY`` jobs do their model work at once. A job that ends with a
result keeps its slot until its report is answered: the report asks, in the
result's own transaction, for the next job of that slot (``claim_next``), which
runs in it; a report that brings none gives the slot back to the loop. Any other
ending (a fail, a lost lease) hands its slot to the loop at once, while it
reports. With jobs in flight and fewer than a quarter of the slots free, the loop
waits up to :data:`GATHER_SECONDS` for more slots to free, so one claim takes
several jobs.

Every runtime call to job_service travels over the client's one ``RuntimeSession``
stream (:mod:`runtime_worker.session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from airuntime_common.errors import AppError
from airuntime_common.logs import bind, log_context
from airuntime_common.timeutil import utcnow
from airuntime_common.tracing import Tracing
from runtime_worker.attempt import SHUTDOWN, Attempts, CallWindow, ClaimNext, JobRun
from runtime_worker.client import RuntimeClient
from runtime_worker.lease_keeper import LeaseKeeper
from runtime_worker.providers.base import ModelProvider
from runtime_worker.settings import WorkerSettings
from runtime_worker.spans import AttemptSpans

log = logging.getLogger(__name__)

#: The most jobs one ClaimJobs returns (reference §2.6 limit cap).
MAX_CLAIM_BATCH = 50
#: With jobs in flight, how long the claim loop waits for a quarter of the slots to
#: free before it claims (s): one claim then takes several jobs.
GATHER_SECONDS = 0.02
#: After the grace period, how long stopped jobs get to report (s).
SHUTDOWN_REPORT_SECONDS = 5.0


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
        self.client = client
        self.capabilities = settings.capabilities
        self.counters: Counter[str] = Counter()
        #: provider name → (its config, the platform key this worker holds for it)
        platform = {
            name: (config, key)
            for name, key in settings.platform_keys().items()
            if (config := settings.providers().get(name)) is not None
        }
        self.attempts = Attempts(client, provider, platform, settings, self.counters)
        self.spans = AttemptSpans(tracing)
        self.keeper = LeaseKeeper(client, settings.HEARTBEAT_INTERVAL_SECONDS)
        #: every attempt in flight, working or reporting, by (jobId, attemptNo)
        self.runs: dict[tuple[str, int], JobRun] = {}
        #: attempts doing their model work: each holds one of the slots
        self.working = 0
        self.draining = False
        self.started_at = utcnow()
        self._status_address = status_address
        self._on_draining = on_draining
        self._slot_freed = asyncio.Event()
        self._drain_event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        """Start the lease keeper and the claim loop."""
        self.keeper.start()
        self._loop_task = asyncio.create_task(self._claim_loop(), name="claim-loop")

    @property
    def free_slots(self) -> int:
        """Slots no attempt's model work holds now."""
        return self.settings.WORKER_CONCURRENCY - self.working

    def claim_batch_target(self) -> int:
        """Free slots worth one claim while jobs are in flight: a quarter of the
        concurrency, at most the claim limit (50), at least 1."""
        return max(1, min(MAX_CLAIM_BATCH, self.settings.WORKER_CONCURRENCY // 4))

    async def _wait_or_drain(self, event: asyncio.Event | None, wait_s: float | None) -> None:
        waiters = [asyncio.create_task(self._drain_event.wait())]
        if event is not None:
            waiters.append(asyncio.create_task(event.wait()))
        try:
            await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _gather_slots(self) -> None:
        """With jobs working and few free slots, wait up to :data:`GATHER_SECONDS` for
        more to free, so one claim takes several jobs (fewer round trips per job)."""
        if not self.working:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GATHER_SECONDS
        target = self.claim_batch_target()
        while not self.draining and self.working:
            remaining = deadline - loop.time()
            if self.free_slots >= target or remaining <= 0:
                return
            self._slot_freed.clear()
            await self._wait_or_drain(self._slot_freed, remaining)

    async def _claim_loop(self) -> None:
        poll_s = self.settings.POLL_INTERVAL_MS / 1000.0
        while not self.draining:
            if self.free_slots <= 0:
                self._slot_freed.clear()
                await self._wait_or_drain(self._slot_freed, None)
                continue
            await self._gather_slots()
            if self.draining:
                break
            began = time.monotonic()
            began_wall = time.time()
            failed = False
            try:
                jobs, snapshots = await self.client.claim_jobs(
                    self.capabilities,
                    self.free_slots,
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

    def _launch(self, job: Any, snapshot: Any, claim: CallWindow) -> None:
        """Run the attempt of a claimed ``job`` (its snapshot from the answer, if any)."""
        key = (job.job_id, job.attempt_no)
        if key in self.runs:  # a duplicate answer must not run the attempt twice
            return
        run = JobRun(
            job=job,
            job_id=job.job_id,
            attempt_no=job.attempt_no,
            snapshot=snapshot,
            # the claim started the job while the call was out: its time budget runs
            # from that moment, as the reaper's does
            started_mono=claim.start_of(job),
        )
        run.trace = self.spans.start(job, claim)
        self.runs[key] = run
        self.working += 1
        self.keeper.register(run)
        run.task = asyncio.create_task(self._execute(run), name=f"job-{run.job_id}")

    async def _execute(self, run: JobRun) -> None:
        with run.trace.activate():
            token = bind(jobId=run.job_id, attemptNo=run.attempt_no, jobType=run.job_type)
            held = True  # this run's slot
            try:
                try:
                    await self._run_work(run)
                finally:
                    # a result keeps its slot for the job its report claims with it; any
                    # other ending hands the slot to the claim loop while it reports
                    if self.draining or not self.attempts.submits(run):
                        held = False
                        self._free_slot()
                self.attempts.observe_invocations(run)
                sent, sent_wall = time.monotonic(), time.time()
                handoff = await self.attempts.report(run, self._claim_next() if held else None)
                if held:
                    held = False
                    self._free_slot()
                    # jobs a result in flight claimed when a drain began run in its grace
                    window = CallWindow(sent, sent_wall, time.monotonic())
                    for job in handoff.jobs:
                        self._launch(job, handoff.snapshots.get(job.job_id), window)
            finally:
                if held:
                    self._free_slot()
                self.keeper.unregister(run)
                self.runs.pop((run.job_id, run.attempt_no), None)
                self._slot_freed.set()
                log_context.reset(token)

    def _free_slot(self) -> None:
        self.working -= 1
        self._slot_freed.set()

    def _claim_next(self) -> ClaimNext:
        """What a result asks to claim with it: one job for the slot it frees."""
        return (self.capabilities, 1, self._status_address())

    async def _run_work(self, run: JobRun) -> None:
        """Start ``run``'s model work and wait for it to end; its outcome is ``run.work``'s.
        A run already stopped ends at once (its work cancelled before it starts)."""
        run.work = asyncio.create_task(self.attempts.work(run))
        if run.reason is not None:
            run.work.cancel()
        try:
            await asyncio.wait({run.work})
        except asyncio.CancelledError:
            run.work.cancel()
            raise

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
        # The runs in flight get the grace.
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
        """Facts for GetStatus: in-flight jobs with ages (s), counters, draining."""
        now = utcnow()
        return {
            "in_flight": [
                {
                    "job_id": r.job_id,
                    "attempt_no": r.attempt_no,
                    "job_type": r.job_type,
                    "started_at": now - timedelta(seconds=r.age_seconds()),
                    "age_seconds": r.age_seconds(),
                }
                for r in self.runs.values()
            ],
            "counters": dict(self.counters),
            "draining": self.draining,
        }


__all__ = ["JobRun", "Worker"]
