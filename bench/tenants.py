"""The ``tenants`` scenario (reference §10.1): the fair order at scale, against ``fifo``.

1. **Scale**: two fresh MariaDB databases, one system each (no worker), one with
   ``SCHEDULING_POLICY=fair`` and one with ``fifo``; each holds the same rows: one
   user with a backlog of ``tenants_backlog`` jobs, ``tenants_users`` users with
   ``tenants_waiting_each`` waiting jobs each, and finished jobs up to
   ``tenants_rows`` rows in all. The waiting jobs are copies of one job made through
   CreateJob, each user's made one after another, with the virtual starts the create
   path gives them under each policy (fair: a user's k-th waiting job starts at k;
   fifo: every job at the same ``V``). Then, after ANALYZE and once InnoDB has
   settled: the EXPLAIN of the claim's pick, the poll, the create's fair-start read
   the parking lot's take-back and its forgetting of old grants (each compiled from job_service's own statement),
   and the claims per second of 16 concurrent claimers (ClaimJobs, one job each)
   on each system in turn, ``tenants_rounds`` rounds of ``tenants_claim_seconds``,
   the order flipped every round; with them, the users of the first 1,000 jobs
   claimed (fair: every user in turn; fifo: the oldest users' whole queues), and
   the creates' p50/p99 (the fair start's reads are on the create path).
2. **Lone users**: per policy, one worker of 16 slots and a model answering in
   200 ms, a user with a backlog of ``tenants_backlog`` jobs (and more, so that
   the backlog stays over it while measured); users with no job create one each,
   one a second: the seconds from each create to its start (database clock).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack, ExitStack
from typing import TYPE_CHECKING, Any, cast

from airuntime_common.enums import JOB_TYPE, JOB_TYPES
from bench import growth
from bench.harness import System, fresh_database, summary_ms
from job_service.store import scheduling as sched
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

if TYPE_CHECKING:
    from bench.scenarios import Params

POLICIES = ("fair", "fifo")
#: Concurrent claimers of the claims-per-second phase (a worker's 16 slots).
CLAIMERS = 16
#: Jobs whose users are counted at the head of the claims.
HEAD = 1000
#: The model's answer time in the lone-user phase (ms), and the worker's slots.
LONE_MODEL_MS = 200
LONE_SLOTS = 16
#: Lone users measured per policy (fifo's wait the whole backlog: fewer).
LONE_USERS = {"fair": 10, "fifo": 3}
#: The longest a lone user's job is waited for (s).
LONE_LIMIT_S = 300.0
#: The heavy user's name.
HEAVY = "tenant-heavy"


def _copies(
    system: System,
    template: str,
    user_sql: str,
    users: int,
    each: int,
    fair: bool,
    older_by_us: int,
) -> None:
    """``users`` × ``each`` pending copies of job ``template`` (its snapshot), user
    ``user_sql`` (SQL over the sequence ``u``), each user's jobs made one after
    another, every user after the previous, the last one ``older_by_us`` µs ago;
    virtual starts as the create path gives them under ``fair`` or ``fifo``."""
    total = users * each
    vstart = "k.seq" if fair else "0"
    system.sql(
        "INSERT INTO ai_runtime_jobs (job_id, user_id, job_type, target_type, target_id,"
        " snapshot_id, status, priority, vstart, params, api_key_mode, credential_id,"
        " model_provider, model_name, attempt_no, retry_count, max_retry_count,"
        " timeout_seconds, cancel_requested, available_at, created_at, updated_at)"
        f" SELECT REPLACE(UUID(),'-',''), {user_sql}, job_type, target_type, {user_sql},"
        f" snapshot_id, 'pending', priority, {vstart}, params, api_key_mode, credential_id,"
        " model_provider, model_name, 0, 0, max_retry_count, timeout_seconds, 0,"
        " UTC_TIMESTAMP(6) - INTERVAL 1 DAY,"
        f" UTC_TIMESTAMP(6) - INTERVAL ({total} - (u.seq * {each} + k.seq) + {older_by_us})"
        " MICROSECOND, UTC_TIMESTAMP(6)"
        f" FROM ai_runtime_jobs t JOIN seq_0_to_{users - 1} u JOIN seq_0_to_{each - 1} k"
        " WHERE t.job_id = %s",
        (template,),
    )


async def _fill(system: System, p: Params, policy: str) -> dict[str, Any]:
    """The scale phase's rows on ``system`` (see the module); returns counts and seconds."""
    t0 = time.perf_counter()
    template = await system.create_job("tenant-template")
    waiting = p.tenants_users * p.tenants_waiting_each + p.tenants_backlog
    finished = max(1, p.tenants_rows - waiting)
    await asyncio.to_thread(growth.grow_finished, system, finished)
    fair = policy == "fair"
    at_once = max(1, 100_000 // p.tenants_waiting_each)  # users per INSERT … SELECT
    await asyncio.to_thread(
        _copies,
        system,
        template,
        f"'{HEAVY}'",
        1,
        p.tenants_backlog,
        fair,
        p.tenants_users * p.tenants_waiting_each + 1_000_000,
    )
    for first in range(0, p.tenants_users, at_once):
        n = min(at_once, p.tenants_users - first)
        await asyncio.to_thread(
            _copies,
            system,
            template,
            f"CONCAT('tenant-', u.seq + {first})",
            n,
            p.tenants_waiting_each,
            fair,
            (p.tenants_users - first - n) * p.tenants_waiting_each,
        )
    system.sql("DELETE FROM ai_runtime_jobs WHERE job_id = %s", (template,))
    await asyncio.to_thread(system.sql, "ANALYZE TABLE ai_runtime_jobs")
    [(rows, pending, users)] = system.sql(
        "SELECT COUNT(*), SUM(status = 'pending'),"
        " (SELECT COUNT(DISTINCT user_id) FROM ai_runtime_jobs WHERE status = 'pending')"
        " FROM ai_runtime_jobs"
    )
    return {
        "rows": int(rows),
        "waiting_jobs": int(pending),
        "users_waiting": int(users),
        "fill_s": round(time.perf_counter() - t0, 1),
    }


def statements() -> dict[str, str]:
    """The statements EXPLAINed, as MariaDB SQL (job_service's, values inlined)."""
    clock = growth.MARIADB
    caps = list(JOB_TYPES)
    return {
        "claim": growth.claim_sql(),
        "poll": growth.compiled(sched.poll_pending.get(clock), caps=caps, n=10),
        "fair_start": growth.compiled(
            sched.fair_start.get(clock), a_user="tenant-42", f_priority=0
        ),
        "take_back_parked": growth.compiled(sched.unpark.get(clock), n=100),
        "forget_old_grants": growth.compiled(sched.forget_old_grants.get(clock)),
    }


async def _claims(system: System, seconds: float, head: list[str]) -> dict[str, Any]:
    """``CLAIMERS`` loops of ClaimJobs (one job each) for ``seconds``: claims and their
    latencies; the users of the jobs claimed are appended to ``head`` up to
    :data:`HEAD`."""
    caps = cast(Any, [JOB_TYPE.to_proto(t) for t in JOB_TYPES])
    stub = system.stub
    assert stub is not None
    took: list[float] = []
    claimed = 0
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds

    async def claimer(i: int) -> None:
        nonlocal claimed
        md = system.md(f"bench-claimer-{i}")
        while loop.time() < stop:
            t0 = time.perf_counter()
            reply = await stub.ClaimJobs(
                rr.ClaimJobsRequest(capabilities=caps, limit=1, wait_ms=0), metadata=md
            )
            took.append(time.perf_counter() - t0)
            claimed += len(reply.jobs)
            for job in reply.jobs:
                if len(head) < HEAD:
                    head.append(str(job.user_id))

    t0 = time.perf_counter()
    await asyncio.gather(*(claimer(i) for i in range(CLAIMERS)))
    elapsed = time.perf_counter() - t0
    return {"claims": claimed, "seconds": elapsed, "latency_s": took}


async def _creates(system: System, n: int, offset: int) -> list[float]:
    """Seconds of ``n`` creates, one at a time, by users who hold waiting jobs."""
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        await system.create_job(f"tenant-{(offset + i * 37) % 1000}")
        took.append(time.perf_counter() - t0)
    return took


async def scale(p: Params) -> dict[str, Any]:
    """Phase 1 (see the module)."""
    out: dict[str, Any] = {}
    env = {"LOCK_LEASE_SECONDS": "3600"}  # the claims are never renewed or ended
    with ExitStack() as databases:
        async with AsyncExitStack() as stack:
            systems: dict[str, System] = {}
            for policy in POLICIES:
                url = databases.enter_context(fresh_database(p.base_url))
                system = await stack.enter_async_context(
                    System(url, workers=0, extra_env={**env, "SCHEDULING_POLICY": policy})
                )
                systems[policy] = system
                out[policy] = await _fill(system, p, policy)
            out["innodb_settle"] = await asyncio.to_thread(
                growth.settle_innodb, systems[POLICIES[-1]], p.settle_limit_s
            )
            sqls = statements()
            plans = {name: growth.explain(systems["fair"], sql) for name, sql in sqls.items()}
            out["explain"] = plans
            out["explain_sql"] = sqls
            out["index_backed"] = {name: growth.index_backed(plan) for name, plan in plans.items()}
            heads: dict[str, list[str]] = {policy: [] for policy in POLICIES}
            runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in POLICIES}
            creates: dict[str, list[float]] = {policy: [] for policy in POLICIES}
            for r in range(p.tenants_rounds):
                order = POLICIES if r % 2 == 0 else tuple(reversed(POLICIES))
                for policy in order:
                    runs[policy].append(
                        await _claims(systems[policy], p.tenants_claim_seconds, heads[policy])
                    )
                    creates[policy] += await _creates(systems[policy], 50, r * 50)
            for policy in POLICIES:
                claims = sum(x["claims"] for x in runs[policy])
                seconds = sum(x["seconds"] for x in runs[policy])
                out[policy].update(
                    {
                        "claims": claims,
                        "claims_per_s": round(claims / seconds, 1),
                        "claim_latency": summary_ms(
                            [t for x in runs[policy] for t in x["latency_s"]]
                        ),
                        "create_latency": summary_ms(creates[policy]),
                        "users_in_first_claims": len(set(heads[policy])),
                        "first_claims": len(heads[policy]),
                    }
                )
    out["fair_to_fifo_claims_per_s"] = round(
        out["fair"]["claims_per_s"] / out["fifo"]["claims_per_s"], 3
    )
    return out


