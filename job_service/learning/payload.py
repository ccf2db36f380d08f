"""The snapshot payload v1: what a job's model call is given about its target (SPEC §5).

Payload v1 (``schemaVersion: "v1"``), camelCase::

    {"jobType", "targetType", "targetId", "userId", "params",
     "materials": [{"materialId","title","blockCount","readBlockCount","progress"}],
     "blocks": [{"blockId","materialId","ordinal","text"}],
     "knowledgePoints": [{"knowledgePointId","name","materialId","blockIds",
                          "attempts","correct","accuracy","lastAttemptAt"}],
     "reading": [{"blockId","materialId","dwellSeconds","lastReadAt"}],
     "stats": {...}}

``accuracy`` is ``correct / attempts`` rounded to 4 places, null when there
were no attempts; a knowledge point's ``blockIds`` are its linked blocks that
are included in ``blocks`` (so every id the payload offers for citation is
citable); ``progress`` is ``readBlockCount / blockCount`` (blocks with
at least one reading event); times are RFC 3339 UTC with milliseconds.

Scope by target (the target must exist and be the user's, else ``NOT_FOUND``):

* ``user`` (``targetId`` = the user's own id): all the user's materials (the
  :data:`MAX_MATERIALS` most recent, listed oldest first) and knowledge points;
* ``material``: that material and its knowledge points;
* ``knowledge_point``: its material, the knowledge point alone, and only its
  linked blocks as block candidates.

Lists are bounded: ``knowledgePoints`` (weakest first, see below) at
:data:`MAX_KNOWLEDGE_POINTS`, ``reading`` (one entry per block, most recent
first) at :data:`MAX_READING`. ``stats`` counts everything in scope:
``materialCount, blockCount, readBlockCount, knowledgePointCount,
quizAttempts, quizCorrect, accuracy, totalDwellSeconds, lastActivityAt,
asOfDate, weakestKnowledgePointIds, leastProgressMaterialIds,
includedBlockCount, omittedBlockCount, blockBudgetChars``.

**Weakness order** of knowledge points: attempted ones first, by accuracy
ascending, then more attempts first; then never-attempted ones; ties by id.
``weakestKnowledgePointIds`` are the first five attempted ones.

**Block selection** (deterministic). Each job type has a text budget, its
:attr:`JobTypeSpec.snapshot <airuntime_common.jobtypes.JobTypeSpec>`: quiz and
flashcard generation 24,000 characters and at most 200 blocks; the three
analysis types a bounded sample of 8,000 characters / 40 blocks. Candidates are the scope's blocks in (material order, ordinal) order.
If they all fit, all are taken. Otherwise:

1. blocks linked to knowledge points, in weakness order (and each knowledge
   point's link order), are taken while they fit;
2. the remaining candidates are visited in an even-spread order over their
   positions — 0, then the middle, then the quarter points, and so on
   (bit-reversal refinement: indices at stride 2^k for decreasing k) — and each
   block is taken if it still fits;
3. a block that does not fit the remaining budget is skipped, and the next is
   tried; selection stops when the budget or the block cap is reached;
4. the chosen blocks are emitted in (material order, ordinal) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import jobtypes
from airuntime_common.enums import TARGET_TYPES
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import rfc3339
from job_service.learning.common import db_now, require_user
from job_service.learning.tables import (
    KnowledgePoint,
    KnowledgePointBlock,
    LearningBlockStat,
    LearningKnowledgePointStat,
    Material,
    MaterialBlock,
)

MAX_MATERIALS: Final = 100
MAX_KNOWLEDGE_POINTS: Final = 200
MAX_READING: Final = 200
WEAKEST_COUNT: Final = 5
_IN_CHUNK = 500


@dataclass(frozen=True)
class BlockMeta:
    """A candidate block without its text: id, material, ordinal and size in characters."""

    block_id: str
    material_id: str
    ordinal: int
    char_count: int


def spread_order(n: int) -> list[int]:
    """Indices 0..n-1 in even-spread order: 0, then stride halves (n=10 → 0,8,4,2,6,1,3,5,7,9)."""
    if n <= 0:
        return []
    step = 1
    while step < n:
        step *= 2
    seen: set[int] = set()
    order: list[int] = []
    while step >= 1:
        for i in range(0, n, step):
            if i not in seen:
                seen.add(i)
                order.append(i)
        step //= 2
    return order


def select_blocks(
    candidates: Sequence[BlockMeta],
    *,
    priority: Sequence[str],
    budget_chars: int,
    max_blocks: int,
) -> list[BlockMeta]:
    """Choose blocks within a character budget by the rule in the module docstring.

    Args:
        candidates: blocks in (material order, ordinal) order.
        priority: block ids to take first, in order (weakest knowledge points' blocks).
        budget_chars: the most characters of text in total.
        max_blocks: the most blocks.

    Returns:
        The chosen blocks, in candidate order.
    """
    total = sum(b.char_count for b in candidates)
    if total <= budget_chars and len(candidates) <= max_blocks:
        return list(candidates)
    position = {b.block_id: i for i, b in enumerate(candidates)}
    chosen: set[int] = set()
    used = 0

    def take(i: int) -> None:
        nonlocal used
        size = candidates[i].char_count
        if i not in chosen and len(chosen) < max_blocks and used + size <= budget_chars:
            chosen.add(i)
            used += size

    for block_id in priority:
        if block_id in position:
            take(position[block_id])
    rest = [i for i in range(len(candidates)) if i not in chosen]
    for k in spread_order(len(rest)):
        if len(chosen) >= max_blocks or used >= budget_chars:
            break
        take(rest[k])
    return [candidates[i] for i in sorted(chosen)]


def _round(value: float, places: int = 4) -> float:
    return round(float(value), places)


async def _chunked_in(session: AsyncSession, stmt_for: Any, ids: Sequence[str]) -> list[Any]:
    rows: list[Any] = []
    for start in range(0, len(ids), _IN_CHUNK):
        rows.extend((await session.execute(stmt_for(ids[start : start + _IN_CHUNK]))).all())
    return rows


async def ensure_target(
    session: AsyncSession, *, user_id: str, target_type: str, target_id: str
) -> None:
    """Check that a job target exists and is the user's (SPEC §2.1).

    Raises:
        AppError: ``NOT_FOUND`` when not; ``INVALID_ARGUMENT`` for an unknown target type.
    """
    await _resolve_scope(session, user_id, target_type, target_id)


@dataclass
class _Scope:
    materials: list[Material]
    material_total: int
    kp_ids: list[str] | None  # None = every KP of the materials (user: every KP of the user)
    kp_block_only: str | None  # a knowledge_point target: only its blocks are candidates


def _not_found(target_type: str, target_id: str) -> AppError:
    return AppError(
        ErrorCode.NOT_FOUND,
        f"{target_type} {target_id!r} not found",
        {"targetType": target_type, "targetId": target_id},
    )


async def _resolve_scope(
    session: AsyncSession, user_id: str, target_type: str, target_id: str
) -> _Scope:
    if target_type not in TARGET_TYPES:
        raise invalid_argument(
            f"targetType must be one of {', '.join(TARGET_TYPES)}",
            field="targetType",
            value=target_type,
        )
    require_user(user_id)
    if target_type == "user":
        if target_id != user_id:
            raise _not_found(target_type, target_id)
        total = (
            await session.execute(
                select(func.count()).select_from(Material).where(Material.user_id == user_id)
            )
        ).scalar_one()
        recent = list(
            (
                await session.execute(
                    select(Material)
                    .where(Material.user_id == user_id)
                    .order_by(Material.created_at.desc(), Material.material_id.desc())
                    .limit(MAX_MATERIALS)
                )
            ).scalars()
        )
        recent.reverse()
        return _Scope(recent, int(total), None, None)
    if target_type == "material":
        material = (
            await session.execute(
                select(Material).where(
                    Material.material_id == target_id, Material.user_id == user_id
                )
            )
        ).scalar_one_or_none()
        if material is None:
            raise _not_found(target_type, target_id)
        return _Scope([material], 1, None, None)
    kp = (
        await session.execute(
            select(KnowledgePoint).where(
                KnowledgePoint.knowledge_point_id == target_id,
                KnowledgePoint.user_id == user_id,
            )
        )
    ).scalar_one_or_none()
    if kp is None:
        raise _not_found(target_type, target_id)
    material = (
        await session.execute(select(Material).where(Material.material_id == kp.material_id))
    ).scalar_one()
    return _Scope([material], 1, [kp.knowledge_point_id], kp.knowledge_point_id)


@dataclass
class _KnowledgePoints:
    """The scope's knowledge points, weakest first, with their linked blocks (in link
    order) and the user's quiz totals on each: ``quiz[kpId] = (attempts, correct, last)``."""

    kps: list[KnowledgePoint]
    links: dict[str, list[str]]
    quiz: dict[str, tuple[int, int, datetime | None]]


