"""Prompt versions and routings as stored (reference §10.4): SQL and the rules of an upload.

Versions are immutable: an upload inserts a row or finds the same one; nothing
updates or deletes a version. The shipped ``v1`` of each type is read from the
code (:func:`airuntime_common.prompts.builtin_source`) and never stored.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.prompts import (
    BUILTIN_VERSION,
    builtin_source,
    check_version_name,
    full_version,
    validate_upload,
)
from job_service.prompts.routing import Guard, Routing, Variant
from job_service.prompts.tables import prompt_routings, prompt_versions
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tx import Store

#: The longest description of a version (characters).
MAX_DESCRIPTION = 1000
#: What GET says of a shipped template.
BUILTIN_DESCRIPTION = "The shipped template."


@dataclass(frozen=True)
class VersionView:
    """One version of a job type's prompt.

    Attributes:
        version: the bare version (``v2``).
        template: its Jinja2 source (a shipped one with its includes inlined); empty
            in lists.
        description: the uploader's description, or None.
        created_at: when it was uploaded (naive UTC); None for a shipped template.
        builtin: whether it is the shipped ``v1``.
    """

    version: str
    template: str
    description: str | None
    created_at: datetime | None
    builtin: bool


def template_hash(template: str) -> str:
    """sha256 hex of the template's UTF-8 bytes."""
    return hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()


def builtin_view(job_type: str, *, with_template: bool = True) -> VersionView:
    """The shipped ``v1`` of ``job_type`` (its includes inlined)."""
    source = builtin_source(job_type) if with_template else ""
    return VersionView(BUILTIN_VERSION, source, BUILTIN_DESCRIPTION, None, True)


def _view(row: Any, *, with_template: bool = True) -> VersionView:
    m = row._mapping
    return VersionView(
        m["version"],
        m["template"] if with_template else "",
        m["description"],
        m["created_at"],
        False,
    )


