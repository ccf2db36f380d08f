"""The audit: what the database says after a fault (plain SQL, no service involved).

:func:`audit` reads ``ai_runtime_jobs``, ``ai_runtime_job_events``,
``ai_results``, the five business tables and the generation plans, and
checks, for the jobs a scenario created (reference §2.3-2.5):

* **lost** — a job the API acknowledged (201/200) that is not in the table;
* **stuck** — a job not terminal at the end of the scenario (after the
  settle wait), unless it is legitimately waiting (``pending`` with
  ``availableAt`` in the future);
* **duplicates** — a succeeded job with other than exactly one result row,
  business rows that do not match its result (rows per job = distinct items
  of the result; generation plans agree), or a job that did not succeed with
  any result or business row;
* **lease** problems — a live lease (``lockUntil`` ≥ now) whose holder is not
  a live worker, two holders (event actors) for one attempt, lock events whose
  ``attemptNo`` does not step by one;
* **history** problems — events that are not a valid path of the reference §2.3
  state machine: first event the creation (— → pending), each ``fromStatus``
  the previous ``toStatus``, the last ``toStatus`` the job's status;
  ``attemptNo`` = number of lock events, ``retryCount`` = number of retries,
  ``retryCount`` ≤ ``maxRetryCount``;
* **backoff** problems — a retry (not ``WORKER_SHUTDOWN``) locked again
  sooner than 90 % of ``RETRY_BACKOFF_BASE_SECONDS × 2^(n−1)`` (capped).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pymysql

from airuntime_common.canonical import content_hash

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

#: reference §2.3: allowed (fromStatus, toStatus) pairs of the event history.
ALLOWED_TRANSITIONS: frozenset[tuple[str | None, str]] = frozenset(
    {
        (None, "pending"),
        ("pending", "locked"),
        ("pending", "cancelled"),
        ("locked", "running"),
        *((s, t) for s in ("locked", "running") for t in ("succeeded", "failed", "pending")),
        *((s, t) for s in ("locked", "running") for t in ("expired", "cancelled")),
        ("expired", "pending"),
        ("expired", "failed"),
        ("expired", "cancelled"),
    }
)
RETRY_SOURCES = frozenset({"locked", "running", "expired"})
#: Statements of one transaction read NOW(6) at different instants: a retry's
#: event row may be written a little after the ``availableAt`` it computed.
BACKOFF_TOLERANCE_SECONDS = 0.05

#: Business table per job type, and how a result's output maps to items.
BUSINESS_TABLE: dict[str, str] = {
    "learning_state_analysis": "ai_learning_analyses",
    "weak_point_analysis": "ai_weak_point_candidates",
    "next_action_planning": "ai_next_action_recommendations",
    "quiz_generation": "ai_quiz_questions",
    "flashcard_generation": "ai_flashcards",
}
PLAN_TABLE: dict[str, str] = {
    "quiz_generation": "ai_question_generation_plans",
    "flashcard_generation": "ai_flashcard_generation_plans",
}


def output_items(job_type: str, output: Any) -> list[Any]:
    """The business items of a result's output (reference §5: the object itself or ``items``)."""
    if job_type == "learning_state_analysis":
        return [output]
    if isinstance(output, dict) and isinstance(output.get("items"), list):
        return list(output["items"])
    return []


