"""Smoke tests of the benchmark harness (``python -m bench``).

The real run uses tiny sizes (5 jobs, one 2-slot worker) so it stays within
the CI budget; the rest checks the pure helpers the figures depend on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.floor import (
    HEX_ID,
    Capture,
    _head_transaction,
    _pick_at,
    job_statements,
    split_statements,
)
from bench.harness import pct, summary_ms
from bench.report import table

JOB = "a" * 32
SNAP = "b" * 32


def test_percentiles_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert pct(values, 50) == 50.0
    assert pct(values, 99) == 99.0
    assert pct(values, 100) == 100.0
    s = summary_ms([0.010, 0.020, 0.030])
    assert (s["p50_ms"], s["max_ms"], s["n"]) == (20.0, 30.0, 3)


def test_job_statements_deinterleaves_and_drops_background() -> None:
    queries = [
        (1, "SELECT job_id FROM ai_runtime_jobs WHERE status='pending' FOR UPDATE SKIP LOCKED"),
        (2, "SELECT job_id FROM ai_runtime_jobs WHERE lock_until < now"),  # reaper
        (1, f"UPDATE ai_runtime_jobs SET status='locked' WHERE job_id IN ('{JOB}')"),
        (2, "ROLLBACK"),
        (1, "COMMIT"),
        (1, "ROLLBACK"),  # pool reset after the claim
        (3, f"SELECT payload FROM ai_snapshots WHERE snapshot_id='{SNAP}'"),
        (3, "ROLLBACK"),
        (1, "SELECT 1 FROM ai_runtime_jobs WHERE status='pending' FOR UPDATE SKIP LOCKED"),
        (1, "COMMIT"),
    ]
    out = job_statements(queries, JOB, SNAP)
    assert out == [
        queries[0][1],
        queries[2][1],
        "COMMIT",
        "ROLLBACK",
        queries[6][1],
        "ROLLBACK",
    ]
    assert HEX_ID.findall(out[1]) == [JOB]


def test_a_batch_ending_in_commit_closes_its_transaction() -> None:
    batch = f"UPDATE ai_runtime_jobs SET status='running' WHERE job_id='{JOB}';\nCOMMIT"
    queries = [
        (1, "SELECT job_id FROM ai_runtime_jobs WHERE status='pending' FOR UPDATE SKIP LOCKED"),
        (1, f"UPDATE ai_runtime_jobs SET status='locked' WHERE job_id IN ('{JOB}');\nCOMMIT"),
        (1, batch),
        # the same connection's next transaction is background work, not the job's
        (1, "SELECT seq FROM ai_runtime_jobs WHERE status='pending' LIMIT 1"),
        (1, "ROLLBACK"),
    ]
    out = job_statements(queries, JOB, None)
    assert out == [queries[0][1], queries[1][1], batch]
    capture = Capture(job_id=JOB, statements=out)
    assert capture.statement_count() == 5
    assert capture.kinds()["COMMIT"] == 2
    assert split_statements(batch) == [batch.split(";\n")[0], "COMMIT"]


def test_statement_kinds_name_the_statements_own_table() -> None:
    read = (
        "SELECT ai_runtime_jobs.seq, (SELECT ai_results.result_id FROM ai_results"
        " WHERE ai_results.idempotency_key = 'a) FROM x') AS prior FROM ai_runtime_jobs"
        " WHERE ai_runtime_jobs.job_id = 'j' FOR UPDATE"
    )
    fence = "SET @airt_fence = IF(ROW_COUNT() = 1, 1, (SELECT 1 UNION ALL SELECT 2))"
    insert = "INSERT INTO ai_runtime_job_events (job_id) SELECT ai_runtime_jobs.job_id FROM ai_runtime_jobs"
    capture = Capture(job_id=JOB, statements=[f"{read};\n{fence};\n{insert};\nCOMMIT"])
    assert capture.kinds() == {
        "SELECT ai_runtime_jobs": 1,
        "SET fence": 1,
        "INSERT ai_runtime_job_events": 1,
        "COMMIT": 1,
    }


def test_table_marks_missed_targets() -> None:
    doc = {
        "results": {
            "throughput": {"runs": {"16": {"jobs": 10, "jobs_per_s": 100.0}}},
            "idle": {
                "params": {"workers": 10, "seconds": 5},
                "db_statements_per_s_per_worker": 0.5,
                "db_statements_per_s": 5.0,
                "global_questions_per_s_with_system": 9.0,
                "global_questions_per_s_without_system": 4.0,
            },
        }
    }
    text = table(doc)
    assert "throughput @16 slots" in text and "≥500 MISSED" in text
    assert "≤2 ok" in text


@pytest.mark.e2e
def test_bench_throughput_tiny_run(mysql_url: str, tmp_path: Path) -> None:
    # mysql_url proves MariaDB is configured; the harness makes its own database.
    assert os.environ.get("TEST_MYSQL_URL")
    rc = main(["--scenario", "throughput", "--jobs", "5", "--slots", "2", "--out", str(tmp_path)])
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    run = doc["results"]["throughput"]["runs"]["2"]
    assert rc == 0, doc["results"]
    assert run["terminal"] == 5 and run["succeeded"] == 5
    assert run["jobs_per_s"] > 0
    assert "job_service" in run["cpu_ms_per_job"]


def test_table_shows_create_latency_at_scale() -> None:
    def at(rows: int, create_p99: float) -> dict[str, object]:
        ms = {"p50_ms": 1.0, "p99_ms": 2.0}
        return {
            "finished_rows": rows,
            "calls_logged_today": rows,
            "poll": ms,
            "claim": ms,
            "create": {"p50_ms": 5.0, "p99_ms": create_p99},
            "explain_claim": [{"key": "ix_jobs_poll"}],
        }

    doc = {
        "results": {
            "poll_scale": {
                "1000": at(1000, 8.0),
                "1000000": at(1000000, 12.0),
                "poll_p99_ratio_big_to_small": 1.0,
                "claim_p99_ratio_big_to_small": 1.0,
                "create_p99_ratio_big_to_small": 1.5,
                "params": {
                    "innodb_settle": {
                        "settled": False,
                        "settle_s": 300.0,
                        "dirty_pages": 4000,
                        "pool_pages": 8112,
                        "history_list_length": 0,
                    }
                },
            }
        }
    }
    text = table(doc)
    assert "create p50/p99 @1000000" in text and "5.0/12.0" in text
    assert "1,000,000 platform calls logged today" in text
    assert "create p99 big/small" in text
    # a settle that ran out of time says so next to the figures it disturbed
    assert "NOT settled" in text and "dirty pages 4000/8112" in text


def test_grown_call_log_and_the_days_total_agree(mysql_url: str) -> None:
    """``poll_scale`` logs today's calls in bulk: the running total must say the same."""
    import asyncio
    from decimal import Decimal
    from typing import Any

    from sqlalchemy.engine import make_url

    from bench.growth import grow_calls
    from bench.harness import admin_connect
    from tests.unit.job_service.conftest import create_schema

    asyncio.run(create_schema(mysql_url))

    class Db:
        def sql(self, query: str, args: Any = None) -> list[tuple[Any, ...]]:
            conn = admin_connect(mysql_url, make_url(mysql_url).database)
            try:
                with conn.cursor() as cur:
                    cur.execute(query, args)
                    return list(cur.fetchall())
            finally:
                conn.close()

    db = Db()
    grow_calls(db, 1000)  # type: ignore[arg-type]
    grow_calls(db, 2500)  # type: ignore[arg-type]
    [(logged, today)] = db.sql(
        "SELECT COUNT(*), SUM(created_at >= UTC_DATE()) FROM ai_runtime_invocation_logs"
    )
    [(cost, calls)] = db.sql(
        "SELECT SUM(cost_usd), SUM(calls) FROM ai_runtime_platform_spend WHERE day = UTC_DATE()"
    )
    assert (logged, today) == (2500, 2500)
    assert (Decimal(cost), calls) == (Decimal("0.25"), 2500)


