"""One fault scenario's run: its sizes (:class:`Profile`), its shared state — the
system, the load, the overdue-lease sampler, timings — (:class:`Run`) and its
result (:class:`ScenarioResult`), which the scenarios (:mod:`chaos.scenarios`,
:mod:`chaos.failover`, :mod:`chaos.galera_faults`) build on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from chaos.audit import AuditConfig, AuditReport, audit
from chaos.load import LoadGenerator, LoadStats
from chaos.system import CHAOS_ENV, System
from launcher.token import mint_token

TERMINAL_SQL = "('succeeded','failed','cancelled')"
#: A lease is "overdue" once past ``lockUntil`` + lease + reaper interval + this
#: (or a running attempt past ``startedAt + timeoutSeconds`` + the same).
OVERDUE_SLACK_SECONDS = 5.0


@dataclass(frozen=True)
class Profile:
    """Sizes of one run.

    Attributes:
        name: ``short`` (CI), ``long`` or ``soak``.
        jobs: jobs per fault scenario.
        rate: creates per second in fault scenarios.
        kills: worker SIGKILLs in ``worker_kill``.
        race_jobs: jobs in ``race``.
        race_workers: worker processes in ``race``.
        race_kills: random worker SIGKILLs in ``race``.
        settle_seconds: most seconds to wait for every job to be terminal.
        soak_seconds: duration of ``soak``.
        soak_rate: creates per second in ``soak``.
        soak_workers: worker processes in ``soak``.
    """

    name: str
    jobs: int
    rate: float
    kills: int
    race_jobs: int
    race_workers: int
    race_kills: int
    settle_seconds: float
    soak_seconds: float = 1200.0
    soak_rate: float = 16.7
    soak_workers: int = 4


PROFILES: dict[str, Profile] = {
    "short": Profile("short", 30, 8.0, 2, 200, 4, 2, 90.0, soak_seconds=60.0),
    "long": Profile("long", 300, 10.0, 5, 2000, 8, 6, 180.0),
    "soak": Profile("soak", 300, 10.0, 5, 2000, 8, 6, 180.0),
}


@dataclass
class ScenarioResult:
    """One row of the table.

    Attributes:
        name: the fault.
        audit: the database audit.
        load: what the load generator saw.
        recovery_seconds: from the end of the fault until the jobs it caught were
            terminal again (or the breaker closed, for ``model_faults``).
        duration_seconds: wall time of the scenario (without start/stop).
        checks: failed scenario-specific checks (empty: all passed).
        notes: figures worth reporting (fault timings, RSS, breaker states, ...).
    """

    name: str
    audit: AuditReport
    load: LoadStats
    recovery_seconds: float | None = None
    duration_seconds: float = 0.0
    checks: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Audit clean, nothing given up and every scenario check passed."""
        return self.audit.ok and not self.checks and not self.load.gave_up

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return {
            "fault": self.name,
            "ok": self.ok,
            "recoverySeconds": self.recovery_seconds,
            "durationSeconds": round(self.duration_seconds, 1),
            "audit": self.audit.as_dict(),
            "load": {
                "acknowledged": len(self.load.job_ids),
                "refused": dict(self.load.refused),
                "gaveUp": dict(self.load.gave_up),
                "transient": dict(self.load.transient),
                "replays": self.load.replays,
            },
            "checks": self.checks,
            "notes": self.notes,
        }


