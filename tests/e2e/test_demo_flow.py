"""The demo flow through the real processes (gateway, gRPC services, worker, stand-in).

The learner's walk of :mod:`demo.flow` runs against the launched system; the
test then checks, independently of the demo's own check, that all five jobs
succeeded and that every business row cites only this document's block ids
(as ``GET /v1/materials/{id}`` lists them), this user's knowledge points and
own targets. Once on SQLite (the shared system), once on MariaDB, and once as
``python -m demo --file …`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airuntime_common.db import mysql_async_driver
from tests.e2e.conftest import REPO_ROOT, DemoRun, RunningSystem

pytestmark = pytest.mark.e2e

JOB_TYPES = {
    "learning_state_analysis",
    "weak_point_analysis",
    "next_action_planning",
    "quiz_generation",
    "flashcard_generation",
}


def _cited(
    job_type: str, items: list[dict[str, Any]]
) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """Block ids, knowledge-point ids and (targetType, targetId) pairs cited by result items."""
    blocks: set[str] = set()
    kps: set[str] = set()
    targets: set[tuple[str, str]] = set()
    for item in items:
        blocks.update(map(str, item.get("sourceBlockIds") or []))
        blocks.update(map(str, item.get("evidenceBlockIds") or []))
        for ev in item.get("evidence") or []:
            if ev.get("blockId"):
                blocks.add(str(ev["blockId"]))
            if ev.get("knowledgePointId"):
                kps.add(str(ev["knowledgePointId"]))
        if item.get("knowledgePointId"):
            kps.add(str(item["knowledgePointId"]))
        if job_type == "next_action_planning":
            targets.add((str(item["targetType"]), str(item["targetId"])))
        if job_type in ("quiz_generation", "flashcard_generation"):
            assert item.get("sourceBlockIds"), f"{job_type} item cites no block: {item}"
    return blocks, kps, targets


def assert_demo_run(system: RunningSystem, run: DemoRun) -> None:
    """All five jobs succeeded and every row cites only the user's own document."""
    outcome = run.outcome
    transcript = "\n".join(run.lines)
    assert {j.job_type for j in outcome.jobs} == JOB_TYPES
    statuses = {j.job_type: (j.status, j.error) for j in outcome.jobs}
    assert all(s == "succeeded" for s, _ in statuses.values()), (
        f"{statuses}\n{transcript}\n{system.diagnostics()}"
    )
    assert outcome.ok, f"{outcome.problems}\n{transcript}"

    with system.client(run.token) as http:
        material = http.get(f"/v1/materials/{run.material_id}")
        assert material.status_code == 200, material.text
        block_ids = {str(b["blockId"]) for b in material.json()["blocks"]}
        assert block_ids
        all_blocks: set[str] = set()
        for job in outcome.jobs:
            view = http.get(f"/v1/ai/jobs/{job.job_id}").json()
            assert view["status"] == "succeeded" and view["finishedAt"] is not None
            assert view["userId"] == run.user_id and view["errorCode"] is None
            reply = http.get(f"/v1/ai/jobs/{job.job_id}/result")
            assert reply.status_code == 200, reply.text
            result = reply.json()
            assert result["jobType"] == job.job_type
            items = result["items"]
            assert items, f"{job.job_type} wrote no business rows"
            blocks, kps, targets = _cited(job.job_type, items)
            assert blocks <= block_ids, f"{job.job_type} cites foreign blocks {blocks - block_ids}"
            assert kps <= run.kp_ids, f"{job.job_type} cites foreign knowledge points"
            allowed = {("user", run.user_id), ("material", run.material_id)} | {
                ("knowledge_point", kp) for kp in run.kp_ids
            }
            assert targets <= allowed, f"foreign recommendation targets {targets - allowed}"
            all_blocks |= blocks
        # the model really cited the document (not an empty citation set that passes trivially)
        assert all_blocks, "no result cites any block"

        # another learner sees none of it
        stranger = system.token("e2e-stranger")
    with system.client(stranger) as http:
        assert http.get(f"/v1/materials/{run.material_id}").status_code == 404
        assert http.get(f"/v1/ai/jobs/{outcome.jobs[0].job_id}").status_code == 404


def test_demo_flow_sqlite(system: RunningSystem) -> None:
    run = system.run_demo()
    assert_demo_run(system, run)


@pytest.fixture(scope="module")
def demo_command() -> Iterator[subprocess.Popen[str]]:
    """``python -m demo --file demo/documents/photosynthesis-zh.md``, started early.

    It runs its own system, so it overlaps with the MariaDB test (which waits
    mostly on process start-up) instead of adding its whole time after it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEMO_")}
    env["DEMO_TIMEOUT_SECONDS"] = "60"
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo", "--file", "demo/documents/photosynthesis-zh.md"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()  # the demo stops its services on SIGTERM
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.mysql
def test_demo_flow_mariadb(
    demo_command: subprocess.Popen[str], mysql_url: str, tmp_path: Path
) -> None:
    # credential_service keeps its own alembic version table, so one database holds both
    running = RunningSystem.start(
        tmp_path, {"DATABASE_URL": mysql_url, "CREDENTIAL_DATABASE_URL": mysql_url}
    )
    try:
        for name in ("DATABASE_URL", "CREDENTIAL_DATABASE_URL"):
            assert running.env[name] == mysql_url
        serving = [
            json.loads(line)
            for line in running.log_text("job_service").splitlines()
            if '"job_service serving"' in line
        ]
        driver = mysql_async_driver(mysql_url)
        assert serving and f"{driver}://" in json.dumps(serving[-1]), serving
        run = running.run_demo()
        assert_demo_run(running, run)
    finally:
        running.close()


@pytest.mark.mysql
def test_demo_flow_mariadb_two_job_service_replicas(mysql_url: str, tmp_path: Path) -> None:
    # both replicas start together on the empty database (their migrations take turns),
    # and the worker's, credential_service's and gateway's calls reach both
    running = RunningSystem.start(
        tmp_path,
        {"DATABASE_URL": mysql_url, "CREDENTIAL_DATABASE_URL": mysql_url},
        metrics=True,
        job_services=2,
    )
    try:
        replicas = [s for s in running.launcher.plan.services if s.kind == "job_service"]
        assert [s.name for s in replicas] == ["job_service-1", "job_service-2"]
        assert running.env["JOB_SERVICE_ADDR"].startswith("ipv4:")
        run = running.run_demo()
        assert_demo_run(running, run)
        for spec in replicas:
            port = spec.env["JOB_SERVICE_METRICS_PORT"]
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            served = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("airt_grpc_server_handling_seconds_count")
            ]
            assert sum(served) > 0, f"{spec.name} answered no call"
    finally:
        running.close()


def test_demo_command_with_another_document(demo_command: subprocess.Popen[str]) -> None:
    try:
        out, _ = demo_command.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        demo_command.terminate()
        out, _ = demo_command.communicate(timeout=60)
        pytest.fail(f"python -m demo did not finish in time:\n{out[-4000:]}")
    assert demo_command.returncode == 0, out[-4000:]
    assert "photosynthesis-zh.md" in out
    assert "Demo passed: all 5 jobs succeeded" in out
    assert "temporary data removed" in out
