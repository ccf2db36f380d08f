"""The Galera faults (reference §9.6): the services on a 3-node cluster, under load.

* ``galera_writer_kill`` — SIGKILL the node HAProxy writes to; HAProxy moves
  to a backup; the node is started again, rejoins by IST and must hold the
  same rows as the others.
* ``galera_conn_kill`` — the services' connections to the writer are cut
  mid-transaction three ways in turn: ``KILL CONNECTION`` on the node, HAProxy's
  ``shutdown sessions``, and a switchover (``disable server`` + ``shutdown
  sessions``, then ``enable server``).
* ``galera_multi_writer`` — two job_service replicas writing to *different*
  nodes at once, no proxy between them and their nodes; both start (and
  migrate) together.

Each runs the common load and audit of :mod:`chaos.scenarios`; in the first
two a :class:`CommitProbe` also commits numbered rows through the proxy the
whole time, and every row it was told was committed must be on every node at
the end ("losing the writer node loses no committed change").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pymysql

from chaos.audit import AuditReport
from chaos.galera import GaleraNode
from chaos.galera_backend import GaleraBackend
from chaos.load import LoadStats
from chaos.scenario_run import Profile, Run, ScenarioResult, wait_in_flight
from chaos.system import System
from launcher import LauncherError
from launcher.token import mint_token

#: Database of the commit probe (on the cluster, next to the services' one).
PROBE_DATABASE = "chaos_probe"
#: The job_service tables whose contents must be equal on every node once settled.
JOB_TABLES = (
    "ai_runtime_jobs",
    "ai_runtime_job_events",
    "ai_results",
    "ai_runtime_invocation_logs",
    "ai_learning_analyses",
    "ai_weak_point_candidates",
    "ai_next_action_recommendations",
    "ai_quiz_questions",
    "ai_flashcards",
)
#: What a job_service or credential_service log says when it retried a transaction.
RETRY_LOG_LINES = {
    "deadlockRetries": "transient database error, retrying",
    "disconnectRetries": "connection lost before commit, retrying",
    "unavailable": "database unavailable in",
}


@dataclass
class ProbeReport:
    """What the commit probe saw.

    Attributes:
        acked: sequence numbers whose autocommit INSERT was acknowledged.
        unknown: sent, but the connection failed before the answer (outcome unknown).
        errors: failed attempts by error code / exception name.
        longest_gap_s: longest time between two acknowledged commits (the write outage).
        missing: node → acknowledged numbers it does not hold (must be empty).
        unknown_committed: of ``unknown``, how many did commit after all.
    """

    acked: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    longest_gap_s: float = 0.0
    missing: dict[str, list[int]] = field(default_factory=dict)
    unknown_committed: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return {
            "acked": len(self.acked),
            "unknownOutcome": len(self.unknown),
            "unknownCommitted": self.unknown_committed,
            "errors": dict(self.errors),
            "longestGapSeconds": round(self.longest_gap_s, 2),
            "missingOnNode": {k: len(v) for k, v in self.missing.items()},
        }


class CommitProbe:
    """Numbered autocommit INSERTs through the proxy every ``interval`` seconds (a thread).

    Args:
        connect: opens a new autocommit pymysql connection to :data:`PROBE_DATABASE`.
        interval: seconds between two INSERTs.
    """

    def __init__(self, connect: Callable[[], pymysql.Connection], interval: float = 0.05) -> None:
        self._connect = connect
        self.interval = interval
        self.report = ProbeReport()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Create the table and start inserting."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "CREATE TABLE IF NOT EXISTS commits"
                    " (seq BIGINT PRIMARY KEY, at DATETIME(6) NOT NULL)"
                )
        finally:
            conn.close()
        self._thread = threading.Thread(target=self._run, name="commit-probe", daemon=True)
        self._thread.start()

    def stop(self) -> ProbeReport:
        """Stop inserting; returns the report (``missing`` is filled by :meth:`verify`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.report

    def _run(self) -> None:
        conn: pymysql.Connection | None = None
        seq = 0
        last_ack = time.monotonic()
        while not self._stop.is_set():
            if conn is None:
                try:
                    conn = self._connect()
                except pymysql.MySQLError as exc:
                    self.report.errors[f"connect {exc.args[0] if exc.args else '?'}"] += 1
                    self._stop.wait(0.1)
                    continue
            seq += 1
            try:
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO commits (seq, at) VALUES (%s, NOW(6))", (seq,))
            except pymysql.MySQLError as exc:
                code = exc.args[0] if exc.args else "?"
                self.report.errors[str(code)] += 1
                # refused before anything ran (not primary, deadlock): not committed;
                # a lost connection: sent, outcome unknown
                if isinstance(code, int) and code >= 2000:
                    self.report.unknown.append(seq)
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
                self._stop.wait(0.05)
                continue
            now = time.monotonic()
            self.report.longest_gap_s = max(self.report.longest_gap_s, now - last_ack)
            last_ack = now
            self.report.acked.append(seq)
            self._stop.wait(self.interval)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def verify(self, backend: GaleraBackend) -> ProbeReport:
        """Read the table on every running node (causal reads): fill ``missing`` and
        ``unknown_committed``."""
        acked = set(self.report.acked)
        unknown = set(self.report.unknown)
        for node in backend.cluster.nodes:
            if not node.running():
                continue
            conn = backend.cluster.connect(node, PROBE_DATABASE, timeout=10.0)
            try:
                with conn.cursor() as cur:
                    cur.execute("SET SESSION wsrep_sync_wait = 1")
                    cur.execute("SELECT seq FROM commits")
                    held = {int(r[0]) for r in cur.fetchall()}
            finally:
                conn.close()
            self.report.missing[node.name] = sorted(acked - held)
            self.report.unknown_committed = len(unknown & held)
        return self.report


async def _since(t0: float, waiting: Awaitable[float | None]) -> float | None:
    """Seconds from ``t0`` (monotonic) until ``waiting`` is done; None if it timed out."""
    if await waiting is None:
        return None
    return time.monotonic() - t0


async def _created(run: Run, loader: asyncio.Task[Any], count: int) -> None:
    """Wait until the load has created ``count`` jobs (or ended)."""
    while not loader.done():
        if len(run.load.stats.job_ids) >= count:
            break
        await asyncio.sleep(0.1)


def _log_counts(system: System) -> dict[str, dict[str, int]]:
    """Per job_service / credential_service log: how often it retried or gave up."""
    out: dict[str, dict[str, int]] = {}
    for spec in [*system.specs("job_service"), *system.specs("credential_service")]:
        path = system.launcher.log_path(spec.name)
        text = path.read_text(errors="replace") if path is not None and path.exists() else ""
        out[spec.name] = {k: text.count(line) for k, line in RETRY_LOG_LINES.items()}
    return out


def _delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
        node: {k: v - before.get(node, {}).get(k, 0) for k, v in vals.items()}
        for node, vals in after.items()
    }


