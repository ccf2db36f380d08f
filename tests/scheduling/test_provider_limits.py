"""Provider rate limits over the real processes (reference §10.2).

A model stand-in that keeps its own per-minute limit (answering 429 past it, as a
provider does) behind a ``MODEL_PROVIDERS`` entry with the same ``requestsPerMinute``:
the limiter must keep every worker under it (no 429, no 60-second window over the
limit) and the provider busy; a provider's 429 with ``Retry-After`` must keep every
worker off it for that long.

The CI profile runs 30 jobs at 20 a minute (about 65 s); ``-m slow`` runs the full
one, 200 jobs of 10 users at 60 a minute (about 3.5 minutes).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.scheduling.conftest import Client, eventually, running

pytestmark = pytest.mark.e2e

JOB_TYPE = "learning_state_analysis"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def providers(limits: dict[str, int] | None = None) -> str:
    """``MODEL_PROVIDERS`` of one DeepSeek-compatible provider (the launcher points it at
    a stand-in of its own) with ``limits``."""
    entry: dict[str, Any] = {
        "name": "deepseek",
        "baseUrl": "https://api.deepseek.com",
        "apiKeyEnv": "DEEPSEEK_API_KEY",
    }
    if limits:
        entry["limits"] = limits
    return json.dumps([entry])


def standin_url(client: Client) -> str:
    """The base URL of the stand-in playing the provider (as the launcher rewrote it)."""
    return str(json.loads(client.system.env["MODEL_PROVIDERS"])[0]["baseUrl"])


async def standin(client: Client, method: str, path: str, body: Any = None) -> Any:
    """A call to the provider stand-in's controls."""
    client.system.env["DEEPSEEK_BASE_URL"] = standin_url(client)
    return await client.standin(method, path, body)


async def create_all(client: Client, users: int, each: int) -> list[tuple[str, str]]:
    """``each`` platform-key jobs for each of ``users`` users; ``(jobId, user)`` each."""
    made: list[tuple[str, str]] = []
    for _ in range(each):
        batch = await asyncio.gather(*(client.create(f"u{u}", JOB_TYPE) for u in range(users)))
        made += [(str(j["jobId"]), str(j["userId"])) for j in batch]
    return made


async def statuses(client: Client, made: list[tuple[str, str]]) -> dict[str, str]:
    """Each job's status (read 20 at a time)."""
    gate = asyncio.Semaphore(20)

    async def one(job: str, user: str) -> dict[str, Any]:
        async with gate:
            return await client.job(job, user)

    seen = await asyncio.gather(*(one(job, user) for job, user in made))
    return {str(j["jobId"]): str(j["status"]) for j in seen}


def most_in_any_window(times: list[float], window: float = 60.0) -> int:
    """The most of ``times`` (s) that fall in any half-open window of ``window`` s."""
    times = sorted(times)
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def busy_share(times: list[float], per_minute: int) -> float:
    """How close the pace came to the limit's: the span the limit itself needs for these
    calls (a full window per ``per_minute`` of them after the first batch) over the span
    they took, first call to last (1.0: as fast as the limit allows)."""
    times = sorted(times)
    needed = (len(times) - 1) // per_minute * 60.0
    took = times[-1] - times[0]
    return 1.0 if took <= 0 else min(1.0, needed / took)


async def limited_run(tmp_path: Path, per_minute: int, users: int, each: int) -> None:
    env = {
        "MODEL_PROVIDERS": providers({"requestsPerMinute": per_minute}),
        "WORKER_CONCURRENCY": "8",
        "STANDIN_DELAY_MS": "200",
    }
    async with running(tmp_path, env) as client:
        await standin(client, "POST", "/_standin/faults", {"requestsPerMinute": per_minute})
        made = await create_all(client, users, each)
        n = len(made)
        expected = (n - 1) // per_minute * 62 + 60

        async def done() -> bool:
            return set((await statuses(client, made)).values()) <= TERMINAL

        await eventually(done, within=expected, every=2.0)
        final = await statuses(client, made)
        assert set(final.values()) == {"succeeded"}, final
        stats = await standin(client, "GET", "/_standin/stats")
        assert "status_429" not in stats["byOutcome"], stats
        calls = stats["admittedAt"]
        assert len(calls) == n
        most, busy = most_in_any_window(calls), busy_share(calls, per_minute)
        print(f"{n} jobs at {per_minute}/min: 429s 0, most in a 60 s window {most},", end=" ")
        print(f"pace {busy:.3f} of the limit's, span {max(calls) - min(calls):.1f} s")
        assert most <= per_minute
        assert busy >= 0.8, calls
        listed = await client.admin("/admin/ai/providers")
        (deepseek,) = listed["providers"]
        assert deepseek["limits"]["requestsPerMinute"] == per_minute
        assert deepseek["usage"]["requestsLastMinute"] <= per_minute
        assert deepseek["usage"]["inFlight"] == 0


async def test_a_limited_provider_is_never_over_its_limit_and_kept_busy(tmp_path: Path) -> None:
    """30 platform-key jobs of 10 users, a provider of 20 a minute: none answered 429,
    no 60-second window over 20 calls, every job succeeds, the pace ≥ 80 % of the
    limit's."""
    await limited_run(tmp_path, per_minute=20, users=10, each=3)


@pytest.mark.slow
async def test_200_jobs_of_10_users_at_60_a_minute(tmp_path: Path) -> None:
    """The full profile: 200 platform-key jobs of 10 users, a provider of 60 a minute."""
    await limited_run(tmp_path, per_minute=60, users=10, each=20)


async def test_a_429_keeps_every_worker_off_the_provider_for_its_retry_after(
    tmp_path: Path,
) -> None:
    """A 429 with ``Retry-After: 20``: the provider is listed paused, and no call reaches
    it for 20 s after the 429 (the retry, nor 8 more jobs on two workers); then every
    job succeeds."""
    env = {"MODEL_PROVIDERS": providers(), "WORKER_CONCURRENCY": "2"}
    async with running(tmp_path, env, workers=2) as client:
        await standin(
            client,
            "POST",
            "/_standin/faults",
            {"faults": [{"kind": "status", "status": 429, "retryAfter": 20}]},
        )
        made = await create_all(client, users=1, each=1)

        async def answered_429() -> list[dict[str, Any]]:
            log = (await standin(client, "GET", "/_standin/requests"))["requests"]
            return [e for e in log if e.get("outcome") == "status_429"]

        (first,) = await eventually(answered_429, within=30)
        listed = await eventually(lambda: _paused(client), within=10)  # as recorded
        assert listed["pausedUntil"] is not None
        more = await create_all(client, users=4, each=2)

        async def done() -> bool:
            every = await statuses(client, made + more)
            return set(every.values()) <= TERMINAL

        await eventually(done, within=60, every=1.0)
        assert set((await statuses(client, made + more)).values()) == {"succeeded"}
        log = (await standin(client, "GET", "/_standin/requests"))["requests"]
        after = sorted(e["at"] for e in log if e["at"] > first["at"])
        assert after, log
        assert after[0] - first["at"] >= 20.0, (first, after[:3])


async def _paused(client: Client) -> dict[str, Any] | None:
    listed = await client.admin("/admin/ai/providers")
    (deepseek,) = listed["providers"]
    return deepseek if deepseek["pausedUntil"] else None
