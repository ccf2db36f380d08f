"""The prompt protocol against the local DeepSeek stand-in: the worker's real
provider and prompts produce outputs of every job type that pass validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from airuntime_common.enums import JOB_TYPES
from airuntime_common.outputs import validate_output
from runtime_worker.app import WorkerApp
from runtime_worker.snapshot import struct_to_dict
from tests.unit.runtime_worker.rw_helpers import (
    FakeBackend,
    make_job,
    snapshot_payload,
    worker_settings,
)

standin_server = pytest.importorskip("model_standin.server")

PARAMS = {
    "quiz_generation": {"count": 2, "difficulty": "easy", "questionTypes": ["single_choice"]},
    "flashcard_generation": {"count": 2},
}


@pytest.fixture
async def standin() -> AsyncIterator[Any]:
    server = standin_server.StandIn(port=0)
    await server.start()
    yield server
    await server.stop()


async def test_every_job_type_through_the_standin(
    backend: tuple[FakeBackend, int, int], standin: Any
) -> None:
    b, job_port, cred_port = backend
    b.base_url = standin.base_url
    for job_type in JOB_TYPES:
        params = PARAMS.get(job_type, {})
        b.add_job(
            make_job(f"job-{job_type}", job_type=job_type, params=params),
            snapshot_payload(job_type, params=params),
        )
    app = WorkerApp(worker_settings(job_port, cred_port, WORKER_CONCURRENCY=5), provider=None)
    await app.start()
    try:
        await b.wait_for(lambda: len(b.results) + len(b.fails) == len(JOB_TYPES), within=20)
    finally:
        await app.stop(0.1)
    assert b.fails == []
    block_ids = {blk["blockId"] for blk in snapshot_payload()["blocks"]}
    for result in b.results:
        job_type = result.job_id.removeprefix("job-")
        output = struct_to_dict(result.output)
        validate_output(job_type, "v1", output)
        assert result.prompt_version == f"{job_type}.v1"
        for item in output.get("items", []):
            assert set(item.get("sourceBlockIds", [])) <= block_ids
            assert set(item.get("evidenceBlockIds", [])) <= block_ids


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ({"kind": "status", "status": 408}, "MODEL_TIMEOUT"),  # case P1
        ({"kind": "out_of_capacity"}, "TEMPORARY_PROVIDER_ERROR"),  # case P2
    ],
)
async def test_provider_failures_end_the_attempt_retryable(
    backend: tuple[FakeBackend, int, int], standin: Any, fault: dict[str, Any], code: str
) -> None:
    """The worker fails the attempt with the retryable code (job_service retries it),
    after exactly one model call: neither is answered with an in-attempt re-ask."""
    b, job_port, cred_port = backend
    b.base_url = standin.base_url
    standin.add_faults([fault])
    b.add_job(make_job("job-p"), snapshot_payload())
    app = WorkerApp(worker_settings(job_port, cred_port), provider=None)
    await app.start()
    try:
        await b.wait_for(lambda: bool(b.fails) and bool(b.invocations), within=10)
    finally:
        await app.stop(0.1)
    assert [f.error_code for f in b.fails] == [code]
    assert b.results == []
    assert standin.stats()["requests"] == 1
    assert [(i.outcome, i.error_code) for i in b.invocations] == [("failed", code)]
