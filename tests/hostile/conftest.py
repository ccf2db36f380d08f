"""A live stack for hostile-input tests: real job_service, credential_service and gateway.

The three servers run in one background thread with its own event loop (so
synchronous clients — schemathesis' ``requests``, the ``grpcurl`` binary — and
async tests alike can call them), on SQLite files under a temporary directory:

* job_service (real learning-data modules, migrations on start),
* credential_service (real vault, lease checks against that job_service,
  the local stand-in platform key allowed),
* the real gateway app under uvicorn, connected to both over gRPC.

``stack`` is session-scoped: it starts once (≈1 s) for every test here. It also
seeds learning data and jobs for :data:`USER` so generated path ids sometimes
exist, and offers :meth:`Stack.fingerprint` — a digest of every row of both
databases — so a test can prove a refused request changed nothing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import sqlite3
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from launcher.token import mint_token

TOKEN = "hostile-service-token"
JWT_SECRET = "hostile-jwt-secret-0123456789abcdef"
USER = "u-hostile"
OTHER_USER = "u-other"
ADMIN = "admin-hostile"
INSTANCE = "worker-hostile"

#: Tables whose rows legitimately change on a read-only call (worker registry
#: ``lastSeenAt`` on poll/heartbeat): left out of the "nothing changed" digest.
VOLATILE_TABLES = frozenset({"ai_runtime_workers", "alembic_version"})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _table_digest(db_path: Path) -> dict[str, str]:
    """sha256 of every table's rows (sorted), read through a separate connection."""
    out: dict[str, str] = {}
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in sorted(tables):
            if table in VOLATILE_TABLES:
                continue
            rows = sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{table}"'))
            out[table] = hashlib.sha256("\n".join(rows).encode()).hexdigest() + f":{len(rows)}"
    finally:
        conn.close()
    return out


@dataclass
class Seed:
    """Ids that exist for :data:`USER` (and one foreign material)."""

    material_id: str = ""
    block_ids: list[str] = field(default_factory=list)
    knowledge_point_id: str = ""
    job_ids: list[str] = field(default_factory=list)
    other_material_id: str = ""