def _caught_up(backend: GaleraBackend, database: str, result: ScenarioResult) -> None:
    """Every node holds the same job tables (checksums) once the load has settled."""
    sums = backend.cluster.checksums(database, JOB_TABLES)
    result.notes["checksumsEqual"] = len({tuple(sorted(v.items())) for v in sums.values()}) == 1
    result.notes["nodesCompared"] = sorted(sums)
    if not result.notes["checksumsEqual"]:
        result.checks.append(f"nodes differ after the fault: {sums}")


def _probe_checks(probe: ProbeReport, result: ScenarioResult) -> None:
    result.notes["probe"] = probe.as_dict()
    for node, missing in probe.missing.items():
        if missing:
            result.checks.append(
                f"{len(missing)} acknowledged commits missing on {node} (first {missing[:5]})"
            )
    if not probe.acked:
        result.checks.append("the commit probe committed nothing")


async def galera_writer_kill(
    system: System, profile: Profile, backend: GaleraBackend
) -> ScenarioResult:
    """SIGKILL the node HAProxy writes to, under load; let it rejoin; check it caught up.

    ``profile.kills`` rounds (2 short, 5 long), each: SIGKILL the writer with jobs in
    flight, wait for HAProxy's next server and the survivors' view of 2, leave it
    down 2 s under load, start it again (it rejoins by IST), wait until the proxy
    writes to it again. Per round (``notes.rounds``): ``failoverSeconds`` (kill →
    the next server UP and chosen), ``evictedSeconds`` (kill → the survivors'
    Primary component of 2), ``rejoinSeconds`` and ``rejoinKind`` (IST expected),
    ``failbackSeconds`` (Synced → the proxy writes to it again, the backup's
    connections cut), ``recoverySeconds`` (kill → every job in flight at the kill
    terminal again). ``probe.longestGapSeconds``: the longest time no commit went
    through. At the end every node must hold the same rows.
    """
    run = Run(system, profile, "galera_writer_kill")
    cluster = backend.cluster
    await run.standin({"delayMs": 800})
    probe = CommitProbe(backend.probe_connector())
    probe.start()
    run.start_sampler()
    load_stop = asyncio.Event()
    loader = asyncio.create_task(run.load.run(profile.jobs * 50, profile.rate, load_stop))
    rounds: list[dict[str, Any]] = []
    recovering: list[asyncio.Task[float | None]] = []
    try:
        for _ in range(max(1, profile.kills)):
            rounds.append(await _kill_the_writer(run, backend, recovering))
        await _created(run, loader, profile.jobs)
        load_stop.set()
        for entry, task in zip(rounds, recovering, strict=True):
            waited = await task
            entry["recoverySeconds"] = None if waited is None else round(waited, 2)
        await loader
    finally:
        load_stop.set()
        report = await asyncio.to_thread(probe.stop)
    run.notes["rounds"] = rounds
    for key in ("failoverSeconds", "evictedSeconds", "rejoinSeconds", "failbackSeconds"):
        run.notes[f"max{key[0].upper()}{key[1:]}"] = max(r[key] for r in rounds)
    recoveries = [r["recoverySeconds"] for r in rounds if r["recoverySeconds"] is not None]
    result = await run.finish(max(recoveries) if len(recoveries) == len(rounds) else None)
    await asyncio.to_thread(cluster.wait_cluster_size, len(cluster.nodes), 60.0)
    await asyncio.to_thread(probe.verify, backend)
    _probe_checks(report, result)
    await asyncio.to_thread(_caught_up, backend, backend.database, result)
    result.notes["retries"] = _log_counts(system)
    for i, r in enumerate(rounds, 1):
        if r["recoverySeconds"] is None:
            result.checks.append(f"round {i}: jobs in flight at the kill not terminal in time")
        if r["rejoinKind"] != "IST":
            result.checks.append(f"round {i}: the killed node rejoined by {r['rejoinKind']}")
        if r["newWriter"] == r["writer"]:
            result.checks.append(f"round {i}: HAProxy did not move to another node")
        if r["sessionsLeftOnBackup"]:
            result.checks.append(
                f"round {i}: {r['sessionsLeftOnBackup']} connections left on {r['newWriter']}"
                " after fail-back"
            )
    return result


