"""The benchmark scenarios; each returns a JSON-able dict of figures with units.

Every scenario starts the real services as child processes on a fresh MariaDB
database (see :class:`bench.harness.System`) and reads its timings from the
job rows (database clock); but ``peer``, which drains the throughput scenario's
backlog through procrastinate on PostgreSQL (:mod:`bench.peer`) as a measuring
stick, and reads its timings from procrastinate's job events (database clock).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

from airuntime_common.enums import JOB_TYPE, JOB_TYPES
from bench import floor as floor_mod
from bench import growth
from bench import peer as peer_mod
from bench.batches import batches
from bench.harness import (
    System,
    admin_connect,
    cpu_snapshot,
    free_port,
    fresh_database,
    global_status,
    mariadb_pid,
    rss_peak_mb,
    run_load_process,
    scrape_histograms,
    summary_ms,
)
from bench.tenants import tenants
from bench.waiting import waiting
from launcher.core import LauncherError
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

TERMINAL_SQL = "('succeeded','failed','cancelled')"


@dataclass
class Params:
    """Sizes of one run (``--quick`` shrinks them).

    Attributes:
        base_url: MariaDB server URL (a fresh database is created per scenario).
        peer_url: PostgreSQL server URL of the ``peer`` scenario (libpq; a fresh
            database per run), :func:`bench.peer.postgres_base_url` by default.
        jobs: jobs per throughput run.
        slots: worker slot counts for the throughput/floor scenarios.
        job_services: job_service replicas in the throughput scenario (the workers'
            calls spread round robin over them).
        pickup_jobs: jobs measured one by one in the idle pickup scenario.
        load_seconds: length of the pickup-under-load phase (s).
        load_rate: job creation rate during the pickup-under-load phase (jobs/s).
        scale_rows: finished-row counts for the poll-at-scale scenario.
        poll_samples: creates, polls and claims measured per table size (each; a p99 of
            1000 calls is their 11th slowest by nearest rank, less at the mercy of one
            stall than of 300).
        idle_workers: worker processes in the idle-cost scenario.
        idle_seconds: measuring window of the idle-cost scenario (s).
        gateway_requests: POSTs sent by the gateway load process.
        gateway_concurrency: concurrent connections of the load process.
        w500_seconds: measuring window of the 500-slot worker scenario (s).
        settle_limit_s: longest wait for InnoDB to flush and purge after the poll-at-scale
            tables are grown (s).
        wait_changes: jobs created and cancelled one by one in the ``waiting`` scenario.
        wait_streams: event streams held open on the gateway in the ``waiting`` scenario.
        tenants_users: users with waiting jobs in the ``tenants`` scenario.
        tenants_waiting_each: waiting jobs of each of them.
        tenants_backlog: the one user's backlog (jobs) in the ``tenants`` scenario.
        tenants_rows: job rows in all in the ``tenants`` scenario (finished ones fill up).
        tenants_rounds: claim rounds per policy in the ``tenants`` scenario.
        tenants_claim_seconds: length of one claim round (s).
        batch_pairs: rounds of two children ending at once in the ``batches`` scenario.
    """

    base_url: str
    peer_url: str = field(default_factory=peer_mod.postgres_base_url)
    jobs: int = 2000
    slots: tuple[int, ...] = (1, 4, 16)
    job_services: int = 1
    pickup_jobs: int = 40
    load_seconds: float = 10.0
    load_rate: float = 100.0
    scale_rows: tuple[int, ...] = (1_000, 1_000_000)
    poll_samples: int = 1000
    idle_workers: int = 10
    idle_seconds: float = 10.0
    gateway_requests: int = 2000
    gateway_concurrency: int = 32
    w500_seconds: float = 60.0
    settle_limit_s: float = 300.0
    wait_changes: int = 300
    wait_streams: int = 1000
    tenants_users: int = 10_000
    tenants_waiting_each: int = 10
    tenants_backlog: int = 1000
    tenants_rows: int = 1_000_000
    tenants_rounds: int = 3
    tenants_claim_seconds: float = 10.0
    batch_pairs: int = 10_000

    @classmethod
    def quick(cls, base_url: str) -> Params:
        """Small sizes: the whole suite in a few minutes."""
        return cls(
            base_url=base_url,
            jobs=300,
            pickup_jobs=20,
            load_seconds=4.0,
            load_rate=60.0,
            scale_rows=(1_000, 100_000),
            poll_samples=100,
            idle_seconds=5.0,
            gateway_requests=500,
            w500_seconds=15.0,
            settle_limit_s=60.0,
            wait_changes=100,
            tenants_users=1000,
            tenants_rows=100_000,
            tenants_rounds=2,
            tenants_claim_seconds=3.0,
            batch_pairs=1_000,
        )


def _worker_pid(system: System) -> int:
    return system.launcher.pids()[system.worker_names()[0]]


#: Where the RPC timings are scraped from: the metrics port's variable → (section of
#: the profile, histogram, label grouped by) read from every child serving it.
RPC_HISTOGRAMS = {
    "WORKER_METRICS_PORT": [
        ("runtime_worker", "airt_worker_rpc_seconds", "rpc"),
        ("model_call", "airt_model_call_latency_seconds", "outcome"),
    ],
    "JOB_SERVICE_METRICS_PORT": [
        ("job_service", "airt_grpc_server_handling_seconds", "method"),
    ],
    "CREDENTIAL_SERVICE_METRICS_PORT": [
        ("credential_service", "airt_grpc_server_handling_seconds", "method"),
    ],
}


def metrics_ports() -> dict[str, str]:
    """Free ports for the services' ``/metrics`` (the bench reads the RPC timings there)."""
    return {var: str(free_port()) for var in RPC_HISTOGRAMS}