def test_a_result_that_claims_splits_into_the_claim_and_the_rest() -> None:
    """Claim-with-result: a job's window starts with the previous job's result
    transaction (which claimed it); the head transaction and its pool reset split off."""
    pick = "SELECT job_id FROM ai_runtime_jobs WHERE status='pending' FOR UPDATE SKIP LOCKED"
    result = f"INSERT INTO ai_runtime_results VALUES ('{SNAP}');\n{pick}"
    statements = [result, f"UPDATE ai_runtime_jobs SET status='locked' WHERE job_id='{JOB}'"]
    statements += ["COMMIT", "ROLLBACK", f"SELECT 1 FROM ai_runtime_jobs WHERE job_id='{JOB}'"]
    statements += ["ROLLBACK"]
    head, rest = _head_transaction(statements)
    assert head == statements[:4]
    assert rest == statements[4:]
    assert _pick_at(result) == 1 and _pick_at(pick) == 0 and _pick_at(statements[1]) is None


@pytest.mark.e2e
def test_bench_floor_tiny_run_replays_the_steady_state(mysql_url: str, tmp_path: Path) -> None:
    """The floor captures a job claimed by the previous job's result (the worker's
    default) and replays every job without errors."""
    assert os.environ.get("TEST_MYSQL_URL")
    rc = main(["--scenario", "floor", "--jobs", "12", "--slots", "3", "--out", str(tmp_path)])
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    floor = doc["results"]["floor"]
    assert rc == 0, floor
    assert floor["claimed_with_result"] is True
    run = floor["runs"]["3"]
    assert (run["jobs"], run["errors"]) == (12, 0), run
    assert floor["one_statement_per_round_trip"]["jobs"] == 12
    # the worker holds the platform key (no lease-checked resolve), and the result's
    # batch carries the next job's claim and the COMMIT: one transaction, two round
    # trips (the locking read with the claim's pick, then every write)
    assert floor["statements_by_kind"]["COMMIT"] == 1
    assert floor["round_trips_per_job"] == 2
    assert not any("SKIP LOCKED" in s for s in floor["statements"][:1])


