"""Read views of jobs and the runtime: a job, its history, job lists, health, gauges and the
breaker (reference §3, §3.1)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.model_providers import ProviderLimits
from airuntime_common.states import LIVE
from job_service import metrics
from job_service.maintenance import breaker
from job_service.maintenance.changes import Change
from job_service.maintenance.workers import WorkerView
from job_service.services.core import Core
from job_service.store import scheduling as sched
from job_service.store import statements as st
from job_service.store.batch import new_batch
from job_service.store.records import EventRecord, InvocationRecord, JobRecord

log = logging.getLogger("job_service.views")

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100


class Views:
    """Reads jobs, their history and the runtime's state.

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    async def get(self, job_id: str, user_id: str | None = None) -> JobRecord:
        """One job; another user's job is ``JOB_NOT_FOUND`` (reference §4)."""
        async with self.core.store.sessions() as session:
            return await self.core.must_get_job(session, job_id, user_id=user_id)

    async def history(self, job_id: str) -> tuple[list[EventRecord], list[InvocationRecord]]:
        """Events (oldest first) and invocations of a job (admin view)."""
        async with self.core.store.sessions() as session:
            ev = (await session.execute(st.events_of_job(job_id))).all()
            inv = (await session.execute(st.invocations_of_job(job_id))).all()
        return [EventRecord.from_row(r) for r in ev], [InvocationRecord.from_row(r) for r in inv]

    async def list_jobs(
        self,
        *,
        user_id: str | None,
        status: str | None,
        job_type: str | None,
        page_size: int,
        page_token: str,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        parent_job_id: str | None = None,
    ) -> tuple[list[JobRecord], str]:
        """Jobs newest first with an opaque page token (reference §3.1 paging); with
        ``created_from``/``created_to`` (naive UTC), only those created in
        ``[created_from, created_to)`` (reference §9.5 console); with ``parent_job_id``,
        only that batch's children (reference §10.3).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a page size outside 1..100 or a bad token.
        """
        if page_size == 0:
            page_size = DEFAULT_PAGE_SIZE
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "pageSize must be between 1 and 100",
                {"field": "pageSize", "value": page_size},
            )
        after = decode_list_token(page_token) if page_token else None
        stmt = st.list_jobs(
            user_id=user_id,
            status=status,
            job_type=job_type,
            after=after,
            limit=page_size + 1,
            created_from=created_from,
            created_to=created_to,
            parent_job_id=parent_job_id,
        )
        async with self.core.store.sessions() as session:
            rows = [JobRecord.from_row(r) for r in (await session.execute(stmt)).all()]
        token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            last = rows[-1]
            by_time = user_id is not None and parent_job_id is None
            token = encode_list_token(last.created_at if by_time else None, last.seq)
        return rows, token

    async def jobs_by_ids(self, user_id: str, job_ids: Sequence[str]) -> list[JobRecord]:
        """Those of ``user_id``'s jobs among ``job_ids``, in the order asked, each once;
        unknown and other users' ids left out (reference §9.2 ``GET /v1/ai/jobs?ids=``).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for more than 100 ids or no user.
        """
        if not user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        wanted = list(dict.fromkeys(i for i in job_ids if i))
        if len(wanted) > MAX_PAGE_SIZE:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                f"at most {MAX_PAGE_SIZE} ids",
                {"field": "ids", "count": len(wanted)},
            )
        if not wanted:
            return []
        stmt = st.jobs_by_ids(user_id=user_id, job_ids=wanted)
        async with self.core.store.sessions() as session:
            found = {
                r.job_id: r for r in (JobRecord.from_row(x) for x in (await session.execute(stmt)))
            }
        return [found[i] for i in wanted if i in found]

    async def user_changes(
        self, user_id: str, after: int | None, limit: int
    ) -> tuple[list[Change], int, bool]:
        """One user's changed jobs after cursor ``after`` (reference §9.1 ``GET /v1/ai/events``).

        Args:
            user_id: whose jobs.
            after: the cursor (a job event sequence); None: no changes, only the head.
            limit: 1..1000 (0 = 500): most change rows read.

        Returns:
            ``(changes, head, more)``: each changed job once, at its latest change,
            ordered by that change; ``head``: the newest cursor of all jobs; ``more``:
            ``limit`` change rows were read (ask again after the last change).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a limit outside 0..1000 or a negative cursor.
        """
        limit = limit or 500
        if not 1 <= limit <= 1000 or (after is not None and after < 0):
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "limit must be 1..1000 and the cursor ≥ 0",
                {"limit": limit, "afterSeq": after},
            )
        async with self.core.store.sessions() as session:
            head = int((await session.execute(st.latest_event_seq())).scalar() or 0)
            if after is None:
                return [], head, False
            rows = (await session.execute(st.user_changes_after(user_id, after, limit))).all()
        latest: dict[str, Change] = {}
        for r in rows:
            latest[r.job_id] = Change(int(r.change_seq), JobRecord.from_row(r))
        return sorted(latest.values(), key=lambda c: c.seq), head, len(rows) >= limit

    async def health(self) -> tuple[bool, list[WorkerView]]:
        """``(serving, workers)``: SERVING while an instance was seen recently (reference §3)."""
        alive = self.core.settings.worker_alive_seconds()
        async with self.core.store.sessions() as session:
            found = await self.core.registry.list_workers(session, alive)
        return any(w.status == "alive" for w in found), found

    async def refresh_gauges(self) -> dict[tuple[str, str], int]:
        """Re-read the database-wide gauges: queue depth by state/type and the breaker.

        Returns:
            ``{(state, jobType): count}`` of the non-terminal jobs (also published
            as ``airt_jobs_queue_depth``; pairs that emptied are set to 0).
        """
        settings, clock = self.core.settings, self.core.clock
        types = jobtypes.names()
        async with self.core.store.sessions() as session:
            rows = (await session.execute(st.queue_depth())).all()
            views = await breaker.read_all(
                session, clock, settings.BREAKER_COOLDOWN_SECONDS, self.core.providers.names
            )
            batch = new_batch(session)
            spent = batch.add(st.platform_spent_today.sql(clock, {}))
            heads = [batch.add(sched.next_in_line.sql(clock, {"n_type": t})) for t in types]
            out = await batch.run()
            workers = await self.core.registry.list_workers(
                session, settings.worker_alive_seconds()
            )
        depth = {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
        for state in sorted(LIVE):
            for job_type in types:
                metrics.QUEUE_DEPTH.labels(state, job_type).set(depth.get((state, job_type), 0))
        for job_type, index in zip(types, heads, strict=True):
            head = out[index].rows
            age = (head[0][1] - head[0][0]).total_seconds() if head else 0.0
            metrics.OLDEST_PENDING_AGE.labels(job_type).set(max(0.0, age))
        metrics.PLATFORM_SPEND.set(float(out[spent].rows[0][0]))
        metrics.PLATFORM_BUDGET.set(float(settings.PLATFORM_DAILY_BUDGET_USD))
        metrics.WORKERS_LIVE.set(sum(w.status == "alive" for w in workers))
        metrics.set_breakers(views)
        return depth

    async def breaker_views(self) -> list[breaker.BreakerView]:
        """Every configured provider's platform-key breaker, in ``MODEL_PROVIDERS`` order
        (reference §3.1 admin, §9.4)."""
        cooldown = self.core.settings.BREAKER_COOLDOWN_SECONDS
        names = self.core.providers.names
        views = await self.core.store.tx(
            lambda s: breaker.read_all(s, self.core.clock, cooldown, names)
        )
        metrics.set_breakers(views)
        return views

    async def provider_states(self) -> list[ProviderStateView]:
        """Every configured provider, in ``MODEL_PROVIDERS`` order, with its limits, its
        usage of the last 60 seconds (the platform-key attempts leased to it and their
        tokens: used where settled, else reserved), the attempts holding a lease on it
        now, its pause after a 429 and its breaker (reference §10.2). Also published as
        the ``airt_provider_*`` gauges."""
        clock, settings = self.core.clock, self.core.settings
        configs = list(self.core.providers)
        names = [p.name for p in configs]
        async with self.core.store.sessions() as session:
            breakers = await breaker.read_all(
                session, clock, settings.BREAKER_COOLDOWN_SECONDS, names
            )
            usage = {
                str(r[0]): (int(r[1]), int(r[2]))
                for r in (await session.execute(sched.provider_usage(clock, names))).all()
            }
            leased = {
                str(r[0]): int(r[1])
                for r in (await session.execute(sched.leased_by_provider(names))).all()
            }
            now = await clock.read(session)
            paused = {
                str(r[0]): r[1]
                for r in (await session.execute(sched.provider_pauses(names))).all()
                if r[1] is not None and r[1] > now
            }
        views = [
            ProviderStateView(
                name=config.name,
                limits=config.limits,
                requests_last_minute=usage.get(config.name, (0, 0))[0],
                tokens_last_minute=usage.get(config.name, (0, 0))[1],
                in_flight=leased.get(config.name, 0),
                paused_until=paused.get(config.name),
                breaker=view,
            )
            for config, view in zip(configs, breakers, strict=True)
        ]
        metrics.set_providers(views)
        return views

    async def breaker_view(self) -> breaker.BreakerView:
        """The first provider's breaker (the fields of reference §3.1's breaker view)."""
        return (await self.breaker_views())[0]

    async def breaker_reset(self, provider: str | None = None) -> breaker.BreakerView:
        """Close ``provider``'s breaker, or every provider's when None (reference §3.1 admin
        reset, §9.4); returns the first provider's breaker afterwards.

        Raises:
            AppError: INVALID_ARGUMENT naming ``provider`` when it is not configured.
        """
        names = self.core.providers.names
        if provider is not None and provider not in names:
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                f"provider must be one of {', '.join(names)}",
                {"field": "provider", "value": provider[:64]},
            )
        chosen = names if provider is None else [provider]
        await self.core.store.tx(lambda s: breaker.reset(s, self.core.clock, chosen))
        log.info("circuit breaker reset", extra={"fields": {"providers": chosen}})
        return await self.breaker_view()


