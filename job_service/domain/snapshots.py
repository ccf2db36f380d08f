"""Snapshots: the immutable input of a job, built at create (SPEC §2.3, §5).

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

**Block selection** (deterministic). Job types get a text budget: quiz and
flashcard generation :data:`GENERATION_BUDGET_CHARS` characters and at most
:data:`GENERATION_MAX_BLOCKS` blocks; the three analysis types a bounded
sample of :data:`ANALYSIS_BUDGET_CHARS` characters / :data:`ANALYSIS_MAX_BLOCKS`
blocks. Candidates are the scope's blocks in (material order, ordinal) order.
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

The content hash is :func:`airuntime_common.canonical.content_hash` of the
payload; a snapshot is stored once per (user, hash) and reused
(UNIQUE(user_id, content_hash), written with insert-or-ignore, so concurrent
creates converge on one row).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import String, bindparam, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.canonical import content_hash
from airuntime_common.enums import JOB_TYPES, TARGET_TYPES
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import rfc3339
from job_service.db import DbExec
from job_service.domain import sqlcache
from job_service.domain.learning import db_now, insert_ignore, new_id, require_user
from job_service.learning_models import (
    AiFlashcardGenerationPlan,
    AiQuestionGenerationPlan,
    AiSnapshot,
    KnowledgePoint,
    KnowledgePointBlock,
    LearningBlockStat,
    LearningKnowledgePointStat,
    Material,
    MaterialBlock,
)

SNAPSHOT_SCHEMA_VERSION: Final = "v1"
GENERATION_BUDGET_CHARS: Final = 24_000
GENERATION_MAX_BLOCKS: Final = 200
ANALYSIS_BUDGET_CHARS: Final = 8_000
ANALYSIS_MAX_BLOCKS: Final = 40
MAX_MATERIALS: Final = 100
MAX_KNOWLEDGE_POINTS: Final = 200
MAX_READING: Final = 200
WEAKEST_COUNT: Final = 5
GENERATION_TYPES: Final = frozenset({"quiz_generation", "flashcard_generation"})
_IN_CHUNK = 500


@dataclass(frozen=True)
class SnapshotView:
    """A stored snapshot (SPEC §3 ``GET …/snapshot``)."""

    snapshot_id: str
    schema_version: str
    target_type: str
    target_id: str
    payload: dict[str, Any]
    content_hash: str

    def to_json(self) -> dict[str, Any]:
        """camelCase view: ``{"snapshotId","schemaVersion","targetType","targetId","payload"}``."""
        return {
            "snapshotId": self.snapshot_id,
            "schemaVersion": self.schema_version,
            "targetType": self.target_type,
            "targetId": self.target_id,
            "payload": self.payload,
        }


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


async def build_snapshot(
    session: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    target_type: str,
    target_id: str,
    params: dict[str, Any] | None,
) -> str:
    """Build the snapshot payload v1 for a new job and store it once (SPEC §2.3, §5).

    Args:
        session: the caller's session (the job-create transaction); not committed.
        user_id: the job's user.
        job_type: one of the five job types.
        target_type: ``user | material | knowledge_point``.
        target_id: the target's id (for ``user``: the user's own id).
        params: the job's normalised params, copied into the payload.

    Returns:
        The snapshot id (an existing one when the same payload was stored for
        this user before).

    Raises:
        AppError: ``NOT_FOUND`` when the target does not exist or is not the
        user's; ``INVALID_ARGUMENT`` for an unknown job or target type.
    """
    payload = await build_payload(
        session,
        user_id=user_id,
        job_type=job_type,
        target_type=target_type,
        target_id=target_id,
        params=params,
    )
    digest = content_hash(payload)
    await insert_ignore(
        session,
        AiSnapshot.__table__,  # type: ignore[arg-type]
        [
            {
                "snapshot_id": new_id(),
                "user_id": user_id,
                "job_type": job_type,
                "target_type": target_type,
                "target_id": target_id,
                "schema_version": SNAPSHOT_SCHEMA_VERSION,
                "payload": payload,
                "content_hash": digest,
                "created_at": db_now(),
            }
        ],
    )
    snapshot_id = (
        await session.execute(
            select(AiSnapshot.snapshot_id).where(
                AiSnapshot.user_id == user_id, AiSnapshot.content_hash == digest
            )
        )
    ).scalar_one()
    return str(snapshot_id)


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
        AppError: as :func:`build_snapshot`.
    """
    if job_type not in JOB_TYPES:
        raise invalid_argument(
            f"jobType must be one of {', '.join(JOB_TYPES)}", field="jobType", value=job_type
        )
    scope = await _resolve_scope(session, user_id, target_type, target_id)
    material_ids = [m.material_id for m in scope.materials]
    material_order = {mid: i for i, mid in enumerate(material_ids)}

    # Blocks (metadata only) of the materials in scope, in (material order, ordinal) order.
    block_rows = await _chunked_in(
        session,
        lambda ids: select(
            MaterialBlock.block_id,
            MaterialBlock.material_id,
            MaterialBlock.ordinal,
            MaterialBlock.char_count,
        ).where(MaterialBlock.material_id.in_(ids)),
        material_ids,
    )
    all_blocks = sorted(
        (BlockMeta(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in block_rows),
        key=lambda b: (material_order[b.material_id], b.ordinal),
    )
    block_count_by_material: dict[str, int] = {}
    for b in all_blocks:
        block_count_by_material[b.material_id] = block_count_by_material.get(b.material_id, 0) + 1

    # Knowledge points in scope with their links and quiz statistics.
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
    # Quiz results per knowledge point: the user's running totals
    # (learning_kp_stats), one row per knowledge point attempted, not their history.
    quiz: dict[str, tuple[int, int, datetime | None]] = {}
    kp_stats = LearningKnowledgePointStat
    for row in await _chunked_in(
        session,
        lambda ids: select(
            kp_stats.knowledge_point_id,
            kp_stats.attempts,
            kp_stats.correct,
            kp_stats.last_attempt_at,
        ).where(kp_stats.user_id == user_id, kp_stats.knowledge_point_id.in_(ids)),
        kp_ids,
    ):
        quiz[str(row[0])] = (int(row[1]), int(row[2] or 0), row[3])

    def weakness(kp: KnowledgePoint) -> tuple[int, float, int, str]:
        attempts, correct, _ = quiz.get(kp.knowledge_point_id, (0, 0, None))
        if attempts:
            return (0, correct / attempts, -attempts, kp.knowledge_point_id)
        return (1, 0.0, 0, kp.knowledge_point_id)

    kps.sort(key=weakness)

    # Reading per block within the scope's materials: the user's running totals
    # (learning_block_stats), one row per block read, not their history.
    block_stats = LearningBlockStat
    reading_rows = await _chunked_in(
        session,
        lambda ids: select(
            block_stats.block_id,
            block_stats.material_id,
            block_stats.dwell_seconds,
            block_stats.last_read_at,
        ).where(block_stats.user_id == user_id, block_stats.material_id.in_(ids)),
        material_ids,
    )
    reading = sorted(
        (
            {
                "blockId": str(r[0]),
                "materialId": str(r[1]),
                "dwellSeconds": _round(r[2] or 0.0, 3),
                "lastReadAt": r[3],
            }
            for r in reading_rows
        ),
        key=lambda e: (e["lastReadAt"], e["blockId"]),
        reverse=True,
    )
    read_by_material: dict[str, int] = {}
    for e in reading:
        read_by_material[e["materialId"]] = read_by_material.get(e["materialId"], 0) + 1
    total_dwell = sum(e["dwellSeconds"] for e in reading)
    last_read = reading[0]["lastReadAt"] if reading else None
    for e in reading:
        e["lastReadAt"] = rfc3339(e["lastReadAt"])

    material_entries = []
    for m in scope.materials:
        count = block_count_by_material.get(m.material_id, 0)
        read = read_by_material.get(m.material_id, 0)
        material_entries.append(
            {
                "materialId": m.material_id,
                "title": m.title,
                "blockCount": count,
                "readBlockCount": read,
                "progress": _round(read / count) if count else 0.0,
            }
        )

    # Block selection.
    if scope.kp_block_only is not None:
        wanted = set(links.get(scope.kp_block_only, []))
        candidates = [b for b in all_blocks if b.block_id in wanted]
    else:
        candidates = all_blocks
    priority = [bid for kp in kps for bid in links[kp.knowledge_point_id]]
    if job_type in GENERATION_TYPES:
        budget, cap = GENERATION_BUDGET_CHARS, GENERATION_MAX_BLOCKS
    else:
        budget, cap = ANALYSIS_BUDGET_CHARS, ANALYSIS_MAX_BLOCKS
    chosen = select_blocks(candidates, priority=priority, budget_chars=budget, max_blocks=cap)
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
    block_entries = [
        {
            "blockId": b.block_id,
            "materialId": b.material_id,
            "ordinal": b.ordinal,
            "text": texts[b.block_id],
        }
        for b in chosen
    ]

    chosen_ids = {b.block_id for b in chosen}
    kp_entries: list[dict[str, Any]] = []
    for kp in kps[:MAX_KNOWLEDGE_POINTS]:
        attempts, correct, last = quiz.get(kp.knowledge_point_id, (0, 0, None))
        kp_entries.append(
            {
                "knowledgePointId": kp.knowledge_point_id,
                "name": kp.name,
                "materialId": kp.material_id,
                "blockIds": [b for b in links[kp.knowledge_point_id] if b in chosen_ids],
                "attempts": attempts,
                "correct": correct,
                "accuracy": _round(correct / attempts) if attempts else None,
                "lastAttemptAt": rfc3339(last),
            }
        )

    attempts_total = sum(q[0] for q in quiz.values())
    correct_total = sum(q[1] for q in quiz.values())
    last_attempt = max((q[2] for q in quiz.values() if q[2] is not None), default=None)
    activity = [t for t in (last_read, last_attempt) if t is not None]
    weakest = [
        kp.knowledge_point_id for kp in kps if quiz.get(kp.knowledge_point_id, (0, 0, None))[0]
    ][:WEAKEST_COUNT]
    least_progress = [
        e["materialId"]
        for e in sorted(material_entries, key=lambda e: (e["progress"], e["materialId"]))
    ][:WEAKEST_COUNT]
    stats = {
        "materialCount": scope.material_total,
        "blockCount": len(candidates),
        "readBlockCount": len(reading_rows),
        "knowledgePointCount": len(kps),
        "quizAttempts": attempts_total,
        "quizCorrect": correct_total,
        "accuracy": _round(correct_total / attempts_total) if attempts_total else None,
        "totalDwellSeconds": _round(total_dwell, 3),
        "lastActivityAt": rfc3339(max(activity)) if activity else None,
        "asOfDate": db_now().date().isoformat(),
        "weakestKnowledgePointIds": weakest,
        "leastProgressMaterialIds": least_progress,
        "includedBlockCount": len(chosen),
        "omittedBlockCount": len(candidates) - len(chosen),
        "blockBudgetChars": budget,
    }
    return {
        "jobType": job_type,
        "targetType": target_type,
        "targetId": target_id,
        "userId": user_id,
        "params": dict(params or {}),
        "materials": material_entries,
        "blocks": block_entries,
        "knowledgePoints": kp_entries,
        "reading": reading[:MAX_READING],
        "stats": stats,
    }


class SnapshotCache:
    """A bounded LRU of loaded snapshots, by ``snapshotId``.

    Snapshots are immutable once stored (a rebuild makes a new row with a new
    id), so a cached view never goes stale. The views are shared: callers must
    treat ``payload`` as read-only.

    Args:
        max_entries: views kept; the least recently used is dropped beyond it.
    """

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._views: OrderedDict[str, SnapshotView] = OrderedDict()

    def get(self, snapshot_id: str) -> SnapshotView | None:
        """The cached view, or None."""
        view = self._views.get(snapshot_id)
        if view is not None:
            self._views.move_to_end(snapshot_id)
        return view

    def put(self, view: SnapshotView) -> None:
        """Keep ``view``, dropping the least recently used beyond ``max_entries``."""
        self._views[view.snapshot_id] = view
        self._views.move_to_end(view.snapshot_id)
        while len(self._views) > self.max_entries:
            self._views.popitem(last=False)

    def clear(self) -> None:
        """Forget every view."""
        self._views.clear()


#: The process's snapshot cache (job_service reads a job's snapshot for
#: GetSnapshot and again to validate its result).
SNAPSHOT_CACHE = SnapshotCache()


#: :mod:`sqlcache` key of the snapshot read (bound: ``s_id``).
SNAPSHOT_READ_KEY = ("load_snapshot",)


def snapshot_read_stmt() -> Any:
    """``SELECT`` of one snapshot's view columns by ``snapshot_id`` (bound: ``s_id``);
    its rows go through :func:`snapshot_from_row`."""
    table = AiSnapshot.__table__
    return select(
        table.c.snapshot_id,
        table.c.schema_version,
        table.c.target_type,
        table.c.target_id,
        table.c.payload,
        table.c.content_hash,
    ).where(table.c.snapshot_id == bindparam("s_id", type_=String()))


def snapshot_exists() -> Any:
    """``EXISTS`` (a snapshot row with ``snapshot_id = :s_id``), one shared registered
    expression, for a statement that must not happen without the snapshot."""

    def build() -> Any:
        table = AiSnapshot.__table__
        return sqlcache.stable(
            exists().where(table.c.snapshot_id == bindparam("s_id", type_=String()))
        )

    return sqlcache.statement(("snapshot_exists",), build)


def snapshot_from_row(row: Sequence[Any]) -> SnapshotView:
    """The view of a :func:`snapshot_read_stmt` row, kept in :data:`SNAPSHOT_CACHE`."""
    view = SnapshotView(*row)
    SNAPSHOT_CACHE.put(view)
    return view


def snapshot_not_found(snapshot_id: str) -> AppError:
    """``NOT_FOUND`` for a snapshot id with no row."""
    return AppError(
        ErrorCode.NOT_FOUND, f"snapshot {snapshot_id!r} not found", {"snapshotId": snapshot_id}
    )


async def load_snapshot(session: DbExec, snapshot_id: str) -> SnapshotView:
    """Read a stored snapshot (through :data:`SNAPSHOT_CACHE`).

    Raises:
        AppError: ``NOT_FOUND`` when no snapshot has this id.
    """
    cached = SNAPSHOT_CACHE.get(snapshot_id)
    if cached is not None:
        return cached
    stmt = sqlcache.statement(SNAPSHOT_READ_KEY, snapshot_read_stmt)
    row = (await session.execute(stmt, {"s_id": snapshot_id})).first()
    if row is None:
        raise snapshot_not_found(snapshot_id)
    return snapshot_from_row(tuple(row))


async def create_generation_plan(
    session: AsyncSession,
    *,
    job_id: str,
    user_id: str,
    job_type: str,
    target_type: str,
    target_id: str,
    params: dict[str, Any] | None,
) -> None:
    """Write the generation plan row of a quiz / flashcard job (SPEC §5); no-op for other types.

    Args:
        params: the job's normalised params: ``count`` (default 5), for quizzes
            also ``difficulty`` (default ``medium``) and ``questionTypes``
            (default ``["single_choice"]``).
    """
    params = params or {}
    count = int(params.get("count", 5))
    now = db_now()
    if job_type == "quiz_generation":
        session.add(
            AiQuestionGenerationPlan(
                job_id=job_id,
                user_id=user_id,
                target_type=target_type,
                target_id=target_id,
                requested_count=count,
                difficulty=str(params.get("difficulty", "medium")),
                question_types=list(params.get("questionTypes") or ["single_choice"]),
                created_at=now,
            )
        )
    elif job_type == "flashcard_generation":
        session.add(
            AiFlashcardGenerationPlan(
                job_id=job_id,
                user_id=user_id,
                target_type=target_type,
                target_id=target_id,
                requested_count=count,
                created_at=now,
            )
        )
    else:
        return
    await session.flush()


async def record_plan_outcome(
    session: DbExec, *, job_id: str, job_type: str, generated: int, written: int, skipped: int
) -> None:
    """Store a generation plan's outcome counts (no-op for non-generation jobs or no plan row)."""
    table: Any
    if job_type == "quiz_generation":
        table = AiQuestionGenerationPlan
    elif job_type == "flashcard_generation":
        table = AiFlashcardGenerationPlan
    else:
        return
    await session.execute(
        update(table)
        .where(table.job_id == job_id)
        .values(
            generated=generated, written=written, skipped_duplicates=skipped, completed_at=db_now()
        )
    )


async def get_generation_plan(session: AsyncSession, job_id: str) -> dict[str, Any] | None:
    """camelCase view of a job's generation plan, or None when it has none."""
    for table in (AiQuestionGenerationPlan, AiFlashcardGenerationPlan):
        row: Any = (
            await session.execute(select(table).where(table.job_id == job_id))
        ).scalar_one_or_none()
        if row is not None:
            view = {
                "jobId": row.job_id,
                "userId": row.user_id,
                "targetType": row.target_type,
                "targetId": row.target_id,
                "requestedCount": row.requested_count,
                "generated": row.generated,
                "written": row.written,
                "skippedDuplicates": row.skipped_duplicates,
                "createdAt": rfc3339(row.created_at),
                "completedAt": rfc3339(row.completed_at),
            }
            if isinstance(row, AiQuestionGenerationPlan):
                view["difficulty"] = row.difficulty
                view["questionTypes"] = list(row.question_types)
            return view
    return None
