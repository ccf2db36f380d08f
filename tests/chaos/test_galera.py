"""The Galera faults (reference §9.6) as tests: each forms its own 3-node MariaDB Galera
cluster behind HAProxy (about 15-25 s here), runs the real services on it under
load, injects the fault and audits the database (the short profile: about three
minutes for the three on this 2-core machine).

Needs ``TEST_MYSQL_URL`` like the other fault tests (CI-only) and the Galera
profile's binaries (``galera-4``, ``haproxy``, ``rsync``, the ``mysql`` user).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import galera
from chaos.runner import Options, run_on, scenario_system
from chaos.scenario_run import ScenarioResult
from tests.chaos.conftest import RESULTS, assert_clean, mysql_server_url, profile

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.mysql,
    pytest.mark.skipif(
        not galera.available(), reason=f"Galera profile needs {', '.join(galera.missing())}"
    ),
]


async def _run(name: str, tmp_path: Path, options: Options | None = None) -> ScenarioResult:
    mysql_server_url()  # CI-only, like the other fault tests (the cluster replaces it)
    opts = options or Options()
    async with scenario_system(name, profile(), opts, mysql_url=None, work_dir=tmp_path) as (
        system,
        db,
    ):
        return await run_on(name, system, profile(), opts, db)


async def test_the_writer_node_sigkilled_under_load_fails_over_and_rejoins_by_ist(
    tmp_path: Path,
) -> None:
    result = await _run("galera_writer_kill", tmp_path)
    assert_clean(result)
    notes = result.notes
    assert len(notes["rounds"]) == profile().kills
    for r in notes["rounds"]:
        assert r["inFlightAtKill"] >= 1 and r["newWriter"] != r["writer"]
        assert r["failoverSeconds"] < 10 and r["recoverySeconds"] is not None
        assert r["rejoinKind"] == "IST"
        assert r["writerAfterRejoin"] == r["writer"] and r["sessionsLeftOnBackup"] == 0
    # every commit the probe was told about is on every node, and the nodes agree
    assert notes["probe"]["acked"] > 0 and not any(notes["probe"]["missingOnNode"].values())
    assert notes["checksumsEqual"] and len(notes["nodesCompared"]) == 3
    audit = result.audit
    assert audit.by_status["succeeded"] == audit.jobs


async def test_connections_cut_mid_transaction_three_ways_lose_and_double_nothing(
    tmp_path: Path,
) -> None:
    result = await _run("galera_conn_kill", tmp_path)
    assert_clean(result)
    rounds = result.notes["rounds"]
    assert [r["method"] for r in rounds[:3]] == [
        "sql_kill",
        "haproxy_shutdown_sessions",
        "haproxy_switchover",
    ]
    assert sum(r.get("killed", 0) for r in rounds) >= 1
    # under load some of the cuts land inside a transaction
    assert sum(r.get("inTransaction", 0) + r.get("openTransactions", 0) for r in rounds) >= 1
    switched = [r for r in rounds if r["method"] == "haproxy_switchover"]
    assert all(r["newWriter"] != r["writer"] and r["sessionsLeftOnBackup"] == 0 for r in switched)
    assert not any(result.notes["probe"]["missingOnNode"].values())
    audit = result.audit
    assert audit.by_status["succeeded"] == audit.jobs


async def test_replicas_writing_to_two_nodes_refuse_to_start_naming_their_node(
    tmp_path: Path,
) -> None:
    result = await _run("galera_multi_writer", tmp_path)
    RESULTS.append(result)
    assert result.ok, result.checks
    refusals = result.notes["refusedAtStart"]
    nodes = result.notes["replicaNodes"]
    said = [line for line in refusals.values() if line]
    assert said and all("refusing to start: DATABASE_URL points straight at" in x for x in said)
    for replica, line in refusals.items():
        if line:
            assert f"Galera node {nodes[replica]!r}" in line
