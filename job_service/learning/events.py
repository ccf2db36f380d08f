"""Learning events: reading and quiz attempts, idempotent per user by ``eventId`` (reference §3.1).

The rows are written one ``INSERT … ON CONFLICT DO NOTHING`` (SQLite) /
``INSERT IGNORE`` (MySQL/MariaDB) each, in one batch, against
UNIQUE(user_id, event_id), so a repeat — in the same batch, in the database,
or in a concurrent request — is counted as a duplicate and never raises. Each
new event also adds to the user's running totals (``learning_block_stats``,
``learning_kp_stats``), which the snapshots read instead of the history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from job_service.learning.common import (
    adding_upsert,
    db_now,
    insert_ignore_sql,
    require_user,
    to_db_time,
    user_rows,
)
from job_service.learning.tables import (
    KnowledgePoint,
    LearningBlockStat,
    LearningEvent,
    LearningKnowledgePointStat,
    Material,
    MaterialBlock,
)
from job_service.store import cache
from job_service.store.batch import new_batch
from job_service.store.engine import dialect_name

#: Largest learning-event batch (reference §3.1).
MAX_EVENT_BATCH: Final = 500
#: Largest ``dwellSeconds`` of one reading event (a day).
MAX_DWELL_SECONDS: Final = 86_400.0


class LearningEventIn(BaseModel):
    """One learning event as the public API sends it (reference §3.1), camelCase.

    ``reading`` needs ``blockId`` or ``materialId`` (``dwellSeconds`` ≥ 0,
    default 0); ``quiz_attempt`` needs ``knowledgePointId`` and ``correct``.
    ``occurredAt`` defaults to the time of ingestion.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    eventId: str = Field(min_length=1, max_length=128)
    type: Literal["reading", "quiz_attempt"]
    # Ids of existing rows: no length limit, so an unknown one of any length is
    # 404 NOT_FOUND (reference §3 "any unknown id → 404, never 400"); only ids found
    # among the user's rows are ever written.
    materialId: str | None = None
    blockId: str | None = None
    knowledgePointId: str | None = None
    dwellSeconds: float | None = Field(default=None, ge=0.0, le=MAX_DWELL_SECONDS)
    correct: bool | None = None
    occurredAt: datetime | None = None


def _bad_event(index: int, field_name: str, message: str, value: Any = None) -> AppError:
    return invalid_argument(
        f"events[{index}].{field_name}: {message}",
        field=f"events[{index}].{field_name}",
        index=index,
        value=value,
    )


def _unknown_in_event(index: int, field_name: str, kind: str, value: str) -> AppError:
    """An event naming an id that is unknown or another user's: 404 (reference §3)."""
    return AppError(
        ErrorCode.NOT_FOUND,
        f"events[{index}].{field_name}: {kind} {value!r} not found",
        {"field": f"events[{index}].{field_name}", "index": index, "value": value},
    )


def _parse_events(events: Sequence[LearningEventIn | Mapping[str, Any]]) -> list[LearningEventIn]:
    parsed: list[LearningEventIn] = []
    for index, raw in enumerate(events):
        if isinstance(raw, LearningEventIn):
            ev = raw
        else:
            try:
                ev = LearningEventIn.model_validate(raw)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"]) or "event"
                raise _bad_event(index, loc, err["msg"]) from None
        for name in ("materialId", "blockId", "knowledgePointId"):
            if getattr(ev, name) == "":
                ev = ev.model_copy(update={name: None})
        if ev.type == "reading":
            if not ev.blockId and not ev.materialId:
                raise _bad_event(index, "blockId", "a reading event needs blockId or materialId")
            if ev.correct is not None:
                raise _bad_event(index, "correct", "only quiz_attempt events carry correct")
        else:
            if not ev.knowledgePointId:
                raise _bad_event(
                    index, "knowledgePointId", "a quiz_attempt event needs knowledgePointId"
                )
            if ev.correct is None:
                raise _bad_event(index, "correct", "a quiz_attempt event needs correct")
        parsed.append(ev)
    return parsed


