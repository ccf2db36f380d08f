"""The database floor: the per-job SQL of the real system, captured and replayed.

:func:`capture_one_job` runs one job through the real services with MariaDB's
general log on and keeps the statements of this database's connections, from
the claim to the job's last write. :func:`replay` then issues exactly those
statements per job, in the same round trips (a multi-statement batch stays one),
with plain aiomysql connections (one per "slot"), taking
each job id from the replayed claim and giving every id the original inserted
a fresh value, so the floor costs what the SQL costs and nothing else.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiomysql
import pymysql
from pymysql.constants import CLIENT
from sqlalchemy.engine import URL

from bench.harness import System, admin_connect, global_status

HEX_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def split_statements(text: str) -> list[str]:
    """The statements of one round trip: a multi-statement batch is sent joined by
    ``";\\n"`` (:mod:`job_service.store.batch`); anything else is one statement."""
    return [part for part in text.split(";\n") if part.strip()]


def _ends_transaction(text: str) -> bool:
    return split_statements(text)[-1].strip().upper() in {"COMMIT", "ROLLBACK"}


_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+`?([a-z_]+)`?", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^'\\]|\\.|'')*'")


def _outer(stmt: str) -> str:
    """``stmt`` without its string literals and parenthesised parts (subqueries)."""
    text = _QUOTED.sub("''", stmt)
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _kind(stmt: str) -> str:
    """Verb and table of a statement, e.g. ``SELECT ai_runtime_jobs`` (the statement's own
    table, not a subquery's); ``SET fence`` for a batch's fence."""
    words = stmt.strip().split()
    head = " ".join(words[:1]).upper() if words else ""
    if head == "SET" and "@airt_fence" in stmt:
        return "SET fence"
    m = _TABLE.search(_outer(stmt)) or _TABLE.search(stmt)
    return (
        f"{head} {m.group(1)}" if m and head in {"SELECT", "INSERT", "UPDATE", "DELETE"} else head
    )


@dataclass
class Capture:
    """One job's round trips, in order, as sent (client-side interpolated).

    Attributes:
        job_id: the captured job.
        statements: the SQL text of each round trip (a batch holds several
            statements, see :func:`split_statements`).
        fresh_ids: ids first seen in an INSERT (given new values on replay).
    """

    job_id: str
    statements: list[str]
    fresh_ids: set[str] = field(default_factory=set)
    #: Steady state with claim-with-result (SubmitResult ``claim_next``): the job
    #: was claimed by the previous job's result, and its own result claims
    #: ``next_job_id``, so ``statements`` (one job's) end with the next job's
    #: claim and ``prologue`` is the plain claim that starts each slot.
    next_job_id: str | None = None
    prologue: list[str] = field(default_factory=list)
    #: the job the prologue claimed (replayed as each connection's first pick)
    prologue_job_id: str | None = None
    #: tokens replayed as another fixed value (other jobs' snapshots → the template's)
    aliases: dict[str, str] = field(default_factory=dict)

    def kinds(self) -> dict[str, int]:
        """Statement counts by verb and table (every statement of a batch counted)."""
        return dict(
            Counter(_kind(p) for s in self.statements for p in split_statements(s)).most_common()
        )

    def statement_count(self) -> int:
        """Statements per job, every statement of a batch counted."""
        return sum(len(split_statements(s)) for s in self.statements)


def _db_threads(conn: pymysql.connections.Connection[Any], database: str) -> set[int]:
    with conn.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB=%s", (database,))
        return {int(r[0]) for r in cur.fetchall()}


class GeneralLog:
    """MariaDB's general log into ``mysql.general_log`` for a window (restores the settings)."""

    def __init__(self, conn: pymysql.connections.Connection[Any]) -> None:
        self.conn = conn
        self.t0: Any = None
        self._saved: tuple[Any, Any] = ("OFF", "FILE")

    def __enter__(self) -> GeneralLog:
        with self.conn.cursor() as cur:
            cur.execute("SELECT @@global.general_log, @@global.log_output, NOW(6)")
            on, output, self.t0 = cur.fetchone()
            self._saved = (on, output)
            if "TABLE" not in str(output).upper():
                cur.execute(
                    "SET GLOBAL log_output = 'TABLE,FILE'"
                    if "FILE" in str(output).upper()
                    else "SET GLOBAL log_output = 'TABLE'"
                )
            cur.execute("SET GLOBAL general_log = 1")
        return self

    def __exit__(self, *exc: object) -> None:
        with self.conn.cursor() as cur:
            on, output = self._saved
            cur.execute(f"SET GLOBAL general_log = {int(on)}")
            cur.execute("SET GLOBAL log_output = %s", (output,))

    def rows(self, threads: set[int]) -> list[tuple[int, str, str]]:
        """(thread, command, text) of ``threads`` since the window opened, in log order."""
        if not threads:
            return []
        ids = ",".join(str(t) for t in threads)
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT thread_id, command_type, argument FROM mysql.general_log"
                f" WHERE event_time >= %s AND thread_id IN ({ids})",
                (self.t0,),
            )
            out = []
            for tid, cmd, arg in cur.fetchall():
                text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
                out.append((int(tid), str(cmd), text))
            return out


