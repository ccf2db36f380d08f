"""The system under test: every service as a real process (the launcher) on MariaDB.

:func:`harness_env` sets the short leases and timeouts every scenario runs
with (see :data:`CHAOS_ENV`); :class:`System` builds the launch plan — with,
optionally, a second job_service replica that half the workers dial, and one
worker whose wall clock is skewed — starts it, and offers what the faults
need: kill/restart a service, SQL connections, live worker ids, RSS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from launcher import Launcher, build_plan, isolated_env
from launcher.plan import LOCAL_HOST, ServiceSpec, free_port, grpc_address_list

#: Short leases and timeouts for the harness (reference §7 names). The heartbeat
#: interval is a third of the lease; the model-call cap is below the job
#: timeout so a hanging model ends as ``MODEL_TIMEOUT`` first.
CHAOS_ENV: dict[str, str] = {
    "LOCK_LEASE_SECONDS": "3",
    "REAPER_INTERVAL_SECONDS": "0.5",
    "HEARTBEAT_INTERVAL_SECONDS": "1",
    "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    "RETRY_BACKOFF_MAX_SECONDS": "4",
    "JOB_TIMEOUT_SECONDS": "10",
    "MODEL_CALL_MAX_SECONDS": "4",
    "MAX_RETRY_COUNT": "3",
    "POLL_INTERVAL_MS": "200",
    "LONG_POLL_WAIT_MS": "2000",
    "WORKER_CONCURRENCY": "8",
    "RPC_RETRY_SECONDS": "30",
    "SHUTDOWN_GRACE_SECONDS": "2",
    "BREAKER_FAILURE_THRESHOLD": "5",
    "BREAKER_COOLDOWN_SECONDS": "2",
    "BREAKER_HALF_OPEN_PROBES": "1",
    "USER_DAILY_JOB_QUOTA": "0",
    "PLATFORM_DAILY_BUDGET_USD": "1000000",
    "LAUNCHER_STOP_GRACE_SECONDS": "5",
    "LOG_LEVEL": "INFO",
}

#: How a worker's clock is skewed: ``faketime`` (libfaketime, when installed) or
#: ``python`` (:mod:`chaos.skew`, patches ``time.time`` and ``datetime``).
SKEW_METHODS = ("auto", "faketime", "python")


#: Settings multiplied by ``CHAOS_TIME_SCALE`` (a slow or busy machine needs longer leases).
SCALED: tuple[str, ...] = (
    "LOCK_LEASE_SECONDS",
    "REAPER_INTERVAL_SECONDS",
    "HEARTBEAT_INTERVAL_SECONDS",
    "RETRY_BACKOFF_BASE_SECONDS",
    "RETRY_BACKOFF_MAX_SECONDS",
    "JOB_TIMEOUT_SECONDS",
    "MODEL_CALL_MAX_SECONDS",
    "BREAKER_COOLDOWN_SECONDS",
)


def time_scale(base: Mapping[str, str] | None = None) -> float:
    """``CHAOS_TIME_SCALE`` (default 1): every lease/timeout of the harness is multiplied by it.

    ``auto`` picks the 1-minute load average per CPU, clamped to 1..4, so an
    oversubscribed machine gets proportionally longer leases instead of
    spurious lease losses.
    """
    env = os.environ if base is None else base
    value = env.get("CHAOS_TIME_SCALE", "").strip().lower()
    if value == "auto":
        per_cpu = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
        return round(min(4.0, max(1.0, per_cpu)), 2)
    try:
        return max(1.0, float(value)) if value else 1.0
    except ValueError:
        return 1.0


def scale_env(env: dict[str, str], scale: float) -> None:
    """Multiply the :data:`SCALED` settings of ``env`` by ``scale`` (in place)."""
    if scale == 1.0:
        return
    for name in SCALED:
        if name in env:
            value = float(env[name]) * scale
            env[name] = str(math.ceil(value)) if name == "JOB_TIMEOUT_SECONDS" else f"{value:g}"


def harness_env(base: Mapping[str, str], database_url: str, **extra: str) -> dict[str, str]:
    """An isolated environment on ``database_url`` (both services' databases) with :data:`CHAOS_ENV`.

    Each value of :data:`CHAOS_ENV` can be overridden from ``base`` with the
    same name prefixed ``CHAOS_`` (e.g. ``CHAOS_LOCK_LEASE_SECONDS=6`` on a
    loaded machine).
    """
    env = isolated_env(base)
    env.update(CHAOS_ENV)
    for name in CHAOS_ENV:
        override = base.get(f"CHAOS_{name}")
        if override:
            env[name] = override
    env["DATABASE_URL"] = database_url
    env["CREDENTIAL_DATABASE_URL"] = database_url
    env.update(extra)
    scale = time_scale(base)
    scale_env(env, scale)
    env["CHAOS_TIME_SCALE"] = f"{scale:g}"
    return env


def pymysql_connector(database_url: str, *, causal_reads: bool = False) -> Any:
    """A zero-argument function returning a new autocommit pymysql connection to the URL.

    ``causal_reads``: on a Galera cluster, the session waits before each read until
    its node has applied every write set the cluster committed before it
    (``wsrep_sync_wait = 1``), so the audit never reads a node that lags behind.
    """
    url = make_url(database_url)
    init = "SET SESSION wsrep_sync_wait = 1" if causal_reads else None

    def connect() -> pymysql.Connection:
        return pymysql.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 3306,
            user=url.username or "root",
            password=url.password or "",
            database=url.database,
            autocommit=True,
            connect_timeout=3,
            read_timeout=30,
            init_command=init,
        )

    return connect


def resolve_skew_method(method: str) -> str:
    """``auto`` → ``faketime`` when the binary is on PATH, else ``python``."""
    if method == "auto":
        return "faketime" if shutil.which("faketime") else "python"
    if method not in SKEW_METHODS:
        raise ValueError(f"unknown skew method {method!r}")
    return method


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process in KiB (``/proc``), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class System:
    """Every service as a child process, on one MariaDB database.

    Args:
        database_url: ``mysql+aiomysql://…`` (or asyncmy) job_service (and credential) database.
        work_dir: var and log directory.
        workers: number of runtime workers.
        replicas: 1 or 2 job_service processes; with 2, odd-numbered workers dial the second.
        skew_seconds: when set, the LAST worker runs with its wall clock this far ahead.
        skew_method: one of :data:`SKEW_METHODS`.
        extra_env: more environment for every child (e.g. the stand-in delay).
        replica_urls: the ``DATABASE_URL`` of each job_service replica, in order (default:
            ``database_url`` for all); e.g. two Galera nodes written at once.
        replicas_together: with 2 replicas, start (and migrate) both at once instead of
            the second after the first.
        spread: with 2 replicas, every client (gateway, credential service, workers)
            dials both, round robin (``JOB_SERVICE_ADDR`` lists them, as the launcher's
            ``--job-services 2``), instead of half the workers on each and the rest
            on the first.
        causal_reads: the harness's own SQL (audit, sampler) waits for its Galera node
            to have applied everything committed before (``wsrep_sync_wait``).
        service_env: more environment for the services of one kind, set after the
            launch plan is built (e.g. the platform keys credential_service holds,
            which the plan withholds from every child when it points them at the
            stand-in).
    """

    def __init__(
        self,
        database_url: str,
        work_dir: str | os.PathLike[str],
        *,
        workers: int = 2,
        replicas: int = 1,
        skew_seconds: float | None = None,
        skew_method: str = "auto",
        extra_env: Mapping[str, str] | None = None,
        replica_urls: list[str] | None = None,
        replicas_together: bool = False,
        spread: bool = False,
        causal_reads: bool = False,
        service_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.database_url = database_url
        self.work_dir = Path(work_dir)
        self.log_dir = self.work_dir / "logs"
        env = harness_env(os.environ, database_url, **dict(extra_env or {}))
        env["RUNTIME_INSTANCE_ID"] = f"chaos-{os.getpid()}"
        if workers == 1:
            env["RUNTIME_INSTANCE_ID"] += "-1"
        plan = build_plan(env, var_dir=self.work_dir / "var", dev=True, workers=workers)
        self.skew_method: str | None = None
        self.skewed_worker: str | None = None
        if replicas == 2:
            self._add_replica(plan.services, together=replicas_together, spread=spread)
        elif replicas != 1:
            raise ValueError("replicas must be 1 or 2")
        if replica_urls is not None:
            self._replica_databases(plan.services, replica_urls)
        if skew_seconds is not None:
            self._skew_last_worker(plan.services, skew_seconds, resolve_skew_method(skew_method))
        for kind, more in (service_env or {}).items():
            for spec in [s for s in plan.services if s.kind == kind]:
                plan.services[plan.services.index(spec)] = dataclasses.replace(
                    spec, env={**spec.env, **more}
                )
        self.plan = plan
        self.launcher = Launcher(plan=plan, log_dir=self.log_dir, echo=False)
        self.connect = pymysql_connector(database_url, causal_reads=causal_reads)

    # -- plan surgery -------------------------------------------------------

    @staticmethod
    def _replica_databases(services: list[ServiceSpec], urls: list[str]) -> None:
        replicas = [s for s in services if s.kind == "job_service"]
        if len(urls) != len(replicas):
            raise ValueError(f"{len(urls)} replica URLs for {len(replicas)} job_service replicas")
        for spec, url in zip(replicas, urls, strict=True):
            services[services.index(spec)] = dataclasses.replace(
                spec, env={**spec.env, "DATABASE_URL": url}
            )

    def _add_replica(
        self, services: list[ServiceSpec], *, together: bool = False, spread: bool = False
    ) -> None:
        first = next(s for s in services if s.kind == "job_service")
        port = free_port()
        listen = f"{LOCAL_HOST}:{port}"
        env = dict(first.env)
        env.update({"JOB_SERVICE_LISTEN": listen, "JOB_SERVICE_METRICS_PORT": "0"})
        # tier 1: starts once the first replica has migrated the database (unless
        # ``together``: both migrate at once, taking turns on the migration lock)
        second = dataclasses.replace(
            first,
            name="job_service-2",
            env=env,
            target=listen,
            listen=f"grpc {listen}",
            tier=first.tier if together else 1,
            bind=(LOCAL_HOST, port),
        )
        services.insert(services.index(first) + 1, second)
        if spread:
            both = grpc_address_list([first.target, listen])
            for spec in [s for s in services if s.kind != "job_service"]:
                services[services.index(spec)] = dataclasses.replace(
                    spec, env={**spec.env, "JOB_SERVICE_ADDR": both}
                )
            return
        workers = [s for s in services if s.kind == "runtime_worker"]
        for i, spec in enumerate(workers):
            if i % 2 == 1:
                wenv = dict(spec.env)
                wenv["JOB_SERVICE_ADDR"] = listen
                services[services.index(spec)] = dataclasses.replace(spec, env=wenv)

    def _skew_last_worker(self, services: list[ServiceSpec], seconds: float, method: str) -> None:
        spec = [s for s in services if s.kind == "runtime_worker"][-1]
        env = dict(spec.env)
        offset = f"{seconds:+g}s"
        if method == "faketime":
            faketime = shutil.which("faketime") or "faketime"
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
            argv: tuple[str, ...] = (faketime, "-f", offset, *spec.argv)
        else:
            argv = (spec.argv[0], "-m", "chaos.skew", f"{seconds:g}", *spec.argv[2:])
        services[services.index(spec)] = dataclasses.replace(spec, argv=argv, env=env)
        self.skew_method = method
        self.skewed_worker = spec.name

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        """Start every service, tier by tier (raises ``LauncherError``)."""
        await self.launcher.start()

    async def stop(self) -> None:
        """Stop every service."""
        await self.launcher.stop()

    @property
    def gateway_url(self) -> str:
        """Base URL of the public API."""
        return self.launcher.gateway_url

    @property
    def standin_url(self) -> str:
        """Base URL of the model stand-in."""
        url = self.launcher.standin_url
        assert url is not None
        return url

    @property
    def standin_urls(self) -> dict[str, str]:
        """Each provider's stand-in base URL (``MODEL_PROVIDERS`` set), else the one's."""
        return dict(self.launcher.plan.standin_urls)

    @property
    def env(self) -> dict[str, str]:
        """The children's shared environment (secrets, addresses)."""
        return self.launcher.env

    def specs(self, kind: str) -> list[ServiceSpec]:
        """The plan's services of one kind (``runtime_worker``, ``job_service``, …)."""
        return [s for s in self.plan.services if s.kind == kind]

    def worker_ids(self) -> dict[str, str]:
        """Service name → ``RUNTIME_INSTANCE_ID`` of every worker in the plan."""
        return {s.name: s.env["RUNTIME_INSTANCE_ID"] for s in self.specs("runtime_worker")}

    def live_worker_ids(self) -> set[str]:
        """Instance ids of the workers whose process runs now."""
        running = self.launcher.pids()
        return {iid for name, iid in self.worker_ids().items() if name in running}

    def rss(self) -> dict[str, int | None]:
        """RSS (KiB) of every running service, by name."""
        return {name: rss_kib(pid) for name, pid in self.launcher.pids().items()}

    def sql(self, query: str, args: Any = None) -> list[Any]:
        """Run one query on the job_service database (blocking; new connection)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return list(cur.fetchall())
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def python(self) -> str:
        """The interpreter the children run."""
        return sys.executable
