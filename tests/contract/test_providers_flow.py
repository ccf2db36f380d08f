"""Keys and providers through the whole runtime (reference §9.4, cases P5, P6): the real
job_service, credential_service and a real worker, against stand-in providers that
record every key and model they are sent: the provider chosen when a lease is
granted, per-provider breakers, the job following the key used (the contract is in
``credential_service/README.md``, Resolve, and the worker's README)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airuntime_common import metadata
from model_standin import StandIn, key_fingerprint, run_standins
from runtime_worker.app import WorkerApp
from runtime_worker.settings import WorkerSettings
from tests.contract.conftest import TOKEN, USER, RuntimeStack, Templates, start_stack, stop_stack
from zhixi.airuntime.job.v1 import request_response_pb2 as job_rr

KEY_A = "sk-user-key-a-000000000000000aaaa"
KEY_B = "sk-user-key-b-000000000000000bbbb"
PRIMARY_KEY = "sk-platform-primary-00000000001"
BACKUP_KEY = "sk-platform-backup-000000000002"


@dataclass
class Flow:
    """A running stack, its worker and the stand-in providers."""

    stack: RuntimeStack
    standins: dict[str, StandIn]
    start_worker: Callable[[], Awaitable[WorkerApp]]

    async def material(self) -> str:
        reply = await self.stack.stub.CreateMaterial(
            job_rr.CreateMaterialRequest(
                user_id=USER,
                title="Photosynthesis",
                content="Photosynthesis turns light energy into chemical energy in plants.\n\n"
                "The Calvin cycle fixes carbon dioxide in the stroma of the chloroplast.",
            ),
            metadata=metadata.outgoing(TOKEN),
        )
        return str(reply.material.material_id)

    async def cards(self, material_id: str, n: int, api_key_mode: str) -> list[str]:
        """``n`` flashcard jobs (one card each) on the material."""
        jobs = []
        for _ in range(n):
            job = await self.stack.create(
                job_type="flashcard_generation",
                target_type="material",
                target_id=material_id,
                params={"count": 1},
                api_key_mode=api_key_mode,
            )
            jobs.append(str(job["jobId"]))
        return jobs

    async def finished(self, job_ids: list[str], within: float = 30.0) -> list[dict[str, Any]]:
        async def all_done() -> list[dict[str, Any]]:
            while True:
                views = [await self.stack.get(j) for j in job_ids]
                if all(v["status"] in ("succeeded", "failed", "cancelled") for v in views):
                    return views
                await asyncio.sleep(0.05)

        return await asyncio.wait_for(all_done(), within)


@pytest.fixture
async def flow(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    contract_templates: Templates,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Flow]:
    """Stand-ins ``primary`` and ``backup`` (serving ``backup-chat``), and a stack whose
    MODEL_PROVIDERS lists them in that order, each with its own platform key."""
    marker = request.node.get_closest_marker("stack_settings")
    job_overrides = dict(marker.kwargs) if marker else {}
    monkeypatch.setenv("PRIMARY_API_KEY", PRIMARY_KEY)
    monkeypatch.setenv("BACKUP_API_KEY", BACKUP_KEY)
    apps: list[WorkerApp] = []
    async with run_standins({"primary": {}, "backup": {"models": ["backup-chat"]}}) as standins:
        providers = json.dumps(
            [
                {
                    "name": "primary",
                    "baseUrl": standins["primary"].base_url,
                    "apiKeyEnv": "PRIMARY_API_KEY",
                },
                {
                    "name": "backup",
                    "baseUrl": standins["backup"].base_url,
                    "apiKeyEnv": "BACKUP_API_KEY",
                    "models": {"deepseek-chat": "backup-chat"},
                },
            ]
        )
        stack = await start_stack(
            tmp_path,
            f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}",
            contract_templates,
            credential_overrides={"MODEL_PROVIDERS": providers, "DEEPSEEK_API_KEY": None},
            MODEL_PROVIDERS=providers,
            **job_overrides,
        )

        async def start_worker() -> WorkerApp:
            app = WorkerApp(
                WorkerSettings(
                    RUNTIME_SERVICE_TOKEN=TOKEN,
                    JOB_SERVICE_ADDR=stack.jobs.address,
                    CREDENTIAL_SERVICE_ADDR=f"127.0.0.1:{stack.credentials.port}",
                    RUNTIME_WORKER_LISTEN="127.0.0.1:0",
                    RUNTIME_INSTANCE_ID="flow-worker",
                    WORKER_METRICS_PORT=0,
                    WORKER_CONCURRENCY=4,
                    HEARTBEAT_INTERVAL_SECONDS=1,
                    LOCK_LEASE_SECONDS=30,
                    POLL_INTERVAL_MS=50,
                    LONG_POLL_WAIT_MS=200,
                    SHUTDOWN_GRACE_SECONDS=0.5,
                )
            )
            await app.start()
            apps.append(app)
            return app

        try:
            yield Flow(stack, standins, start_worker)
        finally:
            for app in apps:
                await app.stop(0.2)
            await stop_stack(stack)


async def test_p5_a_key_replaced_under_queued_work_runs_it_all_on_the_new_key(
    flow: Flow,
) -> None:
    """Case P5: the user stores key A, queues ten user-key jobs, stores key B before a
    worker reaches them. All ten run on key B and succeed; key A is never sent."""
    material = await flow.material()
    key_a = await flow.stack.put_key(KEY_A, provider="primary")
    jobs = await flow.cards(material, 10, "user_deepseek_key")
    assert {(await flow.stack.get(j))["credentialId"] for j in jobs} == {key_a}
    key_b = await flow.stack.put_key(KEY_B, provider="primary")
    await flow.start_worker()
    views = await flow.finished(jobs)
    assert [(v["status"], v["errorCode"]) for v in views] == [("succeeded", None)] * 10
    assert flow.standins["primary"].seen_keys() == {key_fingerprint(KEY_B)}
    assert flow.standins["backup"].seen_keys() == set()
    for job in jobs:  # each model call is logged with the key it used
        assert [i["credentialId"] for i in await flow.stack.invocations(job)] == [key_b]


async def test_p6_a_user_key_runs_on_its_own_provider_only(flow: Flow) -> None:
    """A user key of the backup: its jobs run on the backup (its model name), whatever
    provider the job was created with, and the primary never sees it."""
    material = await flow.material()
    await flow.stack.put_key(KEY_B, provider="backup")
    jobs = await flow.cards(material, 2, "user_deepseek_key")
    await flow.start_worker()
    views = await flow.finished(jobs)
    assert [v["status"] for v in views] == ["succeeded"] * 2
    assert flow.standins["backup"].seen_keys() == {key_fingerprint(KEY_B)}
    assert flow.standins["backup"].seen()["models"] == {"backup-chat": 2}
    assert flow.standins["primary"].seen_keys() == set()
    for job in jobs:
        assert [
            (i["modelProvider"], i["modelName"]) for i in await flow.stack.invocations(job)
        ] == [("backup", "backup-chat")]


async def test_p5_the_job_follows_the_key_it_ran_on(flow: Flow) -> None:
    """The job's ``credentialId`` follows the key the attempt used (the ModelCall's
    ``credential_id``), so a refusal of key B by the model marks B invalid, not A."""
    material = await flow.material()
    await flow.stack.put_key(KEY_A, provider="primary")
    [job] = await flow.cards(material, 1, "user_deepseek_key")
    key_b = await flow.stack.put_key(KEY_B, provider="primary")
    flow.standins["primary"].add_faults([{"kind": "status", "status": 401}])
    await flow.start_worker()
    [view] = await flow.finished([job])
    assert (view["status"], view["errorCode"], view["credentialId"]) == (
        "failed",
        "INVALID_CREDENTIAL",
        key_b,
    )
    from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr

    stored = await flow.stack.cred_stub.GetCredential(
        cred_rr.GetCredentialRequest(user_id=USER), metadata=metadata.outgoing(TOKEN)
    )
    assert stored.credential.credential_id == key_b
    assert stored.credential.status == 2  # CREDENTIAL_STATUS_INVALID: B was refused


@pytest.mark.stack_settings(
    BREAKER_FAILURE_THRESHOLD=2, BREAKER_COOLDOWN_SECONDS=2, MAX_RETRY_COUNT=6
)
async def test_p6_the_primary_down_fails_over_and_comes_back(flow: Flow) -> None:
    """Case P6: every call to the primary answers 503. Once its breaker opens, new and
    retried attempts run on the backup; creates are not refused; each provider sees
    only its own key; when the primary recovers (a half-open probe succeeds) attempts
    go back to it."""
    primary, backup = flow.standins["primary"], flow.standins["backup"]
    primary.add_faults([{"kind": "status", "status": 503, "count": 1_000_000}])
    material = await flow.material()
    jobs = await flow.cards(material, 4, "platform_key")
    await flow.start_worker()
    views = await flow.finished(jobs)
    assert [v["status"] for v in views] == ["succeeded"] * 4
    # the latest attempt's provider; the job keeps the model it asked for
    assert {(v["modelProvider"], v["modelName"]) for v in views} == {("backup", "deepseek-chat")}
    calls = [i for j in jobs for i in await flow.stack.invocations(j)]
    assert {(i["modelProvider"], i["modelName"], i["outcome"]) for i in calls} == {
        ("primary", "deepseek-chat", "failed"),
        ("backup", "backup-chat", "succeeded"),
    }
    assert sum(1 for i in calls if i["modelProvider"] == "primary") >= 2  # opened its breaker
    # creates go on while the primary's breaker is open: the backup's admits them
    [more] = await flow.cards(material, 1, "platform_key")
    assert (await flow.finished([more]))[0]["modelProvider"] == "backup"
    assert primary.seen_keys() == {key_fingerprint(PRIMARY_KEY)}
    assert backup.seen_keys() == {key_fingerprint(BACKUP_KEY)}
    # the primary recovers: after the cool-down a half-open probe succeeds on it
    primary.book.clear()
    await asyncio.sleep(2.5)
    [back] = await flow.cards(material, 1, "platform_key")
    assert (await flow.finished([back]))[0]["modelProvider"] == "primary"
    assert primary.stats()["byOutcome"].get("ok") == 1