@dataclass
class Stack:
    """Handles of the running stack (see the module docstring)."""

    tmp: Path
    job_addr: str = ""
    cred_addr: str = ""
    base_url: str = ""
    loop: asyncio.AbstractEventLoop | None = None
    seed: Seed = field(default_factory=Seed)

    @property
    def job_db(self) -> Path:
        return self.tmp / "job.db"

    @property
    def cred_db(self) -> Path:
        return self.tmp / "cred.db"

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        """Run ``coro`` on the stack's loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def fingerprint(self) -> dict[str, str]:
        """Digest of every row of both databases (volatile registry table excluded)."""
        return {
            **{f"job.{k}": v for k, v in _table_digest(self.job_db).items()},
            **{f"cred.{k}": v for k, v in _table_digest(self.cred_db).items()},
        }

    # ------------------------------------------------------------------ headers

    @staticmethod
    def user_headers(sub: str = USER) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint_token(JWT_SECRET, sub=sub, role='user')}"}

    @staticmethod
    def admin_headers() -> dict[str, str]:
        return {"Authorization": f"Bearer {mint_token(JWT_SECRET, sub=ADMIN, role='admin')}"}

    @staticmethod
    def runtime_headers(instance: str = INSTANCE) -> dict[str, str]:
        return {"x-internal-api-key": TOKEN, "X-Runtime-Instance-Id": instance}

    def headers_for(self, path: str) -> dict[str, str]:
        """The valid credentials for a route by its prefix."""
        if path.startswith("/admin"):
            return self.admin_headers()
        if path.startswith("/internal"):
            return self.runtime_headers()
        return self.user_headers()


def _make_keys() -> str:
    return "k1:" + base64.b64encode(os.urandom(32)).decode()


async def _start(stack: Stack, started: Future[None], stop: asyncio.Event) -> None:
    import grpc

    from api_gateway.app import create_app
    from api_gateway.settings import GatewaySettings
    from credential_service.app import serve as serve_cred
    from credential_service.settings import CredentialSettings
    from job_service.app import serve as serve_job
    from job_service.settings import JobServiceSettings

    job_port = _free_port()
    cred = await serve_cred(
        CredentialSettings(
            CREDENTIAL_DATABASE_URL=f"sqlite+aiosqlite:///{stack.cred_db}",
            CREDENTIAL_ENCRYPTION_KEYS=_make_keys(),
            RUNTIME_SERVICE_TOKEN=TOKEN,
            CREDENTIAL_SERVICE_LISTEN="127.0.0.1:0",
            CREDENTIAL_SERVICE_METRICS_PORT=0,
            JOB_SERVICE_ADDR=f"127.0.0.1:{job_port}",
            ALLOW_PLATFORM_KEY_STANDIN=True,
            DEEPSEEK_BASE_URL="http://127.0.0.1:9/standin",
        )
    )
    stack.cred_addr = f"127.0.0.1:{cred.port}"
    job = await serve_job(
        JobServiceSettings(
            DATABASE_URL=f"sqlite+aiosqlite:///{stack.job_db}",
            RUNTIME_SERVICE_TOKEN=TOKEN,
            JOB_SERVICE_LISTEN=f"127.0.0.1:{job_port}",
            JOB_SERVICE_METRICS_PORT=0,
            CREDENTIAL_SERVICE_ADDR=stack.cred_addr,
            LOCK_LEASE_SECONDS=30,
            REAPER_INTERVAL_SECONDS=3600,
            USER_DAILY_JOB_QUOTA=0,
            JOB_SERVICE_MIGRATE_ON_START=True,
        ),
        start_metrics=False,
    )
    stack.job_addr = job.address
    job_channel = grpc.aio.insecure_channel(stack.job_addr)
    cred_channel = grpc.aio.insecure_channel(stack.cred_addr)
    app = create_app(
        GatewaySettings(
            RUNTIME_SERVICE_TOKEN=TOKEN,
            JWT_SECRET=JWT_SECRET,
            JOB_SERVICE_ADDR=stack.job_addr,
            CREDENTIAL_SERVICE_ADDR=stack.cred_addr,
            GRPC_TIMEOUT_SECONDS=10.0,
        ),
        job_channel=job_channel,
        credential_channel=cred_channel,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    )
    serve_task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serve_task.done():
            serve_task.result()
        await asyncio.sleep(0.01)
    stack.base_url = f"http://127.0.0.1:{port}"
    started.set_result(None)
    try:
        await stop.wait()
    finally:
        server.should_exit = True
        await serve_task
        await job_channel.close()
        await cred_channel.close()
        await job.stop(grace=0.2)
        await cred.stop(grace=0.2)


def _seed(stack: Stack) -> None:
    """Learning data and a few jobs for :data:`USER`, one material of :data:`OTHER_USER`."""
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        user = stack.user_headers()
        r = http.post(
            "/v1/materials",
            headers=user,
            json={
                "title": "Cells",
                "content": "# Membrane\n\nThe membrane keeps the cell together.\n\n"
                "# Nucleus\n\nThe nucleus holds the DNA.",
            },
        )
        assert r.status_code == 201, r.text
        stack.seed.material_id = r.json()["materialId"]
        stack.seed.block_ids = [b["blockId"] for b in r.json()["blocks"]]
        r = http.post(
            "/v1/knowledge-points",
            headers=user,
            json={
                "materialId": stack.seed.material_id,
                "name": "membrane",
                "blockIds": stack.seed.block_ids[:1],
            },
        )
        assert r.status_code == 201, r.text
        stack.seed.knowledge_point_id = r.json()["knowledgePointId"]
        for body in (
            {"jobType": "learning_state_analysis", "targetType": "user"},
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": stack.seed.material_id,
                "params": {"count": 2},
            },
            {
                "jobType": "flashcard_generation",
                "targetType": "knowledge_point",
                "targetId": stack.seed.knowledge_point_id,
            },
        ):
            r = http.post("/v1/ai/jobs", headers=user, json=body)
            assert r.status_code == 201, r.text
            stack.seed.job_ids.append(r.json()["jobId"])
        r = http.post(
            "/v1/materials",
            headers=stack.user_headers(OTHER_USER),
            json={"title": "Other", "content": "Someone else's text."},
        )
        assert r.status_code == 201, r.text
        stack.seed.other_material_id = r.json()["materialId"]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The running stack (session-wide), seeded."""
    st = Stack(tmp=tmp_path_factory.mktemp("hostile"))
    started: Future[None] = Future()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def thread_main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        st.loop = loop
        stop = asyncio.Event()
        holder["stop"] = stop
        ready.set()
        try:
            loop.run_until_complete(_start(st, started, stop))
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise
        finally:
            loop.close()

    thread = threading.Thread(target=thread_main, name="hostile-stack", daemon=True)
    thread.start()
    ready.wait(10)
    started.result(timeout=60)
    _seed(st)
    try:
        yield st
    finally:
        assert st.loop is not None
        st.loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
