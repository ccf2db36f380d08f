"""Server-side result validation and business rows (reference §2.5, §5).

:func:`prepare_result` is what job_service runs, inside the result transaction,
before a job becomes ``succeeded`` (the writes then go in the result's batch):

1. schema — :func:`airuntime_common.outputs.validate_output` (``INVALID_SCHEMA``),
   the worker's strict models (no coercion, quiz answers that fit their options,
   reference §9.4); of a list longer than the job's ``count`` only the first ``count``
   items go on (:func:`requested_count`);
2. ownership — every block id an item cites (``sourceBlockIds``,
   ``evidenceBlockIds``, ``evidence[].blockId``) is one of the snapshot's
   ``blocks[].blockId``; every ``knowledgePointId`` (also in ``evidence[]``)
   is one of the user's knowledge points; every recommended target is the
   user's (``user`` = the user's own id, ``material`` / ``knowledge_point``
   must exist and be the user's). Any violation rejects the whole result with
   ``INVALID_SCHEMA`` naming the item, field and id; nothing is written;
3. dedupe — each item's content hash (sha256 of the validated item's
   canonical JSON; absent optional fields hash as ``null``) is unique per user
   and table: an item whose hash already exists for the user — stored earlier
   or earlier in the same output — is skipped and counted;
4. rows are written (``ordinal`` = position in the output, one ``INSERT IGNORE``
   each: a repeat is skipped by the per-user unique key) and the generation
   plan's counts (generated / written / skippedDuplicates) are recorded.

The result row itself (``ai_results``) is written by the caller; its
semantics (replay, conflicts, leases) are the caller's
(:mod:`job_service.services.completion`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Table, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import jobtypes
from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.outputs import validate_output
from airuntime_common.timeutil import rfc3339
from job_service.learning.common import db_now, insert_ignore_sql, new_id, require_user
from job_service.learning.plans import plan_outcome
from job_service.learning.snapshots import load_snapshot
from job_service.learning.tables import (
    AiResult,
    KnowledgePoint,
    Material,
    business_kinds,
    business_model,
)
from job_service.store.batch import new_batch
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec, dialect_name

DEFAULT_PAGE_SIZE: Final = 20
MAX_PAGE_SIZE: Final = 100
_INTERNAL_COLUMNS: Final = frozenset({"id", "user_id", "content_hash", "ordinal"})


@dataclass(frozen=True)
class AcceptOutcome:
    """What :func:`accept_result` did: items in the output, rows written, duplicates skipped."""

    generated: int
    written: int
    skipped: int


@dataclass(frozen=True)
class ResultRow:
    """A stored result row (``ai_results``)."""

    result_id: str
    job_id: str
    attempt_no: int
    output_hash: str
    idempotency_key: str
    prompt_version: str | None
    output_schema_version: str
    output: Any
    created_at: datetime


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def result_idempotency_key(job_id: str, attempt_no: int, output_hash: str) -> str:
    """``jobId:attemptNo:outputHash`` (reference §2.5)."""
    return f"{job_id}:{attempt_no}:{output_hash}"


async def insert_result_row(
    session: AsyncSession,
    *,
    job_id: str,
    attempt_no: int,
    output_hash: str,
    prompt_version: str | None,
    output_schema_version: str,
    output: Any,
) -> str:
    """Write one ``ai_results`` row in the caller's transaction and return its ``resultId``.

    Raises:
        sqlalchemy.exc.IntegrityError: when the idempotency key
        ``jobId:attemptNo:outputHash`` exists already (check with
        :func:`find_result_row` first).
    """
    result_id = new_id()
    session.add(
        AiResult(
            result_id=result_id,
            job_id=job_id,
            attempt_no=attempt_no,
            output_hash=output_hash,
            idempotency_key=result_idempotency_key(job_id, attempt_no, output_hash),
            prompt_version=prompt_version,
            output_schema_version=output_schema_version,
            output=output,
            created_at=db_now(),
        )
    )
    await session.flush()
    return result_id


async def find_result_row(
    session: AsyncSession,
    *,
    job_id: str,
    attempt_no: int | None = None,
    output_hash: str | None = None,
) -> ResultRow | None:
    """The result row with this key, or (without attempt/hash) the job's latest one."""
    stmt = select(AiResult).where(AiResult.job_id == job_id)
    if attempt_no is not None and output_hash is not None:
        stmt = stmt.where(
            AiResult.idempotency_key == result_idempotency_key(job_id, attempt_no, output_hash)
        )
    row = (
        await session.execute(stmt.order_by(AiResult.created_at.desc()).limit(1))
    ).scalar_one_or_none()
    if row is None:
        return None
    return ResultRow(
        row.result_id,
        row.job_id,
        row.attempt_no,
        row.output_hash,
        row.idempotency_key,
        row.prompt_version,
        row.output_schema_version,
        row.output,
        row.created_at,
    )


