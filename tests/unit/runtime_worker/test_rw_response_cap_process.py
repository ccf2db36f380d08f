"""Case P3 on a real worker process: 8 slots, each model answer 500 MB (chunked,
from the stand-in). Every attempt ends ``TEMPORARY_PROVIDER_ERROR``, the leases
keep being renewed while the bodies arrive, and the worker's peak RSS stays under
8 × ``MODEL_MAX_RESPONSE_BYTES`` + 150 MB (reference §9.4)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from airuntime_common.errors import ErrorCode
from model_standin import run_standin
from tests.unit.runtime_worker.rw_helpers import TOKEN, FakeBackend, make_job

ROOT = Path(__file__).resolve().parents[3]
SLOTS = 8
MiB = 1024 * 1024
CAP = 8 * MiB  # MODEL_MAX_RESPONSE_BYTES's default
BODY = 500_000_000

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc"
)


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmHWM``: peak RSS; ``VmRSS``: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


@pytest.mark.parametrize(
    "pause_ms",
    [
        # as fast as loopback carries it: the most the worker holds at once
        0,
        # 4 ms between 64 KiB chunks: each body takes a while past the cap (≥ 0.5 s),
        # long enough for the lease keeper to have to keep up meanwhile
        4,
    ],
)
async def test_p3_eight_slots_of_500_mb_answers_stay_bounded(
    backend: tuple[FakeBackend, int, int], pause_ms: int
) -> None:
    b, job_port, cred_port = backend
    async with run_standin() as standin:
        fault = {"kind": "huge_body", "totalBytes": BODY, "count": SLOTS}
        standin.add_faults([{**fault, "intervalMs": pause_ms} if pause_ms else fault])
        b.base_url = standin.base_url
        for i in range(SLOTS):
            b.add_job(make_job(f"job-big-{i}"))
        env = {
            **os.environ,
            "RUNTIME_SERVICE_TOKEN": TOKEN,
            "JOB_SERVICE_ADDR": f"127.0.0.1:{job_port}",
            "CREDENTIAL_SERVICE_ADDR": f"127.0.0.1:{cred_port}",
            "RUNTIME_WORKER_LISTEN": "127.0.0.1:0",
            "WORKER_METRICS_PORT": "0",
            "WORKER_CONCURRENCY": str(SLOTS),
            "HEARTBEAT_INTERVAL_SECONDS": "0.1",
            "LOCK_LEASE_SECONDS": "1",
            "POLL_INTERVAL_MS": "50",
            "LONG_POLL_WAIT_MS": "100",
            "SHUTDOWN_GRACE_SECONDS": "0.3",
            "RUNTIME_INSTANCE_ID": "p3-worker",
            "LOG_LEVEL": "WARNING",
        }
        env.pop("MODEL_MAX_RESPONSE_BYTES", None)  # the default is what is measured
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
            await b.wait_for(lambda: len(b.calls) > 0, within=30)  # started and claiming
            baseline_kib = status_kib(proc.pid, "VmRSS")
            await b.wait_for(lambda: len(standin.requests()) == SLOTS, within=30)
            bodies_began = time.monotonic()
            beats_before = b.heartbeats
            await b.wait_for(lambda: len(b.fails) == SLOTS, within=60)
            bodies_took = time.monotonic() - bodies_began
            beats_during = b.heartbeats - beats_before
            peak_kib = status_kib(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        entries = standin.requests()

    assert {f.error_code for f in b.fails} == {ErrorCode.TEMPORARY_PROVIDER_ERROR}
    assert all("MODEL_MAX_RESPONSE_BYTES" in f.error_message for f in b.fails)
    assert b.results == []
    # every answer was abandoned near the cap: the worker read no further
    assert all(e["clientClosed"] for e in entries), entries
    assert max(e["bytesSent"] for e in entries) < CAP + 32 * MiB
    if pause_ms:  # the leases were renewed while the answers arrived (every 0.1 s)
        assert beats_during >= max(2, int(bodies_took / 0.1) // 2), (beats_during, bodies_took)
    peak_mb = peak_kib * 1024 / 1e6
    budget_mb = (SLOTS * CAP + 150e6) / 1e6
    print(
        f"\nP3: {SLOTS} slots x {BODY / 1e6:.0f} MB answers ({pause_ms} ms between 64 KiB"
        f" chunks), cap {CAP} B: worker peak RSS "
        f"{peak_mb:.1f} MB (at start {baseline_kib * 1024 / 1e6:.1f} MB; budget "
        f"{budget_mb:.1f} MB); answers took {bodies_took:.2f} s, {beats_during} heartbeats"
    )
    assert peak_kib * 1024 < SLOTS * CAP + 150e6, stderr.decode()[-2000:]
