"""Users' own base URLs through the real processes (reference §10.5).

The system (gateway, job_service, credential_service, worker: one process each, on
SQLite) runs with ``USER_BASE_URLS=true``, ``EGRESS_ALLOW_CIDRS=127.0.0.1/32`` (the
test's own "operator network": the user's endpoint is the stand-in on loopback) and
the worker trusting a test CA (``SSL_CERT_FILE``). The user's endpoint is the model
stand-in over TLS at ``https://localhost:<port>/v1``, its certificate for the name
``localhost`` only.

* A user-key job through it succeeds; the stand-in saw that user's key and no other,
  under the name (``Host``); the platform's stand-in never saw the user's key, the
  user's endpoint never the platform key.
* Payloads aimed at loopback's other addresses (127.0.0.2, ::1, in every notation)
  and at metadata and private ranges are refused 422 ``INVALID_BASE_URL`` at the
  gateway; their sinkholes see nothing.
* A URL that passed when stored but whose host the worker now reads as 127.0.0.2
  ends its job ``EGRESS_BLOCKED``: final, one attempt, no connection, the key still
  valid, and no fallback to the platform's provider.
* The canary check of the keys (no log, database dump or answer holds them) holds
  with base URLs set.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from credential_service.settings import STANDIN_PLATFORM_KEY
from model_standin.server import StandIn
from tests.security.conftest import (
    System,
    random_canary,
    start_system,
    user_id,
    wait_terminal,
)
from tests.security.tls import make_ca_and_server_cert

from .support import PUBLIC_V4, Names, Payload, Sinkhole, credential_store

pytestmark = pytest.mark.e2e

MATERIAL = (
    "# Cells\n\nA cell is the smallest unit of life.\n\n## Membrane\n\nIt keeps the cell apart.\n"
)


def _p(label: str, url: str, rules: str) -> Payload:
    return Payload(label, url, frozenset(rules.split("|")), "PATT")


#: Aimed at this host's addresses other than 127.0.0.1 (the one the test allows) and
#: at addresses no sinkhole holds; all are read by the system resolver alone.
PROCESS_PAYLOADS = (
    _p("loopback-2", "https://127.0.0.2:{port}/v1", "address"),
    _p("decimal", "https://2130706434:{port}/v1", "address"),
    _p("octal", "https://0177.0.0.2:{port}/v1", "address"),
    _p("hex", "https://0x7f000002:{port}/v1", "address"),
    _p("short", "https://127.2:{port}/v1", "address"),
    _p("v4-mapped", "https://[::ffff:127.0.0.2]:{port}/v1", "address"),
    _p("v4-compatible", "https://[::127.0.0.1]:{port}/v1", "address"),
    _p("nat64", "https://[64:ff9b::127.0.0.1]:{port}/v1", "address"),
    _p("6to4", "https://[2002:7f00:1::]:{port}/v1", "address"),
    _p("v6-loopback", "https://[::1]:{port}/v1", "address"),
    _p("unspecified", "https://0.0.0.0:{port}/v1", "address"),
    _p("metadata", "https://169.254.169.254:{port}/latest/meta-data", "address"),
    _p("metadata-v6", "https://[fd00:ec2::254]:{port}/latest/meta-data", "address"),
    _p("private", "https://10.0.0.1:{port}/v1", "address"),
    _p("user-info", "https://evil@127.0.0.2:{port}/v1", "user_info"),
    _p("gopher", "gopher://127.0.0.2:{port}/_INFO", "scheme"),
    _p("file", "file:///etc/passwd", "scheme"),
    _p("odd-port", "https://localhost:6379/v1", "port"),
    _p("query", "https://localhost:{port}/v1?to=http://127.0.0.2", "query"),
    _p("http", "http://127.0.0.2:{port}/v1", "address|scheme"),
)


@dataclass
class Egress:
    """The running system and what the test put around it."""

    system: System
    model: StandIn  # the users' endpoint, over TLS
    model_url: str
    holes: dict[str, Sinkhole]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def egress(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Egress]:
    tmp = tmp_path_factory.mktemp("egress-system")
    tls = make_ca_and_server_cert(tmp / "tls", hosts=("localhost",), name="model")
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    model = StandIn("127.0.0.1", 0, tls=context, name="users-gateway")
    await model.start()
    holes = {p.label: await Sinkhole().start(("127.0.0.2", "::1")) for p in PROCESS_PAYLOADS}
    holes["rebound"] = await Sinkhole().start(("127.0.0.2", "::1"))
    ports = [model.port, *(h.port for h in holes.values())]
    system = await start_system(
        tmp,
        {
            "USER_BASE_URLS": "true",
            "USER_BASE_URL_PORTS": ",".join(str(p) for p in ports),
            "EGRESS_ALLOW_CIDRS": "127.0.0.1/32",
            "SSL_CERT_FILE": str(tls.ca_file),
        },
    )
    try:
        yield Egress(system, model, f"https://localhost:{model.port}/v1", holes)
    finally:
        await system.launcher.stop()
        await model.stop()
        for hole in holes.values():
            await hole.stop()
    found = system.scan()
    assert not found, f"canary leaked after shutdown: {found[:20]}"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create(client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> Any:
    resp = await client.post("/v1/ai/jobs", json=body, headers=headers)
    assert resp.status_code == 201, resp.text
    return await wait_terminal(client, resp.json()["jobId"], headers, within=60)


async def platform_seen(system: System) -> list[dict[str, Any]]:
    async with system.client(system.launcher.standin_url) as standin:
        got = await standin.get("/_standin/seen")
    assert got.status_code == 200
    keys: list[dict[str, Any]] = got.json()["keys"]
    return keys


@pytest.mark.asyncio(loop_scope="module")
async def test_a_user_key_job_runs_on_the_user_s_endpoint(egress: Egress) -> None:
    system = egress.system
    user = user_id("learner")
    key = system.add_canary(random_canary("sk-own-gw-"))
    headers = system.bearer(user)
    async with system.client() as client:
        put = await client.put(
            "/v1/me/model-credential",
            json={
                "apiKey": key,
                "baseUrl": egress.model_url.replace("localhost", "LOCALHOST") + "/",
            },
            headers=headers,
        )
        assert put.status_code == 200, put.text
        assert put.json()["baseUrl"] == egress.model_url  # normalized
        view = await client.get("/v1/me/model-credential", headers=headers)
        assert view.json()["baseUrl"] == egress.model_url
        material = await client.post(
            "/v1/materials", json={"title": "Cells", "content": MATERIAL}, headers=headers
        )
        assert material.status_code == 201, material.text
        jobs = [
            await create(
                client,
                headers,
                {"jobType": "learning_state_analysis", "targetType": "user", "targetId": user,
                 "apiKeyMode": "user_deepseek_key"},
            ),
            await create(
                client,
                headers,
                {"jobType": "flashcard_generation", "targetType": "material",
                 "targetId": material.json()["materialId"], "params": {"count": 2},
                 "apiKeyMode": "user_deepseek_key"},
            ),
        ]  # fmt: skip
        for job in jobs:
            assert job["status"] == "succeeded", job
            assert job["credentialId"] == put.json()["credentialId"]
        # the same user's platform-key job runs on the platform's provider
        platform = await create(
            client,
            headers,
            {"jobType": "learning_state_analysis", "targetType": "user", "targetId": user,
             "apiKeyMode": "platform_key"},
        )  # fmt: skip
        assert platform["status"] == "succeeded", platform
    seen = egress.model.seen()["keys"]
    assert [k["sha256"] for k in seen] == [sha(key)] and seen[0]["calls"] == 2
    assert {r["host"] for r in egress.model.requests()} == {f"localhost:{egress.model.port}"}
    assert sha(STANDIN_PLATFORM_KEY) not in {k["sha256"] for k in seen}
    assert sha(key) not in {k["sha256"] for k in await platform_seen(system)}
    # the canary check with a base URL set: the scan reads real logs and dumps …
    assert all(job["jobId"] in system.log_text()["runtime_worker.log"] for job in jobs)
    assert egress.model_url in system.db_text()["credential_service"]
    # … and finds the key nowhere (again after shutdown, in the fixture)
    assert not system.scan([key]), system.scan([key])[:10]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("payload", PROCESS_PAYLOADS, ids=lambda p: p.label)
async def test_payloads_are_refused_at_the_gateway(egress: Egress, payload: Payload) -> None:
    system = egress.system
    hole = egress.holes[payload.label]
    headers = system.bearer(user_id("attacker"))
    async with system.client() as client:
        resp = await client.put(
            "/v1/me/model-credential",
            json={"apiKey": "sk-attacker-key-0000000001", "baseUrl": payload.at(hole.port)},
            headers=headers,
        )
        assert resp.status_code == 422, resp.text
        body = resp.json()
        assert body["code"] == "INVALID_BASE_URL"
        assert body["details"]["rule"] in payload.rules, body
        missing = await client.get("/v1/me/model-credential", headers=headers)
        assert missing.status_code == 404  # nothing stored
    assert hole.hits == []


@pytest.mark.asyncio(loop_scope="module")
async def test_refused_at_call_time_ends_the_job_egress_blocked(egress: Egress) -> None:
    system = egress.system
    hole = egress.holes["rebound"]
    user = user_id("learner")
    key = system.add_canary(random_canary("sk-rebound-"))
    url = f"https://2130706434:{hole.port}/v1"
    # stored while the name answered a public address (the store's resolver says so) …
    async with credential_store(
        system.credential_db,
        Names({"2130706434": [PUBLIC_V4]}),
        keys=system.env["CREDENTIAL_ENCRYPTION_KEYS"],
        USER_BASE_URL_PORTS=str(hole.port),
    ) as store:
        stored = await store.put(user, "deepseek", key, url)
    assert stored.base_url == url
    headers = system.bearer(user)
    admin = system.bearer(user_id("ops"), "admin")
    platform_before = await platform_seen(system)
    user_endpoint_before = len(egress.model.requests())
    # … called while the worker's resolver reads it as 127.0.0.2
    async with system.client() as client:
        material = await client.post(
            "/v1/materials", json={"title": "Cells", "content": MATERIAL}, headers=headers
        )
        assert material.status_code == 201, material.text
        job = await create(
            client,
            headers,
            {"jobType": "learning_state_analysis", "targetType": "user", "targetId": user,
             "apiKeyMode": "user_deepseek_key"},
        )  # fmt: skip
        assert job["status"] == "failed", job
        assert job["errorCode"] == "EGRESS_BLOCKED", job
        assert "127.0.0.2" in job["errorMessage"] and "loopback" in job["errorMessage"]
        assert (job["attemptNo"], job["retryCount"]) == (1, 0)  # final: not retried
        view = await client.get("/v1/me/model-credential", headers=headers)
        assert view.json()["status"] == "valid"  # the key is not marked invalid
        detail = await client.get(f"/admin/ai/jobs/{job['jobId']}", headers=admin)
        [call] = detail.json()["invocations"]
        assert (call["outcome"], call["errorCode"]) == ("failed", "EGRESS_BLOCKED")
    assert hole.hits == []
    assert len(egress.model.requests()) == user_endpoint_before
    assert await platform_seen(system) == platform_before  # no fallback to the platform
    assert sha(key) not in {k["sha256"] for k in platform_before}
    assert "EGRESS_BLOCKED" in system.log_text()["runtime_worker.log"]
    assert not system.scan([key]), system.scan([key])[:10]
