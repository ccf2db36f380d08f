"""The batch row (reference §10.3): one batch of children while a worker is SIGKILLed and
the database restarts.

One user, one material per child (each text its own, so the per-user dedupe of
business rows never hides a second write), one ``POST /v1/ai/job-batches`` of
``quiz_generation`` children (retried with its ``Idempotency-Key`` on transient
errors). While children are in flight, the worker holding most of them is SIGKILLed
and started again; then, with children in flight again, the private MariaDB is
SIGKILLed and started again (no service restarted). Once the parent is terminal:

* every child passes the common audit (:mod:`chaos.audit`): exactly one terminal
  state, one result and its business rows once per succeeded child, a valid history;
* the parent ended exactly once: its history is a path of reference §10.3's parent
  states (created → pending → running, counts changing within a state, one move to
  a terminal state and nothing after it but counts), and its state is the one its
  counts give;
* its counts equal its children's states.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter
from typing import Any

import httpx

from chaos.mariadb import PrivateMariaDB
from chaos.scenario_run import Profile, Run, ScenarioResult
from chaos.system import System
from launcher.token import mint_token

NAME = "batch_faults"
#: Children of the batch (reference §10.3 allows 200 by default).
CHILDREN = 100
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
#: The parent's allowed moves (reference §10.3); a count change keeps the state.
PARENT_MOVES = frozenset(
    {
        (None, "pending"),
        ("pending", "running"),
        *((s, t) for s in ("pending", "running") for t in TERMINAL),
        *((s, s) for s in ("pending", "running", "cancelled")),
    }
)
#: Which count a child's state falls in.
BUCKET = {
    "pending": "pending",
    "locked": "running",
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}


def material_text(n: int) -> str:
    """A small study text whose every sentence is the child's own."""
    return (
        f"# Topic {n}\n\n"
        f"Cell type {n} stores its genes in a nucleus numbered {n}.\n\n"
        f"## Energy {n}\n\n"
        f"Mitochondria of type {n} make ATP from glucose in reaction {n}.\n\n"
        f"## Membrane {n}\n\n"
        f"The membrane of cell {n} controls what enters and leaves cell {n}.\n"
    )


async def _post(
    http: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str], run: Run
) -> dict[str, Any]:
    """POST, retried on transport errors and 5xx (a keyed create is replayed, never
    doubled); a 4xx ends the scenario."""
    delay = 0.1
    give_up = time.monotonic() + 60.0
    while True:
        try:
            reply = await http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            run.load.stats.transient[type(exc).__name__] += 1
        else:
            if reply.status_code in (200, 201):
                out: dict[str, Any] = reply.json()
                return out
            if reply.status_code < 500:
                raise RuntimeError(f"{path} refused: {reply.status_code} {reply.text}")
            run.load.stats.transient[f"HTTP_{reply.status_code}"] += 1
        if time.monotonic() > give_up:
            raise RuntimeError(f"{path} kept failing for 60 s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def _create(run: Run, system: System) -> str:
    """The batch's user, materials and batch; returns the parent's id."""
    user = f"chaos-{run.tag}-batch"
    token = mint_token(system.env["JWT_SECRET"], sub=user, role="user", ttl_seconds=24 * 3600)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=system.gateway_url, timeout=30.0, trust_env=False
    ) as http:
        targets = []
        for n in range(CHILDREN):
            body = {"title": f"Topic {n}", "content": material_text(n)}
            made = await _post(http, "/v1/materials", body, headers, run)
            targets.append(str(made["materialId"]))
        batch: dict[str, Any] = {
            "jobType": "quiz_generation",
            "targets": [{"targetType": "material", "targetId": t} for t in targets],
            "params": {"count": 2, "difficulty": "easy"},
        }
        keyed = {**headers, "Idempotency-Key": f"chaos-{run.tag}-batch"}
        parent = await _post(http, "/v1/ai/job-batches", batch, keyed, run)
    return str(parent["jobId"])


async def _children(run: Run, parent_id: str) -> list[tuple[str, str]]:
    rows = await run.sql(
        "SELECT job_id, status FROM ai_runtime_jobs WHERE parent_job_id = %s ORDER BY seq",
        (parent_id,),
    )
    return [(str(r[0]), str(r[1])) for r in rows]


async def _in_flight(run: Run, parent_id: str, minimum: int, limit_s: float = 30.0) -> set[str]:
    began = time.monotonic()
    while True:
        flying = {j for j, s in await _children(run, parent_id) if s in ("locked", "running")}
        if len(flying) >= minimum or time.monotonic() - began > limit_s:
            return flying
        await asyncio.sleep(0.1)