async def _kill_the_writer(
    run: Run, backend: GaleraBackend, recovering: list[asyncio.Task[float | None]]
) -> dict[str, Any]:
    """One round of :func:`galera_writer_kill`; appends its recovery wait to ``recovering``."""
    cluster, proxy = backend.cluster, backend.proxy
    flying = await wait_in_flight(run, 2)
    writer = await asyncio.to_thread(proxy.wait_writer)
    entry: dict[str, Any] = {"writer": writer.name, "inFlightAtKill": len(flying)}
    t0 = time.monotonic()
    run.fault_window(t0)
    await asyncio.to_thread(cluster.kill, writer)
    new = await asyncio.to_thread(proxy.wait_writer, writer, 60.0)
    entry["failoverSeconds"] = round(time.monotonic() - t0, 2)
    entry["newWriter"] = new.name
    await asyncio.to_thread(cluster.wait_cluster_size, len(cluster.nodes) - 1, 60.0)
    entry["evictedSeconds"] = round(time.monotonic() - t0, 2)
    recovering.append(
        asyncio.create_task(_since(t0, run.wait_terminal(set(flying), run.profile.settle_seconds)))
    )
    await asyncio.sleep(2.0)  # down a while under load: the others move on without it
    t1 = time.monotonic()
    await asyncio.to_thread(cluster.start_node, writer)
    entry["rejoinSeconds"] = round(time.monotonic() - t1, 2)
    entry["rejoinKind"] = cluster.rejoin_kind(writer)
    entry["downSeconds"] = round(t1 - t0, 2)
    # fail-back: Synced again, it passes its checks and takes the connections back;
    # the backup's are cut at that moment (a single writer again)
    t2 = time.monotonic()
    back = await asyncio.to_thread(proxy.wait_writer, None, 30.0, node=writer)
    entry["failbackSeconds"] = round(time.monotonic() - t2, 2)
    entry["writerAfterRejoin"] = back.name
    await asyncio.sleep(1.0)
    entry["sessionsLeftOnBackup"] = (await asyncio.to_thread(proxy.sessions)).get(new.name, 0)
    run.close_window()
    return entry