def test_rpc_profile_is_the_runs_calls_per_job_and_mean_time() -> None:
    from bench.scenarios import rpc_profile

    before = {"job_service": {"JobService/SubmitResult": (10.0, 0.5)}}
    after = {
        "job_service": {
            "JobService/SubmitResult": (110.0, 0.9),
            "JobService/ClaimJobs": (2.0, 0.02),
        },
        "runtime_worker": {"SubmitResult": (100.0, 0.6)},
    }
    out = rpc_profile(before, after, jobs=100)
    assert out["job_service"]["JobService/SubmitResult"] == {"calls_per_job": 1.0, "mean_ms": 4.0}
    assert out["job_service"]["JobService/ClaimJobs"] == {"calls_per_job": 0.02, "mean_ms": 10.0}
    assert list(out["job_service"]) == ["JobService/SubmitResult", "JobService/ClaimJobs"]
    assert out["runtime_worker"]["SubmitResult"] == {"calls_per_job": 1.0, "mean_ms": 6.0}
    doc = {
        "results": {
            "throughput": {
                "runs": {
                    "1": {
                        "jobs": 100,
                        "jobs_per_s": 80.0,
                        "rpc_per_job": {
                            **out,
                            "model_call": {"succeeded": {"calls_per_job": 1.0, "mean_ms": 1.5}},
                        },
                    }
                }
            }
        }
    }
    text = table(doc)
    assert "worker's calls per job @1" in text and "SubmitResult 1×6.0, model 1.5" in text


class _Status:
    """A stand-in for :class:`bench.harness.System`: a server that flushes
    ``flushing.pop(0)`` pages and purges ``purging.pop(0)`` undo logs per status read."""

    def __init__(self, dirty: int, history: int, flushing: list[int], purging: list[int]) -> None:
        self.dirty, self.history, self.flushed = dirty, history, 0
        self.flushing, self.purging, self.reads = flushing, purging, 0

    def sql(self, query: str, args: object = None) -> list[tuple[str, str]]:
        assert "SHOW GLOBAL STATUS" in query
        self.reads += 1
        rows = [
            ("Innodb_buffer_pool_pages_dirty", str(self.dirty)),
            ("Innodb_buffer_pool_pages_total", "8000"),
            ("Innodb_buffer_pool_pages_flushed", str(self.flushed)),
            ("Innodb_history_list_length", str(self.history)),
        ]
        pages = self.flushing.pop(0) if self.flushing else 0
        self.dirty, self.flushed = self.dirty - pages, self.flushed + pages
        self.history -= self.purging.pop(0) if self.purging else 0
        return rows


