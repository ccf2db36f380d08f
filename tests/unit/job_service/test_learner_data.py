"""The learner's data: lists, paging, deletes and erasure (reference §9.2), on the real
job_service (gRPC server, real learning room), on SQLite and MariaDB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError
from airuntime_common.grpc_errors import from_rpc_error
from job_service.app import JobServiceApp, serve
from job_service.services.ports import AllowAllCredentials
from tests.unit.job_service.conftest import TOKEN, create_schema, make_settings
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

DOC = (
    "# Cells\n\nCells are the unit of life.\n\nMitochondria make ATP.\n\nRibosomes make proteins.\n"
)


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


async def start_svc(db_url: str, **overrides: Any) -> Svc:
    app = await serve(
        make_settings(db_url, **overrides), credentials=AllowAllCredentials(), start_metrics=False
    )
    channel = grpc.aio.insecure_channel(app.address)
    return Svc(app, channel, service_pb2_grpc.JobServiceStub(channel))


async def stop_svc(svc: Svc) -> None:
    await svc.channel.close()
    await svc.app.stop(grace=0.1)


@pytest.fixture
async def svc(db_url: str) -> AsyncIterator[Svc]:
    await create_schema(db_url)
    one = await start_svc(db_url)
    try:
        yield one
    finally:
        await stop_svc(one)


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
    whole = await svc.call(
        "GetMaterial", rr.GetMaterialRequest(user_id="u1", material_id=m.material_id)
    )
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


# ------------------------------------------------------------------ running jobs by hand

FLASH = "flashcard_generation"


def to_struct(value: dict[str, Any]) -> Any:
    from google.protobuf import json_format, struct_pb2

    return json_format.ParseDict(value, struct_pb2.Struct())


async def claim(svc: Svc, job_type: str, instance: str = "w1") -> Any:
    """Claim (and start) the one pending job of ``job_type``; returns the claimed Job."""
    resp = await svc.call(
        "ClaimJobs",
        rr.ClaimJobsRequest(capabilities=[JOB_TYPE.to_proto(job_type)], limit=1),  # type: ignore[list-item]
        instance,
    )
    assert len(resp.jobs) == 1
    return resp.jobs[0]


def model_call(tokens: int = 1000) -> Any:
    from zhixi.airuntime.job.v1 import message_pb2 as msg

    return msg.ModelCall(
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode=API_KEY_MODE.to_proto("platform_key"),  # type: ignore[arg-type]
        prompt_tokens=tokens,
        completion_tokens=tokens // 2,
        latency_ms=5,
        outcome="succeeded",
    )


async def submit(svc: Svc, job: Any, output: dict[str, Any], instance: str = "w1") -> Any:
    return await svc.call(
        "SubmitResult",
        rr.SubmitResultRequest(
            job_id=job.job_id,
            attempt_no=job.attempt_no,
            prompt_version="v1",
            output_schema_version="v1",
            output=to_struct(output),
            invocations=[model_call()],
        ),
        instance,
    )


async def flashcards(svc: Svc, user: str, material: Any, kp_id: str | None, n: int = 2) -> Any:
    """A flashcard job on ``material`` run to success: ``n`` cards citing its first block."""
    job = await svc.create(user, "material", material.material_id, job_type=FLASH)
    leased = await claim(svc, FLASH)
    assert leased.job_id == job.job_id
    block = material.blocks[0].block_id
    items = [
        {
            "front": f"Q{i} {job.job_id}",
            "back": "A",
            "knowledgePointId": kp_id,
            "sourceBlockIds": [block],
        }
        for i in range(n)
    ]
    await submit(svc, leased, {"items": items})
    return job


async def kp(svc: Svc, user: str, material: Any, name: str = "ATP") -> Any:
    resp = await svc.call(
        "CreateKnowledgePoint",
        rr.CreateKnowledgePointRequest(
            user_id=user,
            material_id=material.material_id,
            name=name,
            block_ids=[material.blocks[1].block_id],
        ),
    )
    return resp.knowledge_point


async def result_items(svc: Svc, user: str, job_id: str) -> list[dict[str, Any]]:
    from google.protobuf import json_format

    resp = await svc.call("GetJobResult", rr.GetJobResultRequest(job_id=job_id, user_id=user))
    return [json_format.MessageToDict(i) for i in resp.items]


# ------------------------------------------------------------------ knowledge points and items


async def test_knowledge_points_listed_by_material_and_paged(svc: Svc) -> None:
    m1, m2 = await svc.material("u1"), await svc.material("u1", title="Two")
    made = [(await kp(svc, "u1", m1, f"k{i}")).knowledge_point_id for i in range(3)]
    other = (await kp(svc, "u1", m2, "elsewhere")).knowledge_point_id
    page = await svc.call(
        "ListKnowledgePoints",
        rr.ListKnowledgePointsRequest(user_id="u1", material_id=m1.material_id, page_size=2),
    )
    assert [k.knowledge_point_id for k in page.knowledge_points] == [made[2], made[1]]
    assert list(page.knowledge_points[0].block_ids) == [m1.blocks[1].block_id]
    rest = await svc.call(
        "ListKnowledgePoints",
        rr.ListKnowledgePointsRequest(
            user_id="u1", material_id=m1.material_id, page_size=2, page_token=page.next_page_token
        ),
    )
    assert [k.knowledge_point_id for k in rest.knowledge_points] == [made[0]]
    assert rest.next_page_token == ""
    every = await svc.call("ListKnowledgePoints", rr.ListKnowledgePointsRequest(user_id="u1"))
    assert [k.knowledge_point_id for k in every.knowledge_points] == [other, *reversed(made)]
    theirs = rr.ListKnowledgePointsRequest(user_id="u2", material_id=m1.material_id)
    assert await code_of(svc.call("ListKnowledgePoints", theirs)) == "NOT_FOUND"
    none = await svc.call("ListKnowledgePoints", rr.ListKnowledgePointsRequest(user_id="u2"))
    assert list(none.knowledge_points) == []


async def test_deleting_a_knowledge_point_keeps_the_items_that_named_it(svc: Svc) -> None:
    m = await svc.material("u1")
    point = await kp(svc, "u1", m)
    job = await flashcards(svc, "u1", m, point.knowledge_point_id)
    before = await result_items(svc, "u1", job.job_id)
    assert [i["knowledgePointId"] for i in before] == [point.knowledge_point_id] * 2
    assert all(i["itemId"] == i["flashcardId"] for i in before)
    theirs = rr.DeleteKnowledgePointRequest(
        user_id="u2", knowledge_point_id=point.knowledge_point_id
    )
    assert await code_of(svc.call("DeleteKnowledgePoint", theirs)) == "NOT_FOUND"
    mine = rr.DeleteKnowledgePointRequest(user_id="u1", knowledge_point_id=point.knowledge_point_id)
    await svc.call("DeleteKnowledgePoint", mine)
    after = await result_items(svc, "u1", job.job_id)
    assert [i["front"] for i in after] == [i["front"] for i in before]
    assert [i.get("knowledgePointId") for i in after] == [None, None]
    assert await code_of(svc.call("DeleteKnowledgePoint", mine)) == "NOT_FOUND"
    listed = await svc.call("ListKnowledgePoints", rr.ListKnowledgePointsRequest(user_id="u1"))
    assert list(listed.knowledge_points) == []


async def test_deleting_a_result_item(svc: Svc) -> None:
    m = await svc.material("u1")
    job = await flashcards(svc, "u1", m, None)
    first, second = await result_items(svc, "u1", job.job_id)
    kind = rr.RESULT_KIND_FLASHCARDS
    theirs = rr.DeleteResultItemRequest(user_id="u2", kind=kind, item_id=first["itemId"])
    assert await code_of(svc.call("DeleteResultItem", theirs)) == "NOT_FOUND"
    wrong_kind = rr.DeleteResultItemRequest(
        user_id="u1", kind=rr.RESULT_KIND_QUESTIONS, item_id=first["itemId"]
    )
    assert await code_of(svc.call("DeleteResultItem", wrong_kind)) == "NOT_FOUND"
    mine = rr.DeleteResultItemRequest(user_id="u1", kind=kind, item_id=first["itemId"])
    await svc.call("DeleteResultItem", mine)
    assert [i["itemId"] for i in await result_items(svc, "u1", job.job_id)] == [second["itemId"]]
    listed = await svc.call("ListResultItems", rr.ListResultItemsRequest(user_id="u1", kind=kind))
    assert len(listed.items) == 1
    assert await code_of(svc.call("DeleteResultItem", mine)) == "NOT_FOUND"


# ------------------------------------------------------------------ deleting a material

OTHER_DOC = "# Rivers\n\nRivers carve valleys over time.\n\nDeltas form at river mouths.\n"


async def dump(svc: Svc) -> str:
    """Every row of every job_service table, as text."""
    from sqlalchemy import select

    from job_service.store.base import Base

    parts: list[str] = []
    async with svc.app.domain.sessions() as session:
        for table in Base.metadata.sorted_tables:
            for row in (await session.execute(select(table))).all():
                parts.append(f"{table.name}: {row!r}")
    return "\n".join(parts)


async def read_event(svc: Svc, user: str, material: Any, n: int = 0) -> None:
    from airuntime_common.enums import LEARNING_EVENT_TYPE
    from zhixi.airuntime.job.v1 import message_pb2 as msg

    event = msg.LearningEvent(
        event_id=f"ev-{material.material_id}-{n}",
        type=LEARNING_EVENT_TYPE.to_proto("reading"),  # type: ignore[arg-type]
        material_id=material.material_id,
        block_id=material.blocks[0].block_id,
        dwell_seconds=30.0,
    )
    await svc.call(
        "RecordLearningEvents", rr.RecordLearningEventsRequest(user_id=user, events=[event])
    )


async def test_deleting_a_material_takes_what_was_built_from_it(svc: Svc) -> None:
    m = await svc.material("u1")
    kept = await svc.material("u1", title="Rivers", content=OTHER_DOC)
    point = await kp(svc, "u1", m)
    await read_event(svc, "u1", m)
    await read_event(svc, "u1", kept)
    done = await flashcards(svc, "u1", m, point.knowledge_point_id)
    untouched = await flashcards(svc, "u1", kept, None)
    leased_job = await svc.create("u1", "material", m.material_id, job_type=FLASH)
    leased = await claim(svc, FLASH, "w2")
    assert leased.job_id == leased_job.job_id
    pending = await svc.create("u1", "knowledge_point", point.knowledge_point_id, job_type=FLASH)
    on_user = await svc.create("u1", "user", "u1")  # its snapshot holds the material's blocks
    theirs = rr.DeleteMaterialRequest(user_id="u2", material_id=m.material_id)
    assert await code_of(svc.call("DeleteMaterial", theirs)) == "NOT_FOUND"

    ended = await svc.call(
        "DeleteMaterial", rr.DeleteMaterialRequest(user_id="u1", material_id=m.material_id)
    )
    assert (ended.cancelled, ended.cancel_requested) == (2, 1)

    async def status(job_id: str) -> Any:
        return (await svc.call("GetJob", rr.GetJobRequest(job_id=job_id, user_id="u1"))).job

    assert (await status(pending.job_id)).status == (await status(on_user.job_id)).status
    assert (await status(leased_job.job_id)).cancel_requested
    late = {"items": [{"front": "late", "back": "b", "sourceBlockIds": [m.blocks[0].block_id]}]}
    assert await code_of(submit(svc, leased, late, "w2")) == "INVALID_JOB_STATE"
    after = await status(leased_job.job_id)

    assert JOB_STATUS.to_str(after.status) == "cancelled"
    assert JOB_STATUS.to_str((await status(pending.job_id)).status) == "cancelled"
    assert JOB_STATUS.to_str((await status(done.job_id)).status) == "succeeded"  # rows stay
    assert await result_items(svc, "u1", done.job_id) == []
    assert len(await result_items(svc, "u1", untouched.job_id)) == 2
    text = await dump(svc)
    for sentence in ("Mitochondria make ATP", "Ribosomes make proteins", "late"):
        assert sentence not in text
    assert "Deltas form at river mouths" in text
    listed = await svc.call("ListMaterials", rr.ListMaterialsRequest(user_id="u1"))
    assert [x.material_id for x in listed.materials] == [kept.material_id]
    again = rr.DeleteMaterialRequest(user_id="u1", material_id=m.material_id)
    assert await code_of(svc.call("DeleteMaterial", again)) == "NOT_FOUND"


# ------------------------------------------------------------------ retry


async def failed_job(svc: Svc, user: str, target_type: str, target_id: str) -> Any:
    """A job run once and failed with a final code."""
    job = await svc.create(user, target_type, target_id)
    leased = await claim(svc, "learning_state_analysis")
    assert leased.job_id == job.job_id
    await svc.call(
        "FailJob",
        rr.FailJobRequest(
            job_id=job.job_id,
            attempt_no=leased.attempt_no,
            error_code="MODEL_BAD_REQUEST",
            error_message="bad",
        ),
        "w1",
    )
    return job


def retry_req(job_id: str, user: str | None = "u1", **kw: Any) -> Any:
    req = rr.RerunJobRequest(job_id=job_id, **kw)
    if user is not None:
        req.user_id = user
    return req


async def test_user_retry_of_a_failed_job(svc: Svc) -> None:
    failed = await failed_job(svc, "u1", "user", "u1")
    pending = await svc.create("u1", "user", "u1")
    assert await code_of(svc.call("RerunJob", retry_req(pending.job_id))) == "INVALID_JOB_STATE"
    theirs = retry_req(failed.job_id, "u2")
    assert await code_of(svc.call("RerunJob", theirs)) == "JOB_NOT_FOUND"
    assert await code_of(svc.call("RerunJob", retry_req("nope"))) == "JOB_NOT_FOUND"
    first = await svc.call("RerunJob", retry_req(failed.job_id, idempotency_key="k1"))
    assert not first.replayed
    assert first.job.retried_from_job_id == failed.job_id
    assert first.job.snapshot_id == failed.snapshot_id
    again = await svc.call("RerunJob", retry_req(failed.job_id, idempotency_key="k1"))
    assert again.replayed and again.job.job_id == first.job.job_id
    other = await svc.call("RerunJob", retry_req(failed.job_id, rebuild_snapshot=True))
    assert not other.replayed and other.job.job_id != first.job.job_id
    await svc.call("SetAiAuthorization", rr.SetAiAuthorizationRequest(user_id="u1", granted=False))
    assert await code_of(svc.call("RerunJob", retry_req(failed.job_id))) == "AI_NOT_AUTHORIZED"


async def test_user_retry_is_held_to_the_daily_quota(db_url: str) -> None:
    await create_schema(db_url)
    one = await start_svc(db_url, USER_DAILY_JOB_QUOTA=2)
    try:
        failed = await failed_job(one, "u1", "user", "u1")
        await one.create("u1", "user", "u1")
        assert await code_of(one.call("RerunJob", retry_req(failed.job_id))) == "QUOTA_EXCEEDED"
        admin = await one.call("RerunJob", retry_req(failed.job_id, user=None))  # not held
        assert admin.job.retried_from_job_id == failed.job_id
    finally:
        await stop_svc(one)


async def test_retry_rebuilds_a_snapshot_whose_material_was_deleted(svc: Svc) -> None:
    m = await svc.material("u1")
    on_user = await failed_job(svc, "u1", "user", "u1")
    on_material = await failed_job(svc, "u1", "material", m.material_id)
    await svc.call(
        "DeleteMaterial", rr.DeleteMaterialRequest(user_id="u1", material_id=m.material_id)
    )
    retried = await svc.call("RerunJob", retry_req(on_user.job_id))
    assert retried.job.snapshot_id and retried.job.snapshot_id != on_user.snapshot_id
    assert await code_of(svc.call("RerunJob", retry_req(on_material.job_id))) == "NOT_FOUND"


# ------------------------------------------------------------------ erasure

ERASED = "learner-erase-q7zk"


async def costs(svc: Svc) -> Any:
    from datetime import UTC, datetime, timedelta

    today = datetime.now(UTC).date()
    resp = await svc.call(
        "GetCosts",
        rr.GetCostsRequest(
            from_date=str(today - timedelta(days=1)),
            to_date=str(today + timedelta(days=1)),
            group_by="apiKeyMode",
        ),
    )
    return [(r.key, r.calls, r.prompt_tokens, r.completion_tokens, r.cost_usd) for r in resp.rows]


async def test_erasing_a_user_leaves_no_row_of_theirs(db_url: str) -> None:
    await create_schema(db_url)
    one = await start_svc(db_url, USER_DAILY_JOB_QUOTA=5)
    try:
        m = await one.material(ERASED)
        kept = await one.material("u2", title="Rivers", content=OTHER_DOC)
        point = await kp(one, ERASED, m)
        await read_event(one, ERASED, m)
        await flashcards(one, ERASED, m, point.knowledge_point_id)
        await flashcards(one, "u2", kept, None)
        leased_job = await one.create(ERASED, "material", m.material_id, job_type=FLASH)
        leased = await claim(one, FLASH, "w3")
        assert leased.job_id == leased_job.job_id
        await one.create(ERASED, "user", ERASED)  # pending
        flip = rr.SetAiAuthorizationRequest(user_id=ERASED, granted=True)
        await one.call("SetAiAuthorization", flip)
        before = await costs(one)

        erased = await one.call("EraseUser", rr.EraseUserRequest(user_id=ERASED))
        assert (erased.cancelled, erased.cancel_requested, erased.jobs_removed) == (1, 1, 3)

        text = await dump(one)
        assert ERASED not in text
        for sentence in ("Mitochondria make ATP", "Cells are the unit of life", "ATP"):
            assert sentence not in text, sentence
        assert "Deltas form at river mouths" in text  # the other user's stay
        name = one.app.domain.erasure.pseudonym(ERASED)
        assert name in text  # the kept invocation logs and the day's usage row
        assert await costs(one) == before
        late = {"items": [{"front": "late", "back": "b", "sourceBlockIds": [m.blocks[0].block_id]}]}
        # the leased job stays, with nothing of the user on it, until its attempt ends:
        # its result writes nothing (409, the job ends cancelled), and then it goes with
        # its events (case N7)
        kept_job = await one.call("GetJob", rr.GetJobRequest(job_id=leased.job_id))
        assert kept_job.job.user_id == name and not kept_job.job.params
        assert await code_of(submit(one, leased, late, "w3")) == "INVALID_JOB_STATE"
        assert await code_of(one.call("GetJob", rr.GetJobRequest(job_id=leased.job_id))) == (
            "JOB_NOT_FOUND"
        )
        assert leased.job_id not in await dump(one)
        assert "late" not in await dump(one)
        assert ERASED not in await dump(one)
        # the same id sees an empty account, and its day's quota is still used (3 of 5)
        mats = await one.call("ListMaterials", rr.ListMaterialsRequest(user_id=ERASED))
        assert list(mats.materials) == []
        jobs = await one.call("ListJobs", rr.ListJobsRequest(user_id=ERASED))
        assert list(jobs.jobs) == []
        switch = await one.call("GetAiAuthorization", rr.GetAiAuthorizationRequest(user_id=ERASED))
        assert switch.granted and not switch.HasField("changed_at")
        await one.create(ERASED, "user", ERASED)
        await one.create(ERASED, "user", ERASED)
        assert await code_of(one.create(ERASED, "user", ERASED)) == "QUOTA_EXCEEDED"
        again = await one.call("EraseUser", rr.EraseUserRequest(user_id=ERASED))
        assert again.jobs_removed == 2
        third = await one.call("EraseUser", rr.EraseUserRequest(user_id=ERASED))
        assert third.jobs_removed == 0
        assert await code_of(one.create(ERASED, "user", ERASED)) == "QUOTA_EXCEEDED"
    finally:
        await stop_svc(one)


def test_the_pseudonym_is_keyed_and_one_way() -> None:
    import hashlib

    from job_service.services.pseudonyms import pseudonym

    a, b = pseudonym(b"key-1", "u1"), pseudonym(b"key-2", "u1")
    assert a != b and a == pseudonym(b"key-1", "u1")
    assert a.startswith("erased-") and len(a) <= 64
    assert hashlib.sha256(b"u1").hexdigest()[:56] not in a


# ------------------------------------------------------------------ migration 0009


def test_migration_0009_matches_the_models(db_url: str) -> None:
    """After ``upgrade head`` the new table and the nullable column are as the models
    say; down to 0008 and up again works."""
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from job_service.migrate import alembic_config
    from job_service.store.base import Base

    cfg = alembic_config(db_url)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "0008")
    command.upgrade(cfg, "head")
    sync = make_url(db_url)
    dialect = sync.drivername.split("+")[0]
    engine = create_engine(sync.set(drivername="mysql+pymysql" if dialect == "mysql" else dialect))
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    mine = [
        d
        for d in diffs
        if "ai_runtime_erased_usage" in repr(d) or "'knowledge_point_id'" in repr(d)
    ]
    assert mine == []


async def test_a_create_after_the_lock_row_was_erased_elsewhere_makes_it_again(
    svc: Svc,
) -> None:
    """Another replica erased the user (their admission row went) while this one
    remembered the row: the create is still serialised by the row, made again."""
    from sqlalchemy import delete, func, select

    from job_service.store.tables import admission_locks

    await svc.create("u9", "user", "u9")  # the row exists, this process knows it
    async with svc.app.domain.sessions() as session, session.begin():
        await session.execute(delete(admission_locks).where(admission_locks.c.user_id == "u9"))
    await svc.create("u9", "user", "u9")
    async with svc.app.domain.sessions() as session:
        rows = (
            await session.execute(select(func.count()).where(admission_locks.c.user_id == "u9"))
        ).scalar_one()
    assert rows == (0 if svc.app.domain.clock.is_sqlite else 1)