#: How long a ``KILL CONNECTION`` round waits for a moment when one of the services'
#: connections holds an open transaction (seconds).
AIM_SECONDS = 5.0


async def _kill_sql(backend: GaleraBackend, database: str) -> dict[str, int]:
    """``KILL CONNECTION`` every connection of the services' database on the writer, at
    a moment (polled, up to :data:`AIM_SECONDS`) one of them holds an open
    transaction; after that wait, whatever they hold.

    The hot path's transactions are a round trip or two long, so a cut at a random
    moment mostly finds them idle. The round makes the moment: its own transaction
    locks the rows of the jobs being worked on (``FOR UPDATE SKIP LOCKED``, so it
    waits on no one), and the next heartbeat, result or fail of one of them waits
    for those locks inside its transaction, which is open when the cut lands. The
    round's transaction is rolled back after the cut: it changes nothing.
    """
    writer = await asyncio.to_thread(backend.proxy.wait_writer)

    def kill() -> dict[str, int]:
        conn = backend.cluster.connect(writer)
        holder = backend.cluster.connect(writer, database)
        try:
            with conn.cursor() as cur, holder.cursor() as hold:
                hold.execute("SET SESSION innodb_lock_wait_timeout = 10")
                hold.execute("BEGIN")
                hold.execute(
                    "SELECT job_id FROM ai_runtime_jobs WHERE status IN ('locked', 'running')"
                    " FOR UPDATE SKIP LOCKED"
                )
                deadline = time.monotonic() + AIM_SECONDS
                listed_at = 0.0
                ids: set[int] = set()
                while True:
                    now = time.monotonic()
                    if now - listed_at > 0.2:  # the services' connections, now and then
                        cur.execute(
                            "SELECT ID FROM information_schema.PROCESSLIST"
                            " WHERE DB = %s AND ID NOT IN (CONNECTION_ID(), %s)",
                            (database, holder.thread_id()),
                        )
                        ids, listed_at = {int(r[0]) for r in cur.fetchall()}, now
                    cur.execute("SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX")
                    busy = {int(r[0]) for r in cur.fetchall()} & ids
                    if busy or now >= deadline:
                        break
                    time.sleep(0.005)
                # the busy ones first: they are what this round is for
                rows = [(i, True) for i in busy] + [(i, False) for i in ids - busy]
                killed = in_tx = 0
                for conn_id, open_tx in rows:
                    with contextlib.suppress(pymysql.MySQLError):  # already gone
                        cur.execute(f"KILL CONNECTION {int(conn_id)}")
                        killed += 1
                        in_tx += int(open_tx)
                hold.execute("ROLLBACK")
                return {"killed": killed, "inTransaction": in_tx}
        finally:
            holder.close()
            conn.close()

    return await asyncio.to_thread(kill)