def test_settle_waits_until_flushing_and_purge_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import growth

    monkeypatch.setattr("bench.growth.time.sleep", lambda _s: None)
    # flushes after reads 1-3, then the pool stays 60 % dirty: reads 5 and 6 see no flush
    server = _Status(dirty=6000, history=0, flushing=[300, 300, 300], purging=[])
    got = growth.settle_innodb(server)  # type: ignore[arg-type]
    assert server.reads == 6 and got["dirty_pages"] == 5100 and got["settled"]
    # flushing has stopped but purge has not: waits for the history to drain
    server = _Status(dirty=6000, history=30_000, flushing=[], purging=[10_000] * 3)
    got = growth.settle_innodb(server)  # type: ignore[arg-type]
    assert server.reads == 4 and got["history_list_length"] == 0
    # never settles: gives up at the limit
    stuck = _Status(dirty=6000, history=0, flushing=[100] * 10, purging=[])
    got = growth.settle_innodb(stuck, limit_s=0.0)  # type: ignore[arg-type]
    assert stuck.reads == 1 and got["dirty_pages"] == 6000 and not got["settled"]


@pytest.mark.e2e
def test_poll_scale_tiny_run_interleaves_both_sizes(mysql_url: str) -> None:
    import asyncio

    from bench.harness import mysql_base_url
    from bench.scenarios import Params, poll_scale

    assert os.environ.get("TEST_MYSQL_URL")
    p = Params(base_url=mysql_base_url(), scale_rows=(10, 300), poll_samples=6, settle_limit_s=5.0)
    out = asyncio.run(poll_scale(p))
    for rows in (10, 300):
        at = out[str(rows)]
        assert at["finished_rows"] == rows
        assert at["poll"]["n"] == at["claim"]["n"] == at["create"]["n"] == 6
        assert at["explain_claim"]
    assert out["params"]["innodb_settle"]["pool_pages"] > 0
    for name in ("poll", "claim", "create"):
        assert out[f"{name}_p99_ratio_big_to_small"] > 0


def test_mariadb_pid_is_the_process_of_the_server_asked(mysql_url: str) -> None:
    """CPU per job reads MariaDB's process: it must be the server of the URL, not another
    ``mariadbd`` on the machine (a fault harness's private one). The process found is the
    one holding the listening socket of the URL's port."""
    import os as _os
    from urllib.parse import urlsplit

    from bench.harness import mariadb_pid

    pid = mariadb_pid(mysql_url)
    if pid is None:
        pytest.skip("the MariaDB server is not on this machine")
    port = urlsplit(mysql_url).port or 3306
    listening: set[str] = set()
    for proc_table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(proc_table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                listening.add(fields[9])
    assert listening, f"nothing listens on port {port}"
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = _os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(target[len("socket:[") : -1])
    assert listening & held, (pid, port)


@pytest.mark.e2e
def test_tenants_tiny_run_claims_in_fair_order_on_both_policies(mysql_url: str) -> None:
    """The ``tenants`` scenario end to end at a tiny size: both policies' rows, the
    EXPLAINs of job_service's statements index-backed, claims counted on both, the
    fair order's head spread over the users and fifo's over the oldest users' queues,
    and the lone users' jobs all started."""
    import asyncio

    from bench.harness import mysql_base_url
    from bench.scenarios import Params
    from bench.tenants import tenants

    p = Params(
        base_url=mysql_base_url(),
        tenants_users=40,
        tenants_waiting_each=10,
        tenants_backlog=100,
        tenants_rows=2000,
        tenants_rounds=1,
        tenants_claim_seconds=0.5,
        settle_limit_s=5.0,
    )
    out = asyncio.run(tenants(p))
    scale = out["scale"]
    for policy in ("fair", "fifo"):
        assert scale[policy]["rows"] == 2000
        assert scale[policy]["users_waiting"] == 41
        assert scale[policy]["claims"] > 0
    assert all(scale["index_backed"].values()), scale["explain"]
    assert scale["explain"]["claim"][0]["key"] == "ix_jobs_poll"
    # fair: the first claims go round the 41 users; fifo: the backlog's user first
    fair_head = scale["fair"]["users_in_first_claims"]
    assert fair_head == min(41, scale["fair"]["first_claims"])
    assert scale["fifo"]["users_in_first_claims"] <= 1 + scale["fifo"]["first_claims"] // 10
    for policy in ("fair", "fifo"):
        assert out["lone"][policy]["started"] == out["lone"][policy]["lone_users"]
    assert out["lone"]["fair"]["create_to_start_s"]["max"] < 3.0
