"""Multi-statement batches on MariaDB (job_service.store.batch) and the hot paths using them.

Skipped without TEST_MYSQL_URL. Each test gets its own database.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import String, bindparam, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.outputs import validate_output
from job_service.learning import results, snapshots
from job_service.learning.port import LearningModulePort as ModuleLearningPort
from job_service.learning.tables import AiResult, AiSnapshot
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.inputs import ModelCallInput
from job_service.services.ports import SnapshotRead, SnapshotsRead
from job_service.store.batch import FenceBroken, new_batch
from job_service.store.cache import Sql
from job_service.store.engine import make_job_engine
from job_service.store.tables import events, invocations, jobs, workers
from tests.integration.job_service.conftest import *  # noqa: F403
from tests.unit.job_service.conftest import (
    ANALYSIS_OUTPUT,
    FakeLearning,
    create_schema,
    new_job,
)

pytestmark = pytest.mark.mysql

CAPS = ["learning_state_analysis"]
WORKER_KEY = ("test_batch_insert_worker",)
WORKER_READ_KEY = ("test_batch_read_worker",)


def _insert_worker() -> Any:
    return insert(workers)


def _read_worker() -> Any:
    return select(workers.c.instance_id, workers.c.capabilities).where(
        workers.c.instance_id == bindparam("w_id", type_=String())
    )


def _worker(instance_id: str) -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "capabilities": ["quiz", "it's"],
        "in_flight": 0,
        "last_seen_at": datetime(2026, 1, 1),
    }


@pytest.fixture
async def engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    await create_schema(mysql_url)
    eng = make_job_engine(mysql_url)
    yield eng
    await eng.dispose()


async def _worker_ids(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(workers.c.instance_id).order_by(workers.c.instance_id))
        return [r[0] for r in rows]


async def _session_counter(engine: AsyncEngine, name: str) -> tuple[object, int]:
    """The pooled connection's own counter ``name`` (``SHOW SESSION STATUS``: other
    clients of the server do not move it) and that connection's identity.

    The read ends with a COMMIT when counting ROLLBACKs and with a ROLLBACK
    otherwise, so the read itself never moves the counter.
    """
    async with engine.connect() as conn:
        raw = await _driver_connection(conn)
        row = (await conn.exec_driver_sql(f"SHOW SESSION STATUS LIKE '{name}'")).one()
        await (conn.commit() if name == "Com_rollback" else conn.rollback())
        return raw, int(row[1])


async def _driver_connection(conn: Any) -> object:
    return (await conn.get_raw_connection()).driver_connection


async def test_one_round_trip_gives_each_outcome_and_commits_once(engine: AsyncEngine) -> None:
    used, before = await _session_counter(engine, "Com_commit")
    async with engine.begin() as conn:
        assert await _driver_connection(conn) is used  # one pooled connection throughout
        batch = new_batch(conn)
        first = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))
        second = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-b")))
        touched = batch.add(
            Sql(
                None,
                lambda: update(workers).where(workers.c.instance_id.in_(["w-a", "w-b", "w-c"])),
                {"in_flight": 3},
            )
        )
        read = batch.add(Sql(WORKER_READ_KEY, _read_worker, {"w_id": "w-b"}))
        batch.commit()
        out = await batch.run()
    assert [o.rowcount for o in (out[first], out[second], out[touched])] == [1, 1, 2]
    # rows come back with the column types' processing: JSON decoded, quotes intact
    assert out[read].rows == [("w-b", ["quiz", "it's"])]
    assert await _worker_ids(engine) == ["w-a", "w-b"]
    # the block's own COMMIT was skipped: the batch's was the only one
    assert await _session_counter(engine, "Com_commit") == (used, before + 1)


async def test_inserts_queued_to_merge_run_as_one_statement(engine: AsyncEngine) -> None:
    """Single-row INSERTs of one shape queued with ``merge`` run as one multi-row
    INSERT at the first one's place; each is answered with its outcome."""
    used, before = await _session_counter(engine, "Com_insert")
    async with engine.begin() as conn:
        assert await _driver_connection(conn) is used
        batch = new_batch(conn)
        a = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")), merge=True)
        read = batch.add(Sql(WORKER_READ_KEY, _read_worker, {"w_id": "w-c"}))
        b = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-b")), merge=True)
        c = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-c")), merge=True)
        batch.commit()
        out = await batch.run()
    assert [out[i].rowcount for i in (a, b, c)] == [3, 3, 3]
    # the read ran after the merged INSERT, which took w-c's row to the first one's place
    assert out[read].rows == [("w-c", ["quiz", "it's"])]
    assert await _worker_ids(engine) == ["w-a", "w-b", "w-c"]
    assert await _session_counter(engine, "Com_insert") == (used, before + 1)


