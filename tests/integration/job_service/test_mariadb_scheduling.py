"""MariaDB specifics: M1–M3, claim disjointness, EXPLAIN of the poll/claim query (docs/reference/cases.md)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text

from airuntime_common.errors import AppError
from job_service.lifecycle import Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.core import new_id
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateJobInput
from job_service.store import scheduling
from job_service.store.tables import admission_locks, events, jobs
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT

pytestmark = pytest.mark.mysql
CAPS_A = ["learning_state_analysis", "weak_point_analysis"]
CAPS_B = ["weak_point_analysis", "next_action_planning"]


async def _bulk_pending(domain: JobDomain, n: int, types: list[str]) -> None:
    rows = [
        {
            "job_id": new_id(),
            "user_id": f"u{i % 50}",
            "job_type": types[i % len(types)],
            "target_type": "user",
            "target_id": f"u{i % 50}",
            "status": "pending",
            "priority": i % 3,
            "params": {},
            "api_key_mode": "platform_key",
            "model_provider": "deepseek",
            "model_name": "deepseek-chat",
            "attempt_no": 0,
            "retry_count": 0,
            "max_retry_count": 3,
            "timeout_seconds": 120,
            "cancel_requested": False,
        }
        for i in range(n)
    ]
    async with domain.sessions() as s, s.begin():
        now = domain.clock.now()
        for chunk in range(0, n, 1000):
            await s.execute(
                insert(jobs).values(available_at=now, created_at=now, updated_at=now),
                rows[chunk : chunk + 1000],
            )


async def test_m3_racing_creates_on_mariadb(domain: JobDomain) -> None:
    async def one() -> tuple[str, bool]:
        job, replayed = await domain.create(
            CreateJobInput(
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="u1",
                idempotency_key="race",
            )
        )
        return job.job_id, replayed

    answers = await asyncio.gather(*(one() for _ in range(50)))
    assert len({j for j, _ in answers}) == 1
    assert sum(1 for _, r in answers if not r) == 1
    async with domain.sessions() as s:
        assert (await s.execute(select(func.count()).select_from(jobs))).scalar_one() == 1


async def test_m2_disjoint_claims_while_one_claim_tx_is_open(domain: JobDomain) -> None:
    await _bulk_pending(
        domain, 3000, ["learning_state_analysis", "weak_point_analysis", "next_action_planning"]
    )
    # A third worker holds its claim transaction open (rows locked, not committed).
    async with domain.sessions() as holder, holder.begin():
        held = (
            (
                await holder.execute(
                    select(jobs.c.job_id)
                    .where(*scheduling.claimable(domain.clock), jobs.c.job_type.in_(CAPS_A))
                    .order_by(*scheduling.TAKE_ORDER)  # a claim's own order: index-backed
                    .limit(20)
                    .with_for_update(skip_locked=True)
                )
            )
            .scalars()
            .all()
        )
        assert len(held) == 20

        async def claimer(name: str, caps: list[str]) -> list[str]:
            got: list[str] = []
            for _ in range(5):
                got += [j.job_id for j in await domain.claim(name, caps, 50, 0)]
            return got

        results = await asyncio.wait_for(
            asyncio.gather(*(claimer(f"w{i}", CAPS_A if i % 2 else CAPS_B) for i in range(8))), 30
        )
    flat = [j for r in results for j in r]
    assert all(results), "every claimer got a non-empty batch"
    assert len(flat) == len(set(flat)), "batches are disjoint"
    assert not set(flat) & set(held)
    async with domain.sessions() as s:
        locks = (
            await s.execute(
                select(func.count()).select_from(events).where(events.c.to_status == "locked")
            )
        ).scalar_one()
    assert locks == len(flat)


@pytest.mark.parametrize("for_claim", [False, True])
async def test_explain_uses_index_without_filesort(domain: JobDomain, for_claim: bool) -> None:
    await _bulk_pending(
        domain, 3000, ["learning_state_analysis", "quiz_generation", "flashcard_generation"]
    )
    async with domain.sessions() as s, s.begin():
        # finished jobs dominate a real table
        await s.execute(text("UPDATE ai_runtime_jobs SET status='succeeded' WHERE seq % 10 <> 0"))
        await s.execute(text("ANALYZE TABLE ai_runtime_jobs"))
    q = scheduling.poll_pending.get(domain.clock).params(
        caps=["learning_state_analysis", "quiz_generation"], n=50
    )
    if for_claim:
        q = q.with_for_update(skip_locked=True)
    async with domain.sessions() as s:
        compiled = q.compile(s.bind, compile_kwargs={"literal_binds": True})
        rows = (await s.execute(text(f"EXPLAIN {compiled}"))).mappings().all()
    plan = " | ".join(f"{r['key']} {r['Extra']}" for r in rows)
    assert rows[0]["key"] == "ix_jobs_poll", plan
    assert "filesort" not in (rows[0]["Extra"] or "").lower(), plan


async def test_m1_producers_and_claimers_short(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(LOCK_LEASE_SECONDS=2, MAX_RETRY_COUNT=1)
    reaper = Reaper(domain.core)
    stop = asyncio.Event()
    created: list[str] = []

    async def producer(i: int) -> None:
        n = 0
        while not stop.is_set():
            job, _ = await domain.create(
                CreateJobInput(
                    user_id=f"p{i}",
                    job_type="learning_state_analysis",
                    target_type="user",
                    target_id=f"p{i}",
                )
            )
            created.append(job.job_id)
            n += 1
            await asyncio.sleep(0.01)

    async def worker(i: int) -> None:
        name = f"w{i}"
        while not stop.is_set() or (await domain.poll(name, ["learning_state_analysis"], 1, 0)):
            for job in await domain.claim(name, ["learning_state_analysis"], 3, 200):
                lease = Lease(job.job_id, name, job.attempt_no)
                r = random.random()
                if r < 0.1:
                    continue  # "crash": the reaper takes it back
                try:
                    if r < 0.2:
                        await domain.fail(lease, error_code="NETWORK_ERROR", error_message="")
                    else:
                        await domain.submit_result(
                            lease,
                            prompt_version=None,
                            output_schema_version="v1",
                            output=ANALYSIS_OUTPUT,
                        )
                except AppError as err:  # the lease lapsed under load: stop, as a worker must
                    assert err.code == "LOCK_NOT_HELD"

    stop_reaper = asyncio.Event()
    reaper_task = asyncio.create_task(_reap(reaper, stop_reaper))
    tasks = [asyncio.create_task(producer(i)) for i in range(10)] + [
        asyncio.create_task(worker(i)) for i in range(10)
    ]
    await asyncio.sleep(4)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    # drain: let leases of "crashed" attempts lapse and be reaped/finished
    for _ in range(60):
        async with domain.sessions() as s:
            open_jobs = (
                await s.execute(
                    select(func.count())
                    .select_from(jobs)
                    .where(jobs.c.status.in_(["pending", "locked", "running"]))
                )
            ).scalar_one()
        if open_jobs == 0:
            break
        for job in await domain.claim("drain", ["learning_state_analysis"], 50, 0):
            await domain.submit_result(
                Lease(job.job_id, "drain", job.attempt_no),
                prompt_version=None,
                output_schema_version="v1",
                output=ANALYSIS_OUTPUT,
            )
        await asyncio.sleep(0.2)
    stop_reaper.set()
    await reaper_task
    async with domain.sessions() as s:
        statuses: dict[str, int] = dict(
            (await s.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))).all()
        )
        over = (
            await s.execute(
                select(func.count())
                .select_from(jobs)
                .where(jobs.c.retry_count > jobs.c.max_retry_count)
            )
        ).scalar_one()
    assert set(statuses) <= {"succeeded", "failed"}, statuses
    assert sum(statuses.values()) == len(created) >= 20
    assert over == 0


async def _reap(reaper: Reaper, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await reaper.sweep()
        await asyncio.sleep(0.1)


async def test_a_pool_of_dead_connections_is_retried_before_commit(domain: JobDomain) -> None:
    """The job engine pings only idle connections (IDLE_PING_SECONDS); a busy one whose
    server thread is gone fails at its first statement, before any COMMIT, and
    ``JobDomain.tx`` runs the transaction again on a fresh connection."""
    # warm several pooled connections
    await asyncio.gather(*(domain.get_authorization(f"warm-{i}") for i in range(4)))
    job, _ = await domain.create(
        CreateJobInput(
            user_id="u-dead", job_type="learning_state_analysis", target_type="user", target_id=""
        )
    )
    async with domain.sessions() as s:
        database = (await s.execute(text("SELECT DATABASE()"))).scalar_one()
        own = (await s.execute(text("SELECT CONNECTION_ID()"))).scalar_one()
        ids = (
            await s.execute(
                text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db AND ID <> :own"),
                {"db": database, "own": own},
            )
        ).scalars()
        victims = list(ids)
        for victim in victims:
            await s.execute(text(f"KILL CONNECTION {int(victim)}"))
    assert victims, "expected pooled connections to kill"
    # at once (well under IDLE_PING_SECONDS): each of these may draw a dead connection
    claimed = await domain.claim("w-dead", ["learning_state_analysis"], 5, 0)
    assert [j.job_id for j in claimed] == [job.job_id]
    lease = Lease(job.job_id, "w-dead", 1)
    outcome = await domain.submit_result(
        lease, prompt_version=None, output_schema_version="v1", output=ANALYSIS_OUTPUT
    )
    assert outcome.status == "succeeded"


async def test_known_admission_rows_are_bounded(
    domain: JobDomain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-process memory of admission lock rows is an LRU: a long run with
    ever new users stays bounded, and a forgotten user's next create still works."""
    known = domain.admission.admission_rows
    monkeypatch.setattr(known, "max_entries", 3)
    users = [f"adm-{n}" for n in range(6)]
    for user in [*users, users[0]]:
        await domain.create(
            CreateJobInput(
                user_id=user,
                job_type="learning_state_analysis",
                target_type="user",
                target_id=user,
                idempotency_key=f"k-{user}-{len(known)}",
            )
        )
        assert len(known) <= 3
    assert list(known.keys()) == [users[4], users[5], users[0]]
    async with domain.sessions() as s:
        rows = (await s.execute(select(func.count()).select_from(admission_locks))).scalar_one()
        created = (await s.execute(select(func.count()).select_from(jobs))).scalar_one()
    assert rows == 6 and created == 7