def _transactions(statements: list[str]) -> list[list[str]]:
    """``statements`` cut into transactions (each ends with COMMIT/ROLLBACK)."""
    out: list[list[str]] = [[]]
    for text in statements:
        out[-1].append(text)
        if _ends_transaction(text):
            out.append([])
    return [tx for tx in out if tx]


def _head_transaction(statements: list[str]) -> tuple[list[str], list[str]]:
    """The first transaction of ``statements`` (with a pool's reset ROLLBACK right
    after it), and the rest."""
    txs = _transactions(statements)
    head = txs[0]
    rest = txs[1:]
    if rest and rest[0] == ["ROLLBACK"]:
        head = head + rest.pop(0)
    return head, [s for tx in rest for s in tx]


async def capture_one_job(system: System) -> Capture:
    """Run three jobs (worker with 1 slot) with the general log on; keep the middle
    one's statements, the steady state: with claim-with-result on, it was
    claimed by the first one's result and its own result claims the third."""
    name = system.worker_names()[0]
    await system.launcher.stop_service(name)
    ids = [await system.create_job(f"floor-user-{k}") for k in "abc"]
    database = system.db_url.database or ""
    conn = admin_connect(system.db_url.render_as_string(hide_password=False))
    try:
        with GeneralLog(conn) as glog:
            await system.launcher.restart_service(name)
            await system.wait_terminal(3, 30)
            await asyncio.sleep(0.3)
            rows = glog.rows(_db_threads(conn, database))
    finally:
        conn.close()
    queries = [(tid, text) for tid, cmd, text in rows if cmd == "Query"]
    snaps = {
        str(r[0]): str(r[1])
        for r in system.sql(
            "SELECT job_id, snapshot_id FROM ai_runtime_jobs WHERE job_id IN (%s,%s,%s)",
            tuple(ids),
        )
    }
    first, job_id, following = ids
    statements = job_statements(queries, job_id, None)
    claim_tx, rest = _head_transaction(statements)
    prologue: list[str] = []
    next_job_id = None
    aliases: dict[str, str] = {}
    if any(first in s for s in claim_tx):  # claimed by the first job's result
        prologue, _ = _head_transaction(job_statements(queries, first, None))
        statements, next_job_id = rest, following
        aliases = {snaps[first]: snaps[job_id], snaps[following]: snaps[job_id]}
    fresh: set[str] = set()
    seen: set[str] = set()
    for text in prologue + statements:
        for token in HEX_ID.findall(text):
            if token not in seen:
                seen.add(token)
                if token not in (job_id, next_job_id) and text.lstrip().upper().startswith(
                    "INSERT"
                ):
                    fresh.add(token)
    return Capture(
        job_id=job_id,
        statements=statements,
        fresh_ids=fresh - set(aliases),
        next_job_id=next_job_id,
        prologue=prologue,
        prologue_job_id=first if prologue else None,
        aliases=aliases,
    )


def job_statements(
    queries: list[tuple[int, str]], job_id: str, snapshot_id: str | None
) -> list[str]:
    """The job's transactions, de-interleaved, in the order they began.

    A transaction is a run of one connection's round trips up to COMMIT/ROLLBACK,
    sent alone or ending a batch (a pool's reset ROLLBACK on its own counts as one). Kept: the claim (``SKIP
    LOCKED``), every transaction naming the job or its snapshot, and the reset
    ROLLBACK that follows a kept transaction on the same connection; background
    work (reaper sweeps, gauges, idle polls after the job) is dropped.
    """
    open_tx: dict[int, list[str]] = {}
    txs: list[tuple[int, list[str]]] = []
    for tid, text in queries:
        cur = open_tx.setdefault(tid, [])
        if not cur:
            txs.append((tid, cur))
        cur.append(text)
        if _ends_transaction(text):
            open_tx[tid] = []
    keys = [k for k in (job_id, snapshot_id) if k]
    first = next(i for i, (_, tx) in enumerate(txs) if any(job_id in s for s in tx))
    claim = max(
        (i for i in range(first + 1) if any("SKIP LOCKED" in s.upper() for s in txs[i][1])),
        default=first,
    )
    last = max(i for i, (_, tx) in enumerate(txs) if any(k in s for s in tx for k in keys))
    out: list[str] = []
    kept_tids: set[int] = set()
    for i in range(claim, len(txs)):
        tid, tx = txs[i]
        mentions = any(k in s for s in tx for k in keys) or i == claim
        reset = len(tx) == 1 and tx[0].strip().upper() == "ROLLBACK" and tid in kept_tids
        if (mentions and i <= last) or reset:
            out.extend(tx)
        if reset or not (mentions and i <= last):
            kept_tids.discard(tid)
        else:
            kept_tids.add(tid)
        if i > last and not kept_tids:
            break
    return out