async def _open_transactions(backend: GaleraBackend, database: str) -> int:
    """Open transactions of the services' database on the writer now."""
    writer = await asyncio.to_thread(backend.proxy.wait_writer)

    def count() -> int:
        conn = backend.cluster.connect(writer)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX t"
                    " JOIN information_schema.PROCESSLIST p ON t.trx_mysql_thread_id = p.ID"
                    " WHERE p.DB = %s",
                    (database,),
                )
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    return await asyncio.to_thread(count)


#: The three ways ``galera_conn_kill`` cuts connections, in turn.
CONN_KILL_METHODS = ("sql_kill", "haproxy_shutdown_sessions", "haproxy_switchover")


async def galera_conn_kill(
    system: System, profile: Profile, backend: GaleraBackend
) -> ScenarioResult:
    """Cut the services' connections to the writer mid-transaction, under load.

    Rounds (at least three, ``profile.kills`` if more) cycle through
    :data:`CONN_KILL_METHODS`: ``KILL CONNECTION`` of every connection of the
    services' database on the writer (3 times 0.3 s apart, each at a moment one
    of them holds an open transaction: :func:`_kill_sql`); HAProxy's ``shutdown
    sessions server``; a switchover (``disable server`` + ``shutdown sessions`` on
    the writer, so the first backup takes over; 2 s later ``enable server``: it takes the writes back and the
    backup's connections are cut).
    Recovery: from the last cut until every job in flight then is terminal.
    """
    run = Run(system, profile, "galera_conn_kill")
    proxy = backend.proxy
    await run.standin({"delayMs": 300})
    probe = CommitProbe(backend.probe_connector())
    probe.start()
    run.start_sampler()
    load_stop = asyncio.Event()
    loader = asyncio.create_task(run.load.run(profile.jobs * 20, profile.rate, load_stop))
    rounds: list[dict[str, Any]] = []
    waited: float | None = None
    try:
        for i in range(max(len(CONN_KILL_METHODS), profile.kills)):
            method = CONN_KILL_METHODS[i % len(CONN_KILL_METHODS)]
            flying = await wait_in_flight(run, 2)
            writer = await asyncio.to_thread(proxy.wait_writer)
            entry: dict[str, Any] = {"method": method, "writer": writer.name}
            t0 = time.monotonic()
            run.fault_window(t0)
            entry.update(await _cut_connections(backend, method, writer, t0))
            run.close_window()
            entry["inFlight"] = len(flying)
            rounds.append(entry)
            waited = await _since(t0, run.wait_terminal(set(flying), profile.settle_seconds))
            entry["recoverySeconds"] = None if waited is None else round(waited, 2)
            await asyncio.sleep(1.0)  # the next cut lands on other transactions
        await _created(run, loader, profile.jobs)
        load_stop.set()
        await loader
    finally:
        load_stop.set()
        report = await asyncio.to_thread(probe.stop)
    run.notes["rounds"] = rounds
    recoveries = [r["recoverySeconds"] for r in rounds if r.get("recoverySeconds") is not None]
    result = await run.finish(max(recoveries) if recoveries else None)
    await asyncio.to_thread(probe.verify, backend)
    _probe_checks(report, result)
    await asyncio.to_thread(_caught_up, backend, backend.database, result)
    result.notes["retries"] = _log_counts(system)
    _conn_kill_checks(rounds, result)
    return result


