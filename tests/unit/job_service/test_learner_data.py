"""The learner's data: lists, paging, deletes and erasure (SPEC §9.2), on the real
job_service (gRPC server, real learning room), on SQLite and MariaDB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError
from airuntime_common.grpc_errors import from_rpc_error
from job_service.app import JobServiceApp, serve
from job_service.services.ports import AllowAllCredentials
from tests.unit.job_service.conftest import TOKEN, create_schema, make_settings
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

DOC = "# Cells\n\nCells are the unit of life.\n\nMitochondria make ATP.\n\nRibosomes make proteins.\n"


@dataclass
class Svc:
    """A running job_service with the real learning room and a stub."""

    app: JobServiceApp
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.JobServiceStub

    async def call(self, method: str, request: Any, instance: str | None = None) -> Any:
        """Call ``method``; a refusal is raised as its :class:`AppError`."""
        try:
            return await getattr(self.stub, method)(
                request, metadata=metadata.outgoing(TOKEN, instance)
            )
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None

    async def material(self, user: str, title: str = "Cells", content: str = DOC) -> Any:
        resp = await self.call(
            "CreateMaterial", rr.CreateMaterialRequest(user_id=user, title=title, content=content)
        )
        return resp.material

    async def create(self, user: str, target_type: str, target_id: str, **kw: Any) -> Any:
        req = rr.CreateJobRequest(
            user_id=user,
            job_type=JOB_TYPE.to_proto(kw.pop("job_type", "learning_state_analysis")),  # type: ignore[arg-type]
            target_type=TARGET_TYPE.to_proto(target_type),  # type: ignore[arg-type]
            target_id=target_id,
            api_key_mode=API_KEY_MODE.to_proto("platform_key"),  # type: ignore[arg-type]
            **kw,
        )
        return (await self.call("CreateJob", req)).job


@pytest.fixture
async def svc(db_url: str) -> AsyncIterator[Svc]:
    await create_schema(db_url)
    app = await serve(make_settings(db_url), credentials=AllowAllCredentials(), start_metrics=False)
    channel = grpc.aio.insecure_channel(app.address)
    try:
        yield Svc(app, channel, service_pb2_grpc.JobServiceStub(channel))
    finally:
        await channel.close()
        await app.stop(grace=0.1)


async def code_of(coro: Any) -> str:
    with pytest.raises(AppError) as info:
        await coro
    return str(info.value.code)


# ------------------------------------------------------------------ lists and paging


async def test_materials_list_newest_first_with_opaque_tokens(svc: Svc) -> None:
    made = [(await svc.material("u1", title=f"M{i}")).material_id for i in range(5)]
    await svc.material("u2", title="other's")
    seen: list[str] = []
    token = ""
    while True:
        resp = await svc.call(
            "ListMaterials", rr.ListMaterialsRequest(user_id="u1", page_size=2, page_token=token)
        )
        assert len(resp.materials) <= 2
        seen += [m.material_id for m in resp.materials]
        assert all(m.block_count == 4 and not m.blocks for m in resp.materials)
        token = resp.next_page_token
        if not token:
            break
    assert seen == list(reversed(made))
    for size in (-1, 101):
        assert (
            await code_of(
                svc.call("ListMaterials", rr.ListMaterialsRequest(user_id="u1", page_size=size))
            )
            == "INVALID_ARGUMENT"
        )
    bad = rr.ListMaterialsRequest(user_id="u1", page_token="not-a-token!")
    assert await code_of(svc.call("ListMaterials", bad)) == "INVALID_ARGUMENT"


async def test_material_blocks_paged_in_order(svc: Svc) -> None:
    m = await svc.material("u1")
    whole = await svc.call("GetMaterial", rr.GetMaterialRequest(user_id="u1", material_id=m.material_id))
    assert len(whole.material.blocks) == 4 and whole.next_blocks_page_token == ""
    got: list[str] = []
    token = ""
    pages = 0
    while True:
        resp = await svc.call(
            "GetMaterial",
            rr.GetMaterialRequest(
                user_id="u1",
                material_id=m.material_id,
                blocks_page_size=3,
                blocks_page_token=token,
            ),
        )
        pages += 1
        got += [b.block_id for b in resp.material.blocks]
        token = resp.next_blocks_page_token
        if not token:
            break
    assert pages == 2
    assert got == [b.block_id for b in whole.material.blocks]
    too_big = rr.GetMaterialRequest(user_id="u1", material_id=m.material_id, blocks_page_size=1001)
    assert await code_of(svc.call("GetMaterial", too_big)) == "INVALID_ARGUMENT"
    other = rr.GetMaterialRequest(user_id="u2", material_id=m.material_id, blocks_page_size=3)
    assert await code_of(svc.call("GetMaterial", other)) == "NOT_FOUND"


async def test_jobs_by_ids_in_the_order_asked(svc: Svc) -> None:
    a = await svc.create("u1", "user", "u1")
    b = await svc.create("u1", "user", "u1")
    theirs = await svc.create("u2", "user", "u2")
    asked = [b.job_id, "nope", theirs.job_id, a.job_id, b.job_id]
    resp = await svc.call("ListJobs", rr.ListJobsRequest(user_id="u1", job_ids=asked))
    assert [j.job_id for j in resp.jobs] == [b.job_id, a.job_id]
    assert resp.next_page_token == ""
    many = rr.ListJobsRequest(user_id="u1", job_ids=[f"j{i}" for i in range(101)])
    assert await code_of(svc.call("ListJobs", many)) == "INVALID_ARGUMENT"
