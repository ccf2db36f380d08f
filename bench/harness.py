"""Shared machinery: a fresh MariaDB database, the system under test, job helpers.

All timings that matter (created → locked, locked → finished) are read from the
job rows, i.e. measured on the database clock (µs), never on this process's clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import grpc
import pymysql
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import URL, make_url

from airuntime_common.db import mysql_async_driver
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.metadata import outgoing
from airuntime_common.model_providers import STANDIN_PLATFORM_KEY
from launcher import Launcher
from launcher.plan import build_plan, isolated_env
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

#: The job type every benchmark job uses (a user-scoped analysis: no material needed).
BENCH_JOB_TYPE = "learning_state_analysis"


def mysql_base_url() -> str:
    """``BENCH_MYSQL_URL`` or ``TEST_MYSQL_URL``.

    Raises:
        SystemExit: neither is set.
    """
    url = os.environ.get("BENCH_MYSQL_URL") or os.environ.get("TEST_MYSQL_URL")
    if not url:
        raise SystemExit(
            "set BENCH_MYSQL_URL or TEST_MYSQL_URL (mysql+aiomysql://root@127.0.0.1:3306/x)"
        )
    return url


def admin_connect(url: str, database: str | None = None) -> pymysql.connections.Connection[Any]:
    """A blocking autocommit connection to the server of ``url`` (optionally a database)."""
    u = make_url(url)
    return pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=database,
        autocommit=True,
    )


@contextmanager
def fresh_database(base_url: str, prefix: str = "airt_bench") -> Iterator[URL]:
    """Create a uniquely named database, yield its URL (on ``base_url``'s async driver), drop
    it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = admin_connect(base_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        yield make_url(base_url).set(drivername=mysql_async_driver(base_url), database=name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def pct(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100, nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p99/max/mean of durations given in seconds, as milliseconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2) if ms else float("nan"),
        "mean_ms": round(statistics.fmean(ms), 2) if ms else float("nan"),
    }


class System:
    """The real services as child processes (via :class:`launcher.Launcher`) on one database.

    Job and credential tables share the fresh database (their names are disjoint).

    Args:
        db_url: the fresh database (asyncmy or aiomysql URL).
        workers: runtime worker processes.
        job_services: job_service replicas (the launcher's ``--job-services``).
        only: services to start (default: standin, job_service, credential_service, workers).
        extra_env: settings for every child (e.g. ``WORKER_CONCURRENCY``).
    """

    def __init__(
        self,
        db_url: URL,
        *,
        workers: int = 1,
        job_services: int = 1,
        only: Sequence[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.db_url = db_url
        self._tmp = tempfile.TemporaryDirectory(prefix="airt-bench-")
        env = isolated_env(os.environ)
        url = db_url.render_as_string(hide_password=False)
        env.update(
            {
                "DATABASE_URL": url,
                "CREDENTIAL_DATABASE_URL": url,
                "LOG_LEVEL": "WARNING",
                "USER_DAILY_JOB_QUOTA": "0",
                "PLATFORM_DAILY_BUDGET_USD": "1000000",
            }
        )
        env.update(extra_env or {})
        if only is None:
            only = ["standin", "job_service", "credential_service"] + (
                ["runtime_worker"] if workers else []
            )
        var = Path(self._tmp.name)
        plan = build_plan(
            env,
            var_dir=var,
            dev=True,
            workers=workers,
            job_services=job_services,
            only=only,
        )
        # The workers hold the (stand-in's) platform key, as a deployment's workers given
        # DEEPSEEK_API_KEY do: a platform-key attempt then needs no resolve.
        plan.services[:] = [
            dataclasses.replace(s, env={**s.env, "DEEPSEEK_API_KEY": STANDIN_PLATFORM_KEY})
            if s.kind == "runtime_worker"
            else s
            for s in plan.services
        ]
        self.launcher = Launcher(env, plan=plan, log_dir=var / "logs", echo=False)
        self.channel: grpc.aio.Channel | None = None
        self.stub: service_pb2_grpc.JobServiceStub | None = None

    async def start(self) -> System:
        """Start the children and open a gRPC channel to job_service."""
        await self.launcher.start()
        self.channel = insecure_or_tls_channel(self.launcher.env["JOB_SERVICE_ADDR"])
        self.stub = service_pb2_grpc.JobServiceStub(self.channel)
        return self

    async def stop(self) -> None:
        """Close the channel, stop the children, remove the temp directory."""
        if self.channel is not None:
            await self.channel.close()
        await self.launcher.stop()
        self._tmp.cleanup()

    async def __aenter__(self) -> System:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def token(self) -> str:
        """The internal service token of this system."""
        return self.launcher.env["RUNTIME_SERVICE_TOKEN"]

    def md(self, instance_id: str | None = None) -> tuple[tuple[str, str], ...]:
        """Internal call metadata (token, optionally a runtime instance id)."""
        return outgoing(self.token, instance_id)

    def worker_names(self) -> list[str]:
        """Names of the runtime worker children."""
        return [n for n in self.launcher.pids() if n.startswith("runtime_worker")]

    async def create_job(self, user: str, job_type: str = BENCH_JOB_TYPE) -> str:
        """CreateJob over gRPC; returns the job id."""
        assert self.stub is not None
        reply = await self.stub.CreateJob(
            rr.CreateJobRequest(
                user_id=user,
                job_type=cast(Any, JOB_TYPE.to_proto(job_type)),
                target_type=cast(Any, TARGET_TYPE.to_proto("user")),
                target_id=user,
                api_key_mode=cast(Any, API_KEY_MODE.to_proto("platform_key")),
                actor=f"user:{user}",
            ),
            metadata=self.md(),
            timeout=30,
        )
        return str(reply.job.job_id)

    async def create_jobs(self, n: int, concurrency: int = 16, users: int = 50) -> float:
        """Create ``n`` jobs with ``concurrency`` concurrent callers; returns jobs/s."""
        it = iter(range(n))

        async def caller() -> None:
            for i in it:
                await self.create_job(f"bench-user-{i % users}")

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(min(concurrency, max(1, n)))))
        return n / max(1e-9, time.perf_counter() - t0)

    def sql(self, query: str, args: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement on the benchmark database (blocking) and return its rows."""
        conn = admin_connect(
            self.db_url.render_as_string(hide_password=False), self.db_url.database
        )
        try:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    async def wait_terminal(self, n: int, limit_s: float) -> int:
        """Wait until ``n`` jobs are terminal; returns how many are (may be fewer on timeout)."""
        deadline = time.monotonic() + limit_s
        done = 0
        while time.monotonic() < deadline:
            done = int(
                self.sql(
                    "SELECT COUNT(*) FROM ai_runtime_jobs"
                    " WHERE status IN ('succeeded','failed','cancelled')"
                )[0][0]
            )
            if done >= n:
                break
            await asyncio.sleep(0.1)
        return done


def rss_peak_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def global_status(
    conn: pymysql.connections.Connection[Any], names: Sequence[str]
) -> dict[str, int]:
    """``SHOW GLOBAL STATUS`` counters by name."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS")
        rows = dict(cur.fetchall())
    return {n: int(rows.get(n, 0)) for n in names}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mariadb_pid(url: str) -> int | None:
    """Pid of the MariaDB/MySQL server ``url`` names, when it runs on this machine.

    Read from the server's own ``pid_file`` (so another ``mariadbd`` on the machine, e.g.
    a fault harness's private one, is never taken for it); None when that file is not
    here or names no ``mariadbd``/``mysqld`` process.
    """
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@pid_file")
            row = cur.fetchone()
    finally:
        conn.close()
    try:
        pid = int(Path(str(row[0] if row else "")).read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm in {"mariadbd", "mysqld"} else None


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per named process (missing ones skipped)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except OSError:
            continue
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a child's metrics endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_histograms(
    port: int, wanted: dict[str, str]
) -> dict[str, dict[str, tuple[float, float]]]:
    """Histograms from ``http://127.0.0.1:port/metrics``, one request.

    Args:
        wanted: histogram name → the label to group its series by.

    Returns:
        name → label value → (count, sum in seconds), over every other label;
        {} when the endpoint is unreachable.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, dict[str, list[float]]] = {}
    for family in text_string_to_metric_families(text):
        label = wanted.get(family.name)
        if label is None:
            continue
        series = out.setdefault(family.name, {})
        for sample in family.samples:
            slot = series.setdefault(sample.labels.get(label, ""), [0.0, 0.0])
            if sample.name == f"{family.name}_count":
                slot[0] += sample.value
            elif sample.name == f"{family.name}_sum":
                slot[1] += sample.value
    return {name: {k: (v[0], v[1]) for k, v in series.items()} for name, series in out.items()}


def run_load_process(
    system: System, requests: int, concurrency: int, *extra: str
) -> dict[str, Any]:
    """Run ``python -m bench.load`` (POST /v1/ai/jobs from a process of its own) against
    the system's gateway; its JSON summary (its last line).

    Raises:
        RuntimeError: the load process failed (its stderr's tail in the message).
    """
    env = dict(os.environ)
    env["BENCH_JWT_SECRET"] = system.launcher.env["JWT_SECRET"]
    cmd = [
        sys.executable,
        "-m",
        "bench.load",
        "--url",
        system.launcher.gateway_url,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
        *extra,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"load process failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