def output_items(job_type: str, validated: Any) -> list[dict[str, Any]]:
    """The validated output as a list of camelCase item dicts (a single-object output: one)."""
    if not jobtypes.get(job_type).itemized:
        return [validated.model_dump(mode="json")]
    return [item.model_dump(mode="json") for item in validated.items]


def _references(
    job_type: str, items: list[dict[str, Any]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(block refs, knowledge-point refs, target refs) as (field path, id[, type])."""
    blocks: list[tuple[str, str]] = []
    kps: list[tuple[str, str]] = []
    targets: list[tuple[str, str, str]] = []
    itemized = jobtypes.get(job_type).itemized
    for i, item in enumerate(items):
        prefix = f"items[{i}]." if itemized else ""
        for key in ("sourceBlockIds", "evidenceBlockIds"):
            for j, block_id in enumerate(item.get(key) or []):
                blocks.append((f"{prefix}{key}[{j}]", block_id))
        if item.get("knowledgePointId"):
            kps.append((f"{prefix}knowledgePointId", item["knowledgePointId"]))
        for j, ev in enumerate(item.get("evidence") or []):
            if ev.get("blockId"):
                blocks.append((f"{prefix}evidence[{j}].blockId", ev["blockId"]))
            if ev.get("knowledgePointId"):
                kps.append((f"{prefix}evidence[{j}].knowledgePointId", ev["knowledgePointId"]))
        if "targetType" in item and "targetId" in item:  # a recommendation's target
            targets.append((f"{prefix}targetId", item["targetType"], item["targetId"]))
    return blocks, kps, targets


async def _owned_ids(
    session: DbExec, col: Any, user_col: Any, user_id: str, ids: set[str]
) -> set[str]:
    if not ids:
        return set()
    rows = await session.execute(select(col).where(col.in_(list(ids)), user_col == user_id))
    return {str(r[0]) for r in rows}


async def check_ownership(
    session: DbExec,
    *,
    user_id: str,
    job_type: str,
    snapshot_block_ids: set[str],
    items: list[dict[str, Any]],
) -> None:
    """Check every id the items cite (module docstring, step 2).

    Raises:
        AppError: ``INVALID_SCHEMA``; the message names the first offending
        field and id, ``details.violations`` lists up to 20 as
        ``{"field","id","reason"}`` with reason ``block_not_in_snapshot``,
        ``knowledge_point_not_owned`` or ``target_not_owned``.
    """
    blocks, kps, targets = _references(job_type, items)
    kp_ids = {k for _, k in kps} | {t for _, tt, t in targets if tt == "knowledge_point"}
    owned_kps = await _owned_ids(
        session, KnowledgePoint.knowledge_point_id, KnowledgePoint.user_id, user_id, kp_ids
    )
    owned_materials = await _owned_ids(
        session,
        Material.material_id,
        Material.user_id,
        user_id,
        {t for _, tt, t in targets if tt == "material"},
    )
    violations: list[dict[str, str]] = []
    messages: list[str] = []
    for path, block_id in blocks:
        if block_id not in snapshot_block_ids:
            violations.append({"field": path, "id": block_id, "reason": "block_not_in_snapshot"})
            messages.append(f"{path}: block {block_id!r} is not in the job's snapshot")
    for path, kp_id in kps:
        if kp_id not in owned_kps:
            violations.append({"field": path, "id": kp_id, "reason": "knowledge_point_not_owned"})
            messages.append(f"{path}: knowledge point {kp_id!r} is not one of the user's")
    for path, target_type, target_id in targets:
        ok = (
            (target_type == "user" and target_id == user_id)
            or (target_type == "material" and target_id in owned_materials)
            or (target_type == "knowledge_point" and target_id in owned_kps)
        )
        if not ok:
            violations.append({"field": path, "id": target_id, "reason": "target_not_owned"})
            messages.append(f"{path}: {target_type} {target_id!r} is not the user's")
    if violations:
        raise AppError(
            ErrorCode.INVALID_SCHEMA,
            messages[0] + (f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""),
            {"violations": violations[:20]},
        )


@dataclass(frozen=True)
class PreparedResult:
    """A validated output's business rows, not yet written (:func:`prepare_result`).

    Attributes:
        job_id, job_type: the job.
        dialect: the database's dialect name.
        table: the job type's business table.
        rows: one row per output item, by column name, in output order.
    """

    job_id: str
    job_type: str
    dialect: str
    table: Table
    rows: list[dict[str, Any]]

    def statements(self, clock: DbClock | None = None) -> list[Sql]:
        """The writes, for the caller's batch, in order: one ``INSERT IGNORE`` per row
        (a repeat within the output is skipped like one already stored, by the
        per-user unique key), then the generation plan's outcome, if the type
        keeps a plan (it counts what the inserts wrote)."""
        out = [insert_ignore_sql(self.dialect, self.table, row) for row in self.rows]
        plan = plan_outcome(self.job_type, self.table, job_id=self.job_id, generated=len(self.rows))
        if plan is not None:
            out.append(plan)
        return out


def requested_count(job_type: str, params: Any) -> int | None:
    """How many items a job asked for: ``params.count`` (as its snapshot stores the
    job's params) of a job type whose output is a list and whose params have a count;
    None when the type has none (reference §9.4: a result with more items writes only the
    first ``count``; the worker trims the same way)."""
    spec = jobtypes.find(job_type)
    if spec is None or not spec.itemized or "count" not in spec.params.model_fields:
        return None
    count = params.get("count") if isinstance(params, dict) else None
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return count
    return None


async def prepare_result(
    session: DbExec,
    *,
    job_id: str,
    user_id: str,
    job_type: str,
    snapshot_id: str,
    output_schema_version: str,
    output: Any,
) -> PreparedResult:
    """Validate a result's output and build its business rows, writing nothing (reference §5).

    Args:
        session: the result transaction (reads only).
        job_id: the job; written on every row.
        user_id: the job's user; ownership and dedupe are per user.
        job_type: a registered job type.
        snapshot_id: the job's snapshot (source of the citable block ids).
        output_schema_version: e.g. ``"v1"``.
        output: the parsed output JSON.

    Raises:
        AppError: ``INVALID_SCHEMA`` for a schema or ownership violation;
        ``INVALID_SNAPSHOT`` when the snapshot is missing. Nothing is written.
    """
    validated = validate_output(job_type, output_schema_version, output)
    items = output_items(job_type, validated)
    try:
        snapshot = await load_snapshot(session, snapshot_id)
    except AppError:
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            f"snapshot {snapshot_id!r} of job {job_id} is missing",
            {"snapshotId": snapshot_id},
        ) from None
    count = requested_count(job_type, snapshot.payload.get("params"))
    if count is not None:
        items = items[:count]  # reference §9.4: only the first count are written
    block_ids = {str(b.get("blockId")) for b in snapshot.payload.get("blocks", [])}
    await check_ownership(
        session, user_id=user_id, job_type=job_type, snapshot_block_ids=block_ids, items=items
    )
    model, _ = business_model(job_type)
    now = db_now()
    rows = []
    for ordinal, item in enumerate(items):
        row = {_snake(k): v for k, v in item.items()}
        row.update(
            id=new_id(),
            user_id=user_id,
            job_id=job_id,
            ordinal=ordinal,
            content_hash=content_hash(item),
            created_at=now,
        )
        rows.append(row)
    return PreparedResult(job_id, job_type, dialect_name(session), model.__table__, rows)


async def accept_result(session: DbExec, **kw: Any) -> AcceptOutcome:
    """:func:`prepare_result`, then its writes in one batch, in the caller's transaction
    (never commits); arguments as :func:`prepare_result`'s.

    Returns:
        ``AcceptOutcome(generated, written, skipped)`` — items in the output,
        rows written, duplicates skipped (``generated = written + skipped``).

    Raises:
        AppError: as :func:`prepare_result` (nothing written).
    """
    prepared = await prepare_result(session, **kw)
    batch = new_batch(session)
    for sql in prepared.statements():
        batch.add(sql)
    outcomes = await batch.run()
    written = sum(o.rowcount for o in outcomes[: len(prepared.rows)])
    return AcceptOutcome(len(prepared.rows), written, len(prepared.rows) - written)


def _row_json(row: Any, id_key: str) -> dict[str, Any]:
    """A business row as its camelCase item: ``itemId`` (reference §9.2) and the kind's own
    id key (the same id), then the item's fields, ``jobId`` and ``createdAt``."""
    view: dict[str, Any] = {"itemId": row.id, id_key: row.id}
    for col in row.__table__.columns:
        if col.key in _INTERNAL_COLUMNS:
            continue
        value = getattr(row, col.key)
        view[_camel(col.key)] = rfc3339(value) if isinstance(value, datetime) else value
    return view


async def result_items(
    session: AsyncSession,
    *,
    job_id: str,
    job_type: str | None = None,
    user_id: str | None = None,
) -> list[dict[str, Any]]:
    """The business rows of a job's result, in output order, as camelCase items
    (GET result, reference §3.1).

    Each item carries its ``itemId`` (reference §9.2; also as ``analysisId`` /
    ``weakPointId`` / ``recommendationId`` / ``questionId`` / ``flashcardId``), the item's
    fields, ``jobId`` (the job that wrote the row) and ``createdAt``.

    With ``job_type`` and ``user_id``, the items are resolved from the job's
    accepted output (``ai_results``): every distinct item of the output is
    listed, an item that was skipped as a duplicate as the user's existing row
    (nothing is written twice, yet the result shows everything the job
    produced). Otherwise — or when the job has no result row — the rows the job
    itself wrote are listed.

    Args:
        job_type: the job's type; without it every business table is searched.
        user_id: the job's user (dedupe scope).
    """
    if job_type and user_id:
        result = await find_result_row(session, job_id=job_id)
        if result is not None:
            try:
                validated = validate_output(job_type, result.output_schema_version, result.output)
            except AppError:
                validated = None
            if validated is not None:
                model, id_key = business_model(job_type)
                hashes = list(
                    dict.fromkeys(content_hash(i) for i in output_items(job_type, validated))
                )
                rows = (
                    await session.execute(
                        select(model).where(
                            model.user_id == user_id, model.content_hash.in_(hashes)
                        )
                    )
                ).scalars()
                by_hash = {r.content_hash: r for r in rows}
                return [_row_json(by_hash[h], id_key) for h in hashes if h in by_hash]
    tables = [business_model(job_type)] if job_type else list(business_kinds().values())
    items: list[dict[str, Any]] = []
    for model, id_key in tables:
        found = (
            await session.execute(
                select(model).where(model.job_id == job_id).order_by(model.ordinal)
            )
        ).scalars()
        items.extend(_row_json(r, id_key) for r in found)
    return items


async def children_items(
    session: AsyncSession, *, parent_job_id: str, job_type: str, user_id: str
) -> tuple[list[dict[str, Any]], str]:
    """The result of a batch's parent (reference §10.3): the items of every succeeded
    child (:func:`result_items`), each with ``jobId`` its child's, children in the
    order of the batch's targets.

    Returns:
        ``(items, outputSchemaVersion)``: the version the first succeeded child's
        output had ("" with none).
    """
    from job_service.store.parents import children_of

    found = await session.execute(
        children_of.get(DbClock(dialect_name(session))), {"c_parent": parent_job_id}
    )
    items: list[dict[str, Any]] = []
    version = ""
    for child_id, status, _, _, schema_version in found.all():
        if status != "succeeded":
            continue
        version = version or (schema_version or "")
        for item in await result_items(
            session, job_id=str(child_id), job_type=job_type, user_id=user_id
        ):
            item["jobId"] = str(child_id)
            items.append(item)
    return items, version


def _encode_token(created_at: datetime, row_id: str) -> str:
    raw = json.dumps({"t": created_at.isoformat(), "i": row_id}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        return datetime.fromisoformat(data["t"]), str(data["i"])
    except (ValueError, KeyError, TypeError, binascii.Error, json.JSONDecodeError):
        raise invalid_argument("pageToken is not valid", field="pageToken") from None


async def list_user_items(
    session: AsyncSession,
    *,
    user_id: str,
    kind: str,
    page_size: int | None,
    page_token: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the user's business rows of one kind, newest first.

    Args:
        kind: ``analyses | weak_points | recommendations | questions | flashcards``.
        page_size: 1..100; 0/None → 20.
        page_token: the previous page's ``nextPageToken`` (opaque), or empty.

    Returns:
        ``(items, next_page_token)``; the token is None on the last page.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unknown kind, a page size out of
        range or a bad token.
    """
    kinds = business_kinds()
    if kind not in kinds:
        raise invalid_argument(f"kind must be one of {', '.join(kinds)}", field="kind", value=kind)
    require_user(user_id)
    size = page_size or DEFAULT_PAGE_SIZE
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise invalid_argument(f"pageSize must be 1..{MAX_PAGE_SIZE}", field="pageSize", value=size)
    model, id_key = kinds[kind]
    stmt = select(model).where(model.user_id == user_id)
    if page_token:
        at, last_id = _decode_token(page_token)
        stmt = stmt.where(
            or_(model.created_at < at, and_(model.created_at == at, model.id < last_id))
        )
    rows = list(
        (
            await session.execute(
                stmt.order_by(model.created_at.desc(), model.id.desc()).limit(size + 1)
            )
        ).scalars()
    )
    next_token = None
    if len(rows) > size:
        rows = rows[:size]
        next_token = _encode_token(rows[-1].created_at, rows[-1].id)
    return [_row_json(r, id_key) for r in rows], next_token