def clone_pending(url: URL, template_job_id: str, n: int) -> None:
    """Replace every other unfinished job with ``n`` pending copies of ``template_job_id``.

    The copies share the template's snapshot; its id and user are kept.
    """
    conn = admin_connect(url.render_as_string(hide_password=False), url.database)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "DELETE FROM ai_runtime_jobs"
                " WHERE status IN ('pending','locked','running') AND job_id <> %s",
                (template_job_id,),
            )
            cur.execute(
                "INSERT INTO ai_runtime_jobs (job_id, user_id, job_type, target_type, target_id,"
                " snapshot_id, status, priority, params, api_key_mode, credential_id,"
                " model_provider, model_name, attempt_no, retry_count, max_retry_count,"
                " timeout_seconds, cancel_requested, available_at, created_at, updated_at)"
                " SELECT REPLACE(UUID(),'-',''), user_id, job_type, target_type, target_id,"
                " snapshot_id, 'pending', priority, params, api_key_mode, credential_id,"
                " model_provider, model_name, 0, 0, max_retry_count, timeout_seconds, 0,"
                " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)"
                f" FROM ai_runtime_jobs JOIN seq_1_to_{int(n)} WHERE job_id=%s",
                (template_job_id,),
            )
    finally:
        conn.close()


def _pick_at(text: str) -> int | None:
    """Which statement of a round trip is a claim's pick (``SKIP LOCKED``), if any."""
    return next(
        (k for k, part in enumerate(split_statements(text)) if "SKIP LOCKED" in part.upper()),
        None,
    )


@dataclass
class _Script:
    """Round trips ready to render: text split around the hex ids, and where each
    round trip's pick is."""

    templates: list[list[str]]
    tokens: list[list[str]]
    ends: list[bool]
    picks: list[int | None]

    @classmethod
    def of(cls, sent: list[str]) -> _Script:
        return cls(
            [HEX_ID.split(s) for s in sent],
            [HEX_ID.findall(s) for s in sent],
            [_ends_transaction(s) for s in sent],
            [_pick_at(s) for s in sent],
        )

    def render(self, i: int, mapping: dict[str, str]) -> str:
        parts = self.templates[i]
        out = [parts[0]]
        for tok, tail in zip(self.tokens[i], parts[1:], strict=True):
            out.append(mapping.get(tok, tok))
            out.append(tail)
        return "".join(out)


async def _connect(url: URL) -> Any:
    """A connection as the services' engines open one (found rows, multi-statements,
    READ COMMITTED)."""
    conn = await aiomysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        db=url.database,
        autocommit=False,
        client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,  # as the services' engines
    )
    async with conn.cursor() as cur:
        await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


@dataclass
class _Pick:
    """A script's first pick: False before it ran, then the job id (None: no job)."""

    value: str | bool | None = False


