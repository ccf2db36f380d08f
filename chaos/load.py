"""Steady load through the PUBLIC REST API (reference §3.1).

Each job gets its own user with its own small material, so a succeeded job's
business rows can be counted exactly (the per-user dedupe of reference §5 never
hides a second write). A create carries an ``Idempotency-Key`` and is retried
with the same key on transport errors and 5xx answers (other than
``PLATFORM_CIRCUIT_OPEN``) for up to ``retry_seconds``: a create that committed
but whose answer was lost is then replayed, never duplicated.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from launcher.token import mint_token

#: (jobType, targetType, params) in rotation.
JOB_MIX: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("learning_state_analysis", "user", None),
    ("quiz_generation", "material", {"count": 3, "difficulty": "easy"}),
    ("weak_point_analysis", "user", None),
    ("flashcard_generation", "material", {"count": 3}),
    ("next_action_planning", "user", None),
)

#: A small study text; ``{n}`` makes each material's blocks its own.
MATERIAL_TEXT = """# Cells and energy {n}

A cell is the basic unit of life, and every organism is built from one or more cells.

## The nucleus

The nucleus is the control centre of the cell: it stores DNA, which carries the genes.

## Mitochondria

Mitochondria are called the powerhouse of the cell because they make ATP from glucose
and oxygen in a process named cellular respiration.

## Membranes

The cell membrane is a thin layer of lipids that controls what enters and leaves the cell.
"""

#: Codes that mean "refused on purpose" (counted, not retried).
DEFINITE_REFUSALS = frozenset(
    {"PLATFORM_CIRCUIT_OPEN", "QUOTA_EXCEEDED", "PLATFORM_BUDGET_EXCEEDED", "AI_NOT_AUTHORIZED"}
)


@dataclass
class LoadStats:
    """What the load generator saw.

    Attributes:
        job_ids: jobs acknowledged by the API (201, or 200 on a replay).
        refused: definite refusals by reference §4 code.
        gave_up: creates abandoned after ``retry_seconds`` of transient errors, by cause.
        transient: transient errors that were retried, by cause.
        replays: creates answered 200 ``Idempotent-Replayed`` after a retry.
        created_at: monotonic time of each acknowledgement, by job id.
    """

    job_ids: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    gave_up: Counter[str] = field(default_factory=Counter)
    transient: Counter[str] = field(default_factory=Counter)
    replays: int = 0
    created_at: dict[str, float] = field(default_factory=dict)


class LoadGenerator:
    """Creates jobs at a steady rate through the gateway.

    Args:
        gateway_url: base URL of the public API.
        jwt_secret: ``JWT_SECRET`` to mint user tokens.
        tag: run tag, part of every user id (``chaos-<tag>-<n>``).
        concurrency: most creates in flight at once.
        retry_seconds: how long one create is retried on transient errors.
        timeout: HTTP timeout of one request (s).
    """

    def __init__(
        self,
        gateway_url: str,
        jwt_secret: str,
        *,
        tag: str | None = None,
        concurrency: int = 16,
        retry_seconds: float = 60.0,
        timeout: float = 15.0,
    ) -> None:
        self.gateway_url = gateway_url
        self.jwt_secret = jwt_secret
        self.tag = tag or uuid.uuid4().hex[:8]
        self.stats = LoadStats()
        self.retry_seconds = retry_seconds
        self._sem = asyncio.Semaphore(concurrency)
        self._client = httpx.AsyncClient(
            base_url=gateway_url,
            timeout=timeout,
            trust_env=False,
            limits=httpx.Limits(max_connections=concurrency + 4),
        )
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Wait for creates in flight, then close the HTTP client."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def run(self, count: int, rate: float, stop: asyncio.Event | None = None) -> LoadStats:
        """Create ``count`` jobs at ``rate`` per second (``stop`` ends early).

        Returns when every create has been answered or abandoned.
        """
        began = time.monotonic()
        for i in range(count):
            if stop is not None and stop.is_set():
                break
            delay = began + i / rate - time.monotonic() if rate > 0 else 0
            if delay > 0:
                if stop is not None:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        break
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            await self._sem.acquire()
            task = asyncio.create_task(self._one())
            self._tasks.add(task)
            task.add_done_callback(self._done)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        return self.stats

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._sem.release()

    async def _one(self) -> None:
        self._seq += 1
        n = self._seq
        user = f"chaos-{self.tag}-{n}"
        token = mint_token(self.jwt_secret, sub=user, role="user", ttl_seconds=24 * 3600)
        headers = {"Authorization": f"Bearer {token}"}
        job_type, target_type, params = JOB_MIX[n % len(JOB_MIX)]
        material = await self._request(
            "POST",
            "/v1/materials",
            {"title": f"Cells {n}", "content": MATERIAL_TEXT.format(n=n)},
            headers,
        )
        if material is None:
            return
        body: dict[str, Any] = {
            "jobType": job_type,
            "targetType": target_type,
            "targetId": material["materialId"] if target_type == "material" else user,
        }
        if params is not None:
            body["params"] = params
        job_headers = {**headers, "Idempotency-Key": f"chaos-{self.tag}-{n}"}
        job = await self._request("POST", "/v1/ai/jobs", body, job_headers)
        if job is not None:
            self.stats.job_ids.append(str(job["jobId"]))
            self.stats.created_at[str(job["jobId"])] = time.monotonic()

    async def _request(
        self, method: str, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any] | None:
        give_up = time.monotonic() + self.retry_seconds
        delay = 0.1
        retried = False
        while True:
            cause: str
            try:
                reply = await self._client.request(method, path, json=body, headers=headers)
            except httpx.HTTPError as exc:
                cause = type(exc).__name__
            else:
                if reply.status_code in (200, 201):
                    if retried and reply.headers.get("Idempotent-Replayed") == "true":
                        self.stats.replays += 1
                    data: dict[str, Any] = reply.json()
                    return data
                try:
                    code = str(reply.json().get("code"))
                except ValueError:
                    code = f"HTTP_{reply.status_code}"
                if reply.status_code < 500 or code in DEFINITE_REFUSALS:
                    self.stats.refused[code] += 1
                    return None
                cause = code
            self.stats.transient[cause] += 1
            if time.monotonic() >= give_up:
                self.stats.gave_up[cause] += 1
                return None
            retried = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