@dataclass
class AuditReport:
    """The audit's findings for one scenario.

    Attributes:
        jobs: jobs the scenario created (acknowledged by the API).
        by_status: final status → count.
        failed_by_code: error code of failed jobs → count.
        lost: acknowledged but missing from the table.
        stuck: not terminal (nor legitimately waiting) at the end.
        waiting: pending with ``availableAt`` in the future (legitimate).
        duplicates: results/business rows not exactly once per succeeded job.
        problems: every finding, one human-readable line each (first 50 kept).
        counts: problems by kind (``lease``, ``history``, ``retry``, ``backoff``, ...).
        lease_expiries: retries caused by ``LEASE_EXPIRED`` (shows jobs were in flight).
        lease_losses_by_actor: ``LEASE_EXPIRED``/``JOB_TIMEOUT`` endings by the attempt's holder.
        retries: retries granted, by error code.
        attempts_max: the highest ``attemptNo`` seen.
        actors: job count per worker actor that finished a job.
    """

    jobs: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    failed_by_code: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    stuck: int = 0
    waiting: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    lease_expiries: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    attempts_max: int = 0
    actors: Counter[str] = field(default_factory=Counter)
    lease_losses_by_actor: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, message: str) -> None:
        """Record one finding of ``kind``."""
        self.counts[kind] += 1
        if len(self.problems) < 50:
            self.problems.append(f"{kind}: {message}")

    @property
    def violations(self) -> int:
        """Findings other than lost/stuck/duplicates (which have their own columns)."""
        return sum(v for k, v in self.counts.items() if k not in ("lost", "stuck", "duplicate"))

    @property
    def ok(self) -> bool:
        """No lost, stuck or duplicated job and no other finding."""
        return not self.counts

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return {
            "jobs": self.jobs,
            "byStatus": dict(self.by_status),
            "failedByCode": dict(self.failed_by_code),
            "lost": self.lost,
            "stuck": self.stuck,
            "waiting": self.waiting,
            "duplicates": self.duplicates,
            "violations": self.violations,
            "counts": dict(self.counts),
            "leaseExpiries": self.lease_expiries,
            "retries": dict(self.retries),
            "attemptsMax": self.attempts_max,
            "actors": dict(self.actors),
            "leaseLossesByActor": dict(self.lease_losses_by_actor),
            "problems": self.problems,
        }


@dataclass
class AuditConfig:
    """Settings the audit needs to judge timing.

    Attributes:
        backoff_base: ``RETRY_BACKOFF_BASE_SECONDS``.
        backoff_max: ``RETRY_BACKOFF_MAX_SECONDS``.
        live_workers: instance ids of the workers alive now (``None``: do not check holders).
    """

    backoff_base: float = 0.0
    backoff_max: float = 300.0
    live_workers: set[str] | None = None