@pytest.mark.parametrize("held", [1, 2, 10])
async def test_a_heartbeat_reads_only_its_own_leases(domain: JobDomain, held: int) -> None:
    """The renew UPDATE of ``held`` leases, among 120 live ones, finds its rows by
    job id: with a single pair, MariaDB's planner used to range over every live
    lease (``ix_jobs_reaper``) for the row constructor, locking them all; with ten,
    it may intersect the holder's and the states' indexes (every live lease of the
    holder) once the row is wide enough. The heartbeat's own statements are
    explained (``renew_many``, ``held_leases``)."""
    from job_service.store.statements import held_leases
    from job_service.store.transitions import renew_many

    await _bulk_pending(domain, 150, CAPS_A)
    claimed = [j for _ in range(3) for j in await domain.claim("w1", CAPS_A, 40, 0)]
    assert len(claimed) == 120
    ids = [j.job_id for j in claimed]
    async with domain.sessions() as s, s.begin():
        await s.execute(jobs.update().where(jobs.c.job_id.in_(ids)).values(status="running"))
        await s.execute(text("ANALYZE TABLE ai_runtime_jobs"))
    refs = [(j, 1) for j in ids[:held]]
    renew = renew_many(domain.clock, instance_id="w1", refs=refs, lease_seconds=60).statement()
    for stmt in (renew, held_leases(domain.clock, "w1", refs)):
        async with domain.store.engine.connect() as conn:
            sql = str(stmt.compile(conn.sync_connection, compile_kwargs={"literal_binds": True}))
            plan = (await conn.execute(text("EXPLAIN " + sql))).mappings().all()
        assert [row["key"] for row in plan] == ["uq_ai_runtime_jobs_job_id"], plan
        assert int(plan[0]["rows"]) <= held, plan


