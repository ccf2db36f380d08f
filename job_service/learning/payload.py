"""The snapshot payload v1: what a job's model call is given about its target (reference §5).

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


async def _chunked_in(
    session: AsyncSession, stmt_for: Any, ids: Sequence[str], *, scalars: bool = False
) -> list[Any]:
    """``stmt_for(chunk)``'s rows (``scalars``: first column) over ``ids`` in chunks of
    :data:`_IN_CHUNK`; no statement for no ids."""
    rows: list[Any] = []
    for start in range(0, len(ids), _IN_CHUNK):
        result = await session.execute(stmt_for(ids[start : start + _IN_CHUNK]))
        rows.extend(result.scalars().all() if scalars else result.all())
    return rows


async def ensure_target(
    session: AsyncSession, *, user_id: str, target_type: str, target_id: str
) -> None:
    """Check that a job target exists and is the user's (reference §2.1).

    Raises:
        AppError: ``NOT_FOUND`` when not; ``INVALID_ARGUMENT`` for an unknown target type.
    """
    await _resolve_scopes(session, user_id, [(target_type, target_id)])


@dataclass
class _Scope:
    target_type: str
    target_id: str
    materials: list[Material]
    material_total: int
    kp_block_only: str | None  # a knowledge_point target: only its blocks are candidates

    def wants(self, kp: KnowledgePoint) -> bool:
        """Whether ``kp`` is in scope: every knowledge point of the user for a ``user``
        target, the material's for a ``material``, the one for a ``knowledge_point``."""
        if self.target_type == "material":
            return kp.material_id == self.target_id
        if self.target_type == "knowledge_point":
            return kp.knowledge_point_id == self.target_id
        return True


def _not_found(target_type: str, target_id: str) -> AppError:
    return AppError(
        ErrorCode.NOT_FOUND,
        f"{target_type} {target_id!r} not found",
        {"targetType": target_type, "targetId": target_id},
    )


async def _resolve_scopes(
    session: AsyncSession, user_id: str, targets: Sequence[tuple[str, str]]
) -> list[_Scope]:
    """The scope of each target, in order, from a few reads whatever their number.

    Raises:
        AppError: for the first target (in order) that is of an unknown type
            (``INVALID_ARGUMENT``) or does not exist or is not the user's (``NOT_FOUND``).
    """
    for target_type, _ in targets:
        if target_type not in TARGET_TYPES:
            raise invalid_argument(
                f"targetType must be one of {', '.join(TARGET_TYPES)}",
                field="targetType",
                value=target_type,
            )
    require_user(user_id)
    wanted = {t: [i for tt, i in targets if tt == t] for t in TARGET_TYPES}
    owned = {
        m.material_id: m
        for m in await _chunked_in(
            session,
            lambda ids: select(Material).where(
                Material.material_id.in_(ids), Material.user_id == user_id
            ),
            wanted["material"],
            scalars=True,
        )
    }
    kps = {
        k.knowledge_point_id: k
        for k in await _chunked_in(
            session,
            lambda ids: select(KnowledgePoint).where(
                KnowledgePoint.knowledge_point_id.in_(ids), KnowledgePoint.user_id == user_id
            ),
            wanted["knowledge_point"],
            scalars=True,
        )
    }
    kp_materials = {
        m.material_id: m
        for m in await _chunked_in(
            session,
            lambda ids: select(Material).where(Material.material_id.in_(ids)),
            sorted({k.material_id for k in kps.values()}),
            scalars=True,
        )
    }
    everything: tuple[list[Material], int] | None = None
    scopes: list[_Scope] = []
    for target_type, target_id in targets:
        if target_type == "user":
            if target_id != user_id:
                raise _not_found(target_type, target_id)
            if everything is None:
                everything = await _recent_materials(session, user_id)
            scopes.append(_Scope(target_type, target_id, *everything, None))
        elif target_type == "material":
            if target_id not in owned:
                raise _not_found(target_type, target_id)
            scopes.append(_Scope(target_type, target_id, [owned[target_id]], 1, None))
        else:
            kp = kps.get(target_id)
            if kp is None:
                raise _not_found(target_type, target_id)
            material = kp_materials[kp.material_id]
            scopes.append(_Scope(target_type, target_id, [material], 1, target_id))
    return scopes


async def _recent_materials(session: AsyncSession, user_id: str) -> tuple[list[Material], int]:
    """A ``user`` target's materials: the :data:`MAX_MATERIALS` most recent, oldest first,
    and how many the user has."""
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
    return recent, int(total)


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
    found = await build_payloads(
        session,
        user_id=user_id,
        job_type=job_type,
        targets=[(target_type, target_id)],
        params=params,
    )
    return found[0]


