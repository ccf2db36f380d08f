"""Property test: random operation sequences never break reference §2 invariants (hypothesis stateful)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from sqlalchemy import select, update

from airuntime_common.db import make_sessionmaker
from airuntime_common.errors import AppError
from job_service.lifecycle import LEASED, TERMINAL, TRANSITIONS, Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput
from job_service.services.ports import AllowAllCredentials
from job_service.store.clock import DbClock
from job_service.store.engine import make_job_engine
from job_service.store.tables import events, jobs, workers
from tests.unit.job_service.conftest import (
    ANALYSIS_OUTPUT,
    FakeLearning,
    create_schema,
    make_settings,
)

ALLOWED_REFUSALS = {
    "LOCK_NOT_HELD",
    "JOB_ALREADY_LOCKED",
    "INVALID_JOB_STATE",
    "RESULT_ALREADY_EXISTS",
    "INVALID_SCHEMA",
}
CODES = ["MODEL_TIMEOUT", "WORKER_SHUTDOWN", "INSUFFICIENT_BALANCE", "CANCELLED", "whatever"]
CAPS = ["learning_state_analysis"]


class JobMachine(RuleBasedStateMachine):
    jobs_b = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.TemporaryDirectory()
        url = f"sqlite+aiosqlite:///{Path(self.dir.name) / 'p.db'}"
        self.run(create_schema(url))
        self.engine = make_job_engine(url)
        sessions = make_sessionmaker(self.engine)
        clock = DbClock("sqlite")
        self.domain = JobDomain(
            sessions,
            clock,
            make_settings(url, MAX_RETRY_COUNT=2),
            FakeLearning(),
            AllowAllCredentials(),
        )
        self.reaper = Reaper(self.domain.core)
        self.terminal: dict[str, str] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.engine.dispose())
        self.loop.close()
        self.dir.cleanup()

    def attempt(self, coro: Any) -> Any:
        try:
            return self.run(coro)
        except AppError as err:
            assert err.code in ALLOWED_REFUSALS, err
            return None

    def current(self, job_id: str) -> Any:
        return self.run(self.domain.get(job_id))

    def lease(self, job_id: str, worker: str, stale: bool) -> Lease:
        job = self.current(job_id)
        return Lease(job_id, worker, max(1, job.attempt_no - (1 if stale else 0)))

    @rule(target=jobs_b, priority=st.integers(0, 2))
    def create(self, priority: int) -> str:
        job, _ = self.run(
            self.domain.create(
                CreateJobInput(
                    user_id="u",
                    job_type=CAPS[0],
                    target_type="user",
                    target_id="u",
                    priority=priority,
                )
            )
        )
        return str(job.job_id)

    @rule(worker=st.sampled_from(["w1", "w2"]), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        self.run(self.domain.claim(worker, CAPS, limit, 0))

    @rule(job=jobs_b, worker=st.sampled_from(["w1", "w2"]))
    def lock(self, job: str, worker: str) -> None:
        self.attempt(self.domain.lock(job, worker))

    @rule(job=jobs_b, worker=st.sampled_from(["w1", "w2"]), stale=st.booleans())
    def heartbeat(self, job: str, worker: str, stale: bool) -> None:
        self.attempt(self.domain.heartbeat(self.lease(job, worker, stale)))

    @rule(job=jobs_b, worker=st.sampled_from(["w1", "w2"]), stale=st.booleans(), good=st.booleans())
    def submit(self, job: str, worker: str, stale: bool, good: bool) -> None:
        output = ANALYSIS_OUTPUT if good else {"items": []}
        self.attempt(
            self.domain.submit_result(
                self.lease(job, worker, stale),
                prompt_version=None,
                output_schema_version="v1",
                output=output,
            )
        )

    @rule(
        job=jobs_b,
        worker=st.sampled_from(["w1", "w2"]),
        stale=st.booleans(),
        code=st.sampled_from(CODES),
    )
    def fail(self, job: str, worker: str, stale: bool, code: str) -> None:
        self.attempt(
            self.domain.fail(self.lease(job, worker, stale), error_code=code, error_message="")
        )

    @rule(job=jobs_b)
    def cancel(self, job: str) -> None:
        self.attempt(self.domain.cancel(job, user_id="u", actor="user:u"))

    @rule(job=jobs_b)
    def lapse_and_reap(self, job: str) -> None:
        async def age() -> None:
            async with self.domain.sessions() as s, s.begin():
                await s.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job, jobs.c.lock_until.is_not(None))
                    .values(lock_until=self.domain.clock.plus(-1))
                )

        self.run(age())
        self.run(self.reaper.sweep())

    @invariant()
    def spec_invariants(self) -> None:
        async def read() -> tuple[list[Any], list[Any], set[str]]:
            async with self.domain.sessions() as s:
                rows = (await s.execute(select(jobs))).all()
                evs = (await s.execute(select(events).order_by(events.c.seq))).all()
                biz = set((await s.execute(select(workers.c.instance_id))).scalars())
            return list(rows), list(evs), biz

        rows, evs, biz = self.run(read())
        for j in rows:
            assert j.status != "expired"
            assert 0 <= j.retry_count <= j.max_retry_count
            assert j.attempt_no <= j.retry_count + 1
            if j.status == "pending":
                assert j.locked_by is None and j.lock_until is None
            if j.status in LEASED:
                assert j.locked_by and j.lock_until is not None and j.attempt_no >= 1
            if j.status in TERMINAL:
                assert j.lock_until is None and j.finished_at is not None
            assert (f"biz-{j.job_id}" in biz) == (j.status == "succeeded")
            if j.job_id in self.terminal:
                assert j.status == self.terminal[j.job_id], "terminal states are absorbing"
            elif j.status in TERMINAL:
                self.terminal[j.job_id] = j.status
            mine = [e for e in evs if e.job_id == j.job_id]
            assert mine[0].from_status is None and mine[0].to_status == "pending"
            for prev, nxt in itertools.pairwise(mine):
                assert nxt.from_status == prev.to_status
                assert nxt.to_status in {
                    t.to_state or nxt.from_status
                    for t in TRANSITIONS.values()
                    if nxt.from_status in t.from_states
                }
            assert mine[-1].to_status == j.status
            assert (
                sum(1 for e in mine if (e.from_status, e.to_status) == ("pending", "locked"))
                == j.attempt_no
            )


TestJobMachine = JobMachine.TestCase
TestJobMachine.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
)
