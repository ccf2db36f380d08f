"""The faults, one at a time, under steady load; then the audit.

Every scenario: start the system (:class:`chaos.system.System`) on a fresh
MariaDB database, run the load generator (:mod:`chaos.load`), inject one
fault while jobs are in flight, wait until every created job is terminal
(the *settle* wait), then :func:`chaos.audit.audit` the database. A
background sampler flags leases left overdue (past ``lockUntil`` + lease +
reaper interval + 5 s, or a running attempt past ``startedAt + timeoutSeconds``
+ the same) outside the fault's own window. Scenario-specific checks (the breaker opened and closed,
the skewed worker did work, no service was restarted by a database restart,
…) are added to ``ScenarioResult.checks`` as failures.

Scenarios (``--fault NAME``): ``worker_kill``, ``job_service_restart``,
``mariadb_restart``, ``credential_down``, ``model_faults``, ``clock_skew``,
``race`` (2 job_service replicas + N workers, random worker SIGKILLs) and
``soak``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from chaos.mariadb import PrivateMariaDB
from chaos.scenario_run import (
    Profile,
    Run,
    ScenarioResult,
    load_in_background,
    wait_in_flight,
)
from chaos.system import System

# ---------------------------------------------------------------- the faults


async def _recovery(
    run: Run, victim: str, held: set[str], t0: float, profile: Profile
) -> float | None:
    """Seconds from a kill until every job the victim held is terminal (None: too slow)."""
    if await run.wait_terminal(held, profile.settle_seconds) is None:
        run.checks.append(f"jobs of killed {victim} not terminal in time")
        return None
    return time.monotonic() - t0


async def worker_kill(system: System, profile: Profile) -> ScenarioResult:
    """Fault 1 (case L5): SIGKILL the worker holding most jobs, restart it; repeat.

    Recovery: the longest time from a kill until every job that worker held
    was terminal again (lease expiry + reaper + backoff + a new attempt).
    """
    run = Run(system, profile, "worker_kill")
    await run.standin({"delayMs": 800})
    run.start_sampler()
    # The load goes on until the last kill has landed (and at least profile.jobs
    # creates): on a slow machine a restart takes seconds, and a fixed-size load
    # could be drained before the next kill was due, leaving nothing to kill.
    load_stop = asyncio.Event()
    loader = asyncio.create_task(run.load.run(profile.jobs * 20, profile.rate, load_stop))
    ids = system.worker_ids()
    by_id = {v: k for k, v in ids.items()}
    recoveries: list[float] = []
    killed: list[dict[str, Any]] = []
    recovering: list[asyncio.Task[float | None]] = []
    for _ in range(profile.kills):
        flying = await wait_in_flight(run, 2)
        holders: dict[str, int] = {}
        for holder in flying.values():
            if holder in by_id:
                holders[holder] = holders.get(holder, 0) + 1
        if not holders:
            run.checks.append("no worker held a job when a kill was due")
            break
        victim = max(holders, key=lambda h: holders[h])
        held = {j for j, h in flying.items() if h == victim}
        t0 = time.monotonic()
        run.fault_window(t0, t0)  # the kill itself: leases lapse by design
        await system.launcher.stop_service(by_id[victim], signal.SIGKILL)
        killed.append({"worker": victim, "jobsHeld": len(held)})
        await system.launcher.restart_service(by_id[victim])
        # Recovery is timed in the background, so the next kill lands while the
        # load (and the killed jobs' retries) are still in flight.
        recovering.append(asyncio.create_task(_recovery(run, victim, held, t0, profile)))
    while not loader.done():  # then at least profile.jobs creates
        if len(run.load.stats.job_ids) >= profile.jobs:
            break
        await asyncio.sleep(0.1)
    load_stop.set()
    for outcome in await asyncio.gather(*recovering):
        if outcome is None:
            continue
        recoveries.append(outcome)
    await loader
    run.notes["kills"] = killed
    result = await run.finish(max(recoveries) if recoveries else None)
    if result.audit.lease_expiries == 0 and killed:
        result.checks.append("no LEASE_EXPIRED retry: the kills caught no job in flight")
    return result


async def job_service_restart(system: System, profile: Profile) -> ScenarioResult:
    """Fault 2: SIGKILL job_service while workers are mid-call, restart it.

    The stand-in answers after 1.5 s so model calls are in flight; results
    finished during the outage are retried by the workers (``RPC_RETRY_SECONDS``)
    and land once after the restart. Runs with a lease longer than the
    outage (``LOCK_LEASE_SECONDS`` 12), so those results are still the holder's.
    """
    run = Run(system, profile, "job_service_restart")
    await run.standin({"delayMs": 1500})
    run.start_sampler()
    loader = await load_in_background(run, profile.jobs, profile.rate)
    # kill while model calls are open: results will come back during the outage
    running: list[Any] = []
    for _ in range(300):
        running = await run.sql(
            "SELECT job_id FROM ai_runtime_jobs WHERE user_id LIKE %s AND status = 'running'",
            (run.user_like,),
        )
        if len(running) >= 2:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # past snapshot and key: inside the 1.5 s model call
    run.notes["runningAtKill"] = len(running)
    flying = await run.in_flight()
    attempts = {
        r[0]: r[1]
        for r in await run.sql(
            "SELECT job_id, attempt_no FROM ai_runtime_jobs WHERE user_id LIKE %s"
            " AND status IN ('locked','running')",
            (run.user_like,),
        )
    }
    t0 = time.monotonic()
    run.fault_window(t0)
    await system.launcher.stop_service("job_service", signal.SIGKILL)
    await asyncio.sleep(1.0)
    await system.launcher.restart_service("job_service")
    t1 = time.monotonic()
    run.close_window()
    run.notes["outageSeconds"] = round(t1 - t0, 2)
    run.notes["inFlightAtKill"] = len(flying)
    waited = await run.wait_terminal(set(flying), profile.settle_seconds)
    await loader
    rows = await run.sql(
        "SELECT job_id, status, attempt_no FROM ai_runtime_jobs WHERE user_id LIKE %s",
        (run.user_like,),
    )
    landed = sum(1 for j, st, a in rows if j in attempts and st == "succeeded" and a == attempts[j])
    run.notes["landedSameAttempt"] = landed
    result = await run.finish(waited)
    if flying and landed == 0:
        result.checks.append("no result finished during the outage landed on its own attempt")
    return result


async def mariadb_restart(system: System, profile: Profile, db: PrivateMariaDB) -> ScenarioResult:
    """Fault 3: SIGKILL the (private) MariaDB under load, start it again.

    No service is restarted: their pools must reconnect by themselves. The
    process ids of every service are compared before and after.
    """
    run = Run(system, profile, "mariadb_restart")
    await run.standin({"delayMs": 300})
    run.start_sampler()
    loader = await load_in_background(run, profile.jobs, profile.rate)
    flying = await wait_in_flight(run, 2)
    pids = system.launcher.pids()
    t0 = time.monotonic()
    run.fault_window(t0)
    await asyncio.to_thread(db.restart, 2.0)
    t1 = time.monotonic()
    run.close_window()
    run.notes["outageSeconds"] = round(t1 - t0, 2)
    run.notes["inFlightAtKill"] = len(flying)
    waited = await run.wait_terminal(set(flying), profile.settle_seconds)
    await loader
    result = await run.finish(waited)
    if system.launcher.pids() != pids:
        result.checks.append(f"service processes changed: {pids} → {system.launcher.pids()}")
    return result


async def credential_down(system: System, profile: Profile) -> ScenarioResult:
    """Fault 4: credential_service SIGKILLed, down 3 s, restarted.

    Workers retry ResolveCredential while it is UNAVAILABLE (keeping their
    leases by heartbeat), so jobs wait; none may be lost. To be sure some job
    meets the outage between its claim and its key (creates need the credential
    service too, and a fast system resolves a key within milliseconds of the
    claim), the workers are paused (SIGSTOP, well under a lease) while a few jobs
    are created, and resumed once the credential service is down.
    """
    run = Run(system, profile, "credential_down")
    await run.standin({"delayMs": 200})
    run.start_sampler()
    loader = await load_in_background(run, profile.jobs, profile.rate)
    await wait_in_flight(run, 2)
    workers = [pid for name, pid in system.launcher.pids().items() if "worker" in name]
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        waiting = await load_in_background(run, 4, 20.0)
        await asyncio.sleep(0.5)  # created, not claimed: every worker is paused
        t0 = time.monotonic()
        run.fault_window(t0)
        await system.launcher.stop_service("credential_service", signal.SIGKILL)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(3.0)
    flying = await run.in_flight()
    await system.launcher.restart_service("credential_service")
    t1 = time.monotonic()
    run.close_window()
    run.notes["outageSeconds"] = round(t1 - t0, 2)
    run.notes["waitingDuringOutage"] = len(flying)
    waited = await run.wait_terminal(set(flying), profile.settle_seconds)
    await loader
    await waiting
    result = await run.finish(waited)
    if not flying:
        result.checks.append("no job was waiting on a credential during the outage")
    return result


class _BreakerWatch:
    """The platform breaker's states as the admin API reports them, every 0.1 s,
    each change with its monotonic time."""

    def __init__(self, system: System, headers: dict[str, str]) -> None:
        self.states: list[tuple[float, str]] = []
        self._system = system
        self._headers = headers
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _watch(self) -> None:
        async with httpx.AsyncClient(
            base_url=self._system.gateway_url, headers=self._headers, trust_env=False, timeout=5
        ) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    reply = await c.get("/admin/ai/circuit-breaker")
                    state = str(reply.json()["state"])
                    if not self.states or self.states[-1][1] != state:
                        self.states.append((time.monotonic(), state))
                await asyncio.sleep(0.1)

    @property
    def seen(self) -> list[str]:
        return [s for _, s in self.states]

    def opened_then_closed(self) -> bool:
        return bool(self.states) and self.states[-1][1] == "closed" and "open" in self.seen


async def _load_until_breaker_open(
    run: Run, watch: _BreakerWatch, load_stop: asyncio.Event
) -> None:
    """Stop the load once the breaker has been open 2 s and ``profile.jobs`` creates
    went out (creates are refused meanwhile), or after 60 s."""
    began = time.monotonic()
    while time.monotonic() - began < 60:
        opened = [t for t, s in watch.states if s == "open"]
        enough = len(run.load.stats.job_ids) >= run.profile.jobs
        if enough and opened and time.monotonic() - opened[0] > 2.0:
            break
        await asyncio.sleep(0.1)
    load_stop.set()


async def _script_model_faults(run: Run) -> tuple[float, float]:
    """Three hanging calls, twelve 503s and four 500s; returns when they were queued
    and when the last was consumed (monotonic seconds)."""
    t0 = time.monotonic()
    await run.standin(
        [
            {"kind": "hang", "count": 3},
            {"kind": "status", "status": 503, "count": 12},
            {"kind": "status", "status": 500, "count": 4},
        ]
    )
    for _ in range(300):
        if not (await run.standin_get("faults"))["faults"]:
            break
        await asyncio.sleep(0.2)
    return t0, time.monotonic()


async def _probe_until_closed(run: Run, watch: _BreakerWatch, since: float) -> int:
    """Create one job a second until the breaker has opened and closed again (30 s at
    most); returns how many were created."""
    probes = 0
    while time.monotonic() - since < 30:
        if watch.opened_then_closed():
            break
        await run.load.run(1, 0)
        probes += 1
        await asyncio.sleep(1.0)
    return probes


def _model_fault_checks(result: ScenarioResult, seen: list[str]) -> None:
    if "open" not in seen:
        result.checks.append(f"breaker never opened (states {seen})")
    if not seen or seen[-1] != "closed":
        result.checks.append(f"breaker not closed at the end (states {seen})")
    if result.load.refused.get("PLATFORM_CIRCUIT_OPEN", 0) == 0:
        result.checks.append("no create refused PLATFORM_CIRCUIT_OPEN while open")
    codes = set(result.audit.retries)
    if not codes & {"MODEL_TIMEOUT", "JOB_TIMEOUT"}:
        result.checks.append(
            f"hanging calls were not retried as MODEL_TIMEOUT ({dict(result.audit.retries)})"
        )
    if "TEMPORARY_PROVIDER_ERROR" not in codes:
        result.checks.append("5xx answers were not retried as TEMPORARY_PROVIDER_ERROR")


async def model_faults(system: System, profile: Profile) -> ScenarioResult:
    """Fault 5: the model endpoint hangs, then answers 5xx, then recovers.

    Hanging calls end as ``MODEL_TIMEOUT`` at ``MODEL_CALL_MAX_SECONDS``; the
    5xx as ``TEMPORARY_PROVIDER_ERROR``; both retryable with backoff (checked
    by the audit) and never past ``maxRetryCount``. Enough consecutive
    failures open the platform breaker (creates refused
    ``PLATFORM_CIRCUIT_OPEN``); after the cool-down a probe job closes it.
    Recovery: from the last scripted fault consumed until the breaker is closed.
    """
    run = Run(system, profile, "model_faults")
    await run.standin({"delayMs": 100})
    watch = _BreakerWatch(system, run.admin_headers())
    watch.start()
    run.start_sampler()
    load_stop = asyncio.Event()
    loader = asyncio.create_task(run.load.run(profile.jobs * 20, profile.rate, load_stop))
    stopper = asyncio.create_task(_load_until_breaker_open(run, watch, load_stop))
    await wait_in_flight(run, 1)
    t0, t1 = await _script_model_faults(run)
    run.notes["faultSeconds"] = round(t1 - t0, 2)
    await loader
    await stopper
    probes = await _probe_until_closed(run, watch, t1)
    closed_at = next((t for t, s in reversed(watch.states) if s == "closed" and t >= t1 - 1), None)
    await watch.stop()
    run.notes["breakerStates"] = watch.seen
    run.notes["probeCreates"] = probes
    result = await run.finish(None if closed_at is None else max(0.0, closed_at - t1))
    _model_fault_checks(result, watch.seen)
    return result


async def clock_skew(system: System, profile: Profile, skew_seconds: float) -> ScenarioResult:
    """Fault 6 (case L7): one worker's wall clock runs ``skew_seconds`` ahead.

    Leases use the database clock only, so nothing changes: no lease expires,
    no job times out, the skewed worker completes jobs like the others. The
    skew itself is verified from the worker's log timestamps.
    """
    run = Run(system, profile, "clock_skew")
    await run.standin({"delayMs": 300})
    run.start_sampler()
    await run.load.run(profile.jobs, profile.rate)
    result = await run.finish(None)
    name = system.skewed_worker
    assert name is not None
    skewed_id = system.worker_ids()[name]
    observed = _log_skew(system.launcher.log_path(name))
    result.notes.update(
        {
            "skewMethod": system.skew_method,
            "skewedWorker": skewed_id,
            "observedSkewSeconds": observed,
        }
    )
    if observed is None or abs(observed - skew_seconds) > 15:
        result.checks.append(f"worker clock skew not in effect (observed {observed})")
    if result.audit.actors.get(f"runtime:{skewed_id}", 0) == 0:
        result.checks.append(f"the skewed worker finished no job ({dict(result.audit.actors)})")
    # leases use the database clock: the skewed worker loses no more leases than the others
    # (on a quiet machine neither loses any)
    losses = result.audit.lease_losses_by_actor
    skewed_losses = losses.get(f"runtime:{skewed_id}", 0)
    others = max([v for k, v in losses.items() if k != f"runtime:{skewed_id}"] or [0])
    result.notes["leaseLossesByActor"] = dict(losses)
    if skewed_losses > 2 * others + 1:
        result.checks.append(f"the skewed worker lost {skewed_losses} leases, others {others}")
    if result.audit.by_status.get("succeeded", 0) != result.audit.jobs:
        result.checks.append(f"not every job succeeded: {dict(result.audit.by_status)}")
    return result


def _log_skew(path: Path | None) -> float | None:
    """Seconds between a worker's log timestamps (its clock) and this machine's clock."""
    if path is None or not path.exists():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()[-200:]):
        try:
            ts = json.loads(line)["ts"]
        except (ValueError, KeyError, TypeError):
            continue
        when = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return round((when - mtime).total_seconds(), 1)
    return None


async def race(system: System, profile: Profile, seed: int | None = None) -> ScenarioResult:
    """Two job_service replicas, many workers, one database; random worker SIGKILLs.

    Every job must end in exactly one terminal state with its business rows
    written once; never two holders of one attempt; none stuck.
    """
    run = Run(system, profile, "race")
    rng = random.Random(seed)
    await run.standin({"delayMs": 50})
    run.start_sampler()
    rate = max(profile.race_jobs / 15.0, 20.0)
    loader = await load_in_background(run, profile.race_jobs, rate)
    names = list(system.worker_ids())
    kills: list[str] = []
    load_seconds = profile.race_jobs / rate
    for k in range(profile.race_kills):
        await asyncio.sleep(rng.uniform(0.5, max(1.0, load_seconds / max(1, profile.race_kills))))
        victim = rng.choice(names)
        t0 = time.monotonic()
        run.fault_window(t0, t0)
        await system.launcher.stop_service(victim, signal.SIGKILL)
        kills.append(victim)
        if k % 2 == 0:  # restart half of them at once, the rest after the load
            await system.launcher.restart_service(victim)
    await loader
    for name in set(kills):
        if name not in system.launcher.pids():
            await system.launcher.restart_service(name)
    run.notes["kills"] = kills
    run.notes["replicas"] = len(system.specs("job_service"))
    run.notes["workers"] = len(names)
    return await run.finish(None)


#: RSS sampling period during a soak (seconds).
RSS_SAMPLE_SECONDS = 10.0
#: The share of the load, from its start, that counts as warm-up (caches filling).
RSS_WARMUP_SHARE = 0.25
#: Allowed RSS growth of a service from the end of warm-up to the end of the load:
#: the larger of this many KiB and :data:`RSS_GROWTH_SHARE` of its warm RSS.
RSS_GROWTH_FLOOR_KIB = 8 * 1024
RSS_GROWTH_SHARE = 0.10


RssSamples = list[tuple[float, dict[str, int | None]]]


def warm_sample(samples: RssSamples) -> tuple[float, dict[str, int | None]]:
    """The first of ``samples`` [(seconds since start, {service: KiB})] taken after warm-up
    (the first :data:`RSS_WARMUP_SHARE` of the time up to the last sample)."""
    end_t = samples[-1][0]
    return next((t, rss) for t, rss in samples if t >= end_t * RSS_WARMUP_SHARE)


def rss_growth_checks(samples: RssSamples) -> list[str]:
    """Failed "memory flat" checks for RSS ``samples`` [(seconds since start, {service: KiB})].

    A service's memory counts as flat when its RSS at the end of the load is at
    most the larger of :data:`RSS_GROWTH_FLOOR_KIB` and :data:`RSS_GROWTH_SHARE`
    above its RSS at the end of warm-up (the first :data:`RSS_WARMUP_SHARE` of
    the load, when bounded caches fill). Services missing from a sample (not
    running) are not judged.
    """
    if len(samples) < 2:
        return []
    _, warm = warm_sample(samples)
    end = samples[-1][1]
    failed = []
    for name, at_warm in sorted(warm.items()):
        at_end = end.get(name)
        if at_warm is None or at_end is None:
            continue
        allowed = max(RSS_GROWTH_FLOOR_KIB, int(at_warm * RSS_GROWTH_SHARE))
        if at_end - at_warm > allowed:
            failed.append(
                f"{name} RSS grew {at_end - at_warm} KiB after warm-up"
                f" ({at_warm} → {at_end} KiB; allowed {allowed})"
            )
    return failed


async def soak(
    system: System, profile: Profile, seconds: float, rate: float, fault_rate: float
) -> ScenarioResult:
    """Steady load for ``seconds`` at up to ``rate`` jobs/s with ``fault_rate`` random model 500s.

    Samples the RSS of every service every :data:`RSS_SAMPLE_SECONDS` and
    checks that none grew after warm-up (:func:`rss_growth_checks`); the notes
    carry the RSS at the start, at the end of warm-up, at the end, and the peak.
    """
    run = Run(system, profile, "soak")
    before = await run.standin_get("stats")
    await run.standin({"faultRate": fault_rate, "delayMs": 100})
    run.start_sampler()
    count = int(seconds * rate)
    began = time.monotonic()
    samples: RssSamples = [(0.0, system.rss())]

    async def sample_rss() -> None:
        while True:
            await asyncio.sleep(RSS_SAMPLE_SECONDS)
            samples.append((time.monotonic() - began, system.rss()))

    sampler = asyncio.create_task(sample_rss())
    stop = asyncio.Event()
    # the load lasts ``seconds`` even when the system cannot keep up with ``rate``
    asyncio.get_running_loop().call_later(seconds, stop.set)
    try:
        await run.load.run(count, rate, stop)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    samples.append((time.monotonic() - began, system.rss()))
    run.notes["loadSeconds"] = round(time.monotonic() - began, 1)
    run.notes["offeredRate"] = rate
    run.notes["achievedCreateRate"] = round(
        len(run.load.stats.job_ids) / max(1e-9, time.monotonic() - began), 2
    )
    result = await run.finish(None)
    warm_t, warm = warm_sample(samples)
    result.notes["rssKiB"] = {
        n: {
            "start": samples[0][1].get(n),
            "warm": warm.get(n),
            "end": samples[-1][1].get(n),
            "peak": max((rss.get(n) or 0) for _, rss in samples),
        }
        for n in samples[0][1]
    }
    result.notes["rssWarmSeconds"] = round(warm_t, 1)
    result.notes["rssSamples"] = len(samples)
    result.checks.extend(rss_growth_checks(samples))
    result.notes["standin"] = await run.standin_get("stats")
    # leave the stand-in as found (a shared system runs other scenarios next)
    await run.standin({"faultRate": before["faultRate"], "delayMs": before["delayMs"]})
    return result


ScenarioFn = Callable[..., Awaitable[ScenarioResult]]
