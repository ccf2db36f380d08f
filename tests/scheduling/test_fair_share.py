"""Fair share across learners over the real processes (reference §10.1 (a)–(f)).

The order in which jobs are leased is read from the runtime shim's claims (a claim
is a lease granted by job_service, as the worker's); the start of a lone user's job
behind another's backlog from a real worker with 2 slots and a model answering in
1 s."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from tests.scheduling.conftest import Client, running

pytestmark = pytest.mark.e2e


def started(job: dict[str, object]) -> float:
    return datetime.fromisoformat(str(job["startedAt"]).replace("Z", "+00:00")).timestamp()


def created(job: dict[str, object]) -> float:
    return datetime.fromisoformat(str(job["createdAt"]).replace("Z", "+00:00")).timestamp()


async def backlog(
    client: Client, user: str, n: int, plan: str | None = None, at_once: int = 20
) -> list[str]:
    """``n`` waiting jobs of ``user``, created ``at_once`` at a time; their ids (in the
    creation order when one at a time)."""
    made: list[str] = []
    for start in range(0, n, at_once):
        batch = await asyncio.gather(
            *(client.create(user, plan=plan) for _ in range(min(at_once, n - start)))
        )
        made += [str(j["jobId"]) for j in batch]
    return made


async def test_the_order_of_leases(tmp_path: Path) -> None:
    """(a) one job each: creation order; (b) a backlog holds up no one: B, C, D within
    the next slots + 3 claims; (c) weights 2:1 share the claims 2:1 (± 10 %);
    (d) a user alone fills every slot; (e) priority first, and a retry keeps its place."""
    # no worker: the test's claims are the only ones, so no concurrent pick holds a row
    # the next claim would skip (a claim answers up to n jobs, SKIP LOCKED)
    async with running(tmp_path, {"PLAN_SCHEDULING_WEIGHTS": '{"gold": 2}'}, workers=0) as client:
        # (a)
        made = [str((await client.create(f"solo-{i}"))["jobId"]) for i in range(5)]
        assert [j["jobId"] for j in await client.claim(5)] == made
        # (b): slots + 3 with a claim of 2 at a time
        await backlog(client, "A", 1000)
        assert {j["userId"] for j in await client.claim(2)} == {"A"}
        late = [str((await client.create(u))["jobId"]) for u in ("B", "C", "D")]
        taken = [j["jobId"] for _ in range(3) for j in await client.claim(2)]
        assert set(late) <= set(taken[:5]), taken
        # (e): priority wins over fairness: F's job at priority 5, older and F's only,
        # waits behind E's at the default priority 0 (the highest)
        lazy = await client.admin_create("F", priority=5)
        urgent = await client.create("E")
        head = await client.claim(2)
        assert urgent["jobId"] in {j["jobId"] for j in head}
        assert lazy["jobId"] not in {j["jobId"] for j in head}
        # (d): the backlog's user takes every slot the claim asks for
        assert len(await client.claim(10)) == 10
    weights = {"PLAN_SCHEDULING_WEIGHTS": '{"gold": 2}'}
    async with running(tmp_path / "weights", weights, workers=0) as client:
        # (c)
        await backlog(client, "heavy", 330, plan="gold")
        await backlog(client, "light", 330)
        claimed = [j for _ in range(60) for j in await client.claim(5)]
        counts = Counter(j["userId"] for j in claimed)
        assert sum(counts.values()) == 300
        assert 1.8 <= counts["heavy"] / counts["light"] <= 2.2, counts


async def test_fifo_restores_the_creation_order(tmp_path: Path) -> None:
    """(f) ``SCHEDULING_POLICY=fifo``: oldest first, whatever each user's queue."""
    async with running(tmp_path, {"SCHEDULING_POLICY": "fifo"}, workers=0) as client:
        made = await backlog(client, "A", 30, at_once=1)
        made += [str((await client.create(u))["jobId"]) for u in ("B", "C")]
        made += await backlog(client, "A", 5, at_once=1)
        taken = [j["jobId"] for _ in range(10) for j in await client.claim(5)]
        assert taken[: len(made)] == made


async def test_a_lone_users_job_starts_within_3_s_behind_a_backlog(tmp_path: Path) -> None:
    """One worker of 2 slots, a model answering in 1 s: A holds 1,000 waiting jobs; the
    job each of B, C and D creates starts within 3 s of its create."""
    env = {"WORKER_CONCURRENCY": "2", "STANDIN_DELAY_MS": "1000"}
    async with running(tmp_path, env) as client:
        job_type = "learning_state_analysis"
        for _ in range(40):
            await asyncio.gather(*(client.create("A", job_type) for _ in range(25)))
        await asyncio.sleep(2)  # A is being served
        late = [await client.create(u, job_type) for u in ("B", "C", "D")]
        waits = []
        for job, user in zip(late, ("B", "C", "D"), strict=True):
            for _ in range(100):
                seen = await client.job(str(job["jobId"]), user)
                if seen["startedAt"]:
                    break
                await asyncio.sleep(0.1)
            waits.append(started(seen) - created(seen))
        assert all(w <= 3.0 for w in waits), waits