class _Replayer:
    """One replay's scripts, its jobs left and what it counted (see :func:`replay`)."""

    def __init__(self, capture: Capture, n: int, one_per_round_trip: bool) -> None:
        def as_sent(statements: list[str]) -> list[str]:
            if one_per_round_trip:
                return [p for s in statements for p in split_statements(s)]
            return statements

        self.capture = capture
        self.job_script = _Script.of(as_sent(capture.statements))
        self.prologue = _Script.of(as_sent(capture.prologue)) if capture.prologue else None
        self.remaining = n
        self.done = 0
        self.errors = 0
        self.retried = 0
        self.first_error: str | None = None

    async def _send(
        self,
        conn: Any,
        script: _Script,
        i: int,
        sql: str,
        pick: _Pick,
        mapping: dict[str, str],
        pick_as: str | None,
    ) -> None:
        """Send round trip ``i``; the script's first pick, when it is in this round
        trip, goes into ``pick`` (None: it found no job) and ``mapping[pick_as]``."""
        async with conn.cursor() as cur:
            await cur.execute(sql)
            k = 0
            while True:
                if k == script.picks[i] and pick.value is False:
                    row = await cur.fetchone()
                    pick.value = str(row[0]) if row else None
                    if pick.value is not None and pick_as is not None:
                        mapping[pick_as] = pick.value
                await cur.fetchall()
                k += 1
                if not await cur.nextset():
                    break

    async def run(
        self, conn: Any, script: _Script, mapping: dict[str, str], pick_as: str | None
    ) -> str | bool | None:
        """Run ``script``; the first pick's job id becomes ``mapping[pick_as]``.

        Returns the picked id; None when a pick found no job; False when the
        script has no pick. A deadlock (1213) or lock wait timeout (1205) runs the
        whole transaction again (5 times at most), as the services do.
        """
        pick = _Pick()
        i = tx_start = tries = 0
        while i < len(script.templates):
            if pick.value is None and pick_as in script.tokens[i]:
                i += 1  # no next job: its lock is not sent
                continue
            sql = script.render(i, mapping)
            try:
                await self._send(conn, script, i, sql, pick, mapping, pick_as)
            except pymysql.err.MySQLError as exc:
                await conn.rollback()
                if exc.args[:1] in ((1213,), (1205,)) and tries < 5:
                    self.retried += 1
                    tries += 1
                    i = tx_start
                    pick.value = False
                    continue
                self.errors += 1
                if self.first_error is None:
                    self.first_error = f"{exc!r} in {sql[:200]}"
            if script.ends[i]:
                tx_start, tries = i + 1, 0
            i += 1
        return pick.value

    async def slot(self, url: URL) -> None:
        """One connection's jobs, until none are left (or a pick finds none)."""
        capture = self.capture
        conn = await _connect(url)
        try:
            if self.prologue is None:  # each job claimed by its own claim
                while self.remaining > 0:
                    self.remaining -= 1
                    mapping = {t: uuid.uuid4().hex for t in capture.fresh_ids}
                    if await self.run(conn, self.job_script, mapping, capture.job_id) is None:
                        break
                    self.done += 1
                return
            mapping = dict(capture.aliases)
            current = await self.run(conn, self.prologue, mapping, capture.prologue_job_id)
            while isinstance(current, str):
                mapping = {t: uuid.uuid4().hex for t in capture.fresh_ids}
                mapping.update(capture.aliases)
                mapping[capture.job_id] = current
                current = await self.run(conn, self.job_script, mapping, capture.next_job_id)
                self.done += 1
        finally:
            conn.close()


async def replay(
    url: URL, capture: Capture, n: int, concurrency: int, *, one_per_round_trip: bool = False
) -> dict[str, Any]:
    """Replay the captured statements for ``n`` jobs with ``concurrency`` connections.

    Each job's statements run as captured, the ids of the job (and of the next
    job, which a claim-with-result capture claims in the job's result
    transaction) taken from the replayed picks. With a ``prologue`` each
    connection first claims one job with it, then runs the job's statements
    until a pick finds no job; a job's last pick finding none skips the
    next job's lock and keeps the COMMIT.

    Args:
        one_per_round_trip: send every statement of a batch on its own (the
            protocol without batches), instead of the round trips as captured.

    Returns:
        ``{"jobs", "jobs_per_s", "statements_per_s", "round_trips_per_s", "errors",
        "deadlocks_retried", "first_error"}``; a deadlock (1213) or lock wait timeout
        (1205) runs its whole transaction again, as the services do, and only
        other failures count as errors.
    """
    replayer = _Replayer(capture, n, one_per_round_trip)
    t0 = time.perf_counter()
    await asyncio.gather(*(replayer.slot(url) for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    done = replayer.done
    return {
        "jobs": done,
        "seconds": round(elapsed, 3),
        "jobs_per_s": round(done / elapsed, 1),
        "statements_per_s": round(done * capture.statement_count() / elapsed, 1),
        "round_trips_per_s": round(done * len(replayer.job_script.templates) / elapsed, 1),
        "errors": replayer.errors,
        "deadlocks_retried": replayer.retried,
        "first_error": replayer.first_error,
    }


def count_db_statements(
    conn: pymysql.connections.Connection[Any], database: str, seconds: float
) -> dict[str, Any]:
    """Statements sent by ``database``'s connections during ``seconds`` (general log),
    and the server-wide ``Questions`` delta over the same window."""
    before = _db_threads(conn, database)
    with GeneralLog(conn) as glog:
        s0 = global_status(conn, ["Questions"])
        time.sleep(seconds)
        s1 = global_status(conn, ["Questions"])
        rows = glog.rows(before | _db_threads(conn, database))
    queries = [text for _, cmd, text in rows if cmd == "Query"]
    return {
        "statements": len(queries),
        "questions": s1["Questions"] - s0["Questions"],
        "by_kind": dict(Counter(_kind(q) for q in queries).most_common()),
    }
