"""Fixtures of the end-to-end tests: the whole system as real processes.

:class:`RunningSystem` drives a :class:`launcher.core.Launcher` (dev mode: the
local model stand-in, generated secrets, free ports) on an event loop in a
background thread, so the children's output keeps being pumped while a test
blocks (Selenium, ``grpcurl`` subprocesses). Tests talk to it synchronously.

``system`` is one SQLite-backed system shared by every test of the session
(its Prometheus endpoints are on, on free ports); a test that needs another
database starts its own with :meth:`RunningSystem.start`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from demo.flow import Demo, DemoOutcome
from launcher.core import Launcher
from launcher.plan import free_port, isolated_env
from launcher.token import mint_token

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_DOCUMENT = REPO_ROOT / "demo" / "documents" / "photosynthesis.md"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
METRICS_VARS = (
    "JOB_SERVICE_METRICS_PORT",
    "CREDENTIAL_SERVICE_METRICS_PORT",
    "WORKER_METRICS_PORT",
)


@dataclass
class DemoRun:
    """One run of :class:`demo.flow.Demo`: its verdict, the user and their material."""

    outcome: DemoOutcome
    user_id: str
    token: str
    material_id: str
    kp_ids: set[str]
    lines: list[str] = field(default_factory=list)


class RunningSystem:
    """Every service as a real process, started by the launcher.

    Args:
        tmp: a directory for the var dir (``tmp/var``: SQLite files,
            ``dev-secrets.env``) and the logs (``tmp/logs/<service>.log``).
        extra_env: variables set on top of :func:`launcher.plan.isolated_env`
            (e.g. ``DATABASE_URL`` for MariaDB).
        metrics: serve every service's Prometheus endpoint on a free port.
        job_services: job_service replicas (the launcher's ``--job-services``).
    """

    def __init__(
        self,
        tmp: Path,
        extra_env: Mapping[str, str] | None = None,
        *,
        metrics: bool = False,
        job_services: int = 1,
    ) -> None:
        env = isolated_env(os.environ)
        env["POLL_INTERVAL_MS"] = "200"
        env["LOG_LEVEL"] = env.get("LOG_LEVEL") or "INFO"
        if metrics:
            for name in METRICS_VARS:
                env[name] = str(free_port())
            env["METRICS_REFRESH_SECONDS"] = "0.3"  # queue-depth / breaker gauges
        env.update(extra_env or {})
        self.tmp = tmp
        self.var_dir = tmp / "var"
        self.log_dir = tmp / "logs"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="e2e-launcher", daemon=True
        )
        self._thread.start()
        self.launcher = Launcher(
            env,
            dev=True,
            var_dir=self.var_dir,
            log_dir=self.log_dir,
            echo=False,
            workers=1,
            job_services=job_services,
        )

    # -- lifecycle ------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run a coroutine on the launcher's loop and wait for its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    @classmethod
    def start(
        cls,
        tmp: Path,
        extra_env: Mapping[str, str] | None = None,
        *,
        metrics: bool = False,
        job_services: int = 1,
    ) -> RunningSystem:
        """Start a system and wait until every service is ready."""
        system = cls(tmp, extra_env, metrics=metrics, job_services=job_services)
        try:
            system.run(system.launcher.start())
        except BaseException:
            system.close()
            raise
        return system

    def close(self) -> None:
        """Stop every service and the loop thread."""
        try:
            if self._loop.is_running():
                self.run(self.launcher.stop(), timeout=90.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # -- addresses and credentials --------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The children's shared environment (secrets, addresses, ports)."""
        return self.launcher.env

    @property
    def gateway_url(self) -> str:
        """The public REST API, e.g. ``http://127.0.0.1:41234``."""
        return self.launcher.gateway_url

    @property
    def standin_url(self) -> str:
        """The model stand-in's base URL (``/_standin/faults``)."""
        url = self.launcher.standin_url
        assert url is not None
        return url

    @property
    def internal_token(self) -> str:
        """``RUNTIME_SERVICE_TOKEN`` (``x-internal-api-key``)."""
        return self.env["RUNTIME_SERVICE_TOKEN"]

    def addr(self, var: str) -> str:
        """A gRPC target from the environment (``JOB_SERVICE_ADDR`` …) as ``host:port``."""
        return self.env[var]

    def metrics_url(self, var: str) -> str:
        """``http://127.0.0.1:<port>/metrics`` of the service whose port variable is ``var``."""
        return f"http://127.0.0.1:{self.env[var]}/metrics"

    def token(self, sub: str, role: str = "user") -> str:
        """A JWT the gateway accepts (``role`` user or admin), valid for an hour."""
        return mint_token(
            self.env["JWT_SECRET"],
            sub=sub,
            role=role,
            ttl_seconds=3600,
            issuer=self.env.get("JWT_ISSUER") or None,
        )

    def client(self, token: str | None = None) -> httpx.Client:
        """A synchronous client of the gateway (no proxies), with a bearer token if given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.gateway_url, headers=headers, timeout=30.0, trust_env=False
        )

    def log_text(self, name: str) -> str:
        """The whole log file of one service (for failure messages)."""
        path = self.launcher.log_path(name)
        return path.read_text(encoding="utf-8", errors="replace") if path and path.exists() else ""

    def diagnostics(self) -> str:
        """The last lines of every service's log."""
        parts = []
        for spec in self.launcher.plan.services:
            parts.append(f"--- {spec.name} ---\n{self.launcher.tail(spec.name, 15)}")
        return "\n".join(parts)

    # -- flows ----------------------------------------------------------------------

    def run_demo(self, document: Path = DEMO_DOCUMENT, timeout: float = 60.0) -> DemoRun:
        """Run the demo's own flow (:class:`demo.flow.Demo`) as a fresh learner."""
        user_id = f"e2e-learner-{uuid.uuid4().hex[:8]}"
        token = self.token(user_id)
        lines: list[str] = []

        async def go() -> tuple[DemoOutcome, Demo]:
            async with httpx.AsyncClient(
                base_url=self.gateway_url,
                headers={"Authorization": f"Bearer {token}"},
                timeout=30.0,
                trust_env=False,
            ) as client:
                demo = Demo(
                    client, user_id=user_id, document=document, timeout=timeout, say=lines.append
                )
                return await demo.run(), demo

        outcome, demo = asyncio.run(go())
        return DemoRun(
            outcome=outcome,
            user_id=user_id,
            token=token,
            material_id=str(demo.look.material_id),
            kp_ids=set(demo.look.kp_names),
            lines=lines,
        )

    def wait_terminal(self, token: str, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """Poll ``GET /v1/ai/jobs/{id}`` until the job is terminal; returns its JSON."""
        deadline = time.monotonic() + timeout
        with self.client(token) as http:
            while True:
                job: dict[str, Any] = http.get(f"/v1/ai/jobs/{job_id}").json()
                if job.get("status") in TERMINAL:
                    return job
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"job {job_id} still {job.get('status')} after {timeout} s\n"
                        + self.diagnostics()
                    )
                time.sleep(0.1)

    def create_job(
        self, token: str, user_id: str, job_type: str = "learning_state_analysis"
    ) -> dict[str, Any]:
        """Create a job on the user as target (needs no material); returns the Job JSON."""
        with self.client(token) as http:
            reply = http.post(
                "/v1/ai/jobs",
                json={
                    "jobType": job_type,
                    "targetType": "user",
                    "targetId": user_id,
                    "apiKeyMode": "platform_key",
                },
            )
        assert reply.status_code == 201, reply.text
        job: dict[str, Any] = reply.json()
        return job

    def add_faults(self, faults: list[dict[str, Any]]) -> None:
        """Queue stand-in faults (``POST /_standin/faults``)."""
        reply = httpx.post(f"{self.standin_url}/_standin/faults", json=faults, trust_env=False)
        assert reply.status_code < 300, reply.text


@pytest.fixture(scope="session")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSystem]:
    """One SQLite-backed system for the whole session, Prometheus endpoints on."""
    running = RunningSystem.start(tmp_path_factory.mktemp("e2e-system"), metrics=True)
    try:
        yield running
    finally:
        running.close()
