"""The prompt guard: a variant whose outputs fail validation more often than the
control's is rolled back on its own (reference §10.4).

Every job_service replica runs one :class:`PromptGuard` loop. Each pass, every
``PROMPT_GUARD_INTERVAL_SECONDS``, it reads the routings that still split
traffic and, for each, the attempts of its versions since the routing came into
force (:func:`~job_service.prompts.stats.attempt_counts`). A non-control variant
with at least ``minAttempts`` attempts whose ``invalidSchemaRate`` exceeds the
control's by more than ``maxInvalidSchemaIncrease`` (a control with no attempts
yet counts as 0) is rolled back, in one transaction:

* the routing row is reverted to the control alone, with ``rolledBackAt`` and the
  reason, by one UPDATE conditional on the revision the pass read: of replicas
  racing on the same evidence exactly one changes it, and an admin's newer
  routing is never overwritten;
* the jobs still pending on that version move to the control: their
  ``promptVersion`` changes in an ordinary versioned UPDATE of each row (its
  version +1, ``updatedAt`` now), with a ``pending → pending`` event whose actor
  names both versions.

Only the replica whose UPDATE committed counts ``ai_runtime_prompt_rollbacks_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from sqlalchemy import insert, literal, select, update

from airuntime_common import jobtypes
from airuntime_common.prompts import full_version
from airuntime_common.states import JobStatus
from job_service import metrics
from job_service.prompts.registry import Registry
from job_service.prompts.routing import Routing
from job_service.prompts.stats import AttemptCounts, attempt_counts
from job_service.store.engine import DbExec
from job_service.store.tables import events, jobs
from job_service.store.tx import Store

log = logging.getLogger("job_service.prompts.guard")

#: Jobs moved per statement while a rollback moves the pending ones.
MOVE_CHUNK = 500
#: The actor of the guard's changes.
GUARD_ACTOR = "prompt-guard"


@dataclass(frozen=True)
class Rollback:
    """A rollback the guard made.

    Attributes:
        job_type: the routing's job type.
        version: the bare version rolled back.
        control: the bare version it fell back to.
        reason: the sentence recorded as ``rollbackReason``.
        moved: pending jobs moved to the control.
    """

    job_type: str
    version: str
    control: str
    reason: str
    moved: int


def verdict(routing: Routing, counts: dict[str, AttemptCounts]) -> tuple[str, str] | None:
    """The first non-control variant of ``routing`` the guard rolls back, with the
    reason, or None (see the module docstring).

    Args:
        routing: the routing in force.
        counts: attempts per full version (``quiz_generation.v2``) since it started.
    """
    jt, guard = routing.job_type, routing.guard
    control = counts.get(full_version(jt, routing.control), AttemptCounts())
    base = control.invalid_schema_rate or 0.0
    for variant in routing.variants[1:]:
        c = counts.get(full_version(jt, variant.version), AttemptCounts())
        rate = c.invalid_schema_rate
        if c.attempts < guard.min_attempts or rate is None:
            continue
        if rate - base > guard.max_invalid_schema_increase + 1e-12:
            return variant.version, (
                f"{variant.version}: invalidSchemaRate {rate:.1%} over {c.attempts} attempts "
                f"exceeds the control {routing.control}'s {base:.1%} "
                f"(over {control.attempts} attempts) by more than "
                f"{guard.max_invalid_schema_increase:.1%}"
            )
    return None


async def move_pending(db: DbExec, store: Store, job_type: str, version: str, control: str) -> int:
    """Move ``job_type``'s pending jobs on ``version`` to ``control`` (full versions),
    each with a ``pending → pending`` event, in the caller's transaction.

    Returns:
        How many moved.
    """
    clock = store.clock
    actor = f"{GUARD_ACTOR}:{version}->{control}"[:160]
    moved = 0
    while True:
        pick = (
            select(jobs.c.job_id)
            .where(
                jobs.c.job_type == job_type,
                jobs.c.status == JobStatus.PENDING.value,
                jobs.c.prompt_version == version,
            )
            .limit(MOVE_CHUNK)
        )
        if not clock.is_sqlite:
            pick = pick.with_for_update()
        ids = [str(r) for r in (await db.execute(pick)).scalars()]
        if not ids:
            return moved
        await db.execute(
            update(jobs)
            .where(
                jobs.c.job_id.in_(ids),
                jobs.c.status == JobStatus.PENDING.value,
                jobs.c.prompt_version == version,
            )
            .values(prompt_version=control, version=jobs.c.version + 1, updated_at=clock.now())
        )
        await db.execute(
            insert(events).from_select(
                ["job_id", "from_status", "to_status", "actor", "attempt_no", "at"],
                select(
                    jobs.c.job_id,
                    literal(JobStatus.PENDING.value),
                    literal(JobStatus.PENDING.value),
                    literal(actor),
                    jobs.c.attempt_no,
                    jobs.c.updated_at,
                ).where(jobs.c.job_id.in_(ids)),
            )
        )
        moved += len(ids)


class PromptGuard:
    """One replica's guard loop (module docstring).

    Args:
        store: the job database.
        registry: the routings.
        interval: seconds between passes (``PROMPT_GUARD_INTERVAL_SECONDS``).
    """

    def __init__(self, store: Store, registry: Registry, interval: float) -> None:
        self.store = store
        self.registry = registry
        self.interval = interval
        for name in jobtypes.names():  # every type's counter from 0: an alert reads increases
            metrics.PROMPT_ROLLBACKS.labels(name)

    async def run(self, stop: asyncio.Event) -> None:
        """Pass every ``interval`` until ``stop`` is set; a failed pass is logged
        and the next one tries again."""
        while not stop.is_set():
            try:
                await self.check()
            except Exception:
                log.warning("prompt guard pass failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)

    async def check(self) -> list[Rollback]:
        """One pass over every routing that splits traffic.

        Returns:
            The rollbacks this pass made (committed).
        """
        routings = await self.store.read(self.registry.routings)
        done = []
        for routing in routings:
            if routing.rolled_back_at is not None or len(routing.variants) < 2:
                continue
            names = [full_version(routing.job_type, v.version) for v in routing.variants]

            async def read(
                db: DbExec, r: Routing = routing, n: list[str] = names
            ) -> dict[str, AttemptCounts]:
                return await attempt_counts(db, r.job_type, r.started_at, n)

            found = verdict(routing, await self.store.read(read))
            if found is None:
                continue
            rolled = await self.roll_back(routing, *found)
            if rolled is not None:
                done.append(rolled)
        return done

    async def roll_back(self, routing: Routing, version: str, reason: str) -> Rollback | None:
        """Revert ``routing`` to its control and move the pending jobs on ``version``, in
        one transaction; None when another replica (or an admin) changed the routing
        first."""
        jt = routing.job_type

        async def body(db: DbExec) -> int | None:
            if not await self.registry.roll_back(db, routing, version, reason):
                return None
            return await move_pending(
                db, self.store, jt, full_version(jt, version), full_version(jt, routing.control)
            )

        moved = await self.store.lean_tx(body)
        if moved is None:
            return None
        metrics.PROMPT_ROLLBACKS.labels(jt).inc()
        log.warning(
            "prompt variant rolled back",
            extra={
                "fields": {
                    "jobType": jt,
                    "version": version,
                    "control": routing.control,
                    "reason": reason,
                    "jobsMoved": moved,
                }
            },
        )
        return Rollback(jt, version, routing.control, reason, moved)
