"""A client generated from ``/openapi.json`` drives the learner's flow (reference §9, §9.1–§9.3).

The running gateway's document is fed to ``openapi-python-client`` (offline, from
the file; ``--fail-on-warning``: every operation and schema must generate). The
generated package is imported from a temporary directory and its typed functions
— never raw HTTP — make every call: grant AI, create two materials, create a quiz
job on one with an ``Idempotency-Key`` (and replay it), wait on the job with
``waitSeconds`` and ``If-None-Match`` (the ETag of the answer before) until it is
terminal, read its result, delete that material, erase the user, and see the other
material, the job and the list of materials gone. If the document cannot produce a
client that does this, the document is wrong.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEMO_DOCUMENT, TERMINAL, RunningSystem

pytestmark = pytest.mark.e2e

PACKAGE = "airt_gateway_client"
#: Seconds one held GET may wait (reference §9.1 allows up to 60).
WAIT_SECONDS = 10
#: Seconds the whole wait for the job may take.
JOB_DEADLINE = 60.0


class Generated:
    """The generated package's modules, by the names the document's operationIds give."""

    def __init__(self, root: ModuleType) -> None:
        self.root = root
        self.client = importlib.import_module(f"{PACKAGE}.client")
        self.models = importlib.import_module(f"{PACKAGE}.models")
        #: The document's ``JobStatus`` enumeration, terminal members (reference §2.3).
        self.terminal = frozenset(self.models.JobStatus(s) for s in TERMINAL)

    def op(self, tag: str, operation: str) -> Any:
        """``<package>.api.<tag>.<operation>`` (e.g. ``public``, ``get_ai_job``)."""
        return importlib.import_module(f"{PACKAGE}.api.{tag}.{operation}")


@pytest.fixture(scope="module")
def generated(
    system: RunningSystem, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Generated]:
    """Generate the client from the running gateway's document and import it."""
    out = tmp_path_factory.mktemp("generated-client")
    document = out / "openapi.json"
    reply = httpx.get(f"{system.gateway_url}/openapi.json", timeout=30.0, trust_env=False)
    assert reply.status_code == 200, reply.text
    document.write_text(json.dumps(reply.json()), encoding="utf-8")

    env = dict(os.environ)
    # the generator formats its output with ruff (post hooks): the venv's own
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(document),
            "--output-path",
            str(out / PACKAGE),
            "--meta",
            "none",
            "--fail-on-warning",
        ],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Warning" not in output and "not in PATH" not in output, output

    sys.path.insert(0, str(out))
    try:
        yield Generated(importlib.import_module(PACKAGE))
    finally:
        sys.path.remove(str(out))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def _wait_terminal(gen: Generated, http: Any, job_id: str, etag: str) -> tuple[Any, list[int]]:
    """Held GETs with the last ETag until the job is terminal; the job and every answer's code."""
    get_ai_job = gen.op("public", "get_ai_job")
    codes: list[int] = []
    deadline = time.monotonic() + JOB_DEADLINE
    while time.monotonic() < deadline:
        reply = get_ai_job.sync_detailed(
            job_id, client=http, wait_seconds=WAIT_SECONDS, if_none_match=etag
        )
        codes.append(int(reply.status_code))
        if reply.status_code == HTTPStatus.NOT_MODIFIED:
            assert reply.headers["ETag"] == etag  # nothing changed: the same version
            assert reply.content == b""
            continue
        assert reply.status_code == HTTPStatus.OK, reply.content
        assert reply.headers["ETag"] != etag, "a 200 to a held GET names a new version"
        etag = reply.headers["ETag"]
        job = reply.parsed
        assert isinstance(job, gen.models.JobOut)
        if job.status in gen.terminal:
            return job, codes
    raise AssertionError(f"job {job_id} not terminal after {JOB_DEADLINE} s: {codes}")