async def build_payloads(
    session: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    targets: Sequence[tuple[str, str]],
    params: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The payload of each of ``targets`` (``(targetType, targetId)``), in order: what
    :func:`build_payload` gives for each, read in one pass of set reads (a batch's
    children, reference §10.3): about ten statements however many targets.

    Raises:
        AppError: ``NOT_FOUND`` for the first target that does not exist or is not the
            user's; ``INVALID_ARGUMENT`` for an unknown job or target type.
    """
    budget = jobtypes.get(job_type).snapshot
    scopes = await _resolve_scopes(session, user_id, targets)
    material_ids = list(dict.fromkeys(m.material_id for s in scopes for m in s.materials))
    blocks = await _blocks_by_material(session, material_ids)
    points = await _knowledge_points(session, user_id, scopes)
    read_rows: dict[str, list[Any]] = {}
    for row in await _reading_rows(session, user_id, material_ids):
        read_rows.setdefault(str(row[1]), []).append(row)
    parts = []
    for scope in scopes:
        in_scope = [b for m in scope.materials for b in blocks.get(m.material_id, [])]
        mine = _points_of(points, scope)
        reading = _reading([r for m in scope.materials for r in read_rows.get(m.material_id, [])])
        if scope.kp_block_only is not None:
            linked = set(mine.links.get(scope.kp_block_only, []))
            candidates = [b for b in in_scope if b.block_id in linked]
        else:
            candidates = in_scope
        priority = [bid for kp in mine.kps for bid in mine.links[kp.knowledge_point_id]]
        chosen = select_blocks(
            candidates, priority=priority, budget_chars=budget.chars, max_blocks=budget.blocks
        )
        parts.append((scope, in_scope, mine, reading, candidates, chosen))
    texts = await _block_texts(session, [b.block_id for *_, chosen in parts for b in chosen])
    out = []
    for scope, in_scope, mine, reading, candidates, chosen in parts:
        materials = _material_entries(scope, in_scope, reading)
        stats = _stats(scope, mine, reading, materials)
        stats.update(
            includedBlockCount=len(chosen),
            omittedBlockCount=len(candidates) - len(chosen),
            blockBudgetChars=budget.chars,
        )
        stats["blockCount"] = len(candidates)
        chosen_ids = {b.block_id for b in chosen}
        out.append(
            {
                "jobType": job_type,
                "targetType": scope.target_type,
                "targetId": scope.target_id,
                "userId": user_id,
                "params": dict(params or {}),
                "materials": materials,
                "blocks": _block_entries(chosen, texts),
                "knowledgePoints": _kp_entries(mine, chosen_ids),
                "reading": reading.entries[:MAX_READING],
                "stats": stats,
            }
        )
    return out


async def _blocks_by_material(
    session: AsyncSession, material_ids: list[str]
) -> dict[str, list[BlockMeta]]:
    """The blocks (metadata only) of ``material_ids``, by material, in ordinal order."""
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
    out: dict[str, list[BlockMeta]] = {}
    for r in rows:
        out.setdefault(str(r[1]), []).append(BlockMeta(str(r[0]), str(r[1]), int(r[2]), int(r[3])))
    for found in out.values():
        found.sort(key=lambda b: b.ordinal)
    return out


async def _knowledge_points(
    session: AsyncSession, user_id: str, scopes: Sequence[_Scope]
) -> _KnowledgePoints:
    """Every knowledge point some scope takes, with their links and quiz totals (in no
    order; :func:`_points_of` picks and orders a scope's)."""
    stmt = select(KnowledgePoint).where(KnowledgePoint.user_id == user_id)
    if all(s.target_type != "user" for s in scopes):
        materials = sorted({s.target_id for s in scopes if s.target_type == "material"})
        points = sorted({s.target_id for s in scopes if s.target_type == "knowledge_point"})
        kps = await _chunked_in(
            session,
            lambda ids: stmt.where(KnowledgePoint.material_id.in_(ids)),
            materials,
            scalars=True,
        )
        kps += await _chunked_in(
            session,
            lambda ids: stmt.where(KnowledgePoint.knowledge_point_id.in_(ids)),
            points,
            scalars=True,
        )
    else:
        kps = list((await session.execute(stmt)).scalars())
    unique = list({k.knowledge_point_id: k for k in kps}.values())
    kp_ids = [k.knowledge_point_id for k in unique]
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
    return _KnowledgePoints(unique, links, quiz)


def _points_of(points: _KnowledgePoints, scope: _Scope) -> _KnowledgePoints:
    """The knowledge points of ``scope``, weakest first (module doc)."""
    quiz = points.quiz

    def weakness(kp: KnowledgePoint) -> tuple[int, float, int, str]:
        attempts, correct, _ = quiz.get(kp.knowledge_point_id, (0, 0, None))
        if attempts:
            return (0, correct / attempts, -attempts, kp.knowledge_point_id)
        return (1, 0.0, 0, kp.knowledge_point_id)

    kps = sorted((k for k in points.kps if scope.wants(k)), key=weakness)
    ids = {k.knowledge_point_id for k in kps}
    return _KnowledgePoints(
        kps,
        {k: v for k, v in points.links.items() if k in ids},
        {k: v for k, v in quiz.items() if k in ids},
    )


async def _reading_rows(session: AsyncSession, user_id: str, material_ids: list[str]) -> list[Any]:
    """The user's reading per block within ``material_ids``: their running totals
    (learning_block_stats), one row per block read, not their history:
    ``(blockId, materialId, dwellSeconds, lastReadAt)``."""
    stats = LearningBlockStat
    return await _chunked_in(
        session,
        lambda ids: select(
            stats.block_id, stats.material_id, stats.dwell_seconds, stats.last_read_at
        ).where(stats.user_id == user_id, stats.material_id.in_(ids)),
        material_ids,
    )


def _reading(rows: Sequence[Any]) -> _Reading:
    """One scope's reading from its :func:`_reading_rows`."""
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


async def _block_texts(session: AsyncSession, block_ids: list[str]) -> dict[str, str]:
    """The text of each of ``block_ids``, by id."""
    return {
        str(r[0]): str(r[1])
        for r in await _chunked_in(
            session,
            lambda ids: select(MaterialBlock.block_id, MaterialBlock.text).where(
                MaterialBlock.block_id.in_(ids)
            ),
            list(dict.fromkeys(block_ids)),
        )
    }


def _block_entries(chosen: list[BlockMeta], texts: dict[str, str]) -> list[dict[str, Any]]:
    """The chosen blocks with their text, in (material order, ordinal) order."""
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
