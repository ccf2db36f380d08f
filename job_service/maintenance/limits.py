"""Provider rate limits and pauses, decided when a lease is granted (reference §10.2).

Each provider of ``MODEL_PROVIDERS`` may carry limits (requests and tokens per
minute, attempts leased at once) over the platform-key attempts of every worker
and replica together; and a provider that answered 429 is paused for every worker
until its ``Retry-After`` has passed, as is a user key that did.

The state is the database's, so every replica sees the same:

* a grant row per platform-key attempt leased to a provider with limits
  (``ai_provider_grants``): when, and the tokens reserved for it (its job type's
  estimate), settled with the tokens its calls used when the attempt ends;
* the provider's breaker row: its ``paused_until``, and ``grants``, written by every
  transaction that grants it attempts, so grants to one provider are decided one
  transaction at a time on every replica (and conflict at certification on Galera
  rather than both passing);
* ``ai_credential_pauses``: a user key's pause.

:func:`read_rooms` reads (and for limited providers locks) what a claim needs; a
:class:`Room` then admits attempts one by one (``take``) and says when a provider
with no room is expected to have some (``room_at``), which is how long a job that
found none is parked (:mod:`job_service.maintenance.parking`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from airuntime_common.model_providers import ProviderConfig, ProviderLimits
from job_service.store import scheduling as sched
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec
from job_service.store.tables import breaker, credential_pauses, grants

#: The window of the per-minute limits (s).
WINDOW_SECONDS = 60
#: How much longer than a minute the grants are counted when room is decided (s): a
#: model call follows its lease by a moment (the claim's answer, the snapshot, the
#: prompt), and attempts leased 60 s apart must not call the provider less than 60 s
#: apart, which its own window would count as one minute over its limit.
CALL_MARGIN_SECONDS = 2.0
#: The window over which room is decided (s).
HELD_WINDOW_SECONDS = WINDOW_SECONDS + CALL_MARGIN_SECONDS
#: A job with no room because every attempt slot is taken is looked at again this
#: soon (s): an attempt may end any time.
CONCURRENCY_RECHECK_SECONDS = 1.0
#: The longest a job waits parked before it is looked at again (s).
MAX_PARK_SECONDS = 60.0
#: A 429 with no ``Retry-After`` pauses this long (s); a longer one is cut to
#: :data:`MAX_PAUSE_SECONDS`.
DEFAULT_PAUSE_SECONDS = 10.0
MAX_PAUSE_SECONDS = 300.0


def pause_seconds(retry_after: float | None) -> float:
    """How long a 429 pauses its provider or key (s): its ``Retry-After``, 10 s when it
    had none, at most 300 (reference §10.2)."""
    if retry_after is None or retry_after <= 0:
        return DEFAULT_PAUSE_SECONDS
    return min(float(retry_after), MAX_PAUSE_SECONDS)


@dataclass
class Room:
    """One provider's room at this lease grant: its limits, what the last minute used,
    the attempts leased now, and its pause.

    Attributes:
        now: the database's time of the read.
        requests: attempts granted in the last :data:`HELD_WINDOW_SECONDS` (this
            transaction's included).
        tokens: their tokens: used where settled, else reserved.
        in_flight: platform-key attempts holding a lease on it.
        oldest: the oldest grant of the window (room frees
            :data:`HELD_WINDOW_SECONDS` after it).
        paused_until: its pause after a 429, or None.
        granted: this transaction's grants: ``(tokens reserved)`` each.
    """

    name: str
    limits: ProviderLimits
    now: datetime
    requests: int = 0
    tokens: int = 0
    in_flight: int = 0
    oldest: datetime | None = None
    paused_until: datetime | None = None
    granted: list[int] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        """Whether a 429's pause is running."""
        return self.paused_until is not None and self.paused_until > self.now

    def admits(self, estimate: int) -> bool:
        """Whether one more attempt reserving ``estimate`` tokens fits every limit now.

        An attempt whose estimate alone exceeds ``tokensPerMinute`` fits a window with
        no tokens in it (else it could never run)."""
        if self.paused:
            return False
        lim = self.limits
        if lim.requestsPerMinute is not None and self.requests >= lim.requestsPerMinute:
            return False
        if lim.maxConcurrent is not None and self.in_flight >= lim.maxConcurrent:
            return False
        tpm = lim.tokensPerMinute
        return tpm is None or self.tokens == 0 or self.tokens + estimate <= tpm

    def take(self, estimate: int) -> None:
        """Count one attempt granted now, reserving ``estimate`` tokens."""
        self.requests += 1
        self.tokens += estimate
        self.in_flight += 1
        self.granted.append(estimate)
        if self.oldest is None:
            self.oldest = self.now

    def room_at(self) -> datetime:
        """When this provider may have room again: the pause's end;
        :data:`HELD_WINDOW_SECONDS` after the window's oldest grant when a per-minute limit is full; a moment from now when
        its attempt slots are (at most :data:`MAX_PARK_SECONDS` from now)."""
        latest = self.now + timedelta(seconds=MAX_PARK_SECONDS)
        if self.paused and self.paused_until is not None:
            return min(self.paused_until, latest)
        lim = self.limits
        window_full = (
            lim.requestsPerMinute is not None and self.requests >= lim.requestsPerMinute
        ) or (lim.tokensPerMinute is not None and self.tokens > 0)
        if window_full and self.oldest is not None:
            ages_out = self.oldest + timedelta(seconds=HELD_WINDOW_SECONDS)
            return max(min(ages_out, latest), self.now + timedelta(milliseconds=100))
        return self.now + timedelta(seconds=CONCURRENCY_RECHECK_SECONDS)


async def read_rooms(
    db: DbExec, clock: DbClock, providers: Sequence[ProviderConfig]
) -> dict[str, Room]:
    """The room of each of ``providers`` now, in the caller's transaction.

    The breaker rows of those with limits are locked (``FOR UPDATE``, in name order)
    before their usage is read, so grants to one provider are decided one
    transaction at a time; :func:`grant_statements` then writes them.
    """
    names = sorted({p.name for p in providers})
    limited = sorted({p.name for p in providers if p.limits.any})
    by_name = {p.name: p for p in providers}
    head = select(breaker.c.provider, breaker.c.paused_until, clock.now()).where(
        breaker.c.provider.in_(names)
    )
    if limited and not clock.is_sqlite:
        head = head.order_by(breaker.c.provider).with_for_update()
    rows = (await db.execute(head)).all()
    now = rows[0][2] if rows else await clock.read(db)
    if isinstance(now, str):  # pragma: no cover - SQLite text
        now = datetime.fromisoformat(now)
    rooms = {n: Room(n, by_name[n].limits, now, paused_until=_as_dt(p)) for n, p, _ in rows}
    for n in names:
        rooms.setdefault(n, Room(n, by_name[n].limits, now))
    if not limited:
        return rooms
    since = now - timedelta(seconds=HELD_WINDOW_SECONDS)
    used = func.coalesce(grants.c.tokens_used, grants.c.tokens_reserved)
    window = (
        select(
            grants.c.provider,
            func.count(),
            func.coalesce(func.sum(used), 0),
            func.min(grants.c.granted_at),
        )
        .where(grants.c.provider.in_(limited), grants.c.granted_at > since)
        .group_by(grants.c.provider)
    )
    for name, count, tokens, oldest in (await db.execute(window)).all():
        room = rooms[str(name)]
        room.requests, room.tokens, room.oldest = int(count), int(tokens), _as_dt(oldest)
    for name, count in (await db.execute(sched.leased_by_provider(limited))).all():
        rooms[str(name)].in_flight = int(count)
    return rooms


def grant_statements(
    clock: DbClock, granted: Sequence[tuple[str, int, str, int]], limited: set[str]
) -> list[Sql]:
    """The writes of this transaction's grants, for its batch: a grant row for every
    platform-key attempt leased (``(jobId, attemptNo, provider, tokens reserved)``:
    its provider's usage), then each limited provider's ``grants`` counter (the write
    that makes concurrent grants to one provider conflict)."""
    out = [
        sched.insert_grant.sql(
            clock,
            {"job_id": job_id, "attempt_no": attempt, "provider": provider, "tokens_reserved": t},
        )
        for job_id, attempt, provider, t in granted
    ]
    counts: dict[str, int] = {}
    for _, _, provider, _ in granted:
        if provider in limited:
            counts[provider] = counts.get(provider, 0) + 1
    for provider in sorted(counts):
        out.append(
            sched.count_grants.sql(clock, {"g_provider": provider, "g_count": counts[provider]})
        )
    return out


async def paused_credentials(
    db: DbExec, clock: DbClock, credential_ids: Sequence[str]
) -> dict[str, datetime]:
    """``{credentialId: pausedUntil}`` of the user keys among ``credential_ids`` whose
    pause after a 429 is still running."""
    if not credential_ids:
        return {}
    rows = await db.execute(
        select(credential_pauses.c.credential_id, credential_pauses.c.paused_until).where(
            credential_pauses.c.credential_id.in_(sorted(set(credential_ids))),
            credential_pauses.c.paused_until > clock.now(),
        )
    )
    return {str(c): _as_dt(u) for c, u in rows.all() if u is not None}  # type: ignore[misc]


def _as_dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))