async def _cut_connections(
    backend: GaleraBackend, method: str, writer: GaleraNode, t0: float
) -> dict[str, Any]:
    """One round of :func:`galera_conn_kill` by ``method`` (see there); returns what
    it found and did, for the round's note."""
    proxy = backend.proxy
    if method == "sql_kill":
        killed = Counter[str]()
        for _ in range(3):
            killed.update(await _kill_sql(backend, backend.database))
            await asyncio.sleep(0.3)
        return dict(killed)
    entry: dict[str, Any] = {
        "openTransactions": await _open_transactions(backend, backend.database),
        "sessions": (await asyncio.to_thread(proxy.sessions)).get(writer.name, 0),
    }
    if method == "haproxy_switchover":
        await asyncio.to_thread(proxy.disable, writer)
    await asyncio.to_thread(proxy.shutdown_sessions, writer)
    if method == "haproxy_switchover":
        entry.update(await _switch_back(backend, writer, t0))
    return entry


async def _switch_back(backend: GaleraBackend, writer: GaleraNode, t0: float) -> dict[str, Any]:
    """After a switchover away from ``writer``: 2 s of writes on the backup, then
    ``writer`` enabled again takes them back; the backup's connections must be cut."""
    proxy = backend.proxy
    new = await asyncio.to_thread(proxy.wait_writer, writer, 30.0)
    await asyncio.sleep(2.0)  # writes go to the backup for a while
    await asyncio.to_thread(proxy.enable, writer)
    # out of maintenance and still Synced: it takes the writes back
    await asyncio.to_thread(proxy.wait_writer, None, 30.0, node=writer)
    failback = round(time.monotonic() - t0 - 2.0, 2)
    await asyncio.sleep(1.0)
    left = (await asyncio.to_thread(proxy.sessions)).get(new.name, 0)
    return {"newWriter": new.name, "failbackSeconds": failback, "sessionsLeftOnBackup": left}


def _conn_kill_checks(rounds: list[dict[str, Any]], result: ScenarioResult) -> None:
    if not any(r.get("killed") for r in rounds):
        result.checks.append("KILL CONNECTION found no service connection on the writer")
    switched = [r for r in rounds if r["method"] == "haproxy_switchover"]
    if any(r.get("newWriter") == r["writer"] for r in switched):
        result.checks.append("the switchover did not move the writer")
    if any(r.get("sessionsLeftOnBackup") for r in switched):
        result.checks.append("connections left on the backup after the switch back")


_NODE_RE = re.compile(r"@([\d.]+:\d+)/")


