"""Snapshots: the immutable input of a job, built at create and stored once (reference §2.3, §5).

The payload is :mod:`job_service.learning.payload`'s. Its content hash is
:func:`airuntime_common.canonical.content_hash` of the payload; a snapshot is
stored once per (user, hash) and reused (UNIQUE(user_id, content_hash), written
with insert-or-ignore, so concurrent creates converge on one row). A stored
snapshot never changes, so loaded views are kept in a process-wide cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import String, bindparam, exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.lru import LruCache
from job_service.learning.common import db_now, insert_ignore, new_id
from job_service.learning.payload import build_payload as build_payload  # re-exported
from job_service.learning.payload import build_payloads
from job_service.learning.tables import AiSnapshot
from job_service.services.ports import SnapshotRead, SnapshotsRead
from job_service.store import cache
from job_service.store.cache import Sql
from job_service.store.engine import DbExec

SNAPSHOT_SCHEMA_VERSION: Final = "v1"
#: Snapshot views kept per process (least recently used dropped).
MAX_CACHED_SNAPSHOTS: Final = 256
#: Hashes per read of stored snapshots' ids.
_IN_CHUNK: Final = 500


@dataclass(frozen=True)
class SnapshotView:
    """A stored snapshot (reference §3 ``GET …/snapshot``)."""

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


#: The process's snapshot views by id (job_service reads a job's snapshot for
#: GetSnapshot and again to validate its result). The views are shared: callers
#: treat ``payload`` as read-only.
SNAPSHOT_CACHE: LruCache[str, SnapshotView] = LruCache(MAX_CACHED_SNAPSHOTS)


async def build_snapshot(
    session: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    target_type: str,
    target_id: str,
    params: dict[str, Any] | None,
) -> str:
    """Build the snapshot payload v1 for a new job and store it once (reference §2.3, §5).

    Args:
        session: the caller's session (the job-create transaction); not committed.
        user_id: the job's user.
        job_type: a registered job type.
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
    found = await build_snapshots(
        session,
        user_id=user_id,
        job_type=job_type,
        targets=[(target_type, target_id)],
        params=params,
    )
    return found[0]


async def build_snapshots(
    session: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    targets: Sequence[tuple[str, str]],
    params: dict[str, Any] | None,
) -> list[str]:
    """:func:`build_snapshot` for each of ``targets`` (``(targetType, targetId)``), in
    order, with set reads and writes (:func:`~job_service.learning.payload.build_payloads`,
    one INSERT of every row, one read of their ids): a batch's children (reference §10.3).

    Raises:
        AppError: as :func:`build_snapshot`, for the first target that fails.
    """
    payloads = await build_payloads(
        session, user_id=user_id, job_type=job_type, targets=targets, params=params
    )
    digests = [content_hash(p) for p in payloads]
    now = db_now()
    rows = [
        {
            "snapshot_id": new_id(),
            "user_id": user_id,
            "job_type": job_type,
            "target_type": target_type,
            "target_id": target_id,
            "schema_version": SNAPSHOT_SCHEMA_VERSION,
            "payload": payload,
            "content_hash": digest,
            "created_at": now,
        }
        for (target_type, target_id), payload, digest in zip(
            targets, payloads, digests, strict=True
        )
    ]
    await insert_ignore(session, AiSnapshot.__table__, rows)  # type: ignore[arg-type]
    ids: dict[str, str] = {}
    unique = list(dict.fromkeys(digests))
    for start in range(0, len(unique), _IN_CHUNK):
        found = await session.execute(
            select(AiSnapshot.content_hash, AiSnapshot.snapshot_id).where(
                AiSnapshot.user_id == user_id,
                AiSnapshot.content_hash.in_(unique[start : start + _IN_CHUNK]),
            )
        )
        ids.update({str(h): str(i) for h, i in found.all()})
    return [ids[d] for d in digests]


def _view_columns() -> Any:
    """``SELECT`` of a snapshot's view columns (the fields of :class:`SnapshotView`)."""
    table = AiSnapshot.__table__
    return select(
        table.c.snapshot_id,
        table.c.schema_version,
        table.c.target_type,
        table.c.target_id,
        table.c.payload,
        table.c.content_hash,
    )


def _read_stmt() -> Any:
    """``SELECT`` of one snapshot's view columns by ``snapshot_id`` (bound: ``s_id``)."""
    table = AiSnapshot.__table__
    return _view_columns().where(table.c.snapshot_id == bindparam("s_id", type_=String()))


def _read_many_stmt() -> Any:
    """``SELECT`` of the view columns of the snapshots whose ids are bound as ``s_ids``
    (a list)."""
    table = AiSnapshot.__table__
    return _view_columns().where(table.c.snapshot_id.in_(bindparam("s_ids", expanding=True)))


def snapshot_exists() -> Any:
    """``EXISTS`` (a snapshot row with ``snapshot_id = :s_id``), one shared registered
    expression, for a statement that must not happen without the snapshot."""

    def build() -> Any:
        table = AiSnapshot.__table__
        return cache.stable(
            exists().where(table.c.snapshot_id == bindparam("s_id", type_=String()))
        )

    return cache.statement(("snapshot_exists",), build)


def snapshot_from_row(row: Sequence[Any]) -> SnapshotView:
    """The view of a snapshot read's row, kept in :data:`SNAPSHOT_CACHE`."""
    view = SnapshotView(*row)
    SNAPSHOT_CACHE.put(view.snapshot_id, view)
    return view


def snapshot_not_found(snapshot_id: str) -> AppError:
    """``NOT_FOUND`` for a snapshot id with no row."""
    return AppError(
        ErrorCode.NOT_FOUND, f"snapshot {snapshot_id!r} not found", {"snapshotId": snapshot_id}
    )


def snapshot_read(snapshot_id: str) -> SnapshotRead:
    """A snapshot as a transaction reads it: the cached view, or the statement that reads it."""
    return SnapshotRead(
        view=SNAPSHOT_CACHE.get(snapshot_id),
        sql=Sql(("load_snapshot",), _read_stmt, {"s_id": snapshot_id}),
        exists=snapshot_exists(),
        from_row=snapshot_from_row,
        not_found=lambda: snapshot_not_found(snapshot_id),
    )


def snapshots_read(snapshot_ids: Sequence[str], *, cached: bool = True) -> SnapshotsRead:
    """Snapshots as a transaction reads them: the views :data:`SNAPSHOT_CACHE` holds
    (none without ``cached``), and one ``SELECT`` of the others' rows (a row for
    each id still stored; none for a deleted one)."""
    views: dict[str, SnapshotView] = {}
    missing: list[str] = []
    for sid in dict.fromkeys(snapshot_ids):
        view = SNAPSHOT_CACHE.get(sid) if cached else None
        if view is not None:
            views[sid] = view
        else:
            missing.append(sid)
    sql = Sql(("load_snapshots",), _read_many_stmt, {"s_ids": missing}) if missing else None
    return SnapshotsRead(views=views, sql=sql, from_row=snapshot_from_row)


async def load_snapshot(session: DbExec, snapshot_id: str) -> SnapshotView:
    """Read a stored snapshot (through :data:`SNAPSHOT_CACHE`).

    Raises:
        AppError: ``NOT_FOUND`` when no snapshot has this id.
    """
    read = snapshot_read(snapshot_id)
    if read.view is not None:
        return read.view  # type: ignore[return-value]
    row = (await session.execute(read.sql.statement(), dict(read.sql.params))).first()
    if row is None:
        raise read.not_found()
    return snapshot_from_row(tuple(row))