async def test_an_insert_whose_row_count_is_read_next_is_not_merged(engine: AsyncEngine) -> None:
    """A fence after an INSERT queued with ``merge`` judges that INSERT alone."""
    used, before = await _session_counter(engine, "Com_insert")
    async with engine.begin() as conn:
        batch = new_batch(conn)
        a = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")), merge=True)
        b = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-b")), merge=True)
        batch.fence("w-b")  # one row: w-b's own INSERT, not a merged one of two
        c = batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-c")), merge=True)
        batch.commit()
        out = await batch.run()
    assert [out[i].rowcount for i in (a, b, c)] == [2, 1, 2]
    assert await _worker_ids(engine) == ["w-a", "w-b", "w-c"]
    assert await _session_counter(engine, "Com_insert") == (used, before + 2)


@pytest.mark.parametrize("statements", [1, 3])
async def test_a_connection_a_batch_committed_goes_back_without_a_rollback(
    engine: AsyncEngine, statements: int
) -> None:
    """The pool's check-in rolls back only an open transaction; after a batch's
    COMMIT none is open, on either driver (asyncmy keeps a stale status there)."""
    used, before = await _session_counter(engine, "Com_rollback")
    for _ in range(3):
        async with engine.begin() as conn:
            assert await _driver_connection(conn) is used
            batch = new_batch(conn)
            for _ in range(statements):
                batch.add(Sql(WORKER_READ_KEY, _read_worker, {"w_id": "nobody"}))
            batch.commit()
            await batch.run()
    assert await _session_counter(engine, "Com_rollback") == (used, before)


async def test_a_statement_after_the_batch_is_committed_too(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        batch = new_batch(conn)
        batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))
        batch.commit()
        await batch.run()
        # a new implicit transaction: the block's COMMIT must be sent for it
        await conn.execute(insert(workers).values(**_worker("w-after")))
    assert await _worker_ids(engine) == ["w-a", "w-after"]


async def test_a_broken_fence_stops_the_batch_before_its_commit(engine: AsyncEngine) -> None:
    with pytest.raises(FenceBroken) as caught:
        async with engine.begin() as conn:
            batch = new_batch(conn)
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-before")))
            batch.add(
                Sql(
                    None,
                    lambda: update(workers).where(workers.c.instance_id == "nobody"),
                    {"in_flight": 1},
                )
            )
            batch.fence("nobody")
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-after")))
            batch.commit()
            await batch.run()
    assert caught.value.label == "nobody"
    # the whole transaction rolled back, the statement before the fence included
    assert await _worker_ids(engine) == []


async def test_a_fence_passes_on_exactly_one_row(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(workers).values(**_worker("w-a")))
    async with engine.begin() as conn:
        batch = new_batch(conn)
        batch.add(
            Sql(
                None,
                lambda: update(workers).where(workers.c.instance_id == "w-a"),
                {"in_flight": 1},
            )
        )
        batch.fence("w-a")
        batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-b")))
        batch.commit()
        await batch.run()
    assert await _worker_ids(engine) == ["w-a", "w-b"]


@pytest.mark.parametrize(
    ("matched", "expected"), [(["w-a", "w-b"], 2), (["w-a"], 2), (["w-a", "w-b"], 1)]
)
async def test_a_fence_of_several_rows_passes_on_exactly_that_many(
    engine: AsyncEngine, matched: list[str], expected: int
) -> None:
    """A group's UPDATE of several leased jobs is fenced on all of them at once."""
    async with engine.begin() as conn:
        await conn.execute(insert(workers), [_worker("w-a"), _worker("w-b")])

    async def run() -> None:
        async with engine.begin() as conn:
            batch = new_batch(conn)
            batch.add(
                Sql(
                    None,
                    lambda: update(workers).where(workers.c.instance_id.in_(matched)),
                    {"in_flight": 1},
                )
            )
            batch.fence("group", rows=expected)
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-c")))
            batch.commit()
            await batch.run()

    if len(matched) == expected:
        await run()
        assert await _worker_ids(engine) == ["w-a", "w-b", "w-c"]
    else:
        with pytest.raises(FenceBroken) as caught:
            await run()
        assert caught.value.label == "group"
        assert await _worker_ids(engine) == ["w-a", "w-b"]
        async with engine.connect() as conn:
            flights = (await conn.execute(select(workers.c.in_flight))).scalars().all()
        assert list(flights) == [0, 0]  # the UPDATE before the fence rolled back too