class Run:
    """Shared state of one scenario: the system, the load, the sampler and timings."""

    def __init__(self, system: System, profile: Profile, name: str) -> None:
        self.system = system
        self.profile = profile
        self.name = name
        self.tag = uuid.uuid4().hex[:8]
        self.load = LoadGenerator(system.gateway_url, system.env["JWT_SECRET"], tag=self.tag)
        self.checks: list[str] = []
        self.notes: dict[str, Any] = {}
        self.began = time.monotonic()
        self.notes["loadAverageAtStart"] = round(os.getloadavg()[0], 2)
        self.windows: list[tuple[float, float]] = []  # monotonic fault windows (sampler ignores)
        self.overdue: dict[str, str] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._lease = float(system.env.get("LOCK_LEASE_SECONDS", CHAOS_ENV["LOCK_LEASE_SECONDS"]))
        self._reaper = float(system.env.get("REAPER_INTERVAL_SECONDS", "0.5"))
        self.scale = float(system.env.get("CHAOS_TIME_SCALE", "1"))
        self.notes["timeScale"] = self.scale
        self.notes["leaseSeconds"] = self._lease

    # -- SQL helpers ----------------------------------------------------------

    @property
    def user_like(self) -> str:
        """``LIKE`` pattern of this scenario's users."""
        return f"chaos-{self.tag}-%"

    async def sql(self, query: str, args: Any = None) -> list[Any]:
        """Run a query in a thread (blocking pymysql)."""
        return await asyncio.to_thread(self.system.sql, query, args)

    async def in_flight(self) -> dict[str, str]:
        """This scenario's locked/running jobs: jobId → lockedBy."""
        rows = await self.sql(
            "SELECT job_id, locked_by FROM ai_runtime_jobs WHERE user_id LIKE %s"
            " AND status IN ('locked','running')",
            (self.user_like,),
        )
        return {r[0]: r[1] for r in rows}

    async def not_terminal(self, job_ids: set[str]) -> set[str]:
        """Those of ``job_ids`` not terminal now."""
        if not job_ids:
            return set()
        ids = sorted(job_ids)
        out: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join(["%s"] * len(chunk))
            rows = await self.sql(
                f"SELECT job_id FROM ai_runtime_jobs WHERE job_id IN ({marks})"
                f" AND status NOT IN {TERMINAL_SQL}",
                chunk,
            )
            out.update(r[0] for r in rows)
        return out

    async def wait_terminal(self, job_ids: set[str], limit_s: float) -> float | None:
        """Seconds until every one of ``job_ids`` is terminal (None: timed out)."""
        began = time.monotonic()
        while True:
            try:
                if not await self.not_terminal(job_ids):
                    return time.monotonic() - began
            except Exception:  # the database may be down for a moment
                pass
            if time.monotonic() - began > limit_s:
                return None
            await asyncio.sleep(0.2)

    async def settle(self) -> float | None:
        """Wait until every job this scenario created is terminal (``settle_seconds`` at most)."""
        ids = set(self.load.stats.job_ids)
        waited = await self.wait_terminal(ids, self.profile.settle_seconds)
        if waited is None:
            self.checks.append(f"not every job terminal after {self.profile.settle_seconds:.0f} s")
        return waited

    # -- sampler ----------------------------------------------------------------

    def start_sampler(self) -> None:
        """Start flagging overdue leases every second (outside fault windows)."""
        self._sampler = asyncio.create_task(self._sample())

    async def stop_sampler(self) -> None:
        """Stop the sampler."""
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler

    def fault_window(self, start: float, end: float | None = None) -> None:
        """Mark ``[start, end + grace]`` (monotonic) as a fault window for the sampler."""
        self.windows.append((start, end if end is not None else float("inf")))

    def close_window(self) -> None:
        """End the latest open fault window now."""
        if self.windows and self.windows[-1][1] == float("inf"):
            self.windows[-1] = (self.windows[-1][0], time.monotonic())

    def _in_window(self, t: float) -> bool:
        grace = self._lease + self._reaper + 3.0
        return any(a <= t <= b + grace for a, b in self.windows)

    async def _sample(self) -> None:
        grace = self._lease + self._reaper + OVERDUE_SLACK_SECONDS * self.scale
        while True:
            await asyncio.sleep(1.0)
            t = time.monotonic()
            if self._in_window(t):
                continue
            try:
                rows = await self.sql(
                    "SELECT job_id, status, lock_until, started_at, timeout_seconds, NOW(6)"
                    " FROM ai_runtime_jobs WHERE user_id LIKE %s AND status IN ('locked','running')",
                    (self.user_like,),
                )
            except Exception:  # the database may be down
                continue
            if self._in_window(time.monotonic()):
                continue
            for job_id, status, lock_until, started_at, timeout_s, now in rows:
                late = lock_until is not None and (now - lock_until).total_seconds() > grace
                if status == "running" and started_at is not None:
                    run_for = (now - started_at).total_seconds()
                    late = late or run_for > timeout_s + grace
                if late:
                    self.overdue[job_id] = f"{status}, lockUntil {lock_until}, now {now}"

    # -- stand-in / admin ---------------------------------------------------------

    async def standin(self, body: Any) -> Any:
        """POST ``/_standin/faults`` (faults list or settings object)."""
        async with httpx.AsyncClient(base_url=self.system.standin_url, trust_env=False) as c:
            reply = await c.post("/_standin/faults", json=body)
            reply.raise_for_status()
            return reply.json()

    async def standin_get(self, path: str) -> Any:
        """GET a stand-in control path (``stats``, ``faults``)."""
        async with httpx.AsyncClient(base_url=self.system.standin_url, trust_env=False) as c:
            reply = await c.get(f"/_standin/{path}")
            reply.raise_for_status()
            return reply.json()

    def admin_headers(self) -> dict[str, str]:
        """An admin bearer token for ``/admin/*``."""
        token = mint_token(self.system.env["JWT_SECRET"], sub="chaos-admin", role="admin")
        return {"Authorization": f"Bearer {token}"}

    # -- finish -------------------------------------------------------------------

    async def finish(self, recovery: float | None) -> ScenarioResult:
        """Settle, stop the sampler, audit, and build the row."""
        settle = await self.settle()
        await self.stop_sampler()
        await self.load.close()
        self.notes["settleSeconds"] = None if settle is None else round(settle, 2)
        self.notes["loadAverageAtEnd"] = round(os.getloadavg()[0], 2)
        live = self.system.live_worker_ids()
        report = await asyncio.to_thread(
            audit,
            self.system.connect,
            self.load.stats.job_ids,
            AuditConfig(
                backoff_base=float(self.system.env.get("RETRY_BACKOFF_BASE_SECONDS", "0")),
                backoff_max=float(self.system.env.get("RETRY_BACKOFF_MAX_SECONDS", "300")),
                live_workers=live,
            ),
        )
        for job_id, what in list(self.overdue.items())[:20]:
            report.add("stuck", f"{job_id}: lease overdue outside a fault window ({what})")
        report.stuck += len(self.overdue)
        if self.system.launcher.failure is not None:
            self.checks.append(
                f"a service exited unexpectedly: {self.system.launcher.failure.name}"
            )
        return ScenarioResult(
            name=self.name,
            audit=report,
            load=self.load.stats,
            recovery_seconds=None if recovery is None else round(recovery, 2),
            duration_seconds=time.monotonic() - self.began,
            checks=self.checks,
            notes=self.notes,
        )


async def load_in_background(run: Run, count: int, rate: float) -> asyncio.Task[LoadStats]:
    """Start creating ``count`` jobs at ``rate`` per second in the background."""
    task = asyncio.create_task(run.load.run(count, rate))
    await asyncio.sleep(0)
    return task


async def wait_in_flight(run: Run, minimum: int = 1, limit_s: float = 20.0) -> dict[str, str]:
    """Wait until at least ``minimum`` of the scenario's jobs are locked/running."""
    began = time.monotonic()
    while True:
        flying = await run.in_flight()
        if len(flying) >= minimum or time.monotonic() - began > limit_s:
            return flying
        await asyncio.sleep(0.1)