async def galera_multi_writer(
    system: System, profile: Profile, backend: GaleraBackend, direct_writes: bool = False
) -> ScenarioResult:
    """Two job_service replicas writing to different nodes at once (no proxy between).

    ``system`` is not started yet: both replicas start (and migrate) together,
    each with its ``DATABASE_URL`` on its own node, every client spreading its
    calls over both. By default they must refuse to start
    (:func:`airuntime_common.db.check_single_writer`); the row is clean when both
    did, with the message naming the node.

    With ``direct_writes`` (``GALERA_ALLOW_DIRECT_NODE=true``, or both replicas
    through HAProxy as a control) they start, and the scenario measures what the
    refusal guards against: a race-sized load (one
    attempt's claim, heartbeats and result may go to different nodes) while
    :func:`_revoke_race` sends a job create and an AI revoke at once for each of
    :data:`REVOKE_RACE_PAIRS` users. Figures: certification failures and
    brute-force aborts per node (``wsrep_local_cert_failures``,
    ``wsrep_local_bf_aborts``), the retries each service logged, the revoke race's
    outcome, attempts that called the model twice, and the usual audit.
    """
    cluster = backend.cluster
    ports = {n.port: n.name for n in cluster.nodes}
    replica_nodes = {}
    for spec in system.specs("job_service"):
        m = _NODE_RE.search(spec.env["DATABASE_URL"])
        port = int(m.group(1).rsplit(":", 1)[1]) if m else 0
        replica_nodes[spec.name] = ports.get(port, "HAProxy")
    via_proxy = set(replica_nodes.values()) == {"HAProxy"}
    run_name = "galera_multi_writer" + (
        " (via HAProxy)" if via_proxy else " (direct writes)" if direct_writes else ""
    )
    began = time.monotonic()
    try:
        await system.start()
    except LauncherError as exc:
        return _refusal(run_name, system, str(exc), replica_nodes, direct_writes, began)
    run = Run(system, profile, run_name)
    run.notes["replicaNodes"] = replica_nodes
    if not direct_writes:
        run.checks.append("the replicas started on two nodes instead of refusing")
    before = await asyncio.to_thread(cluster.counters)
    logs_before = _log_counts(system)
    await run.standin({"delayMs": 50})
    run.start_sampler()
    rate = max(profile.race_jobs / 15.0, 20.0)
    loader = asyncio.create_task(run.load.run(profile.race_jobs, rate))
    race = await _revoke_race(run, REVOKE_RACE_PAIRS)
    await loader
    result = await run.finish(None)
    race.update(await _revoke_race_outcome(run, race.pop("created")))
    result.notes["revokeRace"] = race
    if race["slipped"]:
        result.checks.append(
            f"{race['slipped']} of {race['created']} jobs created while their user turned AI"
            " off were admitted after the revoke and never cancelled (reference §6)"
        )
    after = await asyncio.to_thread(cluster.counters)
    conflicts = _delta(after, before)
    result.notes["wsrep"] = {
        node: {k: v for k, v in vals.items() if k != "wsrep_last_committed"}
        for node, vals in conflicts.items()
    }
    result.notes["certFailures"] = sum(v["wsrep_local_cert_failures"] for v in conflicts.values())
    result.notes["bfAborts"] = sum(v["wsrep_local_bf_aborts"] for v in conflicts.values())
    result.notes["retries"] = _delta(_log_counts(system), logs_before)
    result.notes["retriesAtStart"] = logs_before
    await asyncio.to_thread(_caught_up, backend, backend.database, result)
    result.notes["doubleExecutedAttempts"] = await _double_executed(run)
    if result.notes["doubleExecutedAttempts"]:
        result.checks.append(
            f"{result.notes['doubleExecutedAttempts']} attempts called the model twice"
        )
    return result


def _refusal(
    name: str,
    system: System,
    error: str,
    replica_nodes: dict[str, str],
    direct_writes: bool,
    began: float,
) -> ScenarioResult:
    """The row of a start that was refused: clean when every replica refused to write
    to its node with the single-writer message (and that was expected)."""
    refusals = {}
    for spec in system.specs("job_service"):
        path = system.launcher.log_path(spec.name)
        text = path.read_text(errors="replace") if path is not None and path.exists() else ""
        line = next((x for x in text.splitlines() if "refusing to start" in x), None)
        refusals[spec.name] = line.strip() if line else None
    result = ScenarioResult(name, AuditReport(), LoadStats(), None, time.monotonic() - began)
    result.notes.update(
        {"replicaNodes": replica_nodes, "refusedAtStart": refusals, "launcher": error[-600:]}
    )
    if direct_writes:
        result.checks.append(f"the services did not start: {error[-300:]}")
    # the launcher stops the others when the first refuses: a replica may not have got
    # as far as its own refusal, but one that refused must name its own node
    for replica, line in refusals.items():
        node = replica_nodes.get(replica, "?")
        if line is not None and ("Galera node" not in line or repr(node) not in line):
            result.checks.append(f"{replica} refused for another reason: {line}")
    if not any(line and "Galera node" in line for line in refusals.values()):
        result.checks.append(f"no replica refused to write to its node directly: {error[-300:]}")
    return result


#: Users in ``galera_multi_writer``'s revoke race (a create and a revoke each, at once).
REVOKE_RACE_PAIRS = 60


