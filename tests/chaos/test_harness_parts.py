"""Fast checks of harness parts that need no MariaDB: the clock-skew wrapper, the time
scale of the harness settings, and the table."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from chaos.audit import AuditReport
from chaos.load import LoadStats
from chaos.runner import format_table
from chaos.scenario_run import ScenarioResult
from chaos.system import CHAOS_ENV, harness_env, scale_env, time_scale

REPO = Path(__file__).resolve().parents[2]


def test_skew_wrapper_shifts_wall_clock_not_monotonic(tmp_path: Path) -> None:
    (tmp_path / "probe_clock.py").write_text(
        "import datetime, time\n"
        "print(time.time(), datetime.datetime.now(datetime.UTC).timestamp(), time.monotonic())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    before_wall, before_mono = time.time(), time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "chaos.skew", "90", "probe_clock"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    wall, dt_wall, mono = (float(x) for x in out)
    after_wall = time.time()
    assert before_wall + 89 < wall < after_wall + 91
    assert before_wall + 89 < dt_wall < after_wall + 91
    assert mono < before_mono + 60  # the monotonic clock is not skewed


def test_time_scale_multiplies_leases_and_timeouts() -> None:
    assert time_scale({}) == 1.0
    assert time_scale({"CHAOS_TIME_SCALE": "2.5"}) == 2.5
    assert time_scale({"CHAOS_TIME_SCALE": "0.1"}) == 1.0
    assert 1.0 <= time_scale({"CHAOS_TIME_SCALE": "auto"}) <= 4.0
    env = dict(CHAOS_ENV)
    scale_env(env, 2.0)
    assert env["LOCK_LEASE_SECONDS"] == "6"
    assert env["HEARTBEAT_INTERVAL_SECONDS"] == "2"  # still a third of the lease
    assert env["JOB_TIMEOUT_SECONDS"] == "20"
    assert env["WORKER_CONCURRENCY"] == CHAOS_ENV["WORKER_CONCURRENCY"]
    base = {"CHAOS_TIME_SCALE": "1", "CHAOS_LOCK_LEASE_SECONDS": "9", "DATABASE_URL": "x"}
    built = harness_env(base, "mysql+aiomysql://root@h/db")
    assert built["LOCK_LEASE_SECONDS"] == "9"
    assert built["DATABASE_URL"] == built["CREDENTIAL_DATABASE_URL"] == "mysql+aiomysql://root@h/db"


def test_table_shows_each_column() -> None:
    audit = AuditReport(jobs=3, lost=1, stuck=0, duplicates=2)
    audit.by_status.update({"succeeded": 1, "failed": 1})
    audit.failed_by_code.update({"LEASE_EXPIRED": 1})
    audit.add("lost", "x")
    stats = LoadStats()
    stats.refused.update({"PLATFORM_CIRCUIT_OPEN": 4})
    row = ScenarioResult("worker_kill", audit, stats, recovery_seconds=4.25)
    text = format_table([row])
    header, _, line = text.splitlines()
    assert header.split()[:3] == ["fault", "jobs", "succeeded"]
    assert "LEASE_EXPIRED 1" in line and "PLATFORM_CIRCUIT_OPEN 4" in line
    assert line.split()[-2:] == ["4.2", "NO"] or line.split()[-2:] == ["4.3", "NO"]
    assert not row.ok
