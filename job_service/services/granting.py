"""Lease grant: which provider each picked job's new attempt runs on, or that it waits
(reference §9.4 failover, §10.2 limits and pauses).

A claim's pick reads the candidates; before any of them is leased, :class:`Granting`
decides for each:

* a **platform-key** job runs on the first provider, in ``MODEL_PROVIDERS`` order among
  those serving its model with a platform key, that is not paused after a 429, has
  room under its limits (:mod:`job_service.maintenance.limits`) and whose breaker
  admits it (:func:`~job_service.maintenance.breaker.choose_providers`); the attempt
  is then counted against that provider's limits (a grant row, its tokens reserved);
* a **user-key** job runs on its key's provider, unless that key is paused after a 429;
* a job with nowhere to run **waits**: it stays pending and unleased, with no attempt
  and no retry counted, parked until room is expected (so the next claims do not scan
  past it), and the claim goes on with the jobs behind it.

Only the providers with limits are locked (their breaker rows, in name order), and
only when a picked job may run on one: a system without limits grants as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airuntime_common import jobtypes
from airuntime_common.model_providers import ProviderConfig
from job_service.maintenance import breaker
from job_service.maintenance import limits as lim
from job_service.services.core import Core
from job_service.store.engine import DbExec

#: The key mode whose attempts are given a provider at lease grant (reference §9.4).
PLATFORM_KEY = "platform_key"


@dataclass(frozen=True)
class Pick:
    """One picked job, as :data:`~job_service.store.scheduling.claim_pick` reads it."""

    job_id: str
    snapshot_id: str | None
    api_key_mode: str
    model_name: str
    model_provider: str
    job_type: str
    credential_id: str | None
    attempt_no: int
    parent_job_id: str | None = None

    @classmethod
    def of(cls, row: Sequence[Any]) -> Pick:
        """From a pick row (:data:`~job_service.store.scheduling.PICK_COLUMNS`)."""
        return cls(
            str(row[0]),
            None if row[1] is None else str(row[1]),
            str(row[2]),
            str(row[3]),
            str(row[4]),
            str(row[5]),
            None if row[6] is None else str(row[6]),
            int(row[7]),
            None if row[8] is None else str(row[8]),
        )


@dataclass
class Grant:
    """What a lease grant decided for its picked jobs.

    Attributes:
        providers: ``{jobId: provider}`` of the jobs whose provider the lease changes.
        reserved: ``(jobId, attemptNo, provider, tokens)`` of each platform-key attempt
            granted (its new ``attemptNo``, its job type's token estimate): its
            provider's usage, counted against its limits.
        parked: ``{jobId: until}`` of the jobs with nowhere to run now.
        limited: the providers among ``reserved`` that have limits.
    """

    providers: dict[str, str] = field(default_factory=dict)
    reserved: list[tuple[str, int, str, int]] = field(default_factory=list)
    parked: dict[str, datetime] = field(default_factory=dict)
    limited: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Pauses:
    """The pauses after a 429 running now: ``{provider: until}``, ``{credentialId: until}``."""

    providers: dict[str, datetime] = field(default_factory=dict)
    credentials: dict[str, datetime] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Sequence[Sequence[Any]]) -> Pauses:
        """From the rows of the pick's pause read, ``(kind, key, pausedUntil)``
        (:func:`job_service.store.scheduling.paused_now`)."""
        return cls(
            {str(r[1]): _dt(r[2]) for r in rows if r[0] == "p"},
            {str(r[1]): _dt(r[2]) for r in rows if r[0] == "c"},
        )


class Granting:
    """Decides each picked job's provider at lease grant (module doc).

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    def candidates(self, model_name: str) -> list[ProviderConfig]:
        """The providers a platform-key attempt of ``model_name`` may run on, in order."""
        return [
            config
            for name in self.core.platform_candidates(model_name)
            if (config := self.core.provider(name)) is not None
        ]

    async def decide(
        self,
        db: DbExec,
        picks: Sequence[Pick],
        pauses: Pauses,
        rooms: dict[str, lim.Room] | None = None,
        freed: Mapping[str, int] | None = None,
    ) -> Grant:
        """Decide the provider of each of ``picks``, in order (module doc), in the lease's
        transaction; a limited provider's room is read (locked) here.

        Args:
            rooms: the providers' rooms as an earlier decision of this transaction left
                them (its grants counted), filled in here: pass the same dict to every
                decision of one transaction.
            freed: ``{provider: n}``, the platform-key attempts this transaction ends
                (a result's claim of the next job): their leases, still in the rows,
                do not count against ``maxConcurrent``.
        """
        rooms = {} if rooms is None else rooms
        grant = Grant()
        for pick in picks:
            if pick.api_key_mode != PLATFORM_KEY and pick.credential_id in pauses.credentials:
                grant.parked[pick.job_id] = pauses.credentials[pick.credential_id]
        platform = [p for p in picks if p.api_key_mode == PLATFORM_KEY]
        if not platform:
            return grant
        configs = {c.name: c for p in platform for c in self.candidates(p.model_name)}
        if not any(c.limits.any for c in configs.values()) and not pauses.providers:
            await self._by_breakers(db, platform, grant)
            return grant
        unread = [c for name, c in configs.items() if name not in rooms]
        if unread:
            read = await lim.read_rooms(db, self.core.clock, unread)
            for name, room in read.items():
                room.in_flight = max(0, room.in_flight - (freed or {}).get(name, 0))
            rooms.update(read)
        for pick in platform:
            await self._one(db, pick, rooms, grant)
        return grant

    async def _by_breakers(self, db: DbExec, platform: Sequence[Pick], grant: Grant) -> None:
        """No limits and no pause: the breakers alone choose, one call per model."""
        by_model: dict[str, list[Pick]] = {}
        for pick in platform:
            by_model.setdefault(pick.model_name, []).append(pick)
        for model, found in by_model.items():
            names = [c.name for c in self.candidates(model)]
            if not names:
                continue  # credential_service answers the resolve (reference §5: no fallback)
            chosen = [names[0]] * len(found)
            if len(names) > 1:
                chosen = await breaker.choose_providers(
                    db, self.core.clock, self.core.settings, names, len(found)
                )
            for pick, provider in zip(found, chosen, strict=True):
                estimate = jobtypes.get(pick.job_type).token_estimate
                grant.reserved.append((pick.job_id, pick.attempt_no + 1, provider, estimate))
                if provider != pick.model_provider:
                    grant.providers[pick.job_id] = provider

    async def _one(self, db: DbExec, pick: Pick, rooms: dict[str, lim.Room], grant: Grant) -> None:
        """One platform-key job: the first provider with room whose breaker admits it,
        else it waits until the earliest of its providers may have room."""
        configs = self.candidates(pick.model_name)
        if not configs:
            return
        estimate = jobtypes.get(pick.job_type).token_estimate
        open_ = [c.name for c in configs if rooms[c.name].admits(estimate)]
        if not open_:
            grant.parked[pick.job_id] = min(rooms[c.name].room_at() for c in configs)
            return
        chosen = open_[0]
        if len(open_) > 1:
            [chosen] = await breaker.choose_providers(
                db, self.core.clock, self.core.settings, open_, 1
            )
        room = rooms[chosen]
        room.take(estimate)
        grant.reserved.append((pick.job_id, pick.attempt_no + 1, chosen, estimate))
        if room.limits.any:
            grant.limited.add(chosen)
        if chosen != pick.model_provider:
            grant.providers[pick.job_id] = chosen


def _dt(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