async def record_learning_events(
    session: AsyncSession,
    user_id: str,
    events: Sequence[LearningEventIn | Mapping[str, Any]],
) -> tuple[int, int]:
    """Ingest a batch of learning events, idempotent by ``eventId`` (reference §3.1).

    The whole batch is validated before anything is written: every id an event
    names must be the user's, and a block / knowledge point must belong to the
    event's ``materialId`` when both are given. An event repeating an
    ``eventId`` (earlier in the batch, already stored, or stored concurrently)
    is a duplicate, not an error.

    Args:
        session: the caller's session; not committed here.
        user_id: the owner.
        events: at most 500 events (:class:`LearningEventIn` or camelCase dicts).

    Returns:
        ``(accepted, duplicates)``; their sum is ``len(events)``.

    Raises:
        AppError: ``NOT_FOUND`` for an unknown or foreign id, ``INVALID_ARGUMENT``
        for a bad event (a block of another material included); both name the
        event index and field (``details.field`` like ``events[3].blockId``).
        ``INVALID_ARGUMENT`` for a batch over 500.
    """
    require_user(user_id)
    if len(events) > MAX_EVENT_BATCH:
        raise invalid_argument(
            f"at most {MAX_EVENT_BATCH} events per batch", field="events", count=len(events)
        )
    parsed = _parse_events(events)
    if not parsed:
        return 0, 0

    rows = await _event_rows(session, user_id, parsed)
    rows.sort(key=lambda r: str(r["event_id"]))  # one lock order for racing batches
    new = await _insert_each(session, LearningEvent.__table__, rows)  # type: ignore[arg-type]
    await _add_to_stats(session, user_id, [r for r, added in zip(rows, new, strict=True) if added])
    accepted = sum(new)
    return accepted, len(parsed) - accepted


async def _event_rows(
    session: AsyncSession, user_id: str, parsed: list[LearningEventIn]
) -> list[dict[str, Any]]:
    """The rows of ``parsed`` (a repeated ``eventId`` once), each id checked to be the
    user's and to fit with the event's material.

    Raises:
        AppError: as :func:`record_learning_events`.
    """
    block_ids = {e.blockId for e in parsed if e.blockId}
    kp_ids = {e.knowledgePointId for e in parsed if e.knowledgePointId}
    material_ids = {e.materialId for e in parsed if e.materialId}
    blocks = await user_rows(
        session, MaterialBlock.block_id, MaterialBlock.material_id, MaterialBlock.user_id,
        user_id, block_ids,
    )  # fmt: skip
    kps = await user_rows(
        session, KnowledgePoint.knowledge_point_id, KnowledgePoint.material_id,
        KnowledgePoint.user_id, user_id, kp_ids,
    )  # fmt: skip
    materials = await user_rows(
        session, Material.material_id, Material.material_id, Material.user_id, user_id, material_ids
    )
    now = db_now()
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, ev in enumerate(parsed):
        material_id = ev.materialId
        if material_id and material_id not in materials:
            raise _unknown_in_event(index, "materialId", "material", material_id)
        for name, value, known in (
            ("blockId", ev.blockId, blocks),
            ("knowledgePointId", ev.knowledgePointId, kps),
        ):
            if not value:
                continue
            if value not in known:
                kind = "block" if name == "blockId" else "knowledge point"
                raise _unknown_in_event(index, name, kind, value)
            owner_material = known[value]
            if material_id and owner_material != material_id:
                raise _bad_event(
                    index, name, f"{value!r} does not belong to material {material_id!r}", value
                )
            material_id = material_id or owner_material
        if ev.eventId in seen:
            continue
        seen.add(ev.eventId)
        rows.append(
            {
                "user_id": user_id,
                "event_id": ev.eventId,
                "type": ev.type,
                "material_id": material_id,
                "block_id": ev.blockId,
                "knowledge_point_id": ev.knowledgePointId,
                "dwell_seconds": (ev.dwellSeconds or 0.0) if ev.type == "reading" else None,
                "correct": ev.correct if ev.type == "quiz_attempt" else None,
                "occurred_at": to_db_time(ev.occurredAt) if ev.occurredAt else now,
                "created_at": now,
            }
        )
    return rows