async def test_an_error_mid_batch_is_sqlalchemys_and_runs_nothing_after(
    engine: AsyncEngine,
) -> None:
    with pytest.raises(IntegrityError) as caught:
        async with engine.begin() as conn:
            batch = new_batch(conn)
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))  # duplicate key
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-c")))
            batch.commit()
            await batch.run()
    assert await _worker_ids(engine) == []
    # the error names the failing statement, not the whole batch
    assert "statement 2 of 4 of a batch: INSERT INTO ai_runtime_workers" in str(caught.value)
    assert "w-c" not in str(caught.value)


async def test_a_lost_connection_is_invalidated(engine: AsyncEngine, mysql_url: str) -> None:
    admin = make_job_engine(mysql_url)
    try:
        with pytest.raises(DBAPIError) as caught:
            async with engine.begin() as conn:
                thread_id = (await conn.execute(select(func.connection_id()))).scalar_one()
                async with admin.connect() as other:
                    await other.exec_driver_sql(f"KILL CONNECTION {int(thread_id)}")
                batch = new_batch(conn)
                batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))
                batch.commit()
                await batch.run()
        assert caught.value.connection_invalidated
        assert await _worker_ids(engine) == []  # the pool hands out a live connection
    finally:
        await admin.dispose()


async def test_a_batch_commit_never_skips_a_later_transactions_commit(
    engine: AsyncEngine,
) -> None:
    # the block fails after its batch committed: the skip must not outlive it
    with pytest.raises(RuntimeError):
        async with engine.begin() as conn:
            batch = new_batch(conn)
            batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-a")))
            batch.commit()
            await batch.run()
            raise RuntimeError("after the batch")
    # the same pooled connection, a batch without COMMIT: the block's COMMIT is sent
    async with engine.begin() as conn:
        batch = new_batch(conn)
        batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-b")))
        await batch.run()
    assert await _worker_ids(engine) == ["w-a", "w-b"]


async def test_a_restarted_server_costs_one_failed_batch_not_one_per_connection(
    mysql_url: str,
) -> None:
    await create_schema(mysql_url)
    engine = make_job_engine(mysql_url)
    admin = make_job_engine(mysql_url)
    try:
        # four pooled connections, all dropped by the server at once
        conns = [await engine.connect() for _ in range(4)]
        ids = [(await c.execute(select(func.connection_id()))).scalar_one() for c in conns]
        for c in conns:
            await c.close()
        async with admin.connect() as other:
            for thread_id in ids:
                await other.exec_driver_sql(f"KILL CONNECTION {int(thread_id)}")
        with pytest.raises(DBAPIError) as caught:
            async with engine.begin() as conn:
                batch = new_batch(conn)
                batch.add(Sql(WORKER_KEY, _insert_worker, _worker("w-lost")))
                batch.commit()
                await batch.run()
        assert caught.value.connection_invalidated
        # the pool dropped the other dead connections too: the next batches all run
        for i in range(4):
            async with engine.begin() as conn:
                batch = new_batch(conn)
                batch.add(Sql(WORKER_KEY, _insert_worker, _worker(f"w-{i}")))
                batch.commit()
                await batch.run()
        assert await _worker_ids(engine) == ["w-0", "w-1", "w-2", "w-3"]
    finally:
        await admin.dispose()
        await engine.dispose()


# ------------------------------------------------------------- the hot paths


async def _result_rows(domain: JobDomain, job_id: str) -> int:
    async with domain.sessions() as s:
        return len(
            (await s.execute(select(AiResult.result_id).where(AiResult.job_id == job_id))).all()
        )


async def _history(domain: JobDomain, job_id: str) -> list[tuple[str | None, str]]:
    evs, _ = await domain.history(job_id)
    return [(e.from_status, e.to_status) for e in evs]