def _scrape_rpcs(
    system: System, skip: str | None = None
) -> dict[str, dict[str, tuple[float, float]]]:
    """Section → label value → (count, sum s), one request per metrics port but
    ``skip``'s; replicas of a service (each its own port) are summed."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for var, sections in RPC_HISTOGRAMS.items():
        if var == skip:
            continue
        kind = _METRICS_KIND[var]
        ports = {int(c.env.get(var) or 0) for c in system.launcher.plan.services if c.kind == kind}
        for port in sorted(p for p in ports if p):
            found = scrape_histograms(port, {name: label for _, name, label in sections})
            for section, name, _ in sections:
                into = out.setdefault(section, {})
                for label, (count, total) in found.get(name, {}).items():
                    count0, total0 = into.get(label, (0.0, 0.0))
                    into[label] = (count0 + count, total0 + total)
    return out


#: The kind of child whose own metrics port each variable sets.
_METRICS_KIND = {
    "WORKER_METRICS_PORT": "runtime_worker",
    "JOB_SERVICE_METRICS_PORT": "job_service",
    "CREDENTIAL_SERVICE_METRICS_PORT": "credential_service",
}


def rpc_profile(
    before: dict[str, dict[str, tuple[float, float]]],
    after: dict[str, dict[str, tuple[float, float]]],
    jobs: int,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per service and method: calls per job and mean ms per call over the run (the
    worker's figures are wall time as its client saw it, the services' the time
    in their handlers)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for service, methods in after.items():
        rows: dict[str, dict[str, float]] = {}
        for method, (count, total) in methods.items():
            count0, total0 = before.get(service, {}).get(method, (0.0, 0.0))
            calls = count - count0
            if calls <= 0:
                continue
            rows[method] = {
                "calls_per_job": round(calls / max(1, jobs), 3),
                "mean_ms": round((total - total0) * 1000 / calls, 3),
            }
        out[service] = dict(sorted(rows.items(), key=lambda kv: -kv[1]["calls_per_job"]))
    return out


async def _run_backlog(system: System, n: int, limit_s: float) -> dict[str, Any]:
    """Stop the worker, create ``n`` jobs, restart it, wait; figures from the rows."""
    name = system.worker_names()[0]
    await system.launcher.stop_service(name)
    create_rate = await system.create_jobs(n)
    rpcs0 = _scrape_rpcs(system, skip="WORKER_METRICS_PORT")  # stopped; counts from 0 again
    t0 = time.perf_counter()
    try:
        await system.launcher.restart_service(name)
    except LauncherError:  # a child that died while starting gets one more try
        await system.launcher.restart_service(name)
    pids = dict(system.launcher.pids())
    db_pid = mariadb_pid(system.db_url.render_as_string(hide_password=False))
    if db_pid is not None:
        pids["mariadb (shared)"] = db_pid
    cpu0 = cpu_snapshot(pids)
    done = await system.wait_terminal(n, limit_s)
    cpu1 = cpu_snapshot(pids)
    wall = time.perf_counter() - t0
    rpcs = rpc_profile(rpcs0, _scrape_rpcs(system), done)
    cpu_ms = {k: round((cpu1[k] - cpu0[k]) * 1000 / max(1, done), 2) for k in cpu1 if k in cpu0}
    (span_us, ok, lost) = system.sql(
        "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(locked_at), MAX(finished_at)),"
        " SUM(status='succeeded'), SUM(attempt_no > 1) FROM ai_runtime_jobs"
    )[0]
    span = float(span_us or 0) / 1e6
    return {
        "jobs": n,
        "terminal": done,
        "succeeded": int(ok or 0),
        "retried_attempts": int(lost or 0),
        "span_s": round(span, 3),
        "jobs_per_s": round(done / span, 1) if span > 0 else None,
        "wall_incl_worker_start_s": round(wall, 2),
        "create_jobs_per_s": round(create_rate, 1),
        "cpu_ms_per_job": cpu_ms,
        "rpc_per_job": rpcs,
    }


def _throughput_params(p: Params) -> dict[str, Any]:
    return {"jobs": p.jobs, "slots": list(p.slots), "workers": 1, "job_services": p.job_services}


def full_path_env(slots: int) -> dict[str, str]:
    """The worker's environment for a full-path figure: ``slots`` slots (the launcher's
    dev mode gives every service the stand-in's platform key, so the worker holds it, as
    a worker given ``DEEPSEEK_API_KEY`` does). The throughput runs and the floor's capture
    share it, so the floor replays the statements a throughput job runs."""
    return {"WORKER_CONCURRENCY": str(slots)}


async def throughput_run(p: Params, slots: int) -> dict[str, Any]:
    """One throughput run: a backlog of ``p.jobs`` jobs through the full path, one worker
    of ``slots`` slots (:func:`full_path_env`), on a fresh database (figures:
    :func:`_run_backlog`)."""
    with fresh_database(p.base_url) as url:
        env = {**full_path_env(slots), **metrics_ports()}
        async with System(url, extra_env=env, job_services=p.job_services) as system:
            return await _run_backlog(system, p.jobs, limit_s=60 + p.jobs / 5)


async def throughput(p: Params) -> dict[str, Any]:
    """Scenario 1: a backlog of N jobs through the full path at 1/4/16 worker slots.

    jobs/s = terminal jobs / (last ``finished_at`` − first ``locked_at``), DB clock.
    """
    runs = {str(slots): await throughput_run(p, slots) for slots in p.slots}
    return {"params": _throughput_params(p), "runs": runs}


async def _peer_head(p: Params) -> dict[str, Any]:
    """The peer scenario's parameters, or ``{"skipped": reason}`` when it cannot run
    (the reason is printed as one line on stderr)."""
    reason = await asyncio.to_thread(peer_mod.unavailable, p.peer_url)
    if reason is not None:
        print(f"[bench] peer skipped: {reason}", file=sys.stderr, flush=True)
        return {"skipped": reason}
    return {
        "params": {
            "jobs": p.jobs,
            "slots": list(p.slots),
            "workers": 1,
            "queue": f"procrastinate {importlib.metadata.version('procrastinate')}",
            "task": "async no-op",
            "pool_connections": "= slots (opened before timing)",
            "deferred": f"up front, batches of {peer_mod.DEFER_CHUNK}",
            "postgres": await peer_mod.server_info(p.peer_url),
        },
        "runs": {},
    }


async def peer_run(p: Params, slots: int) -> dict[str, Any]:
    """One peer run: ``p.jobs`` no-op jobs drained by procrastinate at ``concurrency`` =
    ``slots`` (figures: :func:`bench.peer.drain`)."""
    return await peer_mod.drain(p.peer_url, p.jobs, slots, limit_s=60 + p.jobs / 5)


async def peer(p: Params) -> dict[str, Any]:
    """Scenario: the throughput scenario's backlog drained by procrastinate on PostgreSQL
    (see :mod:`bench.peer`), at the same slot counts; skipped when no PostgreSQL answers.

    jobs/s = final jobs / (last ``succeeded`` event − first ``started`` event), DB clock.
    """
    out = await _peer_head(p)
    if "skipped" not in out:
        out["runs"] = {str(slots): await peer_run(p, slots) for slots in p.slots}
    return out


async def throughput_and_peer(p: Params) -> dict[str, dict[str, Any]]:
    """``throughput`` and ``peer`` interleaved: ours@1, peer@1, ours@4, peer@4, …, so the
    machine's drift over the minutes of a run weighs on both alike.

    A run that fails is recorded in its scenario's ``error`` (the other runs still go);
    each scenario's ``scenario_seconds`` is the time of its own runs.

    Returns:
        ``{"throughput": …, "peer": …}``, each shaped as its scenario's result.
    """
    ours: dict[str, Any] = {"params": _throughput_params(p), "runs": {}}
    theirs = await _peer_head(p)
    sides: list[tuple[dict[str, Any], Callable[[Params, int], Awaitable[dict[str, Any]]]]] = [
        (ours, throughput_run)
    ]
    if "skipped" not in theirs:
        sides.append((theirs, peer_run))
    for side, _ in sides:
        side["scenario_seconds"] = 0.0
        side["interleaved"] = "ours@slots, then the peer's, for each slot count"
    for slots in p.slots:
        for side, run in sides:
            t0 = time.perf_counter()
            try:
                side["runs"][str(slots)] = await run(p, slots)
            except Exception as exc:  # keep the other runs' figures
                traceback.print_exc()
                failed = f"@{slots} slots: {exc!r}"
                side["error"] = f"{side['error']}; {failed}" if "error" in side else failed
            side["scenario_seconds"] = round(side["scenario_seconds"] + time.perf_counter() - t0, 1)
    return {"throughput": ours, "peer": theirs}


async def floor(p: Params) -> dict[str, Any]:
    """Scenario 2: the SQL of one job of the full path (the worker set up as the
    throughput runs', :func:`full_path_env`), captured, then replayed directly with
    aiomysql (no services)."""
    with fresh_database(p.base_url) as url:
        async with System(url, extra_env=full_path_env(1)) as system:
            capture = await floor_mod.capture_one_job(system)
        runs: dict[str, Any] = {}
        for slots in p.slots:
            await asyncio.to_thread(floor_mod.clone_pending, url, capture.job_id, p.jobs)
            runs[str(slots)] = await floor_mod.replay(url, capture, p.jobs, slots)
        # the same statements one per round trip, at the most slots: how much the
        # batches themselves are worth (and the floor as earlier runs measured it)
        top = max(p.slots)
        await asyncio.to_thread(floor_mod.clone_pending, url, capture.job_id, p.jobs)
        unbatched = await floor_mod.replay(url, capture, p.jobs, top, one_per_round_trip=True)
    return {
        "params": {"jobs": p.jobs, "concurrency": list(p.slots)},
        "claimed_with_result": capture.next_job_id is not None,
        "statements_per_job": capture.statement_count(),
        "round_trips_per_job": len(capture.statements),
        "statements_by_kind": capture.kinds(),
        "statements": [s[:300] for s in capture.statements],
        "runs": runs,
        "one_statement_per_round_trip": {"concurrency": top, **unbatched},
    }


async def pickup(p: Params) -> dict[str, Any]:
    """Scenario 3: created → locked (DB clock), idle (one by one) and under load."""
    out: dict[str, Any] = {}
    try:
        out["idle"] = await _pickup_idle(p)
    except Exception as exc:  # keep the other phase
        out["idle"] = {"error": repr(exc)}
    try:
        out["under_load"] = await _pickup_load(p)
    except Exception as exc:
        out["under_load"] = {"error": repr(exc)}
    return out


async def _pickup_idle(p: Params) -> dict[str, Any]:
    with fresh_database(p.base_url) as url:
        async with System(url) as system:  # default settings (long poll on)
            await asyncio.sleep(1.0)
            for i in range(p.pickup_jobs):
                job_id = await system.create_job(f"pickup-{i % 5}")
                for _ in range(200):
                    st = system.sql(
                        "SELECT status FROM ai_runtime_jobs WHERE job_id=%s", (job_id,)
                    )[0][0]
                    if st != "pending":
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
            lat = [
                float(r[0]) / 1e6
                for r in system.sql(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, locked_at) FROM ai_runtime_jobs"
                    " WHERE locked_at IS NOT NULL"
                )
            ]
            return {"params": {"jobs": p.pickup_jobs, "gap_ms": 100}, **summary_ms(lat)}


async def _pickup_load(p: Params) -> dict[str, Any]:
    with fresh_database(p.base_url) as url:
        async with System(url, extra_env={"WORKER_CONCURRENCY": "16"}) as system:
            await asyncio.sleep(1.0)
            n = int(p.load_rate * p.load_seconds)
            t0 = time.perf_counter()

            gate = asyncio.Semaphore(16)  # at most 16 creates in flight: no pile-up

            async def one(i: int) -> None:
                delay = t0 + i / p.load_rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with gate:
                    await system.create_job(f"load-{i % 50}")

            await asyncio.gather(*(one(i) for i in range(n)))
            achieved = n / (time.perf_counter() - t0)
            await system.wait_terminal(n, 60)
            lat = [
                float(r[0]) / 1e6
                for r in system.sql(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, locked_at) FROM ai_runtime_jobs"
                    " WHERE locked_at IS NOT NULL"
                )
            ]
            return {
                "params": {
                    "rate_jobs_per_s": p.load_rate,
                    "achieved_create_jobs_per_s": round(achieved, 1),
                    "seconds": p.load_seconds,
                    "worker_slots": 16,
                },
                **summary_ms(lat),
            }


async def _grow(system: System, rows: int) -> float:
    """``rows`` finished jobs with their model calls logged today, then ANALYZE;
    returns the seconds it took to grow them."""
    grow_s = await asyncio.to_thread(growth.grow_finished, system, rows)
    grow_s += await asyncio.to_thread(growth.grow_calls, system, rows)
    await asyncio.to_thread(system.sql, "ANALYZE TABLE ai_runtime_jobs")
    return grow_s


async def _time_calls(
    systems: dict[int, System], sizes: list[int], samples: int
) -> dict[int, dict[str, list[float]]]:
    """Seconds of each create, PollJobs and ClaimJobs (waitMs=0), per size; one call
    on each size in turn, the order flipped every sample."""
    caps = cast(Any, [JOB_TYPE.to_proto(t) for t in JOB_TYPES])
    md = {rows: system.md("bench-poller") for rows, system in systems.items()}
    timings: dict[int, dict[str, list[float]]] = {
        rows: {"create": [], "poll": [], "claim": []} for rows in sizes
    }

    async def create(rows: int, i: int) -> None:
        await systems[rows].create_job(f"bench-user-{i % 50}")

    async def poll(rows: int, _i: int) -> None:
        stub = systems[rows].stub
        assert stub is not None
        await stub.PollJobs(
            rr.PollJobsRequest(capabilities=caps, limit=10, wait_ms=0), metadata=md[rows]
        )

    async def claim(rows: int, _i: int) -> None:
        stub = systems[rows].stub
        assert stub is not None
        await stub.ClaimJobs(
            rr.ClaimJobsRequest(capabilities=caps, limit=1, wait_ms=0), metadata=md[rows]
        )

    for name, call in (("create", create), ("poll", poll), ("claim", claim)):
        for i in range(samples):
            for rows in sizes if i % 2 == 0 else reversed(sizes):
                t0 = time.perf_counter()
                await call(rows, i)
                timings[rows][name].append(time.perf_counter() - t0)
    return timings


async def poll_scale(p: Params) -> dict[str, Any]:
    """Scenario 4: PollJobs / ClaimJobs latency (waitMs=0) with 1k and 1M finished rows.

    Each size has its own database and its own services, grown first; then, once
    InnoDB has settled (:func:`bench.growth.settle_innodb`), the calls are timed interleaved,
    one call on each size in turn (the order flipped every sample), so the
    machine's drift over the minutes of a run weighs on both sizes alike.

    Each finished job has its model call in the invocation log, all logged today;
    the platform-key creates of the pending jobs that are then polled are timed
    one by one, so the create path's reads (quota, daily budget) are measured
    at both sizes too.
    """
    out: dict[str, Any] = {
        "params": {
            "samples": p.poll_samples,
            "pending_jobs": p.poll_samples,
            "method": "one database and system per size, calls interleaved across sizes",
        }
    }
    sizes = list(p.scale_rows)
    with ExitStack() as databases:
        async with AsyncExitStack() as stack:
            systems: dict[int, System] = {}
            for rows in sizes:
                url = databases.enter_context(fresh_database(p.base_url))
                system = await stack.enter_async_context(System(url, workers=0))
                grow_s = await _grow(system, rows)
                systems[rows] = system
                out[str(rows)] = {
                    "finished_rows": rows,
                    "calls_logged_today": rows,
                    "grow_s": round(grow_s, 1),
                }
            out["params"]["innodb_settle"] = await asyncio.to_thread(
                growth.settle_innodb, systems[sizes[-1]], p.settle_limit_s
            )
            timings = await _time_calls(systems, sizes, p.poll_samples)
            claim_sql = growth.claim_sql()
            for rows in sizes:
                explain = growth.explain(systems[rows], claim_sql)
                out[str(rows)].update(
                    {name: summary_ms(values) for name, values in timings[rows].items()}
                )
                out[str(rows)]["explain_claim"] = explain
    small, big = (str(r) for r in (sizes[0], sizes[-1]))
    for name in ("claim", "poll", "create"):
        out[f"{name}_p99_ratio_big_to_small"] = round(
            out[big][name]["p99_ms"] / out[small][name]["p99_ms"], 2
        )
    out["explain_sql"] = growth.claim_sql()
    return out


async def idle(p: Params) -> dict[str, Any]:
    """Scenario 5: queries/s that idle workers cause (long poll, default settings).

    Two figures: the server-wide ``Questions`` delta (includes anything else using the
    server), and the statements of this database's connections counted in the general log.
    """
    with fresh_database(p.base_url) as url:
        async with System(url, workers=p.idle_workers):
            await asyncio.sleep(3.0)
            conn = admin_connect(p.base_url)
            try:
                counted = await asyncio.to_thread(
                    floor_mod.count_db_statements, conn, url.database or "", p.idle_seconds
                )
            finally:
                conn.close()
    conn = admin_connect(p.base_url)
    try:
        s0 = global_status(conn, ["Questions", "Queries"])
        await asyncio.sleep(p.idle_seconds)
        s1 = global_status(conn, ["Questions", "Queries"])
    finally:
        conn.close()
    background = (s1["Questions"] - s0["Questions"]) / p.idle_seconds
    qps = counted["statements"] / p.idle_seconds
    return {
        "params": {"workers": p.idle_workers, "seconds": p.idle_seconds},
        "db_statements_per_s": round(qps, 2),
        "db_statements_per_s_per_worker": round(qps / p.idle_workers, 3),
        "global_questions_per_s_with_system": round(counted["questions"] / p.idle_seconds, 2),
        "global_questions_per_s_without_system": round(background, 2),
        "by_statement": counted["by_kind"],
    }


async def gateway(p: Params) -> dict[str, Any]:
    """Scenario 6: POST /v1/ai/jobs from a separate load process (``python -m bench.load``)."""
    with fresh_database(p.base_url) as url:
        async with System(
            url, workers=0, only=["job_service", "credential_service", "api_gateway"]
        ) as system:
            result = await asyncio.to_thread(
                run_load_process, system, p.gateway_requests, p.gateway_concurrency
            )
    return {
        "params": {"requests": p.gateway_requests, "concurrency": p.gateway_concurrency},
        **result,
    }


async def worker500(p: Params) -> dict[str, Any]:
    """Scenario 7: one worker, WORKER_CONCURRENCY=500, stand-in answering after 2 s."""
    env = {"WORKER_CONCURRENCY": "500", "STANDIN_DELAY_MS": "2000"}
    backlog = int(260 * (p.w500_seconds + 10)) + 500
    with fresh_database(p.base_url) as url:
        async with System(url, extra_env=env) as system:
            name = system.worker_names()[0]
            await system.launcher.stop_service(name)
            template = await system.create_job("w500-user")
            await asyncio.to_thread(floor_mod.clone_pending, url, template, backlog - 1)
            await system.launcher.restart_service(name)
            pid = _worker_pid(system)
            warmup = 5.0
            await asyncio.sleep(warmup)
            (c0,) = system.sql(
                "SELECT COUNT(*) FROM ai_runtime_jobs WHERE status IN " + TERMINAL_SQL
            )[0]
            t0 = time.perf_counter()
            rss_samples = []
            while time.perf_counter() - t0 < p.w500_seconds:
                await asyncio.sleep(0.5)
                rss_samples.append(rss_peak_mb(pid))
            (c1,) = system.sql(
                "SELECT COUNT(*) FROM ai_runtime_jobs WHERE status IN " + TERMINAL_SQL
            )[0]
            elapsed = time.perf_counter() - t0
            peak = rss_peak_mb(pid)
            (expired, retried, failed) = system.sql(
                "SELECT (SELECT COUNT(*) FROM ai_runtime_job_events WHERE to_status='expired'"
                "   OR error_code='LOCK_NOT_HELD'),"
                " (SELECT COUNT(*) FROM ai_runtime_jobs WHERE attempt_no > 1),"
                " (SELECT COUNT(*) FROM ai_runtime_jobs WHERE status='failed')"
            )[0]
    return {
        "params": {
            "worker_concurrency": 500,
            "standin_delay_ms": 2000,
            "seconds": p.w500_seconds,
            "warmup_s": warmup,
            "backlog_jobs": backlog,
        },
        "sustained_jobs_per_s": round((int(c1) - int(c0)) / elapsed, 1),
        "lost_leases": int(expired),
        "retried_attempts": int(retried),
        "failed_jobs": int(failed),
        "peak_rss_mb": round(peak, 1),
        "backlog": "copies of one job made through CreateJob (same snapshot)",
    }


SCENARIOS = {
    "throughput": throughput,
    "peer": peer,
    "floor": floor,
    "pickup": pickup,
    "poll_scale": poll_scale,
    "idle": idle,
    "gateway": gateway,
    "worker500": worker500,
    "waiting": waiting,
    "tenants": tenants,
    "batches": batches,
}
