"""The whole job flow over gRPC with the real learning-data modules (no fakes but the key check)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from airuntime_common import metadata
from airuntime_common.grpc_errors import from_rpc_error
from job_service.app import JobServiceApp, serve
from job_service.services.ports import AllowAllCredentials
from tests.unit.job_service.conftest import TOKEN, make_settings
from zhixi.airuntime.common.v1 import message_pb2 as common
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

QUIZ = common.JOB_TYPE_QUIZ_GENERATION


@pytest.fixture
async def real(
    tmp_path: Path,
) -> AsyncIterator[tuple[JobServiceApp, service_pb2_grpc.JobServiceStub]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'flow.db'}"
    app = await serve(
        make_settings(url, JOB_SERVICE_MIGRATE_ON_START=True), credentials=AllowAllCredentials()
    )
    channel = grpc.aio.insecure_channel(app.address)
    try:
        yield app, service_pb2_grpc.JobServiceStub(channel)
    finally:
        await channel.close()
        await app.stop(grace=0.1)


async def test_material_to_quiz_result(real: tuple[JobServiceApp, Any]) -> None:
    _, stub = real
    md = metadata.outgoing(TOKEN)
    wmd = metadata.outgoing(TOKEN, "worker-1")
    mat = await stub.CreateMaterial(
        rr.CreateMaterialRequest(
            user_id="u1",
            title="Photosynthesis",
            content="# Light\n\nPlants turn light into sugar.\n\n# Dark\n\nThe Calvin cycle fixes carbon.",
        ),
        metadata=md,
    )
    material_id = mat.material.material_id
    assert len(mat.material.blocks) >= 2
    params = struct_pb2.Struct()
    params.update({"count": 1})
    created = await stub.CreateJob(
        rr.CreateJobRequest(
            user_id="u1",
            job_type=QUIZ,
            target_type=common.TARGET_TYPE_MATERIAL,
            target_id=material_id,
            params=params,
            actor="user:u1",
        ),
        metadata=md,
    )
    assert created.job.snapshot_id
    # another user's material is NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateJob(
            rr.CreateJobRequest(
                user_id="u2",
                job_type=QUIZ,
                target_type=common.TARGET_TYPE_MATERIAL,
                target_id=material_id,
            ),
            metadata=md,
        )
    assert from_rpc_error(err.value).code == "NOT_FOUND"

    [job] = (
        await stub.ClaimJobs(rr.ClaimJobsRequest(capabilities=[QUIZ], limit=1), metadata=wmd)
    ).jobs
    snap = await stub.GetSnapshot(
        rr.GetSnapshotRequest(job_id=job.job_id, attempt_no=1), metadata=wmd
    )
    payload = json_format.MessageToDict(snap.payload)
    block_id = payload["blocks"][0]["blockId"]
    output = {
        "items": [
            {
                "questionType": "single_choice",
                "stem": "What do plants make from light?",
                "options": ["sugar", "salt"],
                "answer": "sugar",
                "explanation": "Photosynthesis makes sugar.",
                "difficulty": "medium",
                "sourceBlockIds": [block_id],
            }
        ]
    }
    out = struct_pb2.Struct()
    out.update(output)
    res = await stub.SubmitResult(
        rr.SubmitResultRequest(
            job_id=job.job_id,
            attempt_no=1,
            prompt_version="quiz_generation.v1",
            output_schema_version="v1",
            output=out,
        ),
        metadata=wmd,
    )
    assert res.status == common.JOB_STATUS_SUCCEEDED
    result = await stub.GetJobResult(
        rr.GetJobResultRequest(job_id=job.job_id, user_id="u1"), metadata=md
    )
    assert len(result.items) == 1
    assert json_format.MessageToDict(result.items[0])["stem"] == "What do plants make from light?"