async def test_a_lease_lapsing_after_the_result_read_commits_nothing(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=1)
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    await domain.start(lease)
    learning = domain.learning
    assert isinstance(learning, FakeLearning)
    original = learning.prepare_result

    async def slow_prepare(session: Any, **kw: Any) -> Any:
        # the read has seen the lease live; it lapses before the writes
        await asyncio.sleep(1.3)
        return await original(session, **kw)

    learning.prepare_result = slow_prepare  # type: ignore[method-assign]
    call = _call()
    with pytest.raises(AppError) as caught:
        await domain.submit_result(
            lease,
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[call],
        )
    assert caught.value.code == ErrorCode.LOCK_NOT_HELD
    assert await _result_rows(domain, job.job_id) == 0
    assert (await domain.get(job.job_id)).status == "running"
    assert await _history(domain, job.job_id) == [
        (None, "pending"),
        ("pending", "locked"),
        ("locked", "running"),
    ]
    _, calls = await domain.history(job.job_id)
    assert calls == []


def _call() -> ModelCallInput:
    return ModelCallInput(
        model_provider="",
        model_name="",
        api_key_mode=None,
        credential_id=None,
        prompt_tokens=10,
        completion_tokens=5,
        cache_hit_tokens=0,
        latency_ms=20,
        outcome="succeeded",
    )


class SnapshotTableLearning(FakeLearning):
    """FakeLearning whose snapshots are rows of ``ai_snapshots``, read the batched way."""

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        # the real port's read, never answered from the process's cache
        return replace(ModuleLearningPort().snapshot_read(snapshot_id), view=None)

    def snapshots_read(self, snapshot_ids: Sequence[str]) -> SnapshotsRead:
        return snapshots.snapshots_read(snapshot_ids, cached=False)


async def test_get_snapshot_after_claim_starts_once_and_reads_the_row(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    domain.learning = SnapshotTableLearning()
    job = await new_job(domain)
    assert job.snapshot_id
    await _snapshot_row(domain, job.snapshot_id, "it's")
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)

    # a caller without the lease: nothing starts, no event
    with pytest.raises(AppError) as caught:
        await domain.snapshot(Lease(job.job_id, "intruder", 1))
    assert caught.value.code == ErrorCode.LOCK_NOT_HELD

    view = await domain.snapshot(lease)
    assert view.snapshot_id == job.snapshot_id
    assert view.payload == {"blocks": [{"blockId": "b1", "text": "it's"}]}
    assert (await domain.get(job.job_id)).status == "running"
    again = await domain.snapshot(lease)  # a repeat (one statement at a time): no second event
    assert again.snapshot_id == job.snapshot_id
    assert await _history(domain, job.job_id) == [
        (None, "pending"),
        ("pending", "locked"),
        ("locked", "running"),
    ]


