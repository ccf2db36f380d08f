"""Property tests: whatever happens to a batch's children, in any order and at once, its
parent's counts equal its children's states, and its state follows reference §10.3.

* a hypothesis state machine (SQLite) of batches, claims, locks, results, fails,
  cancels of children and parents, revokes and lapsed leases;
* a randomized run on both databases, each step a few operations at once from two
  replicas (two domains on one database).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from sqlalchemy import update

from airuntime_common.db import make_sessionmaker
from airuntime_common.errors import AppError
from job_service.lifecycle import LEASED, TERMINAL, Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateBatchInput
from job_service.services.ports import AllowAllCredentials
from job_service.store.clock import DbClock
from job_service.store.engine import make_job_engine
from job_service.store.tables import jobs
from tests.unit.job_service.batch_support import ANALYSIS, CAPS, children, counts_hold
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
    "JOB_NOT_FOUND",
    "AI_NOT_AUTHORIZED",
}
CODES = ["MODEL_TIMEOUT", "INSUFFICIENT_BALANCE", "CANCELLED", "WORKER_SHUTDOWN"]
WORKERS = ["w1", "w2"]


async def parent_holds(domain: JobDomain, parent_id: str) -> None:
    """The counts equal the children's states, and the parent's state is the one
    reference §10.3 gives those counts."""
    parent = await counts_hold(domain, parent_id)
    live = (parent.batch_pending or 0) + (parent.batch_running or 0)
    if parent.status == "cancelled":
        return
    if live:
        assert parent.status in ("pending", "running"), parent
        if parent.batch_running:
            assert parent.status == "running", parent
        return
    ok = (parent.batch_succeeded or 0) >= (parent.min_success_ratio or 1) * (
        parent.batch_total or 0
    ) - 1e-9
    assert parent.status == ("succeeded" if ok else "failed"), parent
    assert parent.error_code == (None if ok else "CHILD_JOBS_FAILED")


async def attempt(coro: Any) -> Any:
    try:
        return await coro
    except AppError as err:
        assert err.code in ALLOWED_REFUSALS, err
        return None


async def lease_of(domain: JobDomain, job_id: str, worker: str) -> Lease:
    job = await domain.get(job_id)
    return Lease(job_id, worker, max(1, job.attempt_no))


class BatchMachine(RuleBasedStateMachine):
    batches = Bundle("batches")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.TemporaryDirectory()
        url = f"sqlite+aiosqlite:///{Path(self.dir.name) / 'p.db'}"
        self.run(create_schema(url))
        self.engine = make_job_engine(url)
        self.domain = JobDomain(
            make_sessionmaker(self.engine),
            DbClock("sqlite"),
            make_settings(url, MAX_RETRY_COUNT=1),
            FakeLearning(),
            AllowAllCredentials(),
        )
        self.reaper = Reaper(self.domain.core)
        self.parents: list[str] = []
        self.ended: dict[str, str] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.engine.dispose())
        self.loop.close()
        self.dir.cleanup()

    def kids(self, parent: str) -> list[Any]:
        return list(self.run(children(self.domain, parent)))

    @rule(target=batches, n=st.integers(1, 4), ratio=st.sampled_from([None, 0.5, 0.75]))
    def create(self, n: int, ratio: float | None) -> str:
        req = CreateBatchInput(
            "u",
            ANALYSIS,
            targets=[("material", f"t{i}") for i in range(n)],
            min_success_ratio=ratio,
        )
        parent = self.run(attempt(self.domain.create_batch(req)))
        if parent is None:  # AI turned off by a revoke
            self.run(self.domain.set_authorization("u", True))
            parent, _ = self.run(self.domain.create_batch(req))
        else:
            parent = parent[0]
        self.parents.append(parent.job_id)
        return str(parent.job_id)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), start=st.booleans())
    def claim(self, worker: str, limit: int, start: bool) -> None:
        if start:
            self.run(self.domain.claim_started(worker, CAPS, limit, 0))
        else:
            self.run(self.domain.claim(worker, CAPS, limit, 0))

    @rule(batch=batches, pick=st.integers(0, 3), worker=st.sampled_from(WORKERS))
    def lock(self, batch: str, pick: int, worker: str) -> None:
        kids = self.kids(batch)
        self.run(attempt(self.domain.lock(kids[pick % len(kids)].job_id, worker)))
        self.run(attempt(self.domain.lock(batch, worker)))  # never: a parent

    @rule(batch=batches, pick=st.integers(0, 3), good=st.booleans())
    def submit(self, batch: str, pick: int, good: bool) -> None:
        kid = self.kids(batch)[pick % len(self.kids(batch))]
        lease = self.run(lease_of(self.domain, kid.job_id, kid.locked_by or "w1"))
        output = ANALYSIS_OUTPUT if good else {"items": []}
        self.run(
            attempt(
                self.domain.submit_result(
                    lease, prompt_version=None, output_schema_version="v1", output=output
                )
            )
        )

    @rule(batch=batches, pick=st.integers(0, 3), code=st.sampled_from(CODES))
    def fail(self, batch: str, pick: int, code: str) -> None:
        kid = self.kids(batch)[pick % len(self.kids(batch))]
        lease = self.run(lease_of(self.domain, kid.job_id, kid.locked_by or "w1"))
        self.run(attempt(self.domain.fail(lease, error_code=code, error_message="")))

    @rule(batch=batches, pick=st.integers(0, 4))
    def cancel(self, batch: str, pick: int) -> None:
        kids = self.kids(batch)
        target = batch if pick >= len(kids) else kids[pick].job_id
        self.run(attempt(self.domain.cancel(target, user_id="u", actor="user:u")))

    @rule()
    def revoke(self) -> None:
        self.run(self.domain.set_authorization("u", False))
        self.run(self.domain.set_authorization("u", True))

    @rule()
    def leases_lapse(self) -> None:
        async def age() -> None:
            async with self.domain.sessions() as s, s.begin():
                await s.execute(
                    update(jobs)
                    .where(jobs.c.status.in_(sorted(LEASED)), jobs.c.lock_until.is_not(None))
                    .values(lock_until=self.domain.clock.plus(-1))
                )

        self.run(age())
        self.run(self.reaper.sweep())

    @invariant()
    def counts_equal_children(self) -> None:
        for parent in self.parents:
            self.run(parent_holds(self.domain, parent))
            status = self.run(self.domain.get(parent)).status
            if parent in self.ended:  # a terminal parent never changes state
                assert status == self.ended[parent], parent
            elif status in TERMINAL:
                self.ended[parent] = status


TestBatchMachine = BatchMachine.TestCase
TestBatchMachine.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_steps_from_two_replicas_keep_the_counts(
    make_domain: Callable[..., Any], seed: int
) -> None:
    one: JobDomain = await make_domain(MAX_RETRY_COUNT=1)
    two: JobDomain = await make_domain(MAX_RETRY_COUNT=1)
    rng = random.Random(seed)
    parents = [
        (await one.create_batch(CreateBatchInput("u", ANALYSIS, targets=targets, **kw)))[0].job_id
        for targets, kw in (
            ([("material", f"a{i}") for i in range(6)], {}),
            ([("material", f"b{i}") for i in range(5)], {"min_success_ratio": 0.5}),
        )
    ]
    kids = [k.job_id for p in parents for k in await children(one, p)]

    async def step(domain: JobDomain) -> None:
        kind = rng.choice(["claim", "claim", "result", "result", "fail", "cancel"])
        worker = rng.choice(WORKERS)
        if kind == "claim":
            await domain.claim_started(worker, CAPS, rng.randint(1, 3), 0)
            return
        if kind == "cancel" and rng.random() < 0.1:
            await attempt(domain.cancel(rng.choice(parents), user_id="u", actor="user:u"))
            return
        job = await domain.get(rng.choice(kids))
        if kind == "cancel":
            await attempt(domain.cancel(job.job_id, user_id="u", actor="user:u"))
            return
        lease = Lease(job.job_id, job.locked_by or worker, max(1, job.attempt_no))
        if kind == "result":
            await attempt(
                domain.submit_result(
                    lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
                )
            )
        else:
            code = rng.choice(CODES)
            await attempt(domain.fail(lease, error_code=code, error_message=""))

    for _ in range(40):
        await asyncio.gather(*(step(rng.choice([one, two])) for _ in range(rng.randint(1, 4))))
        for parent in parents:
            await parent_holds(one, parent)