async def _explain_list(domain: JobDomain, **filters: Any) -> tuple[list[Any], str]:
    """Run list_jobs, then EXPLAIN the SELECT it sent; returns (plan rows, next token)."""
    from sqlalchemy import event

    sent: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "ai_runtime_jobs" in statement:
            sent.append((statement, parameters))

    sync = domain.store.engine.sync_engine
    event.listen(sync, "before_cursor_execute", seen)
    try:
        args: dict[str, Any] = {"user_id": None, "status": None, "job_type": None}
        args.update(filters)
        _, token = await domain.list_jobs(page_size=20, page_token="", **args)
    finally:
        event.remove(sync, "before_cursor_execute", seen)
    [(sql, params)] = sent
    async with domain.store.engine.connect() as conn:
        plan = (await conn.exec_driver_sql("EXPLAIN " + sql, params)).mappings().all()
    return list(plan), token


async def test_job_lists_read_a_page_not_the_table(domain: JobDomain) -> None:
    """A user's list walks ix_jobs_user and a status list ix_jobs_status_seq, in
    order: no filesort, no walk of the whole primary key, whatever the table holds."""
    await _bulk_pending(domain, 3000, CAPS_A)  # users u0..u49, 60 jobs each
    async with domain.sessions() as s, s.begin():
        await s.execute(jobs.update().where(jobs.c.seq % 100 == 0).values(status="failed"))
        await s.execute(text("ANALYZE TABLE ai_runtime_jobs"))
    plan, _ = await _explain_list(domain, user_id="u7")
    assert [(p["key"], "filesort" in (p["Extra"] or "")) for p in plan] == [
        ("ix_jobs_user", False)
    ], plan
    plan, _ = await _explain_list(domain, status="failed")
    assert [(p["key"], "filesort" in (p["Extra"] or "")) for p in plan] == [
        ("ix_jobs_status_seq", False)
    ], plan


async def test_a_users_pages_cover_their_jobs_once_in_order(domain: JobDomain) -> None:
    """Pages of one user's jobs, many sharing one created_at (one INSERT): seq breaks
    the ties, so every job comes exactly once, newest first."""
    await _bulk_pending(domain, 500, CAPS_A)  # 10 per user, one created_at
    await _bulk_pending(domain, 500, CAPS_A)  # 10 more, a later created_at
    seen: list[Any] = []
    token = ""
    while True:
        page, token = await domain.list_jobs(
            user_id="u3", status=None, job_type=None, page_size=3, page_token=token
        )
        seen.extend(page)
        if not token:
            break
    keys = [(j.created_at, j.seq) for j in seen]
    assert len(seen) == 20 and len({j.job_id for j in seen}) == 20
    assert keys == sorted(keys, reverse=True)