async def _kill_a_worker(run: Run, system: System, parent_id: str) -> dict[str, Any]:
    """SIGKILL the worker holding most children, start it again."""
    await _in_flight(run, parent_id, 2)
    flying = await run.in_flight()
    by_id = {v: k for k, v in system.worker_ids().items()}
    holders = Counter(h for h in flying.values() if h in by_id)
    if not holders:
        run.checks.append("no worker held a child when the kill was due")
        return {}
    victim, held = holders.most_common(1)[0]
    t0 = time.monotonic()
    run.fault_window(t0, t0)
    await system.launcher.stop_service(by_id[victim], signal.SIGKILL)
    await system.launcher.restart_service(by_id[victim])
    return {"worker": victim, "childrenHeld": held}


async def _restart_the_database(
    run: Run, system: System, db: PrivateMariaDB, parent_id: str
) -> Any:
    """SIGKILL the private MariaDB with children in flight, 2 s down, start it again."""
    flying = await _in_flight(run, parent_id, 2)
    pids = system.launcher.pids()
    t0 = time.monotonic()
    run.fault_window(t0)
    await asyncio.to_thread(db.restart, 2.0)
    run.close_window()
    if system.launcher.pids() != pids:
        run.checks.append("a service was restarted by the database restart")
    return {"outageSeconds": round(time.monotonic() - t0, 2), "inFlight": len(flying)}


async def parent_problems(run: Run, parent_id: str) -> list[str]:
    """What is wrong with the parent once it is terminal (module doc), empty when nothing."""
    rows = await run.sql(
        "SELECT status, error_code, batch_total, batch_pending, batch_running, batch_succeeded,"
        " batch_failed, batch_cancelled, min_success_ratio FROM ai_runtime_jobs WHERE job_id = %s",
        (parent_id,),
    )
    if not rows:
        return ["the parent is lost"]
    status, code, total, *counts, ratio = rows[0]
    problems: list[str] = []
    kids = await _children(run, parent_id)
    seen = Counter(BUCKET[s] for _, s in kids)
    mine = dict(
        zip(("pending", "running", "succeeded", "failed", "cancelled"), counts, strict=True)
    )
    if total != len(kids) or any(mine[k] != seen.get(k, 0) for k in mine):
        problems.append(f"counts {total} {mine} but children {len(kids)} {dict(seen)}")
    if status not in TERMINAL:
        problems.append(f"the parent is {status}")
    elif status != "cancelled":
        ok = mine["succeeded"] >= ratio * total - 1e-9
        if status != ("succeeded" if ok else "failed") or (code == "CHILD_JOBS_FAILED") == ok:
            problems.append(f"the parent is {status} ({code}) with counts {mine}")
    events = await run.sql(
        "SELECT from_status, to_status FROM ai_runtime_job_events WHERE job_id = %s ORDER BY seq",
        (parent_id,),
    )
    path = [(f, t) for f, t in events]
    bad = [step for step in path if step not in PARENT_MOVES]
    ends = [step for step in path if step[1] in TERMINAL and step[0] != step[1]]
    if bad or len(ends) != 1 or (path and path[-1][1] != status):
        problems.append(f"the parent's history {path[:3]}… bad {bad}, {len(ends)} endings")
    for before, after in itertools.pairwise(path):
        if after[0] != before[1]:
            problems.append(f"the parent's history breaks at {before} → {after}")
            break
    return problems


async def batch_faults(system: System, profile: Profile, db: PrivateMariaDB) -> ScenarioResult:
    """The row (module doc)."""
    run = Run(system, profile, NAME)
    await run.standin({"delayMs": 400})
    run.start_sampler()
    t0 = time.monotonic()
    parent_id = await _create(run, system)
    run.notes["createSeconds"] = round(time.monotonic() - t0, 2)
    kids = await _children(run, parent_id)
    run.load.stats.job_ids.extend(j for j, _ in kids)  # the common audit covers them
    run.notes["children"] = len(kids)
    run.notes["kill"] = await _kill_a_worker(run, system, parent_id)
    run.notes["databaseRestart"] = await _restart_the_database(run, system, db, parent_id)
    waited = await run.wait_terminal({parent_id}, profile.settle_seconds * 2)
    if waited is None:
        run.checks.append("the parent was not terminal in time")
    result = await run.finish(waited)
    problems = await parent_problems(run, parent_id)
    result.checks.extend(problems)
    result.notes["parent"] = (await run.sql(
        "SELECT status, batch_succeeded, batch_failed, batch_cancelled, version"
        " FROM ai_runtime_jobs WHERE job_id = %s",
        (parent_id,),
    ))[0]  # fmt: skip
    if len(kids) != CHILDREN:
        result.checks.append(f"{len(kids)} children, not {CHILDREN}")
    if result.audit.lease_expiries == 0:
        result.checks.append("no LEASE_EXPIRED retry: the kill caught no child in flight")
    return result
