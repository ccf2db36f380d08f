"""The learning-data and result RPCs over a real grpc.aio server (reference §3.1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

import job_service.learning.tables as lm
from airuntime_common import metadata
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import GrpcServer
from job_service.learning import results, snapshots
from job_service.rpc.learning import LearningRpcs
from job_service.services.domain import JobDomain
from job_service.store.clock import DbClock
from job_service.store.tables import jobs
from tests.unit.job_service.conftest import make_settings
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

from .conftest import DOCS

N, PER = 90, 20
TOKEN = "learning-test-token-0123456789"
MD = metadata.outgoing(TOKEN)

#: The core job table (the result RPC reads a job's status and type).
JOBS = jobs


def job_row(job_id: str, user_id: str, **columns: Any) -> dict[str, Any]:
    """A job row with every required column (the defaults of a fresh pending job)."""
    now = datetime(2026, 1, 1)
    row: dict[str, Any] = {
        "job_id": job_id, "user_id": user_id, "job_type": "learning_state_analysis",
        "target_type": "user", "target_id": user_id, "status": "pending", "priority": 0,
        "params": {}, "api_key_mode": "platform_key", "model_provider": "deepseek",
        "model_name": "deepseek-chat", "attempt_no": 0, "retry_count": 0,
        "max_retry_count": 3, "timeout_seconds": 120, "cancel_requested": False,
        "available_at": now, "created_at": now, "updated_at": now,
    }  # fmt: skip
    row.update(columns)
    return row


class Servicer(LearningRpcs, service_pb2_grpc.JobServiceServicer):  # type: ignore[misc]
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self.settings = None
        # the real transaction runner: its SQLite write queue is what the writes rely on
        self.domain = JobDomain(
            sessions,
            DbClock(sessions.kw["bind"].dialect.name),
            settings=make_settings(sessions.kw["bind"].url.render_as_string(hide_password=False)),
            learning=None,  # type: ignore[arg-type]
            credentials=None,  # type: ignore[arg-type]
        )


@pytest.fixture
def servicer(sessions: async_sessionmaker[AsyncSession]) -> Servicer:
    return Servicer(sessions)


@pytest.fixture
async def stub(
    engine: AsyncEngine, servicer: Servicer
) -> AsyncIterator[service_pb2_grpc.JobServiceStub]:
    async with engine.begin() as conn:
        await conn.run_sync(JOBS.metadata.create_all)
    server = GrpcServer(
        token=TOKEN,
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.job.v1.JobService"],
        register=lambda s: service_pb2_grpc.add_JobServiceServicer_to_server(servicer, s),
    )
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield service_pb2_grpc.JobServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


async def call(method: Any, request: Any) -> Any:
    return await method(request, metadata=MD, timeout=10)


async def refused(method: Any, request: Any) -> AppError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call(method, request)
    return from_rpc_error(exc.value)


async def test_materials_knowledge_points_and_events(stub: service_pb2_grpc.JobServiceStub) -> None:
    created = await call(
        stub.CreateMaterial,
        rr.CreateMaterialRequest(
            user_id="u1", title="Photo", content=(DOCS / "chinese.md").read_text()
        ),
    )
    material = created.material
    assert material.user_id == "u1" and material.title == "Photo"
    assert [b.ordinal for b in material.blocks] == list(range(6))
    assert material.blocks[0].text == "光合作用"
    assert material.HasField("created_at")

    got = await call(
        stub.GetMaterial, rr.GetMaterialRequest(user_id="u1", material_id=material.material_id)
    )
    assert got.material == material
    err = await refused(
        stub.GetMaterial, rr.GetMaterialRequest(user_id="u2", material_id=material.material_id)
    )
    assert err.code == ErrorCode.NOT_FOUND

    err = await refused(
        stub.CreateMaterial,
        rr.CreateMaterialRequest(user_id="u1", title="Big", content="x" * (1024 * 1024 + 1)),
    )
    assert err.code == ErrorCode.PAYLOAD_TOO_LARGE

    kp = (
        await call(
            stub.CreateKnowledgePoint,
            rr.CreateKnowledgePointRequest(
                user_id="u1",
                material_id=material.material_id,
                name="两个阶段",
                block_ids=[material.blocks[3].block_id],
            ),
        )
    ).knowledge_point
    assert kp.name == "两个阶段" and list(kp.block_ids) == [material.blocks[3].block_id]
    err = await refused(
        stub.CreateKnowledgePoint,
        rr.CreateKnowledgePointRequest(
            user_id="u1", material_id=material.material_id, name="x", block_ids=["nope"]
        ),
    )
    assert err.code == ErrorCode.NOT_FOUND  # an unknown id, body or path (reference §3)
    assert err.details is not None and err.details["unknownBlockIds"] == ["nope"]

    events = [
        msg.LearningEvent(
            event_id="e1",
            type=msg.LEARNING_EVENT_TYPE_READING,
            block_id=material.blocks[1].block_id,
            dwell_seconds=30,
        ),
        msg.LearningEvent(
            event_id="e2",
            type=msg.LEARNING_EVENT_TYPE_QUIZ_ATTEMPT,
            knowledge_point_id=kp.knowledge_point_id,
            correct=False,
        ),
        msg.LearningEvent(
            event_id="e1",
            type=msg.LEARNING_EVENT_TYPE_READING,
            block_id=material.blocks[1].block_id,
        ),
    ]
    events[0].occurred_at.FromJsonString("2026-11-02T08:30:00.123Z")
    answer = await call(
        stub.RecordLearningEvents, rr.RecordLearningEventsRequest(user_id="u1", events=events)
    )
    assert (answer.accepted, answer.duplicates) == (2, 1)
    answer = await call(
        stub.RecordLearningEvents, rr.RecordLearningEventsRequest(user_id="u1", events=events)
    )
    assert (answer.accepted, answer.duplicates) == (0, 3)

    bad = [events[0], msg.LearningEvent(event_id="e9")]  # no type
    err = await refused(
        stub.RecordLearningEvents, rr.RecordLearningEventsRequest(user_id="u1", events=bad)
    )
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert err.details is not None and err.details["field"] == "events[1].type"
    foreign = [
        msg.LearningEvent(
            event_id="e9",
            type=msg.LEARNING_EVENT_TYPE_READING,
            block_id=material.blocks[1].block_id,
        )
    ]
    err = await refused(
        stub.RecordLearningEvents, rr.RecordLearningEventsRequest(user_id="u2", events=foreign)
    )
    assert err.code == ErrorCode.NOT_FOUND  # another user's block
    assert err.details is not None and err.details["field"] == "events[0].blockId"
    too_many = [
        msg.LearningEvent(
            event_id=f"m{i}",
            type=msg.LEARNING_EVENT_TYPE_READING,
            block_id=material.blocks[1].block_id,
        )
        for i in range(501)
    ]
    err = await refused(
        stub.RecordLearningEvents, rr.RecordLearningEventsRequest(user_id="u1", events=too_many)
    )
    assert err.code == ErrorCode.INVALID_ARGUMENT


async def test_job_results_and_result_items(
    stub: service_pb2_grpc.JobServiceStub, sessions: async_sessionmaker[AsyncSession]
) -> None:
    material = (
        await call(
            stub.CreateMaterial,
            rr.CreateMaterialRequest(user_id="u1", title="T", content="One.\n\nTwo."),
        )
    ).material
    block = material.blocks[1].block_id
    async with sessions() as s, s.begin():
        snap = await snapshots.build_snapshot(
            s,
            user_id="u1",
            job_type="flashcard_generation",
            target_type="user",
            target_id="u1",
            params={},
        )
        await s.execute(
            insert(JOBS),
            [
                job_row(
                    "done",
                    "u1",
                    job_type="flashcard_generation",
                    status="succeeded",
                    output_schema_version="v1",
                    snapshot_id=snap,
                ),
                job_row(
                    "busy",
                    "u1",
                    job_type="flashcard_generation",
                    status="running",
                    output_schema_version=None,
                    snapshot_id=snap,
                ),
            ],
        )
        output = {
            "items": [
                {"front": "Two?", "back": "Two.", "sourceBlockIds": [block]},
                {"front": "Count?", "back": "2", "sourceBlockIds": [block]},
            ]
        }
        await results.insert_result_row(
            s,
            job_id="done",
            attempt_no=1,
            output_hash="h",
            prompt_version=None,
            output_schema_version="v1",
            output=output,
        )
        await results.accept_result(
            s,
            job_id="done",
            user_id="u1",
            job_type="flashcard_generation",
            snapshot_id=snap,
            output_schema_version="v1",
            output=output,
        )

    answer = await call(stub.GetJobResult, rr.GetJobResultRequest(job_id="done", user_id="u1"))
    assert answer.job_id == "done"
    assert answer.job_type == common_pb2.JOB_TYPE_FLASHCARD_GENERATION
    assert answer.output_schema_version == "v1"
    items = [json_format.MessageToDict(i) for i in answer.items]
    assert [(i["front"], i["back"], i["sourceBlockIds"]) for i in items] == [
        ("Two?", "Two.", [block]),
        ("Count?", "2", [block]),
    ]
    assert all(i["flashcardId"] and i["knowledgePointId"] is None for i in items)
    # an admin call (no user) reads any job
    assert len((await call(stub.GetJobResult, rr.GetJobResultRequest(job_id="done"))).items) == 2

    for request, code in (
        (rr.GetJobResultRequest(job_id="done", user_id="u2"), ErrorCode.JOB_NOT_FOUND),
        (rr.GetJobResultRequest(job_id="nope", user_id="u1"), ErrorCode.JOB_NOT_FOUND),
        (rr.GetJobResultRequest(job_id="busy", user_id="u1"), ErrorCode.INVALID_JOB_STATE),
    ):
        err = await refused(stub.GetJobResult, request)
        assert err.code == code

    page = await call(
        stub.ListResultItems,
        rr.ListResultItemsRequest(user_id="u1", kind=rr.RESULT_KIND_FLASHCARDS, page_size=1),
    )
    assert len(page.items) == 1 and page.next_page_token
    page2 = await call(
        stub.ListResultItems,
        rr.ListResultItemsRequest(
            user_id="u1",
            kind=rr.RESULT_KIND_FLASHCARDS,
            page_size=1,
            page_token=page.next_page_token,
        ),
    )
    assert len(page2.items) == 1 and page2.next_page_token == ""
    assert {json_format.MessageToDict(i)["front"] for i in [*page.items, *page2.items]} == {
        "Two?",
        "Count?",
    }
    err = await refused(stub.ListResultItems, rr.ListResultItemsRequest(user_id="u1"))
    assert err.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.mysql
async def test_concurrent_event_batches_all_land(
    stub: service_pb2_grpc.JobServiceStub,
    servicer: Servicer,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """30 batches of one user's reading events at once, a third of them repeating
    another batch's events: every call succeeds (SQLite's one writer included: the
    writes queue instead of failing their lock upgrade) and the running totals hold
    exactly the distinct events."""
    material = (
        await call(
            stub.CreateMaterial,
            rr.CreateMaterialRequest(
                user_id="u1", title="Photo", content=(DOCS / "chinese.md").read_text()
            ),
        )
    ).material
    block = material.blocks[1].block_id

    def batch(i: int) -> rr.RecordLearningEventsRequest:
        base = i if i % 3 else i - 1  # every third batch repeats the previous one's ids
        events = [
            msg.LearningEvent(
                event_id=f"b{base}-e{j}",
                type=msg.LEARNING_EVENT_TYPE_READING,
                block_id=block,
                dwell_seconds=5,
            )
            for j in range(PER)
        ]
        return rr.RecordLearningEventsRequest(user_id="u1", events=events)

    async def job_writes(n: int) -> None:
        """The job operations' own writes (claims, heartbeats, reports) meanwhile."""
        for k in range(n):
            await servicer.domain.tx(
                lambda s, k=k: s.execute(insert(JOBS).values(**job_row(f"j{k}", "u9")))
            )

    *answers, _ = await asyncio.gather(
        *(call(stub.RecordLearningEvents, batch(i)) for i in range(1, N + 1)), job_writes(200)
    )
    distinct = {e.event_id for i in range(1, N + 1) for e in batch(i).events}
    assert sum(a.accepted for a in answers) == len(distinct) == PER * N * 2 // 3
    assert sum(a.duplicates for a in answers) == PER * N // 3
    async with sessions() as session:
        stat = (
            await session.execute(
                select(lm.LearningBlockStat.dwell_seconds).where(
                    lm.LearningBlockStat.user_id == "u1", lm.LearningBlockStat.block_id == block
                )
            )
        ).scalar_one()
        events = await session.scalar(
            select(func.count())
            .select_from(lm.LearningEvent)
            .where(lm.LearningEvent.user_id == "u1")
        )
    assert events == len(distinct)
    assert stat == 5 * len(distinct)