def test_a_generated_client_drives_the_flow(generated: Generated, system: RunningSystem) -> None:
    gen = generated
    models = gen.models
    user_id = f"e2e-client-{uuid.uuid4().hex[:8]}"
    http = gen.client.AuthenticatedClient(
        base_url=system.gateway_url,
        token=system.token(user_id),
        timeout=httpx.Timeout(WAIT_SECONDS + 20.0),
        httpx_args={"trust_env": False},
        raise_on_unexpected_status=True,
    )
    with http:
        # AI on (granted by default; the PUT says so explicitly)
        granted = gen.op("public", "put_ai_authorization").sync_detailed(
            client=http, body=models.AuthorizationPut(granted=True)
        )
        assert granted.status_code == HTTPStatus.OK, granted.content
        assert isinstance(granted.parsed, models.AuthorizationOut) and granted.parsed.granted

        # two materials: one for the job, one that only erasure removes
        create_material = gen.op("public", "create_material")
        text = DEMO_DOCUMENT.read_text(encoding="utf-8")
        made = create_material.sync_detailed(
            client=http, body=models.MaterialCreate(title="Photosynthesis", content=text)
        )
        assert made.status_code == HTTPStatus.CREATED, made.content
        material = made.parsed
        assert isinstance(material, models.MaterialOut) and material.blocks
        block_ids = {b.block_id for b in material.blocks}
        other = create_material.sync_detailed(
            client=http, body=models.MaterialCreate(title="Notes", content="# Notes\n\nLight.")
        )
        assert other.status_code == HTTPStatus.CREATED, other.content
        other_id = other.parsed.material_id

        # a quiz job with an Idempotency-Key; the repeat replays it
        create_ai_job = gen.op("public", "create_ai_job")
        body = models.JobCreate(
            job_type=models.JobType.QUIZ_GENERATION,
            target_type=models.TargetType.MATERIAL,
            target_id=material.material_id,
            api_key_mode=models.ApiKeyMode.PLATFORM_KEY,
            params=models.JobCreateParamsType0.from_dict(
                {"count": 3, "questionTypes": ["single_choice"]}
            ),
        )
        key = f"quiz-{uuid.uuid4().hex}"
        created = create_ai_job.sync_detailed(client=http, body=body, idempotency_key=key)
        assert created.status_code == HTTPStatus.CREATED, created.content
        job = created.parsed
        assert isinstance(job, models.JobOut)
        assert job.user_id == user_id and job.target_id == material.material_id
        replay = create_ai_job.sync_detailed(client=http, body=body, idempotency_key=key)
        assert replay.status_code == HTTPStatus.OK, replay.content
        assert replay.headers.get("Idempotent-Replayed") == "true"
        assert replay.parsed.job_id == job.job_id

        # wait on the ETag until the job is terminal
        get_ai_job = gen.op("public", "get_ai_job")
        first = get_ai_job.sync_detailed(job.job_id, client=http)
        assert first.status_code == HTTPStatus.OK, first.content
        etag = first.headers["ETag"]
        assert etag.startswith('"') and etag.endswith('"')
        current = get_ai_job.sync_detailed(job.job_id, client=http, if_none_match=etag)
        if first.parsed.status in gen.terminal:  # a terminal job cannot change: 304
            assert current.status_code == HTTPStatus.NOT_MODIFIED
            done = first.parsed
        else:
            done, codes = _wait_terminal(gen, http, job.job_id, etag)
            assert HTTPStatus.OK in codes, codes
        assert done.status == models.JobStatus.SUCCEEDED, (done.to_dict(), system.diagnostics())
        assert done.error_code is None

        # the result: quiz items citing this material's blocks
        result = gen.op("public", "get_ai_job_result").sync_detailed(job.job_id, client=http)
        assert result.status_code == HTTPStatus.OK, result.content
        assert isinstance(result.parsed, models.JobResultOut)
        assert result.parsed.job_type == models.JobType.QUIZ_GENERATION
        items = [item.to_dict() for item in result.parsed.items]
        assert 1 <= len(items) <= 3, items
        for item in items:
            assert item["itemId"] and item["sourceBlockIds"], item
            assert set(item["sourceBlockIds"]) <= block_ids, item

        # a batch over both materials (targetsOf): its parent ends once both children did
        _batch_flow(gen, http, [material.material_id, other_id])

        # delete the material: 404 afterwards, the job row stays
        get_material = gen.op("public", "get_material")
        deleted = gen.op("public", "delete_material").sync_detailed(
            material.material_id, client=http
        )
        assert deleted.status_code == HTTPStatus.NO_CONTENT, deleted.content
        gone = get_material.sync_detailed(material.material_id, client=http)
        assert gone.status_code == HTTPStatus.NOT_FOUND
        assert isinstance(gone.parsed, models.ErrorBody) and gone.parsed.code
        assert get_ai_job.sync_detailed(job.job_id, client=http).status_code == HTTPStatus.OK
        kept = get_material.sync_detailed(other_id, client=http)
        assert kept.status_code == HTTPStatus.OK, kept.content

        # erase the user: everything of theirs is gone, the same token sees an empty account
        erased = gen.op("public", "erase_me").sync_detailed(client=http)
        assert erased.status_code == HTTPStatus.NO_CONTENT, erased.content
        after = get_material.sync_detailed(other_id, client=http)
        assert after.status_code == HTTPStatus.NOT_FOUND, after.content
        assert isinstance(after.parsed, models.ErrorBody)
        job_gone = get_ai_job.sync_detailed(job.job_id, client=http)
        assert job_gone.status_code == HTTPStatus.NOT_FOUND, job_gone.content
        listed = gen.op("public", "list_materials").sync_detailed(client=http)
        assert listed.status_code == HTTPStatus.OK, listed.content
        assert isinstance(listed.parsed, models.MaterialList) and listed.parsed.materials == []


