"""Learning data: materials, knowledge points and learning events (SPEC §3.1, §5).

Every function runs inside the caller's transaction (it never commits) and
raises :class:`~airuntime_common.errors.AppError` for every refusal:

* an unknown id, or another user's material / block / knowledge point, in the
  path or in the body → ``NOT_FOUND`` (never 403, so a user cannot probe other
  users' ids; never 400, SPEC §3 "any unknown id → 404");
* a bad field → ``INVALID_ARGUMENT`` with the offending field in ``details``;
* content over 1 MiB → ``PAYLOAD_TOO_LARGE``.

Learning events are idempotent per user by ``eventId``: the rows are written
with one ``INSERT … ON CONFLICT DO NOTHING`` (SQLite) / ``INSERT IGNORE``
(MySQL/MariaDB) against UNIQUE(user_id, event_id), so a repeat — in the same
batch, in the database, or in a concurrent request — is counted as a
duplicate and never raises.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Table, func, insert, select
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import as_utc, rfc3339, utcnow
from job_service.db import DbExec, dialect_name
from job_service.domain import sqlcache
from job_service.domain.batch import StatementBatch, supports_batches
from job_service.domain.markdown_split import split_document
from job_service.learning_models import (
    KnowledgePoint,
    KnowledgePointBlock,
    LearningBlockStat,
    LearningEvent,
    LearningKnowledgePointStat,
    Material,
    MaterialBlock,
)

#: Largest learning-event batch (SPEC §3.1).
MAX_EVENT_BATCH: Final = 500
#: Most blocks one knowledge point may link.
MAX_KP_BLOCKS: Final = 500
MAX_TITLE_CHARS: Final = 500
MAX_NAME_CHARS: Final = 500
#: Largest ``dwellSeconds`` of one reading event (a day).
MAX_DWELL_SECONDS: Final = 86_400.0


def new_id() -> str:
    """A fresh opaque id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


def db_now() -> datetime:
    """Current UTC time, naive, as stored in the learning tables (not used for leases)."""
    return utcnow().replace(tzinfo=None)


def to_db_time(value: datetime) -> datetime:
    """Aware or naive-UTC datetime → naive UTC for storage."""
    return as_utc(value).replace(tzinfo=None)


async def insert_ignore(session: DbExec, table: Table, rows: list[dict[str, Any]]) -> int:
    """Insert ``rows`` into ``table``, silently skipping rows that hit a unique key.

    One statement: ``INSERT … ON CONFLICT DO NOTHING`` on SQLite/PostgreSQL,
    ``INSERT IGNORE`` on MySQL/MariaDB. Safe under concurrency: a concurrent
    insert of the same key waits on the key's lock and is then skipped.

    Args:
        session: the caller's session (transaction left open).
        table: the table; it must have a unique key over the dedupe columns.
        rows: the rows, validated beforehand (MySQL's IGNORE also hides other
            errors, so callers must not rely on the database to validate).

    Returns:
        How many rows were inserted (the others were duplicates).
    """
    if not rows:
        return 0
    dialect = dialect_name(session)
    if dialect not in ("sqlite", "mysql", "mariadb", "postgresql"):  # pragma: no cover
        raise AppError(ErrorCode.INTERNAL, f"unsupported database dialect {dialect}")
    # One shape per table, run with the rows as executemany parameters: the
    # driver sends them as one multi-row INSERT, and the statement compiles once
    # (a multi-VALUES ``insert().values(rows)`` has no cache key and compiles
    # on every call).
    key, build = ignore_statement(dialect, table)
    result: Any = await session.execute(sqlcache.statement(key, build), rows)
    return int(result.rowcount)


def ignore_statement(dialect: str, table: Table) -> tuple[tuple[str, ...], Callable[[], Any]]:
    """:func:`insert_ignore`'s statement shape for ``table`` on ``dialect``: its
    :mod:`sqlcache` key and builder (bound: one row's columns by name), for a
    caller that sends the rows one statement each in a batch."""
    return ("insert_ignore", dialect, table.name), lambda: _ignore(dialect, table)


def _ignore(dialect: str, table: Table) -> Any:
    if dialect == "sqlite":
        return sqlite_insert(table).on_conflict_do_nothing()
    if dialect == "postgresql":  # pragma: no cover - not a supported job database
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    return mysql_insert(table).prefix_with("IGNORE")


