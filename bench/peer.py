"""The peer: the same backlog of no-op jobs drained by procrastinate on PostgreSQL.

procrastinate (a PostgreSQL-backed job queue, ``FOR UPDATE SKIP LOCKED`` like our claim)
is the measuring stick for the ``throughput`` scenario: :func:`drain` defers ``jobs``
no-op jobs up front into a fresh database, then starts one worker process
(:mod:`bench.peer_worker`, the peer's equivalent of our runtime worker) with
``concurrency`` = slots, and reads the span from the job events procrastinate's
triggers write: first ``started`` (the first fetch) to last ``succeeded``/``failed``
(the last done), on the database clock, as ours is read from ``locked_at`` and
``finished_at``.

CPU is read from ``/proc`` as ours is: the worker process, the PostgreSQL backends
serving the bench database (the peer's alone) and the server's background processes
(WAL writer, checkpointer, …; shared with anything else using the server). Backends
are found in ``pg_stat_activity``; a server on another machine has no CPU figures.

The server is ``BENCH_PG_URL``, else ``TEST_PG_URL``, else the local default
:data:`DEFAULT_PG_URL`; :func:`unavailable` says in one line why the peer cannot run
(no server answers, or the bench extras are not installed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString

from bench.harness import cpu_snapshot

if TYPE_CHECKING:  # the bench extras are imported where used: the rest of the bench runs without
    import procrastinate
    import psycopg

#: The server the peer uses when neither ``BENCH_PG_URL`` nor ``TEST_PG_URL`` is set.
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

#: Name of the peer's no-op task (registered by :mod:`bench.peer_worker`).
PEER_TASK = "bench_noop"

#: Jobs per ``batch_defer`` call while the backlog is deferred.
DEFER_CHUNK = 500

#: procrastinate job states a job does not leave.
FINAL_STATES = ("succeeded", "failed", "cancelled", "aborted")

#: Environment variable giving :mod:`bench.peer_worker` its database URL.
URL_VAR = "BENCH_PEER_DATABASE_URL"

#: Jobs in a final state (one argument: :data:`FINAL_STATES`).
FINAL_COUNT_SQL: LiteralString = (
    "SELECT count(*) FROM procrastinate_jobs WHERE status = ANY(%s::procrastinate_job_status[])"
)

#: Seconds the worker process has to open its pool and say ``ready``.
READY_TIMEOUT_S = 60.0

#: CPU groups: the worker, the bench database's backends, the server's own processes.
WORKER = "peer_worker"
BACKENDS = "postgres backends"
SERVER = "postgres (shared)"
GROUPS = (WORKER, BACKENDS, SERVER)


def postgres_base_url() -> str:
    """``BENCH_PG_URL``, else ``TEST_PG_URL``, else :data:`DEFAULT_PG_URL` (a libpq URL;
    its database is only used to create and drop the bench's own)."""
    return os.environ.get("BENCH_PG_URL") or os.environ.get("TEST_PG_URL") or DEFAULT_PG_URL


def with_database(url: str, database: str) -> str:
    """``url`` (``postgresql://…``) naming ``database`` instead of its own."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, dbname=database)


def unavailable(url: str) -> str | None:
    """Why the peer cannot run against ``url``, in one line; None when it can.

    Tries one connection with a 2 s timeout; a missing ``procrastinate`` or
    ``psycopg`` (the ``bench`` extras) is a reason too.
    """
    try:
        import procrastinate  # noqa: F401
        import psycopg
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install -e '.[bench]')"
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"no PostgreSQL answers at {_safe(url)}: {first}"
    return None


def _safe(url: str) -> str:
    """The server ``url`` names, as ``user@host:port`` (never its password)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return "an unparsable URL"
    host = params.get("host") or "localhost"
    return f"{params.get('user') or ''}@{host}:{params.get('port') or 5432}"


@contextlib.asynccontextmanager
async def fresh_pg_database(base_url: str, prefix: str = "airt_peer") -> AsyncIterator[str]:
    """Create a uniquely named database on ``base_url``'s server, yield its URL, drop it
    afterwards (``WITH (FORCE)``, PostgreSQL ≥ 13: a worker that outlived its stop
    cannot keep it)."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield with_database(base_url, name)
        finally:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def make_app(url: str, pool_size: int) -> procrastinate.App:
    """A procrastinate ``App`` on ``url`` with a pool of ``pool_size`` connections
    (opened up front, never grown), the no-op task :data:`PEER_TASK` registered."""
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=pool_size, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name=PEER_TASK)
    async def noop() -> None:
        """The job: nothing (the peer's equivalent of our no-op model)."""

    return app


async def defer_backlog(url: str, jobs: int) -> float:
    """Apply procrastinate's schema to the (empty) database at ``url`` and defer ``jobs``
    no-op jobs in batches of :data:`DEFER_CHUNK`; returns jobs deferred per second."""
    app = make_app(url, pool_size=1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        deferrer = app.configure_task(PEER_TASK)
        t0 = time.perf_counter()
        left = jobs
        while left > 0:
            k = min(DEFER_CHUNK, left)
            await deferrer.batch_defer_async(*({} for _ in range(k)))
            left -= k
        return jobs / max(1e-9, time.perf_counter() - t0)


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` is a PostgreSQL process on this machine (a remote server's pids
    may name unrelated local processes)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in {"postgres", "postmaster"}
    except OSError:
        return False


async def server_pids(conn: psycopg.AsyncConnection[Any], database: str) -> dict[int, str]:
    """Local PostgreSQL processes by pid → CPU group: client backends of ``database``
    (but ``conn``'s own) are :data:`BACKENDS`, the server's background processes
    :data:`SERVER`; other databases' backends are left out."""
    cur = await conn.execute(
        "SELECT pid, backend_type, datname FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid()"
        " AND (backend_type <> 'client backend' OR datname = %s)",
        (database,),
    )
    out: dict[int, str] = {}
    for pid, backend_type, datname in await cur.fetchall():
        if _is_postgres(int(pid)):
            out[int(pid)] = (
                BACKENDS if backend_type == "client backend" and datname == database else SERVER
            )
    return out


def cpu_by_group(
    before: Mapping[str, float], after: Mapping[str, float], groups: Mapping[str, str]
) -> dict[str, float]:
    """CPU seconds used per group between two :func:`bench.harness.cpu_snapshot` s.

    Args:
        before: CPU seconds by process name at the start.
        after: CPU seconds by process name at the end.
        groups: process name → its group (every name of ``after``).

    Returns:
        Group → CPU seconds, in :data:`GROUPS` order (groups of ``after``'s processes).
        A process missing from ``before`` (started during the run) counts from 0;
        one missing from ``after`` (gone before the end) is not counted.
    """
    out: dict[str, float] = {}
    for name, t1 in after.items():
        group = groups[name]
        out[group] = out.get(group, 0.0) + t1 - before.get(name, 0.0)
    rank = {group: i for i, group in enumerate(GROUPS)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(rank))))


async def _one(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, args: Sequence[Any] = ()
) -> tuple[Any, ...]:
    """The single row ``query`` returns (an aggregate's)."""
    row = await (await conn.execute(query, args)).fetchone()
    assert row is not None, query
    return tuple(row)


async def _wait_final(conn: psycopg.AsyncConnection[Any], jobs: int, limit_s: float) -> int:
    """Poll until ``jobs`` jobs are in a final state or ``limit_s`` passed; returns how many are."""
    deadline = time.monotonic() + limit_s
    done = 0
    while time.monotonic() < deadline:
        (count,) = await _one(conn, FINAL_COUNT_SQL, (list(FINAL_STATES),))
        done = int(count)
        if done >= jobs:
            break
        await asyncio.sleep(0.1)
    return done


async def _figures(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """Span (first ``started`` → last ``succeeded``/``failed`` event, s) and job counts."""
    span, started = await _one(
        conn,
        "SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE type IN ('succeeded', 'failed'))"
        "   - min(at) FILTER (WHERE type = 'started')),"
        " count(*) FILTER (WHERE type = 'started')"
        " FROM procrastinate_events",
    )
    succeeded, final, retried = await _one(
        conn,
        "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
        " count(*) FILTER (WHERE status = ANY(%s::procrastinate_job_status[])),"
        " count(*) FILTER (WHERE attempts > 1)"
        " FROM procrastinate_jobs",
        (list(FINAL_STATES),),
    )
    return {
        "span_s": float(span or 0.0),
        "started_events": int(started),
        "succeeded": int(succeeded),
        "terminal": int(final),
        "retried_attempts": int(retried),
    }


async def _stop(proc: asyncio.subprocess.Process) -> str:
    """SIGTERM the worker (procrastinate stops gracefully), SIGKILL after 30 s; returns
    the tail of its stderr."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    err = await proc.stderr.read() if proc.stderr is not None else b""
    return err.decode(errors="replace")[-2000:]


async def drain(base_url: str, jobs: int, slots: int, limit_s: float) -> dict[str, Any]:
    """Defer ``jobs`` no-op jobs into a fresh database, drain them with one procrastinate
    worker process of ``concurrency`` = ``slots`` and return the figures.

    Args:
        base_url: the PostgreSQL server (libpq URL).
        jobs: jobs deferred up front.
        slots: the worker's ``concurrency`` (its pool has as many connections).
        limit_s: longest wait for the drain (s).

    Returns:
        ``jobs``, ``terminal``, ``succeeded``, ``retried_attempts``, ``span_s`` (DB
        clock), ``jobs_per_s`` (terminal / span; None without a span),
        ``wall_incl_worker_start_s``, ``defer_jobs_per_s``, ``cpu_ms_per_job`` (by
        group: the worker, the database's backends, the server's shared processes;
        empty when the server is not on this machine).

    Raises:
        RuntimeError: the worker process did not start.
    """
    import psycopg

    async with fresh_pg_database(base_url) as url:
        database = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        defer_rate = await defer_backlog(url, jobs)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.peer_worker",
            "--concurrency",
            str(slots),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, URL_VAR: url},  # not on the command line: it may hold a password
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            except TimeoutError:
                line = b""
            if line.strip() != b"ready":
                raise RuntimeError(f"peer worker did not start: {await _stop(proc)}")
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                groups = {WORKER: WORKER}
                pids = {WORKER: proc.pid}
                for pid, group in (await server_pids(conn, database)).items():
                    groups[str(pid)], pids[str(pid)] = group, pid
                cpu0 = cpu_snapshot(pids)
                t0 = time.perf_counter()
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
                done = await _wait_final(conn, jobs, limit_s)
                # backends opened during the run (the worker's listener) count from 0
                for pid, group in (await server_pids(conn, database)).items():
                    groups[str(pid)], pids[str(pid)] = group, pid
                cpu1 = cpu_snapshot(pids)
                wall = time.perf_counter() - t0
                figures = await _figures(conn)
        finally:
            await _stop(proc)
    cpu = cpu_by_group(cpu0, cpu1, groups)
    span = figures["span_s"]
    return {
        "jobs": jobs,
        "terminal": done,
        "succeeded": figures["succeeded"],
        "retried_attempts": figures["retried_attempts"],
        "span_s": round(span, 3),
        "jobs_per_s": round(figures["terminal"] / span, 1) if span > 0 else None,
        "wall_incl_worker_start_s": round(wall, 2),
        "defer_jobs_per_s": round(defer_rate, 1),
        "cpu_ms_per_job": {k: round(v * 1000 / max(1, done), 2) for k, v in cpu.items()},
    }


async def server_info(base_url: str) -> dict[str, str]:
    """The server (``user@host:port``), its version and the settings that decide a
    commit's cost, as ``SHOW`` prints them (e.g. ``shared_buffers`` ``128MB``)."""
    import psycopg

    names = ["server_version", "fsync", "synchronous_commit", "shared_buffers", "wal_level"]
    async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (names,),
        )
        return {str(k): str(v) for k, v in await cur.fetchall()} | {"server": _safe(base_url)}
