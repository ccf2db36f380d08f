"""Growing a benchmark database to scale, letting InnoDB settle, and EXPLAINing the
services' own statements on it (the ``poll_scale`` and ``tenants`` scenarios).

The statements EXPLAINed are job_service's, compiled for MariaDB with their values
inlined (:func:`compiled`), so a plan printed is the plan of the query the services
run, never a copy of it.
"""

from __future__ import annotations

import time
from copy import deepcopy
from decimal import Decimal
from typing import Any

from sqlalchemy.dialects import mysql

from airuntime_common.enums import JOB_TYPES
from bench.harness import System
from job_service.store.clock import DbClock
from job_service.store.scheduling import claim_pick

#: The clock of the statements compiled for MariaDB.
MARIADB = DbClock("mysql")


def compiled(stmt: Any, **values: Any) -> str:
    """``stmt`` (a SQLAlchemy statement of job_service's) as MariaDB SQL text, with
    ``values`` bound and inlined (expanding lists too, in subqueries too).

    The statement is copied first: job_service's cached statement is left as it is."""
    dialect = mysql.dialect()
    copy = deepcopy(stmt)
    for param in copy.compile(dialect=dialect).binds.values():
        if param.key in values:
            param.value = values[param.key]
    return str(copy.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def claim_sql(limit: int = 10) -> str:
    """The claim's pick (:data:`job_service.store.scheduling.claim_pick`) of every job
    type, at most ``limit`` jobs, as MariaDB SQL."""
    return compiled(claim_pick.get(MARIADB), caps=list(JOB_TYPES), n=limit)


def explain(system: System, sql: str) -> list[dict[str, str]]:
    """MariaDB's ``EXPLAIN`` of ``sql`` on ``system``'s database, one dict per row."""
    return [
        dict(zip(EXPLAIN_COLUMNS, map(str, r), strict=False)) for r in system.sql("EXPLAIN " + sql)
    ]


def index_backed(plan: list[dict[str, str]]) -> bool:
    """Whether every table an EXPLAIN reads is read through an index range or lookup:
    none is read whole (``type`` ``ALL``, or ``index``: every entry of an index) or
    sorted after the read (``Using filesort``). A derived table (``<derived…>``, the
    few rows a subquery materialized) is read whole by design and not counted."""
    return all(
        r.get("type") not in ("ALL", "index") and "filesort" not in r.get("extra", "")
        for r in plan
        if r.get("table") not in (None, "None", "NULL")
        and not str(r.get("table")).startswith("<derived")
    )


def grow_finished(system: System, target: int) -> float:
    """Double finished rows with INSERT … SELECT until ``target``; returns seconds taken."""
    t0 = time.perf_counter()
    cols = (
        "user_id, job_type, target_type, target_id, status, priority, params, api_key_mode,"
        " model_provider, model_name, attempt_no, retry_count, max_retry_count, timeout_seconds,"
        " cancel_requested, available_at, created_at, updated_at, started_at, finished_at, locked_at"
    )
    have = int(system.sql("SELECT COUNT(*) FROM ai_runtime_jobs WHERE status='succeeded'")[0][0])
    if have == 0:
        system.sql(
            f"INSERT INTO ai_runtime_jobs (job_id, {cols}) VALUES (REPLACE(UUID(),'-',''),"
            " 'old-0', 'learning_state_analysis', 'user', 'old-0', 'succeeded', 100, '{}',"
            " 'platform_key', 'deepseek', 'deepseek-chat', 1, 0, 3, 120, 0,"
            " UTC_TIMESTAMP(6) - INTERVAL 2 DAY, UTC_TIMESTAMP(6) - INTERVAL 2 DAY,"
            " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 2 DAY, UTC_TIMESTAMP(6),"
            " UTC_TIMESTAMP(6) - INTERVAL 2 DAY)"
        )
        have = 1
    while have < target:
        k = min(have, target - have)
        system.sql(
            f"INSERT INTO ai_runtime_jobs (job_id, {cols}) SELECT REPLACE(UUID(),'-',''), {cols}"
            f" FROM ai_runtime_jobs WHERE status='succeeded' LIMIT {k}"
        )
        have += k
    return time.perf_counter() - t0


def grow_calls(system: System, target: int) -> float:
    """Double today's platform-key invocation log with INSERT … SELECT until ``target``
    rows (one call per finished job, all logged today: the daily budget's worst case),
    adding their cost to the day's running total as the services do; returns seconds."""
    t0 = time.perf_counter()
    cols = (
        "job_id, job_type, attempt_no, model_provider, model_name, api_key_mode,"
        " prompt_tokens, completion_tokens, cache_hit_tokens, latency_ms, outcome, cost_usd"
    )
    cost = "0.00010000"
    have = int(system.sql("SELECT COUNT(*) FROM ai_runtime_invocation_logs")[0][0])
    start = have
    if have == 0:
        system.sql(
            f"INSERT INTO ai_runtime_invocation_logs (id, {cols}, created_at) VALUES"
            " (REPLACE(UUID(),'-',''), 'old-0', 'learning_state_analysis', 1, 'deepseek',"
            f" 'deepseek-chat', 'platform_key', 300, 200, 0, 900, 'succeeded', {cost},"
            " UTC_TIMESTAMP(6))"
        )
        have = 1
    while have < target:
        k = min(have, target - have)
        system.sql(
            f"INSERT INTO ai_runtime_invocation_logs (id, {cols}, created_at)"
            f" SELECT REPLACE(UUID(),'-',''), {cols}, UTC_TIMESTAMP(6)"
            f" FROM ai_runtime_invocation_logs LIMIT {k}"
        )
        have += k
    added = have - start
    system.sql(
        "INSERT INTO ai_runtime_platform_spend (day, shard, cost_usd, calls, updated_at)"
        " VALUES (UTC_DATE(), 0, %s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE"
        " cost_usd = cost_usd + VALUES(cost_usd), calls = calls + VALUES(calls)",
        (Decimal(cost) * added, added),
    )
    return time.perf_counter() - t0


def settle_innodb(system: System, limit_s: float = 300.0) -> dict[str, Any]:
    """Wait (blocking) until InnoDB is done with what the bulk growth left: no page
    flushed for two consecutive one-second samples (or at most 2 % of the pool dirty)
    and an undo history under 1000 transactions, or ``limit_s`` seconds. Returns the
    wait (s), whether InnoDB settled before the limit, and the final counts.

    A bulk INSERT … SELECT of millions of rows leaves minutes of background flushing
    and purge; measured during it, a big table's p99 is the flusher's, not the query's.
    An idle MariaDB may keep most of its pool dirty indefinitely, so the test is that
    flushing has stopped, not that nothing is dirty.
    """
    t0 = time.perf_counter()
    flushed_before: int | None = None
    quiet = 0
    while True:
        status = {
            str(k): int(v)
            for k, v in system.sql(
                "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_buffer_pool_pages_dirty',"
                " 'Innodb_buffer_pool_pages_total', 'Innodb_buffer_pool_pages_flushed',"
                " 'Innodb_history_list_length')"
            )
        }
        dirty = status.get("Innodb_buffer_pool_pages_dirty", 0)
        total = max(1, status.get("Innodb_buffer_pool_pages_total", 1))
        flushed = status.get("Innodb_buffer_pool_pages_flushed", 0)
        history = status.get("Innodb_history_list_length", 0)
        quiet = quiet + 1 if flushed == flushed_before or dirty <= 0.02 * total else 0
        flushed_before = flushed
        waited = time.perf_counter() - t0
        settled = quiet >= 2 and history < 1000
        if settled or waited >= limit_s:
            return {
                "settled": settled,
                "settle_s": round(waited, 1),
                "dirty_pages": dirty,
                "pool_pages": total,
                "history_list_length": history,
            }
        time.sleep(1.0)


EXPLAIN_COLUMNS = [
    "id",
    "select_type",
    "table",
    "type",
    "possible_keys",
    "key",
    "key_len",
    "ref",
    "rows",
    "extra",
]