def adding_upsert(
    dialect: str,
    table: Table,
    *,
    keys: Sequence[str],
    add: Sequence[str] = (),
    latest: Sequence[str] = (),
    replace: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
) -> Any:
    """An INSERT of one row of a running total that, when the row of its ``keys``
    exists, adds to it under the row lock instead: ``add`` columns are summed,
    ``latest`` ones keep the greater value, ``replace`` ones take the new value.

    ``ON CONFLICT … DO UPDATE`` on SQLite, ``ON DUPLICATE KEY UPDATE`` on
    MySQL/MariaDB. Racing upserts of one row each see the other's committed
    total, so none is lost. ``values`` are fixed SQL values (e.g. the database
    clock); the rest are bound per call.
    """
    c = table.c
    stmt: Any
    greatest: Any
    if dialect == "sqlite":
        stmt = sqlite_insert(table).values(**(values or {}))
        new, greatest = stmt.excluded, func.max
    else:
        stmt = mysql_insert(table).values(**(values or {}))
        new, greatest = stmt.inserted, func.greatest
    changes = {
        **{name: c[name] + new[name] for name in add},
        **{name: greatest(c[name], new[name]) for name in latest},
        **{name: new[name] for name in replace},
    }
    if dialect == "sqlite":
        return stmt.on_conflict_do_update(index_elements=[c[k] for k in keys], set_=changes)
    return stmt.on_duplicate_key_update(**changes)


# ---------------------------------------------------------------- views


@dataclass(frozen=True)
class BlockView:
    """One block of a material (``ordinal`` from 0, in document order)."""

    block_id: str
    material_id: str
    ordinal: int
    kind: str
    text: str

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"blockId","ordinal","kind","text"}``."""
        return {
            "blockId": self.block_id,
            "ordinal": self.ordinal,
            "kind": self.kind,
            "text": self.text,
        }


@dataclass(frozen=True)
class MaterialView:
    """A material with its blocks."""

    material_id: str
    user_id: str
    title: str
    created_at: datetime
    blocks: list[BlockView] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"materialId","userId","title","createdAt","blocks":[…]}``."""
        return {
            "materialId": self.material_id,
            "userId": self.user_id,
            "title": self.title,
            "createdAt": rfc3339(self.created_at),
            "blocks": [b.to_json() for b in self.blocks],
        }


