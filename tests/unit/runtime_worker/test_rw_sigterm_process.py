"""``python -m runtime_worker`` as a real process: SIGTERM with a job in flight
drains it (``WORKER_SHUTDOWN``) and the process exits cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from airuntime_common.errors import ErrorCode
from tests.unit.runtime_worker.rw_helpers import TOKEN, FakeBackend, make_job

ROOT = Path(__file__).resolve().parents[3]


async def test_sigterm_drains_in_flight_job(
    backend: tuple[FakeBackend, int, int], raw_http: Any
) -> None:
    b, job_port, cred_port = backend

    async def hang(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()  # the model never answers

    http = await raw_http(hang)
    b.base_url = http.base_url
    b.add_job(make_job("job-sig"))
    env = {
        **os.environ,
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "JOB_SERVICE_ADDR": f"127.0.0.1:{job_port}",
        "CREDENTIAL_SERVICE_ADDR": f"127.0.0.1:{cred_port}",
        "RUNTIME_WORKER_LISTEN": "127.0.0.1:0",
        "WORKER_METRICS_PORT": "0",
        "HEARTBEAT_INTERVAL_SECONDS": "0.2",
        "LOCK_LEASE_SECONDS": "1",
        "POLL_INTERVAL_MS": "50",
        "LONG_POLL_WAIT_MS": "100",
        "SHUTDOWN_GRACE_SECONDS": "0.3",
        "RUNTIME_INSTANCE_ID": "sig-worker",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runtime_worker",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await b.wait_for(lambda: bool(http.requests), within=30)  # model call in flight
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert [(f.job_id, f.error_code) for f in b.fails] == [("job-sig", ErrorCode.WORKER_SHUTDOWN)]
    assert b.results == []
    assert b.instance_ids == {"sig-worker"}
    assert b"sk-secretsecret1234" not in stderr  # the key never reaches the log
