"""The runtime-instance registry (reference §3): workers are discovered, not configured.

Instances are upserted from the ``x-runtime-instance-id`` and capabilities of
their poll/claim/heartbeat calls, at most once a second per instance and
process. Health is SERVING while at least one instance was seen within
:attr:`~job_service.settings.JobServiceSettings.worker_alive_seconds` (three poll intervals, at least
30 s because a long poll keeps a worker silent for up to 20 s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common.states import LEASED
from job_service.store import statements as st
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import jobs, workers

TOUCH_EVERY_SECONDS = 1.0


@dataclass(frozen=True)
class WorkerView:
    """One runtime instance for the health view."""

    instance_id: str
    capabilities: list[str]
    in_flight: int
    last_seen_at: datetime
    status: str
    status_address: str | None


class WorkerRegistry:
    """Upserts and reads ``ai_runtime_workers``."""

    def __init__(self, clock: DbClock) -> None:
        self.clock = clock
        #: instanceId → (monotonic time of the last write, capabilities, status address)
        self._last_touch: dict[str, tuple[float, tuple[str, ...] | None, str | None]] = {}

    def due(
        self,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> bool:
        """Whether this instance's row should be written now, and if so note it as written.

        Due on first sight, when a call brings capabilities or a status address
        other than the last written, and otherwise once every
        :data:`TOUCH_EVERY_SECONDS` (seconds, monotonic clock), so a busy
        worker's claims do not each upsert the registry row.
        """
        now = time.monotonic()
        last = self._last_touch.get(instance_id)
        caps = tuple(capabilities) if capabilities else None
        if last is not None:
            at, known_caps, known_address = last
            changed = (caps is not None and caps != known_caps) or (
                bool(status_address) and status_address != known_address
            )
            if not changed and now - at < TOUCH_EVERY_SECONDS:
                return False
            caps = caps if caps is not None else known_caps
            status_address = status_address or known_address
        self._last_touch[instance_id] = (now, caps, status_address or None)
        return True

    async def touch(
        self,
        session: DbExec,
        instance_id: str,
        capabilities: list[str] | None = None,
        status_address: str | None = None,
    ) -> None:
        """Record that ``instance_id`` was seen now (database clock)."""
        values: dict[str, object] = {
            "instance_id": instance_id,
            "capabilities": capabilities or [],
            "status_address": status_address or None,
            "in_flight": 0,
            "last_seen_at": self.clock.now(),
        }
        update_cols: dict[str, object] = {"last_seen_at": self.clock.now()}
        if capabilities:
            update_cols["capabilities"] = capabilities
        if status_address:
            update_cols["status_address"] = status_address
        if self.clock.is_sqlite:
            stmt = sqlite_insert(workers).values(**values)
            await session.execute(
                stmt.on_conflict_do_update(index_elements=["instance_id"], set_=update_cols)
            )
        else:
            mstmt = mysql_insert(workers).values(**values)
            await session.execute(mstmt.on_duplicate_key_update(**update_cols))

    async def purge(self, session: DbExec, retention_seconds: float) -> int:
        """Delete the rows of instances not seen for ``retention_seconds`` (database
        clock) that hold no lease, and forget them here; returns how many rows went.

        Runtime instance ids are per process (a restarted pod is a new instance), so
        without this the table and :meth:`list_workers` grow with every restart. A
        row whose instance still holds a ``locked``/``running`` job stays until the
        reaper has expired that lease, so ``GET /admin/ai/workers`` never loses sight
        of a lease holder.
        """
        holds_lease = exists().where(
            jobs.c.locked_by == workers.c.instance_id, jobs.c.status.in_(sorted(LEASED))
        )
        result = await session.execute(
            delete(workers).where(
                workers.c.last_seen_at < self.clock.plus(-retention_seconds), ~holds_lease
            )
        )
        horizon = time.monotonic() - retention_seconds
        for instance_id in [i for i, (at, _, _) in self._last_touch.items() if at < horizon]:
            del self._last_touch[instance_id]
        return int(getattr(result, "rowcount", 0) or 0)

    async def list_workers(self, session: DbExec, alive_seconds: float) -> list[WorkerView]:
        """Every known instance, newest first, with live lease counts and alive/stale status."""
        now = await self.clock.read(session)
        leased = await session.execute(st.leases_by_holder())
        counts: dict[str, int] = {str(r[0]): int(r[1]) for r in leased.all()}
        rows = (await session.execute(st.workers_newest_first())).all()
        cutoff = now - timedelta(seconds=alive_seconds)
        return [
            WorkerView(
                instance_id=r.instance_id,
                capabilities=list(r.capabilities or []),
                in_flight=int(counts.get(r.instance_id, 0)),
                last_seen_at=r.last_seen_at,
                status="alive" if r.last_seen_at >= cutoff else "stale",
                status_address=r.status_address,
            )
            for r in rows
        ]
