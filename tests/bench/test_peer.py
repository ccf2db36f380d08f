"""The bench's peer scenario (``bench.peer``): procrastinate on PostgreSQL.

The drain runs for real on a tiny backlog when a PostgreSQL answers (CI starts
one); the interleaving, the side-by-side table and the CPU grouping are checked
with fakes, so they need no server. No timed assertions.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench import peer as peer_mod
from bench import scenarios
from bench.__main__ import main
from bench.harness import free_port
from bench.report import side_by_side, side_by_side_table, table
from bench.scenarios import Params


@pytest.fixture
def pg_url() -> str:
    """The PostgreSQL server the peer uses; the test is skipped when none answers."""
    url = peer_mod.postgres_base_url()
    reason = peer_mod.unavailable(url)
    if reason is not None:
        pytest.skip(reason)
    return url


def _databases(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'airt_peer_%'")
        return {str(r[0]) for r in rows.fetchall()}


@pytest.mark.e2e
@pytest.mark.postgres
def test_tiny_drain_runs_every_job_once_and_drops_its_database(pg_url: str) -> None:
    before = _databases(pg_url)
    run = asyncio.run(peer_mod.drain(pg_url, jobs=20, slots=2, limit_s=60))
    assert (run["jobs"], run["terminal"], run["succeeded"]) == (20, 20, 20), run
    assert run["retried_attempts"] == 0
    assert run["span_s"] > 0 and run["jobs_per_s"] > 0
    cpu = run["cpu_ms_per_job"]
    # the worker process and this database's backends were found and measured
    assert list(cpu)[:2] == [peer_mod.WORKER, peer_mod.BACKENDS], cpu
    assert cpu[peer_mod.WORKER] > 0
    assert _databases(pg_url) <= before


@pytest.mark.postgres
def test_server_info_names_the_settings_a_commit_costs(pg_url: str) -> None:
    import psycopg

    info = asyncio.run(peer_mod.server_info(pg_url))
    assert {"server_version", "fsync", "synchronous_commit", "server"} <= set(info)
    with psycopg.connect(pg_url) as conn:
        for name in ("shared_buffers", "synchronous_commit"):
            row = conn.execute(f"SHOW {name}").fetchone()
            assert row is not None and info[name] == row[0], (name, info[name])
    assert ":" in info["server"] and "password" not in info["server"]


def test_no_postgres_is_one_line_and_skips_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    # a port that was free a moment ago: nothing listens there
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    reason = peer_mod.unavailable(url)
    assert reason is not None and reason.startswith("no PostgreSQL answers at postgres@127.0.0.1:")
    assert "\n" not in reason
    out = asyncio.run(scenarios.peer(Params(base_url="", peer_url=url)))
    assert out == {"skipped": reason}
    printed = capsys.readouterr().err.strip().splitlines()
    assert printed == [f"[bench] peer skipped: {reason}"]
    assert "peer skipped" in table({"results": {"peer": out}})


def test_urls_name_the_database_and_never_print_the_password() -> None:
    url = peer_mod.with_database("postgresql://bench:s3cret@db.example:6543/postgres", "airt_x")
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(url)
    assert (params["dbname"], params["host"], params["port"]) == ("airt_x", "db.example", "6543")
    assert peer_mod._safe(url) == "bench@db.example:6543"


def test_cpu_groups_sum_their_processes_and_count_new_ones_from_zero() -> None:
    groups = {
        "peer_worker": peer_mod.WORKER,
        "101": peer_mod.BACKENDS,
        "102": peer_mod.BACKENDS,
        "103": peer_mod.BACKENDS,  # opened during the run: not in `before`
        "7": peer_mod.SERVER,
        "104": peer_mod.BACKENDS,  # gone before the end: not in `after`
    }
    before = {"peer_worker": 1.0, "101": 0.5, "102": 0.5, "7": 3.0, "104": 9.0}
    after = {"peer_worker": 3.0, "101": 1.5, "102": 0.75, "103": 0.25, "7": 3.5}
    got = peer_mod.cpu_by_group(before, after, groups)
    assert got == {peer_mod.WORKER: 2.0, peer_mod.BACKENDS: 1.5, peer_mod.SERVER: 0.5}
    assert list(got) == list(peer_mod.GROUPS)


def _fake_run(calls: list[str], name: str, fail_at: int | None = None) -> Any:
    async def run(p: Params, slots: int) -> dict[str, Any]:
        calls.append(f"{name}@{slots}")
        if slots == fail_at:
            raise RuntimeError(f"{name} broke")
        return {"jobs": p.jobs, "jobs_per_s": 100.0 * slots, "cpu_ms_per_job": {}}

    return run


def test_throughput_and_peer_alternate_per_slot_count(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(scenarios, "throughput_run", _fake_run(calls, "ours", fail_at=4))
    monkeypatch.setattr(scenarios, "peer_run", _fake_run(calls, "peer"))

    async def head(p: Params) -> dict[str, Any]:
        return {"params": {"queue": "procrastinate"}, "runs": {}}

    monkeypatch.setattr(scenarios, "_peer_head", head)
    got = asyncio.run(scenarios.throughput_and_peer(Params(base_url="", slots=(1, 4, 16))))
    assert calls == ["ours@1", "peer@1", "ours@4", "peer@4", "ours@16", "peer@16"]
    # ours@4 failed: recorded, and every other run still went
    assert list(got["throughput"]["runs"]) == ["1", "16"]
    assert got["throughput"]["error"] == "@4 slots: RuntimeError('ours broke')"
    assert list(got["peer"]["runs"]) == ["1", "4", "16"] and "error" not in got["peer"]


def test_a_skipped_peer_leaves_our_runs_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(scenarios, "throughput_run", _fake_run(calls, "ours"))
    monkeypatch.setattr(scenarios, "peer_run", _fake_run(calls, "peer"))

    async def head(p: Params) -> dict[str, Any]:
        return {"skipped": "no PostgreSQL answers at postgres@127.0.0.1:5432: refused"}

    monkeypatch.setattr(scenarios, "_peer_head", head)
    got = asyncio.run(scenarios.throughput_and_peer(Params(base_url="", slots=(1, 4))))
    assert calls == ["ours@1", "ours@4"]
    assert got["peer"] == {"skipped": "no PostgreSQL answers at postgres@127.0.0.1:5432: refused"}


def test_main_interleaves_and_writes_the_side_by_side(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    monkeypatch.setenv("BENCH_MYSQL_URL", "mysql+aiomysql://root@127.0.0.1:1/x")  # never dialled
    monkeypatch.setattr(scenarios, "throughput_run", _fake_run(calls, "ours"))
    monkeypatch.setattr(scenarios, "peer_run", _fake_run(calls, "peer"))

    async def head(p: Params) -> dict[str, Any]:
        return {"params": {"queue": "procrastinate 3.10.0"}, "runs": {}}

    monkeypatch.setattr(scenarios, "_peer_head", head)
    # listed peer first: the pair still runs once, interleaved, where the first is listed
    argv = ["--scenario", "peer", "--scenario", "throughput", "--slots", "1,4"]
    rc = main([*argv, "--jobs", "7", "--out", str(tmp_path)])
    assert rc == 0
    assert calls == ["ours@1", "peer@1", "ours@4", "peer@4"]
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [row["slots"] for row in doc["side_by_side"]] == [1, 4]
    assert doc["side_by_side"][1]["ratio_ours_to_peer"] == 1.0
    assert "peer_url" not in doc["params"] and "base_url" not in doc["params"]
    printed = capsys.readouterr().out
    assert "ours jobs/s  peer jobs/s  ours/peer" in printed
    assert "peer @4 slots" in printed


def _doc() -> dict[str, Any]:
    ours_cpu = {
        "standin": 0.5,
        "job_service": 4.0,
        "credential_service": 1.0,
        "runtime_worker-1": 2.0,
        "mariadb (shared)": 3.0,
    }
    peer_cpu = {"peer_worker": 2.0, "postgres backends": 1.25, "postgres (shared)": 0.25}
    return {
        "results": {
            "throughput": {
                "runs": {
                    "1": {"jobs": 10, "jobs_per_s": 110.0, "cpu_ms_per_job": ours_cpu},
                    "4": {"jobs": 10, "jobs_per_s": 201.0},
                }
            },
            "peer": {
                "params": {"queue": "procrastinate 3.10.0"},
                "runs": {
                    "1": {"jobs": 10, "jobs_per_s": 355.0, "cpu_ms_per_job": peer_cpu},
                    "4": {"jobs": 10, "jobs_per_s": 474.0},
                    "16": {"jobs": 10, "jobs_per_s": 525.0},
                },
            },
            "floor": {"runs": {"1": {"jobs_per_s": 600.0}}},
        }
    }


def test_side_by_side_pairs_runs_by_slot_count() -> None:
    rows = side_by_side(_doc())
    assert [r["slots"] for r in rows] == [1, 4, 16]
    one, four, sixteen = rows
    assert one == {
        "slots": 1,
        "ours_jobs_per_s": 110.0,
        "peer_jobs_per_s": 355.0,
        "ratio_ours_to_peer": 0.31,
        "db_floor_jobs_per_s": 600.0,
        # the model stand-in is no part of ours: the peer has no model
        "ours_cpu_ms_per_job": 7.0,
        "peer_cpu_ms_per_job": 2.0,
        "ours_db_cpu_ms_per_job": 3.0,
        "peer_db_cpu_ms_per_job": 1.5,
    }
    assert four["ratio_ours_to_peer"] == round(201 / 474, 3) and four["db_floor_jobs_per_s"] is None
    # a slot count only the peer ran has no ratio rather than a made-up one
    assert sixteen["ours_jobs_per_s"] is None and sixteen["ratio_ours_to_peer"] is None
    text = side_by_side_table(rows)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("slots"))
    assert header.split("  ")[0:1] == ["slots"]
    for column in ("ours jobs/s", "peer jobs/s", "ours/peer", "our DB floor jobs/s"):
        assert column in header
    line_1 = next(line for line in text.splitlines() if line.split()[:1] == ["1"])
    assert line_1.split() == ["1", "110", "355", "31%", "600", "7.00", "2.00", "3.00", "1.50"]
    # one side alone is no comparison
    for alone in ("throughput", "peer"):
        assert side_by_side({"results": {alone: _doc()["results"][alone]}}) == []


def test_table_lists_the_peer_runs() -> None:
    doc = _doc()
    del doc["results"]["floor"]  # the floor's own rows need its whole result
    text = table(doc)
    assert "peer @1 slots" in text and "procrastinate 3.10.0, N=10, 1 worker, concurrency 1" in text
    assert "peer CPU per job @1" in text