async def _insert_each(
    session: AsyncSession, table: Table, rows: list[dict[str, Any]]
) -> list[bool]:
    """Insert ``rows`` one statement each, skipping those that hit a unique key;
    returns, per row, whether it was inserted.

    Exact under concurrency: a racing insert of the same key waits on that key's
    lock and is then skipped (or inserted, if the other transaction rolled back).
    The statements go as one batch (on MySQL/MariaDB one round trip).
    """
    if not rows:
        return []
    dialect = dialect_name(session)
    batch = new_batch(session)
    for row in rows:
        batch.add(insert_ignore_sql(dialect, table, row))
    return [outcome.rowcount == 1 for outcome in await batch.run()]


async def _add_to_stats(session: AsyncSession, user_id: str, new: Sequence[dict[str, Any]]) -> None:
    """Add newly stored events to the user's running totals (``learning_block_stats``,
    ``learning_kp_stats``), in the caller's transaction.

    Reading events with a block add their dwell time to (material, block);
    quiz attempts on a knowledge point add an attempt (and a correct one). Each
    total is one upsert that adds to the stored row under its lock, so racing
    batches of one user never lose each other's events. Keys go in sorted order,
    so two batches lock common rows in the same order.
    """
    reading: dict[tuple[str, str], list[Any]] = {}
    quiz: dict[str, list[Any]] = {}
    for ev in new:
        at = ev["occurred_at"]
        if ev["type"] == "reading" and ev["block_id"]:
            total = reading.setdefault((ev["material_id"], ev["block_id"]), [0.0, at])
            total[0] += float(ev["dwell_seconds"] or 0.0)
            total[1] = max(total[1], at)
        elif ev["type"] == "quiz_attempt" and ev["knowledge_point_id"]:
            count = quiz.setdefault(ev["knowledge_point_id"], [0, 0, at])
            count[0] += 1
            count[1] += 1 if ev["correct"] else 0
            count[2] = max(count[2], at)
    dialect = dialect_name(session)
    if reading:
        stmt = cache.statement(("add_block_stats", dialect), lambda: _block_stats_upsert(dialect))
        await session.execute(
            stmt,
            [
                {
                    "user_id": user_id,
                    "material_id": material_id,
                    "block_id": block_id,
                    "dwell_seconds": dwell,
                    "last_read_at": at,
                }
                for (material_id, block_id), (dwell, at) in sorted(reading.items())
            ],
        )
    if quiz:
        stmt = cache.statement(("add_kp_stats", dialect), lambda: _kp_stats_upsert(dialect))
        await session.execute(
            stmt,
            [
                {
                    "user_id": user_id,
                    "knowledge_point_id": kp_id,
                    "attempts": attempts,
                    "correct": correct,
                    "last_attempt_at": at,
                }
                for kp_id, (attempts, correct, at) in sorted(quiz.items())
            ],
        )


def _block_stats_upsert(dialect: str) -> Any:
    return adding_upsert(
        dialect,
        cast(Table, LearningBlockStat.__table__),
        keys=("user_id", "material_id", "block_id"),
        add=("dwell_seconds",),
        latest=("last_read_at",),
    )


def _kp_stats_upsert(dialect: str) -> Any:
    return adding_upsert(
        dialect,
        cast(Table, LearningKnowledgePointStat.__table__),
        keys=("user_id", "knowledge_point_id"),
        add=("attempts", "correct"),
        latest=("last_attempt_at",),
    )