class Registry:
    """The prompt versions and routings of every job type.

    Args:
        store: the job database.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def clock(self) -> DbClock:
        """The database clock."""
        return self.store.clock

    # ------------------------------------------------------------------ versions

    async def put_version(
        self, job_type: str, version: str, template: str, description: str | None, actor: str
    ) -> tuple[VersionView, bool]:
        """Upload ``version`` of ``job_type``'s prompt (reference §10.4).

        Returns:
            ``(version, created)``: created False when the same template was already
            stored under that version (the answer is then 200, not 201).

        Raises:
            AppError: INVALID_ARGUMENT (unknown job type, bad version name, description
                too long); PROMPT_VERSION_EXISTS (``v1``, or the version holds another
                template); INVALID_PROMPT_TEMPLATE (naming the line).
        """
        jobtypes.get(job_type)
        check_version_name(version)
        if description is not None and len(description) > MAX_DESCRIPTION:
            raise invalid_argument(
                f"description is at most {MAX_DESCRIPTION} characters", field="description"
            )
        if version == BUILTIN_VERSION:
            raise _exists(job_type, version, "v1 is the shipped template and cannot change")
        digest = template_hash(template)
        found = await self._stored(job_type, version)
        if found is not None:
            return _same_or_conflict(job_type, version, found, digest), False
        # off the event loop: a render may take up to the sandbox's time limit
        await asyncio.to_thread(validate_upload, job_type, template)
        row = {
            "job_type": job_type,
            "version": version,
            "template": template,
            "template_hash": digest,
            "description": description,
            "created_by": actor[:160] or "admin",
        }

        async def insert(db: DbExec) -> None:
            await db.execute(prompt_versions.insert().values(created_at=self.clock.now()), row)

        try:
            await self.store.lean_tx(insert)
        except IntegrityError:  # a concurrent upload of the same version won
            found = await self._stored(job_type, version)
            if found is None:
                raise
            return _same_or_conflict(job_type, version, found, digest), False
        stored = await self._stored(job_type, version)
        assert stored is not None
        return _view(stored), True

    async def _stored(self, job_type: str, version: str) -> Any:
        stmt = select(prompt_versions).where(
            prompt_versions.c.job_type == job_type, prompt_versions.c.version == version
        )
        return await self.store.read(lambda db: _first(db, stmt))

    async def get_version(self, job_type: str, version: str) -> VersionView:
        """One version of ``job_type``'s prompt with its template.

        Raises:
            AppError: INVALID_ARGUMENT (unknown job type, bad version name); NOT_FOUND.
        """
        jobtypes.get(job_type)
        check_version_name(version)
        if version == BUILTIN_VERSION:
            return builtin_view(job_type)
        row = await self._stored(job_type, version)
        if row is None:
            raise AppError(
                ErrorCode.NOT_FOUND,
                f"no prompt version {full_version(job_type, version)}",
                {"jobType": job_type, "version": version},
            )
        return _view(row)

    async def list_versions(self, job_type: str) -> list[VersionView]:
        """Every version of ``job_type``'s prompt, ``v1`` first, then oldest first
        (without their templates)."""
        jobtypes.get(job_type)
        stmt = (
            select(
                prompt_versions.c.version,
                prompt_versions.c.description,
                prompt_versions.c.created_at,
            )
            .where(prompt_versions.c.job_type == job_type)
            .order_by(prompt_versions.c.created_at, prompt_versions.c.version)
        )
        rows = await self.store.read(lambda db: _all(db, stmt))
        views = [VersionView(r.version, "", r.description, r.created_at, False) for r in rows]
        return [builtin_view(job_type, with_template=False), *views]

    async def known_versions(self, db: DbExec, job_type: str, versions: Sequence[str]) -> set[str]:
        """Which of ``versions`` ``job_type`` has (``v1`` always)."""
        stored = (
            await db.execute(
                select(prompt_versions.c.version).where(
                    prompt_versions.c.job_type == job_type,
                    prompt_versions.c.version.in_(sorted(set(versions))),
                )
            )
        ).scalars()
        return {BUILTIN_VERSION, *(str(v) for v in stored)}

    # ------------------------------------------------------------------ routings

    async def routing(self, db: DbExec, job_type: str, *, share: bool = False) -> Routing | None:
        """The routing of ``job_type``, or None; ``share``: ``LOCK IN SHARE MODE`` on
        MySQL/MariaDB (a create's read: a rollback's UPDATE waits for it and it for the
        rollback, so no job is created on a version as it is rolled back)."""
        stmt = select(prompt_routings).where(prompt_routings.c.job_type == job_type)
        if share and not self.clock.is_sqlite:
            stmt = stmt.with_for_update(read=True)
        row = (await db.execute(stmt)).first()
        return Routing.of(row) if row is not None else None

    async def routings(self, db: DbExec) -> list[Routing]:
        """Every stored routing."""
        rows = (await db.execute(select(prompt_routings))).all()
        return [Routing.of(r) for r in rows]

    async def put_routing(
        self,
        job_type: str,
        variants: tuple[Variant, ...],
        guard: Guard,
        routing_id: str,
        actor: str,
    ) -> Routing:
        """Set the routing of ``job_type`` (a new id, the rollback cleared, the guard's
        window starting now), in one transaction.

        Raises:
            AppError: INVALID_ARGUMENT (unknown job type; a version the type does not have).
        """
        jobtypes.get(job_type)

        async def body(db: DbExec) -> Routing:
            known = await self.known_versions(db, job_type, [v.version for v in variants])
            for i, v in enumerate(variants):
                if v.version not in known:
                    raise invalid_argument(
                        f"{job_type} has no prompt version {v.version!r}",
                        field=f"variants[{i}].version",
                    )
            now = self.clock.now()
            values = {
                "routing_id": routing_id,
                "variants": [v.json() for v in variants],
                "guard": guard.json(),
                "updated_by": actor[:160] or "admin",
                "rolled_back_at": None,
                "rollback_reason": None,
                "rolled_back_version": None,
            }
            await db.execute(_upsert(self.clock, job_type, values, now))
            found = await self.routing(db, job_type)
            assert found is not None
            return found

        return await self.store.lean_tx(body)

    async def roll_back(self, db: DbExec, routing: Routing, version: str, reason: str) -> bool:
        """Revert ``routing`` to its control alone, if it is still the routing read
        (``revision``): one conditional UPDATE, so of racing replicas exactly one wins.

        Returns:
            Whether this call changed it.
        """
        first = routing.variants[0]
        stmt = (
            update(prompt_routings)
            .where(
                prompt_routings.c.job_type == routing.job_type,
                prompt_routings.c.revision == routing.revision,
            )
            .values(
                variants=[Variant(first.version, first.weight or 1.0).json()],
                revision=prompt_routings.c.revision + 1,
                updated_at=self.clock.now(),
                updated_by="prompt-guard",
                rolled_back_at=self.clock.now(),
                rollback_reason=reason,
                rolled_back_version=version,
            )
        )
        result = await db.execute(stmt)
        return int(getattr(result, "rowcount", 0) or 0) == 1


def _upsert(clock: DbClock, job_type: str, values: dict[str, Any], now: Any) -> Any:
    """INSERT of ``job_type``'s routing row, or the UPDATE of the row that exists
    (``revision`` + 1), in one statement."""
    row = {"job_type": job_type, **values, "revision": 1, "started_at": now, "updated_at": now}
    c = prompt_routings.c
    if clock.is_sqlite:
        stmt: Any = sqlite_insert(prompt_routings).values(**row)
        new = stmt.excluded
        return stmt.on_conflict_do_update(
            index_elements=[c.job_type],
            set_={**{k: new[k] for k in values}, "revision": c.revision + 1,
                  "started_at": now, "updated_at": now},
        )  # fmt: skip
    stmt = mysql_insert(prompt_routings).values(**row)
    new = stmt.inserted
    return stmt.on_duplicate_key_update(
        {**{k: new[k] for k in values}, "revision": c.revision + 1, "started_at": now,
         "updated_at": now},
    )  # fmt: skip


def _exists(job_type: str, version: str, message: str) -> AppError:
    return AppError(
        ErrorCode.PROMPT_VERSION_EXISTS, message, {"jobType": job_type, "version": version}
    )


def _same_or_conflict(job_type: str, version: str, row: Any, digest: str) -> VersionView:
    if row.template_hash != digest:
        raise _exists(
            job_type,
            version,
            f"{full_version(job_type, version)} exists with another template; "
            "versions are immutable: upload a new version",
        )
    return _view(row)


async def _first(db: DbExec, stmt: Any) -> Any:
    return (await db.execute(stmt)).first()


async def _all(db: DbExec, stmt: Any) -> Sequence[Any]:
    return (await db.execute(stmt)).all()
