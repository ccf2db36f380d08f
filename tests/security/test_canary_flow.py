"""A canary key through the whole system, real processes (reference §6): it must appear nowhere.

Nowhere means: no line of any service's log file, no row of any table of either
database (SQLite dump and raw files), no HTTP answer the client saw (user and
admin views, invocations, errors, the stand-in's stored requests), and not the
worker's status output. "Appear" means any 9-character piece of the key.
"""

from __future__ import annotations

import pytest

from tests.security.conftest import System, leaks, windows
from tests.security.flows import run_canary_flow

pytestmark = pytest.mark.e2e


def test_leak_scan_finds_what_it_looks_for() -> None:
    key = "sk-canary-0123456789abcdef"
    assert leaks(f"log line {key[5:15]} end", [key])  # a 10-char piece is found
    assert not leaks("masked sk-****cdef", [key])  # the mask is not a leak
    assert all(len(w) == 9 for w in windows(key)) and len(windows(key)) == len(key) - 8


@pytest.mark.asyncio(loop_scope="package")
async def test_canary_keys_never_leave_the_credential_service(system: System) -> None:
    run = await run_canary_flow(system)
    keys = list(run.keys.values())

    # the scan really reads something: logs name the jobs, the dumps hold the masked keys
    logs = system.log_text()
    assert {
        "job_service.log",
        "credential_service.log",
        "runtime_worker.log",
        "api_gateway.log",
        "standin.log",
    } <= set(logs)
    worker_log = logs["runtime_worker.log"]
    assert all(job["jobId"] in worker_log for job in run.jobs.values())
    dumps = system.db_text()
    # a PUT replaces the user's key: the current credential row is there, masked
    assert run.credential_ids["unshaped"] in dumps["credential_service"]
    assert f"****{run.keys['unshaped'][-4:]}" in dumps["credential_service"]
    assert all(job["jobId"] in dumps["job_service"] for job in run.jobs.values())
    assert len(system.seen) > 20

    found = system.scan(keys)
    for text in run.texts:
        found += [f"worker status: {w}" for w in leaks(text, keys)]
    assert not found, f"canary leaked: {found[:20]}"