@dataclass
class _Reading:
    """The user's reading of the scope's blocks: one entry per block, newest first."""

    entries: list[dict[str, Any]]
    rows: int
    by_material: dict[str, int]
    total_dwell: float
    last_read: datetime | None


async def build_payload(
    session: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    target_type: str,
    target_id: str,
    params: dict[str, Any] | None,
) -> dict[str, Any]:
    """The snapshot payload v1 (module docstring), without storing it.

    Raises:
        AppError: ``NOT_FOUND`` when the target does not exist or is not the user's;
            ``INVALID_ARGUMENT`` for an unknown job or target type.
    """
    budget = jobtypes.get(job_type).snapshot
    scope = await _resolve_scope(session, user_id, target_type, target_id)
    all_blocks = await _blocks_in_scope(session, scope)
    points = await _knowledge_points(session, user_id, scope, target_type, target_id)
    reading = await _reading(session, user_id, [m.material_id for m in scope.materials])
    materials = _material_entries(scope, all_blocks, reading)
    if scope.kp_block_only is not None:
        wanted = set(points.links.get(scope.kp_block_only, []))
        candidates = [b for b in all_blocks if b.block_id in wanted]
    else:
        candidates = all_blocks
    priority = [bid for kp in points.kps for bid in points.links[kp.knowledge_point_id]]
    chosen = select_blocks(
        candidates, priority=priority, budget_chars=budget.chars, max_blocks=budget.blocks
    )
    blocks = await _block_entries(session, chosen)
    chosen_ids = {b.block_id for b in chosen}
    stats = _stats(scope, points, reading, materials)
    stats.update(
        includedBlockCount=len(chosen),
        omittedBlockCount=len(candidates) - len(chosen),
        blockBudgetChars=budget.chars,
    )
    stats["blockCount"] = len(candidates)
    return {
        "jobType": job_type,
        "targetType": target_type,
        "targetId": target_id,
        "userId": user_id,
        "params": dict(params or {}),
        "materials": materials,
        "blocks": blocks,
        "knowledgePoints": _kp_entries(points, chosen_ids),
        "reading": reading.entries[:MAX_READING],
        "stats": stats,
    }