def _batch_flow(gen: Generated, http: Any, material_ids: list[str]) -> None:
    """A batch of analyses of every material (reference §10.3), through the typed client:
    create it with a key (and replay it), wait on its parent's ETag until it is
    terminal, page its children, read its result."""
    models = gen.models
    create_batch = gen.op("public", "create_ai_job_batch")
    body = models.JobBatchCreate(
        job_type=models.JobType.LEARNING_STATE_ANALYSIS,
        targets_of=models.TargetsOfIn(target_type=models.TargetsOfType.MATERIAL),
        min_success_ratio=1.0,
    )
    key = f"batch-{uuid.uuid4().hex}"
    created = create_batch.sync_detailed(client=http, body=body, idempotency_key=key)
    assert created.status_code == HTTPStatus.CREATED, created.content
    parent = created.parsed
    assert isinstance(parent, models.JobOut) and isinstance(parent.batch, models.JobBatchOut)
    assert parent.batch.total == len(material_ids) and parent.parent_job_id is None
    replay = create_batch.sync_detailed(client=http, body=body, idempotency_key=key)
    assert replay.status_code == HTTPStatus.OK and replay.parsed.job_id == parent.job_id

    first = gen.op("public", "get_ai_job").sync_detailed(parent.job_id, client=http)
    done, _ = (
        (first.parsed, [])
        if first.parsed.status in gen.terminal
        else _wait_terminal(gen, http, parent.job_id, first.headers["ETag"])
    )
    listed = gen.op("public", "list_ai_jobs").sync_detailed(
        client=http, parent_job_id=parent.job_id
    )
    assert listed.status_code == HTTPStatus.OK, listed.content
    kids = listed.parsed.jobs
    assert done.status == models.JobStatus.SUCCEEDED, [k.to_dict() for k in kids]
    assert (done.batch.succeeded, done.batch.pending, done.batch.running) == (2, 0, 0)
    assert sorted(k.target_id for k in kids) == sorted(material_ids)
    assert all(k.parent_job_id == parent.job_id for k in kids)
    result = gen.op("public", "get_ai_job_result").sync_detailed(parent.job_id, client=http)
    assert result.status_code == HTTPStatus.OK, result.content
    items = [item.to_dict() for item in result.parsed.items]
    assert {i["jobId"] for i in items} == {k.job_id for k in kids}, items
