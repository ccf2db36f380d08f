"""Runs scenarios: a fresh MariaDB database and system each, then the table.

The database server is the one at ``mysql_url`` (``CHAOS_MYSQL_URL`` or
``TEST_MYSQL_URL``; a database ``chaos_<hex>`` is created and dropped per
scenario) or, without one — and always for ``mariadb_restart`` — a private
``mariadbd`` started for the run (:mod:`chaos.mariadb`). The ``galera_*``
faults, and every scenario but ``mariadb_restart`` with ``Options.galera``,
run on a private 3-node Galera cluster behind HAProxy formed for that
scenario (:mod:`chaos.galera`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from airuntime_common.db import GALERA_ALLOW_DIRECT_NODE, mysql_async_driver
from chaos import batches, failover
from chaos import galera_faults as gf
from chaos import scenarios as sc
from chaos.galera_backend import GaleraBackend
from chaos.mariadb import PrivateMariaDB
from chaos.scenario_run import Profile, ScenarioResult
from chaos.system import System

FAULTS: tuple[str, ...] = (
    "worker_kill",
    "job_service_restart",
    "mariadb_restart",
    "credential_down",
    "model_faults",
    "clock_skew",
    "race",
    "provider_failover",
    "batch_faults",
)
#: reference §9.6: faults of a Galera cluster behind HAProxy (each on its own cluster).
GALERA_FAULTS: tuple[str, ...] = ("galera_writer_kill", "galera_conn_kill", "galera_multi_writer")
ALL_SCENARIOS: tuple[str, ...] = (*FAULTS, "soak", *GALERA_FAULTS)
#: Scenarios that can share one running system (same settings, faults they recover from).
SHAREABLE: tuple[str, ...] = ("worker_kill", "credential_down", "model_faults")


@dataclass
class Options:
    """Run options beyond the profile.

    Attributes:
        skew_seconds: the clock-skew fault's offset (L7: 90 s fast).
        skew_method: ``auto`` | ``faketime`` | ``python``.
        soak_seconds / soak_rate / soak_fault_rate: the soak's duration, creates per second
            and random model-500 probability.
        seed: random seed of the race's kills.
        keep: keep databases and logs after the run.
        galera: run every scenario (but ``mariadb_restart``) on a private Galera
            cluster behind HAProxy; the ``galera_*`` faults always do.
        direct_writes: ``galera_multi_writer`` sets ``GALERA_ALLOW_DIRECT_NODE=true``, so
            the replicas start on their nodes instead of refusing, and measures what
            then happens (the unsafe topology the refusal guards against).
        replicas_via_proxy: ``galera_multi_writer``'s control: both replicas through
            HAProxy (so on one node), with the same load and revoke race.
    """

    skew_seconds: float = 90.0
    skew_method: str = "auto"
    soak_seconds: float | None = None
    soak_rate: float | None = None
    soak_fault_rate: float = 0.05
    seed: int | None = None
    keep: bool = False
    galera: bool = False
    direct_writes: bool = False
    replicas_via_proxy: bool = False


def on_galera(name: str, options: Options) -> bool:
    """Whether scenario ``name`` runs on a private Galera cluster."""
    return name in GALERA_FAULTS or (
        options.galera and name not in ("mariadb_restart", batches.NAME)
    )


def system_kwargs(name: str, profile: Profile, options: Options) -> dict[str, Any]:
    """How the system of scenario ``name`` is configured."""
    if name in SHAREABLE:
        return {"workers": 3}
    if name == "job_service_restart":
        # the lease outlives the outage, so results finished meanwhile still belong to their holder
        return {"workers": 2, "extra_env": {"LOCK_LEASE_SECONDS": "12"}}  # scaled too
    if name in ("mariadb_restart", batches.NAME):
        return {"workers": 2}
    if name == "clock_skew":
        return {
            "workers": 2,
            "skew_seconds": options.skew_seconds,
            "skew_method": options.skew_method,
        }
    if name == "race":
        return {"workers": profile.race_workers, "replicas": 2}
    if name == "provider_failover":
        return failover.system_kwargs()
    if name == "soak":
        return {"workers": profile.soak_workers}
    if name in ("galera_writer_kill", "galera_conn_kill"):
        return {"workers": 3}
    if name == "galera_multi_writer":
        # both replicas start at once, each on its own node (see scenario_system)
        return {
            "workers": profile.race_workers,
            "replicas": 2,
            "replicas_together": True,
            "spread": True,
        }
    raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(ALL_SCENARIOS)}")


async def run_on(
    name: str,
    system: System,
    profile: Profile,
    options: Options,
    db: PrivateMariaDB | GaleraBackend | None = None,
) -> ScenarioResult:
    """Run scenario ``name`` on an already started system (``db``: the private server
    or Galera cluster it runs on, which ``mariadb_restart`` and ``galera_*`` need)."""
    if name in GALERA_FAULTS:
        if not isinstance(db, GaleraBackend):
            raise ValueError(f"{name} needs the Galera cluster")
        faults = {
            "galera_writer_kill": gf.galera_writer_kill,
            "galera_conn_kill": gf.galera_conn_kill,
        }
        if name == "galera_multi_writer":
            result = await gf.galera_multi_writer(
                system, profile, db, options.direct_writes or options.replicas_via_proxy
            )
        else:
            result = await faults[name](system, profile, db)
        result.notes["clusterFormedSeconds"] = round(db.formed_seconds, 1)
        if db.port_retries:
            result.notes["clusterPortRetries"] = db.port_retries
        return result
    if name == "worker_kill":
        return await sc.worker_kill(system, profile)
    if name == "job_service_restart":
        return await sc.job_service_restart(system, profile)
    if name == "mariadb_restart":
        if not isinstance(db, PrivateMariaDB):
            raise ValueError("mariadb_restart needs the private MariaDB")
        return await sc.mariadb_restart(system, profile, db)
    if name == batches.NAME:
        if not isinstance(db, PrivateMariaDB):
            raise ValueError(f"{name} needs the private MariaDB")
        return await batches.batch_faults(system, profile, db)
    if name == "credential_down":
        return await sc.credential_down(system, profile)
    if name == "model_faults":
        return await sc.model_faults(system, profile)
    if name == "clock_skew":
        return await sc.clock_skew(system, profile, options.skew_seconds)
    if name == "race":
        return await sc.race(system, profile, options.seed)
    if name == "provider_failover":
        return await failover.provider_failover(system, profile)
    if name == "soak":
        return await sc.soak(
            system,
            profile,
            options.soak_seconds or profile.soak_seconds,
            options.soak_rate or profile.soak_rate,
            options.soak_fault_rate,
        )
    raise ValueError(f"unknown scenario {name!r}")


def _admin(url: str) -> pymysql.Connection:
    u = make_url(url)
    return pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        autocommit=True,
    )


@contextlib.contextmanager
def shared_database(mysql_url: str, keep: bool = False) -> Any:
    """A fresh database ``chaos_<hex>`` on the server of ``mysql_url``; yields its URL."""
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    conn = _admin(mysql_url)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    url = make_url(mysql_url).set(drivername=mysql_async_driver(mysql_url), database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        if not keep:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


@contextlib.asynccontextmanager
async def scenario_system(
    name: str,
    profile: Profile,
    options: Options,
    *,
    mysql_url: str | None,
    work_dir: Path,
) -> AsyncIterator[tuple[System, PrivateMariaDB | GaleraBackend | None]]:
    """Database (shared server, private mariadbd or a private Galera cluster behind
    HAProxy) + started system for scenario ``name``; everything started is stopped
    on the way out, also when starting fails."""
    db: PrivateMariaDB | GaleraBackend | None = None
    kwargs = system_kwargs(name, profile, options)
    with contextlib.ExitStack() as stack:
        if on_galera(name, options):
            galera = GaleraBackend(work_dir / "galera")
            stack.callback(galera.stop, options.keep)
            await asyncio.to_thread(galera.start)
            db = galera
            url = galera.url
            kwargs["causal_reads"] = True
            if name == "galera_multi_writer" and not options.replicas_via_proxy:
                kwargs["replica_urls"] = [galera.node_url(0), galera.node_url(1)]
                if options.direct_writes:
                    kwargs["extra_env"] = {GALERA_ALLOW_DIRECT_NODE: "true"}
        elif mysql_url is None or name in ("mariadb_restart", batches.NAME):
            private = PrivateMariaDB(work_dir / "mariadb")
            private.start()
            stack.callback(private.stop)
            private.create_database("chaos")
            db = private
            url = private.url("chaos")
        else:
            url = stack.enter_context(shared_database(mysql_url, options.keep))
        system = System(url, work_dir / name, **kwargs)
        try:
            if name != "galera_multi_writer":  # it starts the system itself: it may refuse
                await system.start()
            yield system, db
        finally:
            await system.stop()


async def run_scenarios(
    names: list[str],
    profile: Profile,
    options: Options | None = None,
    *,
    mysql_url: str | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    on_result: Any = None,
) -> list[ScenarioResult]:
    """Run each scenario on its own fresh system; returns the rows in order."""
    opts = options or Options()
    base = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="chaos-"))
    results: list[ScenarioResult] = []
    for name in names:
        async with scenario_system(
            name, profile, opts, mysql_url=mysql_url, work_dir=base / name
        ) as (system, private):
            result = await run_on(name, system, profile, opts, private)
            result.notes.setdefault("logs", str(system.log_dir))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def format_table(results: list[ScenarioResult]) -> str:
    """The harness table: fault, jobs, succeeded, failed (by code), refused, duplicates,
    lost, stuck, other violations, recovery time."""
    head = (
        "fault",
        "jobs",
        "succeeded",
        "failed (by code)",
        "refused",
        "dup",
        "lost",
        "stuck",
        "viol",
        "recovery s",
        "ok",
    )
    rows: list[tuple[str, ...]] = [head]
    for r in results:
        a = r.audit
        failed = ", ".join(f"{k} {v}" for k, v in sorted(a.failed_by_code.items())) or "0"
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r.load.refused.items())) or "0"
        rows.append(
            (
                r.name,
                str(a.jobs),
                str(a.by_status.get("succeeded", 0)),
                failed,
                refused,
                str(a.duplicates),
                str(a.lost),
                str(a.stuck),
                str(a.violations),
                "-" if r.recovery_seconds is None else f"{r.recovery_seconds:.1f}",
                "yes" if r.ok else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