@dataclass(frozen=True)
class ProviderStateView:
    """One provider as ``GET /admin/ai/providers`` shows it (reference §10.2)."""

    name: str
    limits: ProviderLimits
    requests_last_minute: int
    tokens_last_minute: int
    in_flight: int
    paused_until: datetime | None
    breaker: breaker.BreakerView


def encode_list_token(created_at: datetime | None, seq: int) -> str:
    """A job list's opaque page token: ``s:<seq>``, or ``t:<created_at>|<seq>`` for
    lists in (created_at, seq) order (URL-safe base64)."""
    raw = f"s:{seq}" if created_at is None else f"t:{created_at.isoformat()}|{seq}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_list_token(token: str) -> tuple[datetime | None, int]:
    """``(created_at or None, seq)`` of a job list's page token.

    The token is opaque (reference §3.1) but comes from the caller: a crafted one is
    held to what :func:`encode_list_token` writes, a naive UTC time and a ``seq``
    within the column's signed 64-bit range.

    Raises:
        AppError: INVALID_ARGUMENT (``pageToken``) for anything else.
    """
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        at: datetime | None = None
        if raw.startswith("t:"):
            stamp, seq_text = raw[2:].rsplit("|", 1)
            at = datetime.fromisoformat(stamp)
            if at.tzinfo is not None:
                raise ValueError("not a database time")
        else:
            seq_text = raw.removeprefix("s:")
        seq = int(seq_text)
        if not 0 <= seq < 2**63:
            raise ValueError("seq out of range")
        return at, seq
    except (ValueError, UnicodeDecodeError):
        raise AppError(
            ErrorCode.INVALID_ARGUMENT, "invalid pageToken", {"field": "pageToken"}
        ) from None
