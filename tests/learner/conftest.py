"""Fixtures of the learner's-data tests (reference §9.2): the whole system as real processes.

``system`` (package scope) is every service started by the launcher on SQLite files,
with the worker WITHOUT ``next_action_planning`` (:data:`PARKED_TYPE`): jobs of that
type stay pending, or leased to a test that claims them through the REST shim, so a
test can hold a job in flight exactly as long as it needs. ``mariadb_system`` starts
another system on two fresh MariaDB databases (skipped without ``TEST_MYSQL_URL``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.security.conftest import (
    PARKED_TYPE,
    System,
    mysql_database,
    start_system,
    user_id,
    wait_terminal,
)

DOC = (
    "# Photosynthesis\n\n"
    "Plants turn light into chemical energy inside chloroplasts.\n\n"
    "The light reactions split water and release oxygen.\n\n"
    "The Calvin cycle fixes carbon dioxide into sugar.\n"
)

#: ``USER_DAILY_JOB_QUOTA`` of :func:`mariadb_system` (its erasure test counts on it).
MARIADB_DAILY_QUOTA = 6

__all__ = [
    "DOC",
    "PARKED_TYPE",
    "Learner",
    "System",
    "logical_dump",
    "user_id",
    "wait_terminal",
]


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """The shared running system (SQLite)."""
    sys_ = await start_system(tmp_path_factory.mktemp("learner-system"))
    try:
        yield sys_
    finally:
        await sys_.launcher.stop()


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def mariadb_system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """A running system on two fresh MariaDB databases (job and credential)."""
    base = os.environ.get("TEST_MYSQL_URL")
    if not base:
        pytest.skip("TEST_MYSQL_URL not set")
    job_db, drop_job = mysql_database(base)
    cred_db, drop_cred = mysql_database(base)
    try:
        sys_ = await start_system(
            tmp_path_factory.mktemp("learner-mariadb"),
            {
                "DATABASE_URL": job_db,
                "CREDENTIAL_DATABASE_URL": cred_db,
                "USER_DAILY_JOB_QUOTA": str(MARIADB_DAILY_QUOTA),
            },
        )
        try:
            yield sys_
        finally:
            await sys_.launcher.stop()
    finally:
        drop_job()
        drop_cred()


def logical_dump(sys_: System) -> str:
    """Both databases as a logical dump: every row of every table (SQLite's
    ``iterdump``, MariaDB's rows); not the files' free pages or WAL frames."""
    import sqlite3
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from tests.security.conftest import mysql_dump

    parts: list[str] = []
    for url in (sys_.job_db, sys_.credential_db):
        if url.startswith("sqlite"):
            path = Path(make_url(url).database or "")
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                parts.extend(conn.iterdump())
            finally:
                conn.close()
        else:
            parts.append(mysql_dump(url))
    return "\n".join(parts)


class Learner:
    """One user of a running system: their token and a gateway client."""

    def __init__(self, sys_: System, prefix: str = "learner") -> None:
        self.sys = sys_
        self.user_id = user_id(prefix)
        self.headers = sys_.bearer(self.user_id)
        self.http = sys_.client()

    async def close(self) -> None:
        await self.http.aclose()

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.http.get(path, headers=self.headers, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        return await self.http.post(path, json=body or {}, headers=headers, **kw)

    async def delete(self, path: str) -> httpx.Response:
        return await self.http.delete(path, headers=self.headers)

    async def material(self, content: str = DOC, title: str = "Photosynthesis") -> dict[str, Any]:
        resp = await self.post("/v1/materials", {"title": title, "content": content})
        assert resp.status_code == 201, resp.text
        out: dict[str, Any] = resp.json()
        return out

    async def job(
        self, job_type: str, target_type: str, target_id: str, **kw: Any
    ) -> dict[str, Any]:
        body = {
            "jobType": job_type,
            "targetType": target_type,
            "targetId": target_id,
            "apiKeyMode": "platform_key",
            **kw,
        }
        resp = await self.post("/v1/ai/jobs", body)
        assert resp.status_code == 201, resp.text
        out: dict[str, Any] = resp.json()
        return out

    async def done(self, job_id: str) -> dict[str, Any]:
        return await wait_terminal(self.http, job_id, self.headers)


@pytest_asyncio.fixture(loop_scope="package")
async def learner(system: System) -> AsyncIterator[Learner]:
    """A fresh user of :func:`system`."""
    one = Learner(system)
    try:
        yield one
    finally:
        await one.close()