async def _revoke_race(run: Run, pairs: int) -> dict[str, Any]:
    """For ``pairs`` users: a job create and an AI revoke sent at once (reference §6).

    Whatever the order they commit in, a create that is acknowledged must end
    ``cancelled`` (the revoke came second and cancelled it) unless it was refused
    (``AI_NOT_AUTHORIZED``: the revoke came first). The two requests go through the
    gateway, which spreads calls over both replicas, so about half the pairs meet
    on different Galera nodes. Returns counts and ``created`` (user → jobId).
    """
    system = run.system
    rng = random.Random(7)
    created: dict[str, str] = {}
    outcomes: Counter[str] = Counter()
    async with httpx.AsyncClient(
        base_url=system.gateway_url, trust_env=False, timeout=30
    ) as client:

        async def one(i: int) -> None:
            user = f"chaos-{run.tag}-revoke-{i}"
            token = mint_token(system.env["JWT_SECRET"], sub=user, role="user")
            headers = {"Authorization": f"Bearer {token}"}
            body = {"jobType": "learning_state_analysis", "targetType": "user", "targetId": user}

            async def create() -> httpx.Response:
                return await client.post("/v1/ai/jobs", json=body, headers=headers)

            async def revoke() -> httpx.Response:
                # the create first asks the credential service: the revoke is sent
                # a little later, so the two transactions overlap
                await asyncio.sleep(rng.uniform(0.0, 0.03))
                return await client.post("/v1/me/ai-authorization/revoke", headers=headers)

            made, revoked = await asyncio.gather(create(), revoke())
            outcomes[f"create {made.status_code}"] += 1
            outcomes[f"revoke {revoked.status_code}"] += 1
            if made.status_code == 201:
                created[user] = str(made.json()["jobId"])

        for start in range(0, pairs, 10):
            await asyncio.gather(*(one(i) for i in range(start, min(pairs, start + 10))))
    return {"pairs": pairs, "answers": dict(outcomes), "created": created}


async def _revoke_race_outcome(run: Run, created: dict[str, str]) -> dict[str, Any]:
    """How the revoke race's created jobs ended, and how many slipped past their revoke.

    A create and a revoke of one user are ordered by the user's admission lock: the
    create first, and the revoke finds the job (pending → ``cancelled``; leased →
    ``cancelRequested``, after which a result committed before the worker saw it still
    wins, reference §2.3); or the revoke first, and the create is refused. A job the
    revoke neither cancelled nor flagged, and that had not finished before the revoke
    (``finishedAt`` ≤ the switch's ``changedAt``), was admitted after AI was turned off:
    it *slipped*.
    """
    ids = set(created.values())
    await run.wait_terminal(ids, run.profile.settle_seconds)
    statuses: Counter[str] = Counter()
    slipped = after = flagged = 0
    if ids:
        marks = ",".join(["%s"] * len(ids))
        rows = await run.sql(
            "SELECT j.status, j.cancel_requested, j.created_at, j.finished_at, a.changed_at"
            " FROM ai_runtime_jobs j LEFT JOIN ai_authorizations a ON a.user_id = j.user_id"
            f" WHERE j.job_id IN ({marks})",
            sorted(ids),
        )
        for status, cancel_requested, created_at, finished_at, changed_at in rows:
            statuses[str(status)] += 1
            flagged += int(bool(cancel_requested))
            if changed_at is not None and created_at > changed_at:
                after += 1
            if status == "cancelled" or cancel_requested:
                continue
            if finished_at is not None and changed_at is not None and finished_at <= changed_at:
                continue  # it was over before the user turned AI off
            slipped += 1
    return {
        "created": len(ids),
        "endedAs": dict(statuses),
        "cancelRequested": flagged,
        "createdAfterRevoke": after,
        "slipped": slipped,
    }


async def _double_executed(run: Run) -> int:
    """Attempts of this scenario's jobs with more than one model-call log row."""
    rows = await run.sql(
        "SELECT COUNT(*) FROM (SELECT l.job_id, l.attempt_no FROM ai_runtime_invocation_logs l"
        " JOIN ai_runtime_jobs j ON j.job_id = l.job_id WHERE j.user_id LIKE %s"
        " GROUP BY l.job_id, l.attempt_no HAVING COUNT(*) > 1) d",
        (run.user_like,),
    )
    return int(rows[0][0]) if rows else 0
