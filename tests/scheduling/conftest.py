"""Fixtures of the scheduling tests over the real processes (reference §10.1, §10.2).

Each test starts its own system (the launcher, SQLite unless ``TEST_MYSQL_URL`` asks
for MariaDB through :func:`database_env`) with the settings it is about, and talks to
it as a client does: the public API to create, the runtime shim to claim (a claim
through the shim is a lease granted by job_service like the worker's own), the admin
API and the stand-in's controls to look.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.conftest import FAST_ENV, PARKED_TYPE, System, mysql_database, start_system

__all__ = ["PARKED_TYPE", "Client", "running"]


class Client:
    """A client of one running system: the public API, the shim, the admin API."""

    def __init__(self, system: System, http: httpx.AsyncClient) -> None:
        self.system = system
        self.http = http

    def auth(self, user: str, plan: str | None = None, role: str = "user") -> dict[str, str]:
        """The ``Authorization`` header of a token for ``user`` (with its ``plan``)."""
        return {"Authorization": f"Bearer {self.system.token(user, role, plan=plan)}"}

    async def create(
        self, user: str, job_type: str = PARKED_TYPE, *, plan: str | None = None, **body: Any
    ) -> dict[str, Any]:
        """A job of ``user`` on their own learning state (201)."""
        answer = await self.http.post(
            "/v1/ai/jobs",
            json={"jobType": job_type, "targetType": "user", **body},
            headers=self.auth(user, plan),
        )
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    async def admin_create(self, user: str, **body: Any) -> dict[str, Any]:
        """A job an admin creates for ``user`` (priority and the rest as given)."""
        answer = await self.http.post(
            "/admin/ai/jobs",
            json={
                "jobType": PARKED_TYPE,
                "targetType": "user",
                "targetId": user,
                "userId": user,
                **body,
            },
            headers=self.auth("ops", role="admin"),
        )
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    async def claim(self, n: int = 1, job_type: str = PARKED_TYPE) -> list[dict[str, Any]]:
        """Claim up to ``n`` jobs through the runtime shim, as instance ``sched-w``."""
        answer = await self.http.post(
            "/internal/runtime/jobs/claim",
            json={"capabilities": [job_type], "limit": n, "waitMs": 0},
            headers=self.system.runtime_headers("sched-w"),
        )
        assert answer.status_code == 200, answer.text
        return list(answer.json()["jobs"])

    async def job(self, job_id: str, user: str) -> dict[str, Any]:
        """``GET /v1/ai/jobs/{id}`` as ``user``."""
        answer = await self.http.get(f"/v1/ai/jobs/{job_id}", headers=self.auth(user))
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    async def admin(self, path: str) -> Any:
        """``GET`` an admin path."""
        answer = await self.http.get(path, headers=self.auth("ops", role="admin"))
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def standin(self, method: str, path: str, body: Any = None) -> Any:
        """A call to the model stand-in's controls (``/_standin/...``)."""
        base = self.system.env["DEEPSEEK_BASE_URL"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            answer = await http.request(method, path, json=body)
            answer.raise_for_status()
            return answer.json()


def database_env(tmp: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """Two fresh MariaDB databases when ``TEST_MYSQL_URL`` is set (the job and the
    credential database), else SQLite; and what drops them afterwards."""
    base = os.environ.get("TEST_MYSQL_URL")
    if not base:
        return {}, lambda: None
    job_db, drop_job = mysql_database(base)
    cred_db, drop_cred = mysql_database(base)

    def drop() -> None:
        drop_job()
        drop_cred()

    return {"DATABASE_URL": job_db, "CREDENTIAL_DATABASE_URL": cred_db}, drop


@asynccontextmanager
async def running(tmp: Path, env: dict[str, str], workers: int = 1) -> AsyncIterator[Client]:
    """A system with ``env`` on top of the fast settings and ``workers`` workers, and a
    client of it."""
    more, drop = database_env(tmp)
    # the shim's claims are never renewed: a lease longer than any test keeps them held
    held = {"LOCK_LEASE_SECONDS": "600", "USER_DAILY_JOB_QUOTA": "0"}
    system = await start_system(tmp, {**FAST_ENV, **held, **more, **env}, workers=workers)
    try:
        base = f"http://127.0.0.1:{system.env['GATEWAY_PORT']}"
        # idle connections are dropped well before the server's keep-alive (5 s) closes
        # them: a request sent on one the server is closing fails with a ReadError
        limits = httpx.Limits(keepalive_expiry=2.0)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
            yield Client(system, http)
    finally:
        await system.launcher.stop()
        drop()


async def eventually(check: Callable[[], Any], within: float = 30.0, every: float = 0.1) -> Any:
    """Await ``check()`` every ``every`` seconds until it returns something true, at most
    ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > deadline:
            pytest.fail(f"not true within {within} s")
        await asyncio.sleep(every)
