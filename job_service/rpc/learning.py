"""JobService RPCs of the learner's data and results (reference §3.1, §5).

Proto ↔ :mod:`job_service.learning` translation only: one transaction per RPC
(retried on deadlocks), every refusal a rich gRPC status (:func:`rpc`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from google.protobuf import json_format, struct_pb2
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import jobtypes
from airuntime_common.db import retry_transient
from airuntime_common.enums import LEARNING_EVENT_TYPE
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import from_timestamp, to_timestamp
from job_service import learning
from job_service.learning import results
from job_service.rpc.common import Ctx, rpc
from job_service.services.domain import JobDomain
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

T = TypeVar("T")

#: ``ResultKind`` enum number → ``list_user_items`` kind.
RESULT_KINDS: dict[int, str] = {
    rr.RESULT_KIND_ANALYSES: "analyses",
    rr.RESULT_KIND_WEAK_POINTS: "weak_points",
    rr.RESULT_KIND_RECOMMENDATIONS: "recommendations",
    rr.RESULT_KIND_QUESTIONS: "questions",
    rr.RESULT_KIND_FLASHCARDS: "flashcards",
}


def _kind(number: int) -> str:
    """A ``ResultKind`` number → its kind name.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unset or unknown kind.
    """
    kind = RESULT_KINDS.get(number)
    if kind is None:
        raise invalid_argument(
            "kind must be one of analyses, weak_points, recommendations, questions, flashcards",
            field="kind",
        )
    return kind


def to_struct(value: dict[str, Any]) -> struct_pb2.Struct:
    """A JSON object → ``google.protobuf.Struct`` (numbers become doubles)."""
    return json_format.ParseDict(value, struct_pb2.Struct())


def material_proto(view: learning.MaterialView) -> msg.Material:
    """Domain material → ``Material`` message."""
    return msg.Material(
        material_id=view.material_id,
        user_id=view.user_id,
        title=view.title,
        blocks=[
            msg.Block(block_id=b.block_id, ordinal=b.ordinal, text=b.text) for b in view.blocks
        ],
        created_at=to_timestamp(view.created_at),
        block_count=view.block_count,
    )


def knowledge_point_proto(view: learning.KnowledgePointView) -> msg.KnowledgePoint:
    """Domain knowledge point → ``KnowledgePoint`` message."""
    return msg.KnowledgePoint(
        knowledge_point_id=view.knowledge_point_id,
        user_id=view.user_id,
        material_id=view.material_id,
        name=view.name,
        block_ids=view.block_ids,
        created_at=to_timestamp(view.created_at),
    )


def event_from_proto(index: int, ev: msg.LearningEvent) -> learning.LearningEventIn:
    """``LearningEvent`` message → domain event; a bad type names the event index.

    Raises:
        AppError: ``INVALID_ARGUMENT`` with ``details.field = events[i].type`` etc.
    """
    try:
        kind = LEARNING_EVENT_TYPE.to_str(ev.type)
    except AppError:
        raise invalid_argument(
            f"events[{index}].type must be reading or quiz_attempt",
            field=f"events[{index}].type",
            index=index,
        ) from None
    data: dict[str, Any] = {"eventId": ev.event_id, "type": kind}
    for proto_name, key in (
        ("material_id", "materialId"),
        ("block_id", "blockId"),
        ("knowledge_point_id", "knowledgePointId"),
        ("dwell_seconds", "dwellSeconds"),
        ("correct", "correct"),
    ):
        if ev.HasField(proto_name):
            data[key] = getattr(ev, proto_name)
    if ev.HasField("occurred_at"):
        data["occurredAt"] = from_timestamp(ev.occurred_at)
    try:
        return learning.LearningEventIn.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise invalid_argument(
            f"events[{index}].{loc}: {first['msg']}",
            field=f"events[{index}].{loc}",
            index=index,
        ) from None


class LearningRpcs:
    """``CreateMaterial, GetMaterial, ListMaterials, DeleteMaterial, CreateKnowledgePoint,
    ListKnowledgePoints, DeleteKnowledgePoint, RecordLearningEvents, GetJobResult,
    ListResultItems, DeleteResultItem, EraseUser``."""

    domain: JobDomain

    async def _tx(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run the write ``fn`` in one transaction (:meth:`~job_service.store.tx.Store.tx`): retried on
        transient database errors and, on SQLite, begun with ``BEGIN IMMEDIATE``
        behind the process's write queue."""
        return await self.domain.tx(fn)

    async def _read(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run the read-only ``fn`` in one deferred transaction, retried on
        transient database errors (readers never queue behind writers)."""

        async def once() -> T:
            async with self.domain.sessions() as session, session.begin():
                return await fn(session)

        return await retry_transient(once)

    @rpc
    async def CreateMaterial(
        self, request: rr.CreateMaterialRequest, context: Ctx
    ) -> rr.CreateMaterialResponse:
        """Store a material split into blocks (``POST /v1/materials``)."""
        view = await self._tx(
            lambda s: learning.create_material(s, request.user_id, request.title, request.content)
        )
        return rr.CreateMaterialResponse(material=material_proto(view))

    @rpc
    async def GetMaterial(
        self, request: rr.GetMaterialRequest, context: Ctx
    ) -> rr.GetMaterialResponse:
        """Read one of the user's materials (``GET /v1/materials/{id}``); foreign → NOT_FOUND."""
        view = await self._read(
            lambda s: learning.get_material(
                s,
                request.user_id,
                request.material_id,
                blocks_page_size=request.blocks_page_size,
                blocks_page_token=request.blocks_page_token,
            )
        )
        return rr.GetMaterialResponse(
            material=material_proto(view),
            next_blocks_page_token=view.next_blocks_page_token or "",
        )

    @rpc
    async def ListMaterials(
        self, request: rr.ListMaterialsRequest, context: Ctx
    ) -> rr.ListMaterialsResponse:
        """A page of the user's materials, newest first (``GET /v1/materials``, reference §9.2)."""
        views, token = await self._read(
            lambda s: learning.list_materials(
                s,
                request.user_id,
                page_size_value=request.page_size,
                page_token=request.page_token,
            )
        )
        return rr.ListMaterialsResponse(
            materials=[material_proto(v) for v in views], next_page_token=token or ""
        )

    @rpc
    async def CreateKnowledgePoint(
        self, request: rr.CreateKnowledgePointRequest, context: Ctx
    ) -> rr.CreateKnowledgePointResponse:
        """Define a knowledge point over blocks of one material (``POST /v1/knowledge-points``)."""
        view = await self._tx(
            lambda s: learning.create_knowledge_point(
                s, request.user_id, request.material_id, request.name, list(request.block_ids)
            )
        )
        return rr.CreateKnowledgePointResponse(knowledge_point=knowledge_point_proto(view))

    @rpc
    async def DeleteMaterial(
        self, request: rr.DeleteMaterialRequest, context: Ctx
    ) -> rr.DeleteMaterialResponse:
        """Delete one of the user's materials and everything built from it; its live jobs
        are cancelled or asked to cancel (``DELETE /v1/materials/{id}``, reference §9.2)."""
        ended = await self.domain.delete_material(request.user_id, request.material_id)
        return rr.DeleteMaterialResponse(
            cancelled=ended.cancelled, cancel_requested=ended.cancel_requested
        )

    @rpc
    async def EraseUser(self, request: rr.EraseUserRequest, context: Ctx) -> rr.EraseUserResponse:
        """Erase every row of the user in job_service (``DELETE /v1/me``, reference §9.2)."""
        erased = await self.domain.erase_user(request.user_id)
        return rr.EraseUserResponse(
            cancelled=erased.cancelled,
            cancel_requested=erased.cancel_requested,
            jobs_removed=erased.jobs_removed,
        )

    @rpc
    async def ListKnowledgePoints(
        self, request: rr.ListKnowledgePointsRequest, context: Ctx
    ) -> rr.ListKnowledgePointsResponse:
        """A page of the user's knowledge points, newest first (reference §9.2)."""
        material_id = request.material_id if request.HasField("material_id") else None
        views, token = await self._read(
            lambda s: learning.list_knowledge_points(
                s,
                request.user_id,
                material_id=material_id,
                page_size_value=request.page_size,
                page_token=request.page_token,
            )
        )
        return rr.ListKnowledgePointsResponse(
            knowledge_points=[knowledge_point_proto(v) for v in views], next_page_token=token or ""
        )

    @rpc
    async def DeleteKnowledgePoint(
        self, request: rr.DeleteKnowledgePointRequest, context: Ctx
    ) -> rr.DeleteKnowledgePointResponse:
        """Delete one of the user's knowledge points; items naming it keep their text."""
        await self._tx(
            lambda s: learning.delete_knowledge_point(
                s, request.user_id, request.knowledge_point_id
            )
        )
        return rr.DeleteKnowledgePointResponse()

    @rpc
    async def DeleteResultItem(
        self, request: rr.DeleteResultItemRequest, context: Ctx
    ) -> rr.DeleteResultItemResponse:
        """Delete one of the user's business items of one kind (reference §9.2)."""
        kind = _kind(request.kind)
        await self._tx(
            lambda s: learning.delete_result_item(s, request.user_id, kind, request.item_id)
        )
        return rr.DeleteResultItemResponse()

    @rpc
    async def RecordLearningEvents(
        self, request: rr.RecordLearningEventsRequest, context: Ctx
    ) -> rr.RecordLearningEventsResponse:
        """Ingest learning events, idempotent by event id (``POST /v1/learning-events``)."""
        if len(request.events) > learning.MAX_EVENT_BATCH:
            raise invalid_argument(
                f"at most {learning.MAX_EVENT_BATCH} events per batch",
                field="events",
                count=len(request.events),
            )
        events = [event_from_proto(i, ev) for i, ev in enumerate(request.events)]
        accepted, duplicates = await self._tx(
            lambda s: learning.record_learning_events(s, request.user_id, events)
        )
        return rr.RecordLearningEventsResponse(accepted=accepted, duplicates=duplicates)

    @rpc
    async def GetJobResult(
        self, request: rr.GetJobResultRequest, context: Ctx
    ) -> rr.GetJobResultResponse:
        """The business rows of a succeeded job (``GET /v1/ai/jobs/{id}/result``).

        Without ``user_id`` (admin) any job is readable; with it, another
        user's job is ``JOB_NOT_FOUND``. Not yet succeeded → ``INVALID_JOB_STATE``.
        """
        user_id = request.user_id if request.HasField("user_id") else None

        async def read(session: AsyncSession) -> tuple[Any, list[dict[str, Any]], str]:
            job = (
                await self.domain.core.get_job(session, request.job_id) if request.job_id else None
            )
            if job is None or (user_id is not None and job.user_id != user_id):
                raise AppError(
                    ErrorCode.JOB_NOT_FOUND,
                    f"job {request.job_id!r} not found",
                    {"jobId": request.job_id},
                )
            if job.status != "succeeded":
                raise AppError(
                    ErrorCode.INVALID_JOB_STATE,
                    f"job {request.job_id} has no result: it is {job.status}",
                    {"jobId": request.job_id, "status": job.status},
                )
            if job.is_parent:  # a batch: its succeeded children's items (reference §10.3)
                items, version = await results.children_items(
                    session, parent_job_id=job.job_id, job_type=job.job_type, user_id=job.user_id
                )
                return job, items, version
            items = await results.result_items(
                session, job_id=request.job_id, job_type=job.job_type, user_id=job.user_id
            )
            return job, items, job.output_schema_version or ""

        job, items, version = await self._read(read)
        return rr.GetJobResultResponse(
            job_id=job.job_id,
            job_type=cast(Any, jobtypes.get(job.job_type).wire),
            output_schema_version=version,
            items=[to_struct(i) for i in items],
        )

    @rpc
    async def ListResultItems(
        self, request: rr.ListResultItemsRequest, context: Ctx
    ) -> rr.ListResultItemsResponse:
        """A page of the user's business rows of one kind, newest first."""
        kind = _kind(request.kind)
        items, token = await self._read(
            lambda s: results.list_user_items(
                s,
                user_id=request.user_id,
                kind=kind,
                page_size=request.page_size,
                page_token=request.page_token,
            )
        )
        return rr.ListResultItemsResponse(
            items=[to_struct(i) for i in items], next_page_token=token or ""
        )
