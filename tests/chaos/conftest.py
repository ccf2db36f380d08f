"""Fixtures of the fault-harness tests: profile, MariaDB server, a shared running system.

The profile is ``CHAOS_PROFILE`` (default ``short``: the CI one; ``long`` for
the full sizes). Tests need ``TEST_MYSQL_URL`` (skipped without it); the
``mariadb_restart`` test also needs the ``mariadbd`` binaries (private server).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from chaos.runner import Options, format_table, scenario_system
from chaos.scenario_run import PROFILES, Profile, ScenarioResult
from chaos.system import System

# Leases and timeouts grow with the machine's load (1..4x), so a busy CI box
# does not turn into spurious lease losses; CHAOS_TIME_SCALE=1 pins them.
os.environ.setdefault("CHAOS_TIME_SCALE", "auto")


def profile() -> Profile:
    """The profile the tests run (``CHAOS_PROFILE``, default short)."""
    return PROFILES[os.environ.get("CHAOS_PROFILE", "short")]


def mysql_server_url() -> str:
    """``TEST_MYSQL_URL`` or skip."""
    url = os.environ.get("TEST_MYSQL_URL")
    if not url:
        pytest.skip("TEST_MYSQL_URL not set")
    return url


#: Every scenario result of this session, for the table printed at the end.
RESULTS: list[ScenarioResult] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault table (as ``python -m chaos`` does) after the chaos tests ran."""
    if RESULTS:
        terminalreporter.write_sep("=", "chaos fault table")
        terminalreporter.write_line(format_table(RESULTS))
        for r in RESULTS:
            notes = {k: v for k, v in r.notes.items() if k not in ("logs", "rssKiB", "standin")}
            terminalreporter.write_line(f"{r.name}: {notes}")


def assert_clean(result: ScenarioResult) -> None:
    """The common verdict: nothing lost, stuck, duplicated; audit and checks clean."""
    RESULTS.append(result)
    detail = "\n".join([*result.checks, *result.audit.problems[:20]])
    assert result.audit.jobs > 0, "the load generator created no job"
    assert result.audit.lost == 0, detail
    assert result.audit.duplicates == 0, detail
    assert result.audit.stuck == 0, detail
    assert not result.audit.counts, detail
    assert not result.load.gave_up, f"creates abandoned: {dict(result.load.gave_up)}"
    assert not result.checks, detail
    assert result.ok


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """One running system (3 workers) for the faults it recovers from on its own."""
    url = mysql_server_url()
    work: Path = tmp_path_factory.mktemp("chaos-shared")
    async with scenario_system(
        "worker_kill", profile(), Options(), mysql_url=url, work_dir=work
    ) as (system, _private):
        yield system