async def _blocks_in_scope(session: AsyncSession, scope: _Scope) -> list[BlockMeta]:
    """The blocks (metadata only) of the materials in scope, in (material order, ordinal) order."""
    material_ids = [m.material_id for m in scope.materials]
    order = {mid: i for i, mid in enumerate(material_ids)}
    rows = await _chunked_in(
        session,
        lambda ids: select(
            MaterialBlock.block_id,
            MaterialBlock.material_id,
            MaterialBlock.ordinal,
            MaterialBlock.char_count,
        ).where(MaterialBlock.material_id.in_(ids)),
        material_ids,
    )
    return sorted(
        (BlockMeta(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows),
        key=lambda b: (order[b.material_id], b.ordinal),
    )


async def _knowledge_points(
    session: AsyncSession, user_id: str, scope: _Scope, target_type: str, target_id: str
) -> _KnowledgePoints:
    """The knowledge points in scope with their links and quiz totals, weakest first."""
    kp_stmt = select(KnowledgePoint).where(KnowledgePoint.user_id == user_id)
    if scope.kp_ids is not None:
        kp_stmt = kp_stmt.where(KnowledgePoint.knowledge_point_id.in_(scope.kp_ids))
    elif target_type == "material":
        kp_stmt = kp_stmt.where(KnowledgePoint.material_id == target_id)
    kps = list((await session.execute(kp_stmt)).scalars())
    kp_ids = [k.knowledge_point_id for k in kps]
    links: dict[str, list[str]] = {k: [] for k in kp_ids}
    for row in await _chunked_in(
        session,
        lambda ids: (
            select(KnowledgePointBlock.knowledge_point_id, KnowledgePointBlock.block_id)
            .where(KnowledgePointBlock.knowledge_point_id.in_(ids))
            .order_by(KnowledgePointBlock.knowledge_point_id, KnowledgePointBlock.position)
        ),
        kp_ids,
    ):
        links[str(row[0])].append(str(row[1]))
    # the user's running totals (learning_kp_stats), one row per knowledge point
    # attempted, not their history
    stats = LearningKnowledgePointStat
    quiz: dict[str, tuple[int, int, datetime | None]] = {}
    for row in await _chunked_in(
        session,
        lambda ids: select(
            stats.knowledge_point_id, stats.attempts, stats.correct, stats.last_attempt_at
        ).where(stats.user_id == user_id, stats.knowledge_point_id.in_(ids)),
        kp_ids,
    ):
        quiz[str(row[0])] = (int(row[1]), int(row[2] or 0), row[3])

    def weakness(kp: KnowledgePoint) -> tuple[int, float, int, str]:
        attempts, correct, _ = quiz.get(kp.knowledge_point_id, (0, 0, None))
        if attempts:
            return (0, correct / attempts, -attempts, kp.knowledge_point_id)
        return (1, 0.0, 0, kp.knowledge_point_id)

    kps.sort(key=weakness)
    return _KnowledgePoints(kps, links, quiz)


async def _reading(session: AsyncSession, user_id: str, material_ids: list[str]) -> _Reading:
    """Reading per block within the scope's materials: the user's running totals
    (learning_block_stats), one row per block read, not their history."""
    stats = LearningBlockStat
    rows = await _chunked_in(
        session,
        lambda ids: select(
            stats.block_id, stats.material_id, stats.dwell_seconds, stats.last_read_at
        ).where(stats.user_id == user_id, stats.material_id.in_(ids)),
        material_ids,
    )
    entries = sorted(
        (
            {
                "blockId": str(r[0]),
                "materialId": str(r[1]),
                "dwellSeconds": _round(r[2] or 0.0, 3),
                "lastReadAt": r[3],
            }
            for r in rows
        ),
        key=lambda e: (e["lastReadAt"], e["blockId"]),
        reverse=True,
    )
    by_material: dict[str, int] = {}
    for e in entries:
        by_material[e["materialId"]] = by_material.get(e["materialId"], 0) + 1
    total_dwell = sum(e["dwellSeconds"] for e in entries)
    last_read = entries[0]["lastReadAt"] if entries else None
    for e in entries:
        e["lastReadAt"] = rfc3339(e["lastReadAt"])
    return _Reading(entries, len(rows), by_material, total_dwell, last_read)


def _material_entries(
    scope: _Scope, blocks: list[BlockMeta], reading: _Reading
) -> list[dict[str, Any]]:
    """One entry per material in scope: its blocks, how many were read, and progress."""
    count_by_material: dict[str, int] = {}
    for b in blocks:
        count_by_material[b.material_id] = count_by_material.get(b.material_id, 0) + 1
    entries = []
    for m in scope.materials:
        count = count_by_material.get(m.material_id, 0)
        read = reading.by_material.get(m.material_id, 0)
        entries.append(
            {
                "materialId": m.material_id,
                "title": m.title,
                "blockCount": count,
                "readBlockCount": read,
                "progress": _round(read / count) if count else 0.0,
            }
        )
    return entries


async def _block_entries(session: AsyncSession, chosen: list[BlockMeta]) -> list[dict[str, Any]]:
    """The chosen blocks with their text, in (material order, ordinal) order."""
    texts = {
        str(r[0]): str(r[1])
        for r in await _chunked_in(
            session,
            lambda ids: select(MaterialBlock.block_id, MaterialBlock.text).where(
                MaterialBlock.block_id.in_(ids)
            ),
            [b.block_id for b in chosen],
        )
    }
    return [
        {
            "blockId": b.block_id,
            "materialId": b.material_id,
            "ordinal": b.ordinal,
            "text": texts[b.block_id],
        }
        for b in chosen
    ]


def _kp_entries(points: _KnowledgePoints, chosen_ids: set[str]) -> list[dict[str, Any]]:
    """The first :data:`MAX_KNOWLEDGE_POINTS` knowledge points, weakest first; each lists
    only its linked blocks that are in the payload (every id offered is citable)."""
    entries: list[dict[str, Any]] = []
    for kp in points.kps[:MAX_KNOWLEDGE_POINTS]:
        attempts, correct, last = points.quiz.get(kp.knowledge_point_id, (0, 0, None))
        entries.append(
            {
                "knowledgePointId": kp.knowledge_point_id,
                "name": kp.name,
                "materialId": kp.material_id,
                "blockIds": [b for b in points.links[kp.knowledge_point_id] if b in chosen_ids],
                "attempts": attempts,
                "correct": correct,
                "accuracy": _round(correct / attempts) if attempts else None,
                "lastAttemptAt": rfc3339(last),
            }
        )
    return entries


def _stats(
    scope: _Scope, points: _KnowledgePoints, reading: _Reading, materials: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ``stats`` that count everything in scope (module docstring); the caller fills
    ``blockCount`` (left 0 here, in its place) and the selection's counts."""
    quiz = points.quiz
    attempts_total = sum(q[0] for q in quiz.values())
    correct_total = sum(q[1] for q in quiz.values())
    last_attempt = max((q[2] for q in quiz.values() if q[2] is not None), default=None)
    activity = [t for t in (reading.last_read, last_attempt) if t is not None]
    weakest = [
        kp.knowledge_point_id
        for kp in points.kps
        if quiz.get(kp.knowledge_point_id, (0, 0, None))[0]
    ][:WEAKEST_COUNT]
    least_progress = [
        e["materialId"] for e in sorted(materials, key=lambda e: (e["progress"], e["materialId"]))
    ][:WEAKEST_COUNT]
    return {
        "materialCount": scope.material_total,
        "blockCount": 0,
        "readBlockCount": reading.rows,
        "knowledgePointCount": len(points.kps),
        "quizAttempts": attempts_total,
        "quizCorrect": correct_total,
        "accuracy": _round(correct_total / attempts_total) if attempts_total else None,
        "totalDwellSeconds": _round(reading.total_dwell, 3),
        "lastActivityAt": rfc3339(max(activity)) if activity else None,
        "asOfDate": db_now().date().isoformat(),
        "weakestKnowledgePointIds": weakest,
        "leastProgressMaterialIds": least_progress,
    }
