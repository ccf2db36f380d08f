"""The prompt registry's operations, as the servicers and admission call them (reference §10.4)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from airuntime_common import jobtypes
from airuntime_common.errors import invalid_argument
from airuntime_common.prompts import full_version
from job_service.prompts.feedback import set_feedback
from job_service.prompts.guard import PromptGuard
from job_service.prompts.registry import Registry, VersionView
from job_service.prompts.routing import Routing, default_version, parse_guard, parse_variants
from job_service.prompts.stats import VersionStats, version_stats
from job_service.store.engine import DbExec
from job_service.store.tx import Store

#: The stats window's bounds (hours).
MIN_HOURS, MAX_HOURS = 1, 24 * 30


@dataclass(frozen=True)
class PromptOverview:
    """``GET /admin/ai/prompts/{jobType}``: the versions, the routing and the stats.

    Attributes:
        job_type: the job type.
        versions: every version (``v1`` first), without templates.
        routing: the stored routing, or None (every job gets ``v1``).
        stats: one entry per version, in the order of ``versions``.
        hours: the stats' window.
    """

    job_type: str
    versions: list[VersionView]
    routing: Routing | None
    stats: list[VersionStats]
    hours: int


class Prompts:
    """Versions, routings, the choice at create, stats, feedback and the guard.

    Args:
        store: the job database.
        guard_interval: seconds between the guard's passes.
    """

    def __init__(self, store: Store, guard_interval: float = 2.0) -> None:
        self.store = store
        self.registry = Registry(store)
        self.guard = PromptGuard(store, self.registry, guard_interval)

    async def put_version(
        self, job_type: str, version: str, template: str, description: str | None, actor: str
    ) -> tuple[VersionView, bool]:
        """:meth:`Registry.put_version`."""
        return await self.registry.put_version(job_type, version, template, description, actor)

    async def get_version(self, job_type: str, version: str) -> VersionView:
        """:meth:`Registry.get_version`."""
        return await self.registry.get_version(job_type, version)

    async def put_routing(
        self,
        job_type: str,
        variants: Sequence[tuple[str, float]],
        max_invalid_schema_increase: float | None,
        min_attempts: int | None,
        actor: str,
    ) -> Routing:
        """Set ``job_type``'s routing (reference §10.4): checked, a new id, the rollback
        cleared; new jobs of every replica follow it from their next create.

        Raises:
            AppError: INVALID_ARGUMENT (unknown job type, bad variants or guard, a
                version the type does not have).
        """
        jobtypes.get(job_type)
        parsed = parse_variants(variants)
        guard = parse_guard(max_invalid_schema_increase, min_attempts)
        routing_id = f"rt_{uuid.uuid4().hex}"
        return await self.registry.put_routing(job_type, parsed, guard, routing_id, actor)

    async def overview(self, job_type: str, hours: int) -> PromptOverview:
        """The versions, routing and per-version stats of ``job_type`` over the last
        ``hours`` (1..720).

        Raises:
            AppError: INVALID_ARGUMENT (unknown job type, hours out of range).
        """
        jobtypes.get(job_type)
        if not MIN_HOURS <= hours <= MAX_HOURS:
            raise invalid_argument(f"hours is {MIN_HOURS}..{MAX_HOURS}", field="hours")
        versions = await self.registry.list_versions(job_type)
        clock = self.store.clock

        async def read(db: DbExec) -> tuple[Routing | None, list[VersionStats]]:
            routing = await self.registry.routing(db, job_type)
            since = await clock.read(db) - timedelta(hours=hours)
            stats = await version_stats(db, job_type, since, [v.version for v in versions])
            return routing, stats

        routing, stats = await self.store.read(read)
        return PromptOverview(job_type, versions, routing, stats, hours)

    async def choose(self, db: DbExec, job_type: str, user_id: str) -> str:
        """A new job's ``promptVersion`` (``<jobType>.<version>``), in the create's
        transaction: the routing in force, read with the create (so a routing change
        on any replica is seen by the next create), sticky per user."""
        routing = await self.registry.routing(db, job_type, share=True)
        version = routing.choose(user_id) if routing is not None else default_version()
        return full_version(job_type, version)

    async def set_feedback(self, user_id: str, kind: str, item_id: str, rating: int) -> None:
        """:func:`~job_service.prompts.feedback.set_feedback` in its own transaction."""
        clock = self.store.clock
        await self.store.lean_tx(lambda db: set_feedback(db, clock, user_id, kind, item_id, rating))