async def test_get_snapshot_of_a_missing_snapshot_starts_nothing(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    domain.learning = SnapshotTableLearning()
    job = await new_job(domain)  # its snapshot has no ai_snapshots row
    await domain.claim("w1", CAPS, 1, 0)
    with pytest.raises(AppError) as caught:
        await domain.snapshot(Lease(job.job_id, "w1", 1))
    assert caught.value.code == ErrorCode.NOT_FOUND
    assert (await domain.get(job.job_id)).status == "locked"
    assert await _history(domain, job.job_id) == [(None, "pending"), ("pending", "locked")]


async def _snapshot_row(domain: JobDomain, snapshot_id: str, text: str) -> None:
    async with domain.sessions() as s, s.begin():
        await s.execute(
            insert(AiSnapshot).values(
                snapshot_id=snapshot_id,
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="",
                schema_version="v1",
                payload={"blocks": [{"blockId": "b1", "text": text}]},
                content_hash=hashlib.sha256(text.encode()).hexdigest(),
                created_at=datetime(2026, 1, 1),
            )
        )


async def test_claim_with_start_reads_the_snapshot_rows_in_its_batch(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    domain.learning = SnapshotTableLearning()
    with_row = [await new_job(domain) for _ in range(2)]
    for i, job in enumerate(with_row):
        assert job.snapshot_id
        await _snapshot_row(domain, job.snapshot_id, f"it's {i}")
    without_row = await new_job(domain)  # its snapshot has no ai_snapshots row
    claimed, views = await domain.claim_started("w1", CAPS, 3, 0)
    assert [j.job_id for j in claimed] == [j.job_id for j in [*with_row, without_row]]
    assert all(j.status == "running" for j in claimed)
    assert set(views) == {j.job_id for j in with_row}
    for i, job in enumerate(with_row):
        assert views[job.job_id].payload == {"blocks": [{"blockId": "b1", "text": f"it's {i}"}]}
    for job in claimed:
        assert job == await domain.get(job.job_id)
        assert await _history(domain, job.job_id) == [
            (None, "pending"),
            ("pending", "locked"),
            ("locked", "running"),
        ]
    # the job without a row is running; its snapshot read answers NOT_FOUND as before
    with pytest.raises(AppError) as caught:
        await domain.snapshot(Lease(without_row.job_id, "w1", 1))
    assert caught.value.code == ErrorCode.NOT_FOUND


async def test_concurrent_claims_with_start_take_disjoint_jobs(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    made = {(await new_job(domain)).job_id for _ in range(30)}
    answers = await asyncio.gather(*(domain.claim_started(f"w{i}", CAPS, 4, 0) for i in range(10)))
    taken = [j for jobs_, _ in answers for j in jobs_]
    assert len(taken) == len({j.job_id for j in taken}) == 30
    assert {j.job_id for j in taken} == made
    for job in taken:
        assert len(await _history(domain, job.job_id)) == 3


async def test_verify_leases_judges_each_lease_from_one_read(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    held, lapsed = (await new_job(domain)).job_id, (await new_job(domain)).job_id
    await domain.claim("w1", CAPS, 2, 0)
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs).where(jobs.c.job_id == lapsed).values(lock_until=domain.clock.plus(-5))
        )
    used, before = await _session_counter(domain.store.engine, "Com_commit")
    verdicts = await domain.verify_leases(
        [
            Lease(held, "w1", 1),
            Lease(held, "w1", 2),
            Lease(lapsed, "w1", 1),
            Lease("nope", "w1", 1),
            Lease(held, "w1", 1),
        ]
    )
    assert await _session_counter(domain.store.engine, "Com_commit") == (used, before + 1)
    codes = [v.code if isinstance(v, AppError) else v.user_id for v in verdicts]
    assert codes == ["u1", "LOCK_NOT_HELD", "LOCK_NOT_HELD", "JOB_NOT_FOUND", "u1"]
    assert verdicts[2].details == {"jobId": lapsed, "attemptNo": 1, "status": "locked"}  # type: ignore[union-attr]
    assert await domain.verify_leases([]) == []


async def test_verify_lease_in_one_round_trip(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain()
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    view = await domain.verify_lease(Lease(job.job_id, "w1", 1))
    assert view.user_id == "u1" and view.model_name == "deepseek-chat"
    with pytest.raises(AppError) as caught:
        await domain.verify_lease(Lease(job.job_id, "w1", 2))
    assert caught.value.code == ErrorCode.LOCK_NOT_HELD
    with pytest.raises(AppError) as caught:
        await domain.verify_lease(Lease(uuid.uuid4().hex, "w1", 1))
    assert caught.value.code == ErrorCode.JOB_NOT_FOUND


async def test_a_result_lands_with_its_call_log_event_and_row(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    call = _call()
    out = await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call],
    )
    assert out.status == "succeeded" and not out.replayed
    replay = await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[call],
    )
    assert replay.replayed and replay.result_id == out.result_id
    assert await _result_rows(domain, job.job_id) == 1
    async with domain.sessions() as s:
        stored = (
            await s.execute(select(AiResult.output).where(AiResult.job_id == job.job_id))
        ).scalar_one()
        logged = (await s.execute(select(func.count()).select_from(invocations))).scalar_one()
        ended = (
            (await s.execute(select(events.c.to_status).where(events.c.job_id == job.job_id)))
            .scalars()
            .all()
        )
        row = (
            await s.execute(
                select(jobs.c.status, jobs.c.lock_until).where(jobs.c.job_id == job.job_id)
            )
        ).one()
    assert stored == ANALYSIS_OUTPUT
    assert logged == 1
    assert ended[-1] == "succeeded" and ended.count("succeeded") == 1
    assert tuple(row) == ("succeeded", None)


async def test_claim_locks_logs_and_reads_a_batch_in_one_round_trip(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain()
    made = [await new_job(domain, user_id=f"u{i}") for i in range(3)]
    claimed = await domain.claim("w1", CAPS, 5, 0)
    # in pick order, each exactly as stored (types included: bools, JSON, datetimes)
    assert [j.job_id for j in claimed] == [j.job_id for j in made]
    for job in claimed:
        assert job == await domain.get(job.job_id)
        assert job.status == "locked" and job.locked_by == "w1" and job.attempt_no == 1
        assert job.cancel_requested is False and isinstance(job.params, dict)
        evs, _ = await domain.history(job.job_id)
        assert [(e.from_status, e.to_status, e.attempt_no, e.actor) for e in evs] == [
            (None, "pending", 0, evs[0].actor),
            ("pending", "locked", 1, "runtime:w1"),
        ]
        assert evs[1].at == job.locked_at
    assert await domain.claim("w2", CAPS, 5, 0) == []


class PreparingLearning(FakeLearning):
    """FakeLearning whose results are prepared, then written with the result's batch:
    one ``ai_runtime_workers`` row per result stands in for its business row."""

    delay = 0.0

    async def prepare_result(self, session: Any, **kw: Any) -> results.PreparedResult:  # type: ignore[override]
        validate_output(kw["job_type"], kw["output_schema_version"], kw["output"])
        await asyncio.sleep(self.delay)
        return results.PreparedResult(
            kw["job_id"],
            kw["job_type"],
            session.dialect.name,
            workers,
            [{**_worker(f"biz-{kw['job_id']}"), "capabilities": []}],
        )


async def _business_rows(engine: AsyncEngine, job_id: str) -> int:
    return sum(1 for w in await _worker_ids(engine) if w == f"biz-{job_id}")


async def test_business_rows_go_in_the_results_batch(
    make_domain: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    domain: JobDomain = await make_domain()
    domain.learning = PreparingLearning()

    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    await domain.start(lease)
    used, commits = await _session_counter(domain.store.engine, "Com_commit")
    out = await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[_call()],
    )
    assert out.status == "succeeded"
    assert await _session_counter(domain.store.engine, "Com_commit") == (used, commits + 1)
    assert await _business_rows(domain.store.engine, job.job_id) == 1
    assert await _result_rows(domain, job.job_id) == 1


async def test_a_lease_lapsing_after_the_rows_are_prepared_writes_none_of_them(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=1)
    learning = PreparingLearning()
    learning.delay = 1.3  # the read saw the lease live; it lapses before the batch
    domain.learning = learning
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    await domain.start(lease)
    with pytest.raises(AppError) as caught:
        await domain.submit_result(
            lease,
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[_call()],
        )
    assert caught.value.code == ErrorCode.LOCK_NOT_HELD
    assert await _business_rows(domain.store.engine, job.job_id) == 0
    assert await _result_rows(domain, job.job_id) == 0
    assert (await domain.get(job.job_id)).status == "running"


def test_a_generation_plans_outcome_goes_in_the_results_batch_after_its_rows() -> None:
    rows = [{"id": "r1"}, {"id": "r2"}]
    quiz = results.PreparedResult("j1", "quiz_generation", "mariadb", workers, rows)
    *inserts, plan = quiz.statements()
    assert [s.params for s in inserts] == rows
    assert plan.key is not None and plan.key[0] == "plan_outcome"
    assert plan.params["p_job_id"] == "j1" and plan.params["p_generated"] == 2
    analysis = results.PreparedResult("j1", "learning_state_analysis", "mariadb", workers, rows)
    assert [s.params for s in analysis.statements()] == rows


async def test_a_call_in_another_key_mode_refuses_the_batched_result_whole(
    make_domain: Callable[..., Any],
) -> None:
    """The batched result path checks its calls before anything is sent: a user-key
    call on a platform-key job (it would escape the daily budget) leaves no row."""
    domain: JobDomain = await make_domain()
    domain.learning = PreparingLearning()
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    lease = Lease(job.job_id, "w1", 1)
    stray = replace(_call(), api_key_mode="user_deepseek_key")
    with pytest.raises(AppError) as err:
        await domain.submit_result(
            lease,
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=ANALYSIS_OUTPUT,
            calls=[_call(), stray],
        )
    assert (err.value.code, err.value.details) == ("INVALID_ARGUMENT", {"field": "apiKeyMode"})
    assert await _result_rows(domain, job.job_id) == 0
    assert await _business_rows(domain.store.engine, job.job_id) == 0
    assert (await domain.history(job.job_id))[1] == []
    assert (await domain.get(job.job_id)).status in ("locked", "running")
