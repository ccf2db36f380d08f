"""Fixtures of the security suite: one real system (every service a process), tokens, leak scans.

``system`` (package scope) starts the whole system with the launcher on SQLite
files, each service's output captured in ``<tmp>/logs/<name>.log``. The worker
is started WITHOUT the ``next_action_planning`` capability, so jobs of that type
stay ``pending`` unless a test drives them through the REST shim itself (the
authorization matrix relies on this for exact, race-free statuses).

Every HTTP answer a test receives through :meth:`System.client` is recorded
(status, headers, body) so the canary test can prove no body ever held a key.
Canaries registered with :meth:`System.add_canary` are checked once more after
the system stops: every log file and both database files.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from airuntime_common.db import mysql_async_driver
from launcher import Launcher, isolated_env
from launcher.token import mint_token

#: The one job type no worker of ``system`` handles (see module docstring).
PARKED_TYPE = "next_action_planning"
WORKER_TYPES = "learning_state_analysis,weak_point_analysis,quiz_generation,flashcard_generation"

FAST_ENV = {
    "POLL_INTERVAL_MS": "100",
    "LONG_POLL_WAIT_MS": "1000",
    "HEARTBEAT_INTERVAL_SECONDS": "1",
    "LOCK_LEASE_SECONDS": "10",
    "REAPER_INTERVAL_SECONDS": "1",
    "RETRY_BACKOFF_BASE_SECONDS": "1",
    "SHUTDOWN_GRACE_SECONDS": "2",
    "LOG_LEVEL": "DEBUG",
    "WORKER_CAPABILITIES": WORKER_TYPES,
}

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def windows(secret: str, size: int = 9) -> set[str]:
    """Every substring of ``secret`` of ``size`` characters (a leak of > 8 chars hits one)."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def leaks(text: str | bytes, canaries: Iterable[str]) -> list[str]:
    """The 9-character pieces of any canary that occur in ``text`` (empty: no leak)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return sorted({w for c in canaries for w in windows(c) if w in text})


def sqlite_dump(path: Path) -> str:
    """Every table of a SQLite database as SQL text (``iterdump``), plus the raw files."""
    parts: list[str] = []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        parts.extend(conn.iterdump())
    finally:
        conn.close()
    for suffix in ("", "-wal", "-journal"):
        p = Path(f"{path}{suffix}")
        if p.exists():
            parts.append(p.read_bytes().decode("latin-1"))
    return "\n".join(parts)


def mysql_dump(url: str) -> str:
    """``SELECT *`` of every table of a MariaDB database, rendered as text."""
    import pymysql

    u = make_url(url)
    conn = pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=u.database,
    )
    parts: list[str] = []
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            tables = [r[0] for r in cur.fetchall()]
            assert tables, f"no tables in {u.database}"
            for table in tables:
                cur.execute(f"SELECT * FROM `{table}`")
                for row in cur.fetchall():
                    parts.append(
                        f"{table}: "
                        + " | ".join(
                            v.decode("latin-1") if isinstance(v, bytes) else repr(v) for v in row
                        )
                    )
    finally:
        conn.close()
    return "\n".join(parts)


@dataclass
class Seen:
    """One HTTP answer a test received."""

    method: str
    url: str
    status: int
    headers: str
    body: bytes


@dataclass
class System:
    """A running system and what the tests saw of it."""

    launcher: Launcher
    var_dir: Path
    log_dir: Path
    job_db: str
    credential_db: str
    seen: list[Seen] = field(default_factory=list)
    canaries: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The children's shared environment (secrets, addresses)."""
        return self.launcher.env

    @property
    def service_token(self) -> str:
        """``RUNTIME_SERVICE_TOKEN``."""
        return self.env["RUNTIME_SERVICE_TOKEN"]

    def token(self, sub: str, role: str = "user", **kw: Any) -> str:
        """A valid HS256 JWT for ``sub``."""
        return mint_token(self.env["JWT_SECRET"], sub=sub, role=role, **kw)

    def bearer(self, sub: str, role: str = "user") -> dict[str, str]:
        """``Authorization`` header with a valid token for ``sub``."""
        return {"Authorization": f"Bearer {self.token(sub, role)}"}

    def runtime_headers(self, instance: str = "sec-instance") -> dict[str, str]:
        """Shim headers: the service token and an instance id."""
        return {"x-internal-api-key": self.service_token, "X-Runtime-Instance-Id": instance}

    def add_canary(self, value: str) -> str:
        """Register a secret that must never appear anywhere; returns it."""
        self.canaries.append(value)
        return value

    def client(self, base_url: str | None = None) -> httpx.AsyncClient:
        """An HTTP client (gateway by default) that records every answer in :attr:`seen`."""

        async def record(response: httpx.Response) -> None:
            await response.aread()
            self.seen.append(
                Seen(
                    response.request.method,
                    str(response.request.url),
                    response.status_code,
                    "\n".join(f"{k}: {v}" for k, v in response.headers.items()),
                    response.content,
                )
            )

        return httpx.AsyncClient(
            base_url=base_url or self.launcher.gateway_url,
            timeout=30.0,
            trust_env=False,
            event_hooks={"response": [record]},
        )

    def log_text(self) -> dict[str, str]:
        """Every service's log file, by file name."""
        return {p.name: p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log"))}

    def db_text(self) -> dict[str, str]:
        """Both databases, every table, as text."""
        out: dict[str, str] = {}
        for name, url in (("job_service", self.job_db), ("credential_service", self.credential_db)):
            if url.startswith("sqlite"):
                out[name] = sqlite_dump(Path(make_url(url).database or ""))
            else:
                out[name] = mysql_dump(url)
        return out

    def scan(self, canaries: Iterable[str] | None = None) -> list[str]:
        """Where any canary leaked: ``["<place>: <piece>", ...]`` (empty: nowhere)."""
        values = list(self.canaries if canaries is None else canaries)
        found: list[str] = []
        for name, text in {**self.log_text(), **self.db_text()}.items():
            found += [f"{name}: {w}" for w in leaks(text, values)]
        for s in self.seen:
            found += [
                f"HTTP {s.method} {s.url}: {w}" for w in leaks(s.headers.encode() + s.body, values)
            ]
        return found


async def wait_terminal(
    client: httpx.AsyncClient, job_id: str, headers: dict[str, str], within: float = 45.0
) -> dict[str, Any]:
    """Poll ``GET /v1/ai/jobs/{id}`` until the job is terminal (``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        resp = await client.get(f"/v1/ai/jobs/{job_id}", headers=headers)
        assert resp.status_code == 200, resp.text
        job: dict[str, Any] = resp.json()
        if job["status"] in TERMINAL:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']}"
        await _pause()


async def _pause(seconds: float = 0.1) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def user_id(prefix: str) -> str:
    """A fresh user id."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def random_canary(prefix: str) -> str:
    """``<prefix><40 random url-safe chars>``."""
    return prefix + secrets.token_hex(20)


def mysql_database(base_url: str) -> tuple[str, Any]:
    """Create a uniquely named database; returns its aiomysql URL and a drop function."""
    import pymysql

    u = make_url(base_url)
    name = f"airt_sec_{uuid.uuid4().hex[:10]}"

    def connect() -> Any:
        return pymysql.connect(
            host=u.host or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "root",
            password=u.password or "",
            autocommit=True,
        )

    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()

    def drop() -> None:
        c = connect()
        try:
            with c.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            c.close()

    url = u.set(drivername=mysql_async_driver(str(u)), database=name).render_as_string(
        hide_password=False
    )
    return url, drop


async def start_system(
    tmp: Path, extra_env: dict[str, str] | None = None, *, workers: int = 1
) -> System:
    """Start every service as a process (SQLite unless ``extra_env`` names databases)."""
    env = isolated_env(os.environ)
    env.update(FAST_ENV)
    env.update(extra_env or {})
    launcher = Launcher(
        env, dev=True, var_dir=tmp, log_dir=tmp / "logs", echo=False, workers=workers
    )
    await launcher.start()
    return System(
        launcher=launcher,
        var_dir=tmp,
        log_dir=tmp / "logs",
        job_db=launcher.env["DATABASE_URL"],
        credential_db=launcher.env["CREDENTIAL_DATABASE_URL"],
    )


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """The shared running system (SQLite); canaries are re-checked after it stops."""
    sys_ = await start_system(tmp_path_factory.mktemp("security-system"))
    try:
        yield sys_
    finally:
        await sys_.launcher.stop()
    if sys_.canaries:
        found = sys_.scan()
        assert not found, f"canary leaked after shutdown: {found[:20]}"


# ------------------------------------------------------------------ hostile tokens


def expired_token(sys_: System, sub: str, role: str = "user") -> str:
    """Correctly signed, expired a minute ago."""
    now = int(time.time())
    return jwt.encode(
        {"sub": sub, "role": role, "iat": now - 120, "exp": now - 60},
        sys_.env["JWT_SECRET"],
        algorithm="HS256",
    )


def wrong_signature_token(sub: str, role: str = "user") -> str:
    """HS256 with a different secret."""
    return jwt.encode(
        {"sub": sub, "role": role, "exp": int(time.time()) + 600},
        "not-the-secret-" + secrets.token_hex(32),
        algorithm="HS256",
    )


def alg_none_token(sub: str, role: str = "admin") -> str:
    """An unsigned token (``alg: none``) claiming admin."""
    return jwt.encode({"sub": sub, "role": role, "exp": int(time.time()) + 600}, "", "none")


def other_alg_token(sys_: System, alg: str, sub: str, role: str = "admin") -> str:
    """A token signed with the right secret but another algorithm (HS384/HS512) or RS256."""
    claims = {"sub": sub, "role": role, "exp": int(time.time()) + 600}
    if alg.startswith("HS"):
        with warnings.catch_warnings():  # the key is short for HS512: irrelevant here
            warnings.simplefilter("ignore")
            return jwt.encode(claims, sys_.env["JWT_SECRET"], algorithm=alg)
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(claims, key, algorithm=alg)