def _rows(conn: pymysql.Connection, sql: str, args: Iterable[Any] | None = None) -> list[Any]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _as_json(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        value = value.decode()
    if isinstance(value, str):
        return json.loads(value)
    return value


@dataclass
class _Tables:
    """The rows the audit reads, in one connection."""

    now: datetime
    jobs: dict[str, tuple[Any, ...]]
    events: dict[str, list[tuple[Any, ...]]]
    results: dict[str, list[tuple[Any, ...]]]
    rows_per_job: dict[str, Counter[str]]
    plans: dict[str, tuple[Any, ...]]


def _read_tables(conn: pymysql.Connection) -> _Tables:
    now: datetime = _rows(conn, "SELECT NOW(6)")[0][0]
    jobs = {
        r[0]: r
        for r in _rows(
            conn,
            "SELECT job_id, job_type, status, retry_count, max_retry_count, attempt_no,"
            " locked_by, lock_until, available_at, error_code, cancel_requested"
            " FROM ai_runtime_jobs",
        )
    }
    events: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in _rows(
        conn,
        "SELECT job_id, from_status, to_status, error_code, actor, attempt_no, at"
        " FROM ai_runtime_job_events ORDER BY seq",
    ):
        events[r[0]].append(r)
    results: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in _rows(conn, "SELECT job_id, attempt_no, output FROM ai_results"):
        results[r[0]].append(r)
    rows_per_job: dict[str, Counter[str]] = {}
    for job_type, table in BUSINESS_TABLE.items():
        rows_per_job[job_type] = Counter(
            {
                r[0]: int(r[1])
                for r in _rows(conn, f"SELECT job_id, COUNT(*) FROM {table} GROUP BY job_id")
            }
        )
    plans: dict[str, tuple[Any, ...]] = {}
    for table in PLAN_TABLE.values():
        for r in _rows(conn, f"SELECT job_id, generated, written FROM {table}"):
            plans[r[0]] = r
    return _Tables(now, jobs, events, results, rows_per_job, plans)


def _check_rows_of_unsucceeded_jobs(t: _Tables, rep: AuditReport) -> None:
    """Database-wide: nothing but succeeded jobs has results or business rows."""
    for job_id in t.results:
        job = t.jobs.get(job_id)
        if job is None or job[2] != "succeeded":
            rep.duplicates += 1
            rep.add("duplicate", f"{job_id}: result row for a job in {job[2] if job else 'no row'}")
    for job_type, counter in t.rows_per_job.items():
        for job_id, n in counter.items():
            job = t.jobs.get(job_id)
            if job is None or job[2] != "succeeded":
                rep.duplicates += 1
                rep.add("duplicate", f"{job_id}: {n} {job_type} rows for a job not succeeded")


def _check_job_row(
    job_id: str, job: tuple[Any, ...], now: datetime, cfg: AuditConfig, rep: AuditReport
) -> None:
    """The job's status (stuck or legitimately waiting), its live lease's holder and
    its retry counters."""
    (_, _, status, retry_count, max_retry, attempt_no, locked_by, lock_until,
     available_at, error_code, _cancel) = job  # fmt: skip
    rep.by_status[status] += 1
    rep.attempts_max = max(rep.attempts_max, attempt_no)
    if status == "failed":
        rep.failed_by_code[error_code or "?"] += 1
    if status not in TERMINAL:
        if status == "pending" and available_at is not None and available_at > now:
            rep.waiting += 1
        else:
            rep.stuck += 1
            rep.add("stuck", f"{job_id}: still {status} (lockUntil {lock_until})")
    if (
        status in ("locked", "running")
        and lock_until is not None
        and lock_until >= now
        and cfg.live_workers is not None
        and locked_by not in cfg.live_workers
    ):
        rep.add("lease", f"{job_id}: live lease held by {locked_by}, not a live worker")
    if retry_count > max_retry:
        rep.add("retry", f"{job_id}: retryCount {retry_count} > maxRetryCount {max_retry}")
    if attempt_no not in (retry_count, retry_count + 1):
        rep.add("retry", f"{job_id}: attemptNo {attempt_no} vs retryCount {retry_count}")


@dataclass
class _Walk:
    """One job's event history read in order: what it adds up to so far."""

    job_id: str
    events: list[tuple[Any, ...]]
    cfg: AuditConfig
    rep: AuditReport
    status: str | None = None  # the last event's toStatus
    locks: int = 0
    retries: int = 0
    holders: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    last_retry_at: datetime | None = None
    last_retry_code: str | None = None

    def run(self) -> None:
        for i, (_, frm, to, _code, actor, ev_attempt, _at) in enumerate(self.events):
            if i > 0 and frm != self.status:
                self.rep.add(
                    "history", f"{self.job_id}: event {i} from {frm} but status was {self.status}"
                )
            if (frm, to) not in ALLOWED_TRANSITIONS:
                self.rep.add("history", f"{self.job_id}: transition {frm}→{to} not allowed")
            if actor and str(actor).startswith("runtime:") and ev_attempt:
                self.holders[int(ev_attempt)].add(str(actor))
            if frm == "pending" and to == "locked":
                self._lock(i)
            if to == "pending" and frm in RETRY_SOURCES:
                self._retry(i)
            self.status = to

    def _lock(self, i: int) -> None:
        """A lock: its attemptNo steps by one, and a retry waited out its backoff."""
        ev_attempt, at = self.events[i][5], self.events[i][6]
        self.locks += 1
        if ev_attempt != self.locks:
            self.rep.add("lease", f"{self.job_id}: lock #{self.locks} has attemptNo {ev_attempt}")
        if self.last_retry_at is not None and self.last_retry_code != "WORKER_SHUTDOWN":
            floor = 0.9 * min(
                self.cfg.backoff_base * 2 ** max(0, self.retries - 1), self.cfg.backoff_max
            )
            gap = (at - self.last_retry_at).total_seconds()
            if gap + BACKOFF_TOLERANCE_SECONDS < floor:
                self.rep.add(
                    "backoff",
                    f"{self.job_id}: retry {self.retries} ({self.last_retry_code}) locked after"
                    f" {gap:.3f} s < {floor:.3f} s",
                )
        self.last_retry_at = None

    def _retry(self, i: int) -> None:
        """A retry (back to pending): counted by its code, and by the holder whose
        lease it took for a lease expiry or a job timeout."""
        _, frm, _to, code, _actor, ev_attempt, at = self.events[i]
        self.retries += 1
        code_key = code or "?"
        # the expired → pending row carries the code of the expired row before it
        if frm == "expired" and i > 0:
            code_key = self.events[i - 1][3] or code_key
        self.rep.retries[code_key] += 1
        if code_key == "LEASE_EXPIRED":
            self.rep.lease_expiries += 1
        if code_key in ("LEASE_EXPIRED", "JOB_TIMEOUT"):
            for actor in self.holders.get(int(ev_attempt or 0), {"?"}):
                self.rep.lease_losses_by_actor[actor] += 1
        # measured from the first row of the retry's transaction (the
        # reaper's expired row), which precedes the availableAt it set
        self.last_retry_at = self.events[i - 1][6] if frm == "expired" and i > 0 else at
        self.last_retry_code = code_key


def _check_history(
    job_id: str,
    job: tuple[Any, ...],
    evs: list[tuple[Any, ...]],
    cfg: AuditConfig,
    rep: AuditReport,
) -> None:
    """The events are a valid path of the state machine that ends in the job's status,
    and agree with its counters; one holder per attempt."""
    status, retry_count, attempt_no = job[2], job[3], job[5]
    if not evs:
        rep.add("history", f"{job_id}: no events")
        return
    if evs[0][1] is not None or evs[0][2] != "pending":
        rep.add("history", f"{job_id}: first event {evs[0][1]}→{evs[0][2]}, not creation")
    walk = _Walk(job_id, evs, cfg, rep)
    walk.run()
    if walk.status != status:
        rep.add("history", f"{job_id}: last event →{walk.status} but status {status}")
    if walk.locks != attempt_no:
        rep.add("history", f"{job_id}: {walk.locks} lock events, attemptNo {attempt_no}")
    if walk.retries != retry_count:
        rep.add("history", f"{job_id}: {walk.retries} retries in events, retryCount {retry_count}")
    for attempt, actors in walk.holders.items():
        if len(actors) > 1:
            rep.add("lease", f"{job_id}: attempt {attempt} acted on by {sorted(actors)}")
    if status == "succeeded":
        for actor in walk.holders.get(attempt_no, set()):
            rep.actors[actor] += 1


def _check_exactly_once(job_id: str, job: tuple[Any, ...], t: _Tables, rep: AuditReport) -> None:
    """A succeeded job has one result, business rows = its distinct items, and a plan
    that agrees."""
    job_type, status, attempt_no = job[1], job[2], job[5]
    if status != "succeeded":
        return
    res = t.results.get(job_id, [])
    n_rows = t.rows_per_job[job_type].get(job_id, 0)
    if len(res) != 1:
        rep.duplicates += 1
        rep.add("duplicate", f"{job_id}: {len(res)} result rows")
        return
    items = output_items(job_type, _as_json(res[0][2]))
    distinct = len({content_hash(i) for i in items})
    if n_rows != distinct:
        rep.duplicates += 1
        rep.add("duplicate", f"{job_id}: {n_rows} business rows for {distinct} items")
    plan = t.plans.get(job_id)
    if job_type in PLAN_TABLE and (plan is None or plan[1] != len(items) or plan[2] != n_rows):
        rep.duplicates += 1
        rep.add("duplicate", f"{job_id}: plan {plan} vs {len(items)} items / {n_rows} rows")
    if res[0][1] != attempt_no:
        rep.add("history", f"{job_id}: result of attempt {res[0][1]}, job at {attempt_no}")


def audit(
    connect: Callable[[], pymysql.Connection],
    job_ids: Iterable[str],
    config: AuditConfig | None = None,
) -> AuditReport:
    """Audit the jobs ``job_ids`` (and, database-wide, rows of jobs that did not succeed).

    Args:
        connect: returns a new pymysql connection to the job_service database.
        job_ids: the jobs the scenario's load generator was told were created.
        config: timing and liveness settings.

    Returns:
        The report; ``report.ok`` when nothing was found.
    """
    cfg = config or AuditConfig()
    wanted = set(job_ids)
    rep = AuditReport(jobs=len(wanted))
    conn = connect()
    try:
        tables = _read_tables(conn)
    finally:
        conn.close()
    _check_rows_of_unsucceeded_jobs(tables, rep)
    for job_id in sorted(wanted):
        job = tables.jobs.get(job_id)
        if job is None:
            rep.lost += 1
            rep.add("lost", f"{job_id}: acknowledged at create, not in ai_runtime_jobs")
            continue
        _check_job_row(job_id, job, tables.now, cfg, rep)
        _check_history(job_id, job, tables.events.get(job_id, []), cfg, rep)
        _check_exactly_once(job_id, job, tables, rep)
    return rep