@dataclass(frozen=True)
class KnowledgePointView:
    """A knowledge point and the ids of its linked blocks (in the order given)."""

    knowledge_point_id: str
    user_id: str
    material_id: str
    name: str
    block_ids: list[str]
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"knowledgePointId","userId","materialId","name","blockIds","createdAt"}``."""
        return {
            "knowledgePointId": self.knowledge_point_id,
            "userId": self.user_id,
            "materialId": self.material_id,
            "name": self.name,
            "blockIds": list(self.block_ids),
            "createdAt": rfc3339(self.created_at),
        }


# ---------------------------------------------------------------- materials


#: Longest user id the tables hold.
MAX_USER_ID_CHARS: Final = 128


def require_user(user_id: str) -> None:
    """Refuse an empty or over-long user id.

    Raises:
        AppError: ``INVALID_ARGUMENT`` naming ``userId``.
    """
    if not user_id or len(user_id) > MAX_USER_ID_CHARS:
        raise invalid_argument(
            f"userId is required (at most {MAX_USER_ID_CHARS} characters)", field="userId"
        )


async def create_material(
    session: AsyncSession, user_id: str, title: str, content: str
) -> MaterialView:
    """Store a material and its blocks (split by :mod:`markdown_split`).

    Args:
        session: the caller's session; not committed here.
        user_id: the owner.
        title: 1..500 characters after trimming.
        content: plain text or Markdown, ≤ 1 MiB of UTF-8.

    Returns:
        The stored material with its blocks (ordinals 0..n-1).

    Raises:
        AppError: ``INVALID_ARGUMENT`` (empty/too long title, empty content),
        ``PAYLOAD_TOO_LARGE`` (content over 1 MiB).
    """
    require_user(user_id)
    title = (title or "").strip()
    if not title or len(title) > MAX_TITLE_CHARS:
        raise invalid_argument(
            f"title must be 1..{MAX_TITLE_CHARS} characters", field="title", length=len(title)
        )
    # CPU-bound (about 2 s for 1 MiB of short paragraphs): keep the event loop responsive.
    split = await asyncio.to_thread(split_document, content)
    now = db_now()
    material_id = new_id()
    session.add(
        Material(
            material_id=material_id,
            user_id=user_id,
            title=title,
            content_hash=content_hash(content),
            block_count=len(split),
            created_at=now,
        )
    )
    await session.flush()
    blocks = [
        BlockView(new_id(), material_id, ordinal, b.kind, b.text) for ordinal, b in enumerate(split)
    ]
    rows = [
        {
            "block_id": b.block_id,
            "material_id": material_id,
            "user_id": user_id,
            "ordinal": b.ordinal,
            "kind": b.kind,
            "text": b.text,
            "char_count": len(b.text),
        }
        for b in blocks
    ]
    for start in range(0, len(rows), 1000):
        await session.execute(insert(MaterialBlock), rows[start : start + 1000])
    return MaterialView(material_id, user_id, title, now, blocks)


async def get_material(session: AsyncSession, user_id: str, material_id: str) -> MaterialView:
    """Read one of the user's materials with its blocks in order.

    Raises:
        AppError: ``NOT_FOUND`` when the id is unknown or the material is another user's.
    """
    material = await _owned_material(session, user_id, material_id)
    rows = await session.execute(
        select(
            MaterialBlock.block_id,
            MaterialBlock.material_id,
            MaterialBlock.ordinal,
            MaterialBlock.kind,
            MaterialBlock.text,
        )
        .where(MaterialBlock.material_id == material.material_id)
        .order_by(MaterialBlock.ordinal)
    )
    blocks = [BlockView(r[0], r[1], r[2], r[3], r[4]) for r in rows]
    return MaterialView(
        material.material_id, material.user_id, material.title, material.created_at, blocks
    )


async def _owned_material(session: AsyncSession, user_id: str, material_id: str) -> Material:
    require_user(user_id)
    material = None
    if material_id:
        material = (
            await session.execute(
                select(Material).where(
                    Material.material_id == material_id, Material.user_id == user_id
                )
            )
        ).scalar_one_or_none()
    if material is None:
        raise AppError(
            ErrorCode.NOT_FOUND, f"material {material_id!r} not found", {"materialId": material_id}
        )
    return material


# ---------------------------------------------------------------- knowledge points


async def create_knowledge_point(
    session: AsyncSession,
    user_id: str,
    material_id: str,
    name: str,
    block_ids: Sequence[str],
) -> KnowledgePointView:
    """Define a knowledge point over blocks of one of the user's materials.

    Args:
        session: the caller's session; not committed here.
        user_id: the owner.
        material_id: the material every block must belong to.
        name: 1..500 characters after trimming.
        block_ids: 1..500 block ids of that material (repeats are ignored).

    Raises:
        AppError: ``NOT_FOUND`` when the material is unknown or another user's, or
        when block ids are (listed in ``details.unknownBlockIds``, SPEC §3);
        ``INVALID_ARGUMENT`` for a bad name, no blocks, or the user's blocks of
        another material (listed in ``details.otherMaterialBlockIds``).
    """
    material = await _owned_material(session, user_id, material_id)
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise invalid_argument(f"name must be 1..{MAX_NAME_CHARS} characters", field="name")
    ids = list(dict.fromkeys(block_ids))
    if not ids or len(ids) > MAX_KP_BLOCKS:
        raise invalid_argument(
            f"blockIds must name 1..{MAX_KP_BLOCKS} blocks", field="blockIds", count=len(ids)
        )
    owned = await _user_rows(
        session,
        MaterialBlock.block_id,
        MaterialBlock.material_id,
        MaterialBlock.user_id,
        user_id,
        ids,
    )
    unknown = [b for b in ids if b not in owned]
    if unknown:
        raise AppError(
            ErrorCode.NOT_FOUND,
            f"blocks not found: {', '.join(unknown[:10])}",
            {"field": "blockIds", "unknownBlockIds": unknown},
        )
    elsewhere = [b for b in ids if owned[b] != material.material_id]
    if elsewhere:
        raise invalid_argument(
            f"blockIds are not blocks of material {material.material_id}:"
            f" {', '.join(elsewhere[:10])}",
            field="blockIds",
            otherMaterialBlockIds=elsewhere,
        )
    now = db_now()
    kp_id = new_id()
    session.add(
        KnowledgePoint(
            knowledge_point_id=kp_id,
            user_id=user_id,
            material_id=material.material_id,
            name=name,
            created_at=now,
        )
    )
    await session.flush()
    await session.execute(
        insert(KnowledgePointBlock),
        [{"knowledge_point_id": kp_id, "block_id": b, "position": i} for i, b in enumerate(ids)],
    )
    return KnowledgePointView(kp_id, user_id, material.material_id, name, ids, now)


async def get_knowledge_point(
    session: AsyncSession, user_id: str, knowledge_point_id: str
) -> KnowledgePointView:
    """Read one of the user's knowledge points.

    Raises:
        AppError: ``NOT_FOUND`` when unknown or another user's.
    """
    require_user(user_id)
    kp = None
    if knowledge_point_id:
        kp = (
            await session.execute(
                select(KnowledgePoint).where(
                    KnowledgePoint.knowledge_point_id == knowledge_point_id,
                    KnowledgePoint.user_id == user_id,
                )
            )
        ).scalar_one_or_none()
    if kp is None:
        raise AppError(
            ErrorCode.NOT_FOUND,
            f"knowledge point {knowledge_point_id!r} not found",
            {"knowledgePointId": knowledge_point_id},
        )
    block_ids = list(
        (
            await session.execute(
                select(KnowledgePointBlock.block_id)
                .where(KnowledgePointBlock.knowledge_point_id == kp.knowledge_point_id)
                .order_by(KnowledgePointBlock.position)
            )
        ).scalars()
    )
    return KnowledgePointView(
        kp.knowledge_point_id, kp.user_id, kp.material_id, kp.name, block_ids, kp.created_at
    )


# ---------------------------------------------------------------- learning events


class LearningEventIn(BaseModel):
    """One learning event as the public API sends it (SPEC §3.1), camelCase.

    ``reading`` needs ``blockId`` or ``materialId`` (``dwellSeconds`` ≥ 0,
    default 0); ``quiz_attempt`` needs ``knowledgePointId`` and ``correct``.
    ``occurredAt`` defaults to the time of ingestion.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    eventId: str = Field(min_length=1, max_length=128)
    type: Literal["reading", "quiz_attempt"]
    # Ids of existing rows: no length limit, so an unknown one of any length is
    # 404 NOT_FOUND (SPEC §3 "any unknown id → 404, never 400"); only ids found
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
    """An event naming an id that is unknown or another user's: 404 (SPEC §3)."""
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
    """Ingest a batch of learning events, idempotent by ``eventId`` (SPEC §3.1).

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

    block_ids = {e.blockId for e in parsed if e.blockId}
    kp_ids = {e.knowledgePointId for e in parsed if e.knowledgePointId}
    material_ids = {e.materialId for e in parsed if e.materialId}
    blocks = await _user_rows(
        session,
        MaterialBlock.block_id,
        MaterialBlock.material_id,
        MaterialBlock.user_id,
        user_id,
        block_ids,
    )
    kps = await _user_rows(
        session,
        KnowledgePoint.knowledge_point_id,
        KnowledgePoint.material_id,
        KnowledgePoint.user_id,
        user_id,
        kp_ids,
    )
    materials = await _user_rows(
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
    rows.sort(key=lambda r: str(r["event_id"]))  # one lock order for racing batches
    new = await _insert_each(session, LearningEvent.__table__, rows)  # type: ignore[arg-type]
    await _add_to_stats(session, user_id, [r for r, added in zip(rows, new, strict=True) if added])
    accepted = sum(new)
    return accepted, len(parsed) - accepted


async def _insert_each(
    session: AsyncSession, table: Table, rows: list[dict[str, Any]]
) -> list[bool]:
    """Insert ``rows`` one statement each, skipping those that hit a unique key;
    returns, per row, whether it was inserted.

    Exact under concurrency: a racing insert of the same key waits on that key's
    lock and is then skipped (or inserted, if the other transaction rolled back).
    On MySQL/MariaDB the statements go as one batch (one round trip).
    """
    if not rows:
        return []
    dialect = dialect_name(session)
    key, build = ignore_statement(dialect, table)
    conn = await session.connection()
    if supports_batches(conn):
        batch = StatementBatch(conn)
        for row in rows:
            batch.add(key, build, row)
        return [outcome.rowcount == 1 for outcome in await batch.run()]
    stmt = sqlcache.statement(key, build)
    return [(await session.execute(stmt, row)).rowcount == 1 for row in rows]  # type: ignore[attr-defined]


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
        stmt = sqlcache.statement(
            ("add_block_stats", dialect), lambda: _block_stats_upsert(dialect)
        )
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
        stmt = sqlcache.statement(("add_kp_stats", dialect), lambda: _kp_stats_upsert(dialect))
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


async def _user_rows(
    session: AsyncSession,
    id_col: Any,
    material_col: Any,
    user_col: Any,
    user_id: str,
    ids: Iterable[str],
) -> dict[str, str]:
    """``{id: material_id}`` of the given ids that are the user's."""
    wanted = list(ids)
    if not wanted:
        return {}
    result = await session.execute(
        select(id_col, material_col).where(id_col.in_(wanted), user_col == user_id)
    )
    return {str(r[0]): str(r[1]) for r in result}
