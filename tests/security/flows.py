"""The canary-key flow through a running system (reference §6), shared by the SQLite and TLS/MariaDB runs.

A user stores a key, creates ``user_deepseek_key`` jobs and the model refuses the
key (HTTP 401): the job fails ``INVALID_CREDENTIAL`` after exactly one model
call, the credential turns ``invalid`` and new user-key jobs are refused 422
until a new key is stored; then good keys' jobs succeed. Every key is a
registered canary; the caller scans logs, databases and answers afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.metadata import outgoing
from tests.security.conftest import System, random_canary, user_id, wait_terminal
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

MATERIAL = (
    "# Photosynthesis\n\nPlants turn light into chemical energy in the chloroplasts.\n\n"
    "## Light reactions\n\nWater is split and oxygen is released; ATP and NADPH are made.\n\n"
    "## Calvin cycle\n\nCarbon dioxide is fixed into sugars using ATP and NADPH.\n"
)
#: The stand-in is told to refuse (401) the next request of this task.
FAULT_TYPE = "flashcard_generation"


@dataclass
class CanaryRun:
    """What the flow did, for the caller's extra checks."""

    user: str
    keys: dict[str, str] = field(default_factory=dict)  # label -> canary
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> final job JSON
    credential_ids: dict[str, str] = field(default_factory=dict)  # label -> credentialId
    texts: list[str] = field(default_factory=list)  # non-HTTP outputs (gRPC status)


def _mask_tail(key: str) -> str:
    return key[-4:]


async def _put_key(sys_: System, client: Any, headers: dict[str, str], key: str) -> dict[str, Any]:
    resp = await client.put(
        "/v1/me/model-credential", json={"provider": "deepseek", "apiKey": key}, headers=headers
    )
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    assert body["maskedKey"] == f"{key[:3]}****{_mask_tail(key)}"
    got = await client.get("/v1/me/model-credential", headers=headers)
    assert got.status_code == 200 and got.json()["status"] == "valid", got.text
    return body


async def _create(
    client: Any, headers: dict[str, str], job_type: str, target: tuple[str, str]
) -> Any:
    body: dict[str, Any] = {
        "jobType": job_type,
        "targetType": target[0],
        "targetId": target[1],
        "apiKeyMode": "user_deepseek_key",
    }
    if job_type in ("quiz_generation", "flashcard_generation"):
        body["params"] = {"count": 2}
    return await client.post("/v1/ai/jobs", json=body, headers=headers)


async def _refused_key_round(
    sys_: System,
    client: Any,
    headers: dict[str, str],
    run: CanaryRun,
    label: str,
    key: str,
    target: tuple[str, str],
) -> None:
    cred = await _put_key(sys_, client, headers, key)
    run.credential_ids[label] = cred["credentialId"]
    resp = await _create(client, headers, FAULT_TYPE, target)
    assert resp.status_code == 201, resp.text
    job = await wait_terminal(client, resp.json()["jobId"], headers)
    run.jobs[label] = job
    assert job["status"] == "failed", job
    assert job["errorCode"] == "INVALID_CREDENTIAL", job
    assert job["attemptNo"] == 1 and job["retryCount"] == 0, job  # never retried
    assert job["credentialId"] == cred["credentialId"]
    view = await client.get("/v1/me/model-credential", headers=headers)
    assert view.status_code == 200, view.text
    assert view.json()["status"] == "invalid", view.text
    assert view.json()["credentialId"] == cred["credentialId"]
    for job_type, tgt in ((FAULT_TYPE, target), ("learning_state_analysis", ("user", run.user))):
        refused = await _create(client, headers, job_type, tgt)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "INVALID_CREDENTIAL"