async def _lone(p: Params, policy: str) -> dict[str, Any]:
    """Phase 2 for ``policy`` (see the module)."""
    env = {
        "SCHEDULING_POLICY": policy,
        "WORKER_CONCURRENCY": str(LONE_SLOTS),
        "STANDIN_DELAY_MS": str(LONE_MODEL_MS),
    }
    lone = LONE_USERS[policy]
    # enough that the backlog stays above tenants_backlog while the lone users are measured
    rate = LONE_SLOTS * 1000 / LONE_MODEL_MS
    backlog = p.tenants_backlog + int(rate * (lone + 2))
    with fresh_database(p.base_url) as url:
        async with System(url, workers=1, extra_env=env) as system:
            template = await system.create_job(HEAVY)
            await asyncio.to_thread(
                _copies, system, template, f"'{HEAVY}'", 1, backlog, policy == "fair", 0
            )
            await asyncio.sleep(2.0)  # the worker busy with the backlog
            made = []
            for i in range(lone):
                made.append(await system.create_job(f"tenant-lone-{i}"))
                await asyncio.sleep(1.0)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + LONE_LIMIT_S
            waits: list[float] = []
            while loop.time() < deadline:
                rows = system.sql(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, started_at) / 1e6"
                    " FROM ai_runtime_jobs WHERE job_id IN ("
                    + ",".join(["%s"] * len(made))
                    + ") AND started_at IS NOT NULL",
                    tuple(made),
                )
                if len(rows) == len(made):
                    waits = [float(r[0]) for r in rows]
                    break
                await asyncio.sleep(0.5)
            [(left,)] = system.sql(
                "SELECT COUNT(*) FROM ai_runtime_jobs WHERE user_id = %s AND status = 'pending'",
                (HEAVY,),
            )
    return {
        "lone_users": lone,
        "started": len(waits),
        "backlog_at_start": backlog,
        "backlog_left_at_end": int(left),
        "create_to_start_s": {
            "max": round(max(waits), 3) if waits else None,
            "mean": round(sum(waits) / len(waits), 3) if waits else None,
        },
    }


async def tenants(p: Params) -> dict[str, Any]:
    """The ``tenants`` scenario (see the module)."""
    out: dict[str, Any] = {
        "params": {
            "users": p.tenants_users,
            "waiting_each": p.tenants_waiting_each,
            "backlog": p.tenants_backlog,
            "rows": p.tenants_rows,
            "claimers": CLAIMERS,
            "rounds": p.tenants_rounds,
            "claim_seconds": p.tenants_claim_seconds,
            "lone_model_ms": LONE_MODEL_MS,
            "lone_slots": LONE_SLOTS,
        }
    }
    out["scale"] = await scale(p)
    out["lone"] = {policy: await _lone(p, policy) for policy in POLICIES}
    return out
