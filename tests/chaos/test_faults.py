"""The fault table (``python -m chaos``) as tests: one fault each, real processes on MariaDB.

Each test runs one scenario of :mod:`chaos.scenarios` and asserts the audit:
every job in exactly one terminal state, business rows exactly once per
succeeded job, no lost or stuck job, a valid event history, retry counters
in bounds, plus the scenario's own checks. Short leases (``LOCK_LEASE_SECONDS``
3, reaper 0.5 s, heartbeat 1 s, backoff base 0.5 s, job timeout 10 s; see
:data:`chaos.system.CHAOS_ENV`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos import mariadb
from chaos.runner import Options, run_on, scenario_system
from chaos.system import System
from tests.chaos.conftest import assert_clean, mysql_server_url, profile

pytestmark = [pytest.mark.e2e, pytest.mark.mysql]
module_loop = pytest.mark.asyncio(loop_scope="module")


@module_loop
async def test_worker_sigkill_with_jobs_in_flight(shared_system: System) -> None:
    result = await run_on("worker_kill", shared_system, profile(), Options())
    assert_clean(result)
    assert result.audit.lease_expiries >= 1  # the kills did catch jobs in flight
    assert all(k["jobsHeld"] >= 1 for k in result.notes["kills"])
    assert result.audit.by_status["succeeded"] == result.audit.jobs


@module_loop
async def test_credential_service_down(shared_system: System) -> None:
    result = await run_on("credential_down", shared_system, profile(), Options())
    assert_clean(result)
    assert result.notes["waitingDuringOutage"] >= 1
    # jobs waited (or failed retryably and were retried): every one succeeded in the end
    assert result.audit.by_status["succeeded"] == result.audit.jobs


@module_loop
async def test_model_hang_5xx_then_recovery(shared_system: System) -> None:
    result = await run_on("model_faults", shared_system, profile(), Options())
    assert_clean(result)
    assert "open" in result.notes["breakerStates"]
    assert result.notes["breakerStates"][-1] == "closed"
    assert result.audit.attempts_max <= 4  # 1 + maxRetryCount
    # only the injected faults end jobs (retries used up), never anything else
    assert set(result.audit.failed_by_code) <= {
        "TEMPORARY_PROVIDER_ERROR",
        "MODEL_TIMEOUT",
        "JOB_TIMEOUT",
    }


async def test_job_service_sigkill_and_restart(tmp_path: Path) -> None:
    url = mysql_server_url()
    async with scenario_system(
        "job_service_restart", profile(), Options(), mysql_url=url, work_dir=tmp_path
    ) as (system, _):
        result = await run_on("job_service_restart", system, profile(), Options())
    assert_clean(result)
    assert result.notes["landedSameAttempt"] >= 1
    assert result.audit.by_status["succeeded"] == result.audit.jobs


@pytest.mark.skipif(not mariadb.available(), reason="mariadbd / mariadb-install-db not installed")
async def test_mariadb_restart_under_load(tmp_path: Path) -> None:
    url = mysql_server_url()  # the private server replaces it, but CI-only like the rest
    async with scenario_system(
        "mariadb_restart", profile(), Options(), mysql_url=url, work_dir=tmp_path
    ) as (system, private):
        assert private is not None
        result = await run_on("mariadb_restart", system, profile(), Options(), private)
    assert_clean(result)
    assert result.audit.by_status["succeeded"] == result.audit.jobs


async def test_worker_clock_far_off(tmp_path: Path) -> None:
    url = mysql_server_url()
    options = Options(skew_seconds=90.0)
    async with scenario_system(
        "clock_skew", profile(), options, mysql_url=url, work_dir=tmp_path
    ) as (system, _):
        result = await run_on("clock_skew", system, profile(), options)
    assert_clean(result)
    assert abs(result.notes["observedSkewSeconds"] - 90.0) < 15


@module_loop
async def test_short_soak_with_random_model_errors(shared_system: System) -> None:
    """The soak's machinery in CI (the 20-minute run is by hand): steady load with
    10 % random model 500s, a clean audit, and RSS sampled for every service."""
    before = await _standin_stats(shared_system)
    result = await run_on(
        "soak",
        shared_system,
        profile(),
        Options(soak_seconds=25.0, soak_rate=8.0, soak_fault_rate=0.1),
    )
    assert_clean(result)
    assert result.notes["standin"]["byOutcome"].get("random_500", 0) >= 1
    assert result.audit.attempts_max <= 4  # 1 + maxRetryCount
    rss = result.notes["rssKiB"]
    assert {"job_service", "credential_service", "api_gateway", "standin"} <= set(rss)
    assert all(v["start"] and v["warm"] and v["end"] for v in rss.values())
    assert result.notes["rssSamples"] >= 3
    # the stand-in is left as the soak found it
    after = await _standin_stats(shared_system)
    assert (after["faultRate"], after["delayMs"]) == (before["faultRate"], before["delayMs"])


async def _standin_stats(system: System) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=system.standin_url, trust_env=False) as c:
        reply = await c.get("/_standin/stats")
        reply.raise_for_status()
        return dict(reply.json())


@pytest.mark.skipif(not mariadb.available(), reason="mariadbd / mariadb-install-db not installed")
async def test_a_batch_through_a_worker_kill_and_a_database_restart(tmp_path: Path) -> None:
    """Reference §10.3: 100 children, a worker SIGKILLed and MariaDB restarted while they
    run; the parent ends exactly once, each child exactly once, the counts equal the
    children's states (:mod:`chaos.batches`)."""
    url = mysql_server_url()
    async with scenario_system(
        "batch_faults", profile(), Options(), mysql_url=url, work_dir=tmp_path
    ) as (system, private):
        assert private is not None
        result = await run_on("batch_faults", system, profile(), Options(), private)
    assert_clean(result)
    assert result.notes["children"] == 100 == result.audit.jobs
    assert result.notes["kill"]["childrenHeld"] >= 1
    assert result.notes["parent"][0] in ("succeeded", "failed")