async def run_canary_flow(sys_: System, *, ca_file: str | None = None) -> CanaryRun:
    """Drive the whole flow; see the module docstring. Returns what it did."""
    # not "canary-…": a user id must never share a 9-char window with a canary key
    run = CanaryRun(user=user_id("learner"))
    headers = sys_.bearer(run.user)
    admin = sys_.bearer(user_id("ops"), "admin")
    # the stand-in records "****" + the last 4 characters: make those distinct per key
    tails: set[str] = set()

    def fresh(prefix: str) -> str:
        while (key := random_canary(prefix))[-4:] in tails:
            pass
        tails.add(key[-4:])
        return sys_.add_canary(key)

    native_401 = fresh("sk-invalid-canary-")
    fault_401 = fresh("sk-canary-")
    good = fresh("sk-canary-")
    # not shaped like a key, so log redaction cannot hide a leak: it must never be logged
    unshaped = fresh("QZCANARY")
    run.keys = {"native401": native_401, "fault401": fault_401, "good": good, "unshaped": unshaped}

    async with sys_.client() as client, sys_.client(sys_.launcher.standin_url) as standin:
        mat = await client.post(
            "/v1/materials", json={"title": "Photosynthesis", "content": MATERIAL}, headers=headers
        )
        assert mat.status_code == 201, mat.text
        material = ("material", mat.json()["materialId"])

        # 1. a key the model refuses by itself (the stand-in answers 401 to sk-invalid*)
        await _refused_key_round(sys_, client, headers, run, "native401", native_401, material)

        # 2. a normal-looking key the model is told to refuse once
        fault = await standin.post(
            "/_standin/faults",
            json=[{"kind": "status", "status": 401, "match": FAULT_TYPE, "count": 1}],
        )
        assert fault.status_code == 200, fault.text
        await _refused_key_round(sys_, client, headers, run, "fault401", fault_401, material)

        # 3. good keys: a new PUT makes user-key jobs possible again, and they succeed
        for label, key, job_type, target in (
            ("good", good, "flashcard_generation", material),
            ("unshaped", unshaped, "learning_state_analysis", ("user", run.user)),
        ):
            cred = await _put_key(sys_, client, headers, key)
            run.credential_ids[label] = cred["credentialId"]
            resp = await _create(client, headers, job_type, target)
            assert resp.status_code == 201, resp.text
            job = await wait_terminal(client, resp.json()["jobId"], headers)
            run.jobs[label] = job
            assert job["status"] == "succeeded", job
            assert job["credentialId"] == cred["credentialId"]
            result = await client.get(f"/v1/ai/jobs/{job['jobId']}/result", headers=headers)
            assert result.status_code == 200 and result.json()["items"], result.text

        # admin views, with invocations: one model call per job, keyed by credential id only
        for label, job in run.jobs.items():
            view = await client.get(f"/admin/ai/jobs/{job['jobId']}", headers=admin)
            assert view.status_code == 200, view.text
            invocations = view.json()["invocations"]
            assert len(invocations) == 1, (label, invocations)
            inv = invocations[0]
            assert inv["apiKeyMode"] == "user_deepseek_key"
            assert inv["credentialId"] == run.credential_ids[label]
            assert inv["outcome"] == ("succeeded" if job["status"] == "succeeded" else "failed")
        listing = await client.get(f"/admin/ai/jobs?userId={run.user}", headers=admin)
        assert listing.status_code == 200 and len(listing.json()["jobs"]) == 4, listing.text
        runtime = await client.get("/admin/ai/runtime", headers=admin)
        assert runtime.status_code == 200, runtime.text
        for path in ("/v1/ai/jobs", "/v1/me/model-credential", "/v1/ai/results/questions"):
            assert (await client.get(path, headers=headers)).status_code == 200

        # the stand-in's stored requests hold only the mask, one request per key
        stored = await standin.get("/_standin/requests")
        assert stored.status_code == 200, stored.text
        requests = stored.json()["requests"]
        for label, key in run.keys.items():
            mine = [r for r in requests if r.get("keyMask") == "****" + _mask_tail(key)]
            assert len(mine) == 1, (label, mine)  # refused keys: exactly one call, no retry

    # the worker's own status output (gRPC), as an operator would read it
    async with _worker_channel(sys_, ca_file) as channel:
        status = await wgrpc.WorkerStatusServiceStub(channel).GetStatus(
            wrr.GetStatusRequest(), metadata=outgoing(sys_.service_token), timeout=10
        )
    run.texts.append(str(status))
    return run


class _worker_channel:
    def __init__(self, sys_: System, ca_file: str | None) -> None:
        self.channel: grpc.aio.Channel = insecure_or_tls_channel(
            sys_.env["RUNTIME_WORKER_ADDR"], ca_file
        )

    async def __aenter__(self) -> grpc.aio.Channel:
        return self.channel

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
