"""The gateway's side of users' own base URLs (reference §10.5): the PUT forwards
``baseUrl`` whole, the masked view and the shim's resolve carry it, and the backend's
refusals keep their codes (422 ``INVALID_BASE_URL``, 400 ``INVALID_ARGUMENT``)."""

from __future__ import annotations

import httpx
import pytest

from airuntime_common.errors import AppError, ErrorCode
from zhixi.airuntime.credential.v1 import message_pb2 as cred_msg
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr

from .conftest import OWNER, Backends, bearer, make_token, runtime_headers

USER = bearer(make_token(OWNER, "user", exp_in=86400))
H = runtime_headers("worker-a")


async def test_put_forwards_the_base_url_and_the_view_shows_it(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    stored = cred_msg.Credential(
        credential_id="cred-2",
        provider="deepseek",
        masked_key="sk-****1234",
        status=cred_msg.CREDENTIAL_STATUS_VALID,
        base_url="https://llm.example.com/v1",
    )
    backends.credential.responses["PutCredential"] = cred_rr.PutCredentialResponse(
        credential=stored
    )
    backends.credential.responses["GetCredential"] = cred_rr.GetCredentialResponse(
        credential=stored
    )
    put = await client.put(
        "/v1/me/model-credential",
        json={"apiKey": "sk-secret-abcd1234", "baseUrl": "https://LLM.example.com/v1/"},
        headers=USER,
    )
    assert put.status_code == 200, put.text
    assert put.json()["baseUrl"] == "https://llm.example.com/v1"
    # passed on as given: credential_service checks and normalizes it
    assert backends.credential.last("PutCredential").request.base_url == (
        "https://LLM.example.com/v1/"
    )
    got = await client.get("/v1/me/model-credential", headers=USER)
    assert got.json()["baseUrl"] == "https://llm.example.com/v1"
    # a PUT without baseUrl asks for none: the stored one goes with the old credential
    await client.put("/v1/me/model-credential", json={"apiKey": "sk-other-5678"}, headers=USER)
    assert backends.credential.last("PutCredential").request.base_url == ""


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (
            AppError(
                ErrorCode.INVALID_BASE_URL, "baseUrl refused (address): …", {"rule": "address"}
            ),
            422,
        ),
        (AppError(ErrorCode.INVALID_ARGUMENT, "user base URLs are off", {"field": "baseUrl"}), 400),
    ],
)
async def test_refusals_keep_their_code(
    client: httpx.AsyncClient, backends: Backends, error: AppError, status: int
) -> None:
    backends.credential.errors["PutCredential"] = error
    resp = await client.put(
        "/v1/me/model-credential",
        json={"apiKey": "sk-secret-abcd1234", "baseUrl": "https://127.0.0.1/v1"},
        headers=USER,
    )
    assert resp.status_code == status
    assert resp.json()["code"] == error.code
    assert resp.json()["details"] == error.details
    assert "sk-secret" not in resp.text


@pytest.mark.parametrize("bad", ["", "x" * 2049, 42])
async def test_a_malformed_base_url_never_reaches_the_backend(
    client: httpx.AsyncClient, backends: Backends, bad: object
) -> None:
    resp = await client.put(
        "/v1/me/model-credential", json={"apiKey": "sk-k-12345678", "baseUrl": bad}, headers=USER
    )
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_ARGUMENT"
    assert not [c for c in backends.credential.calls if c.method == "PutCredential"]


async def test_resolve_says_whose_base_url_it_is(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    answer = backends.credential.responses["ResolveCredential"]
    answer.base_url, answer.user_base_url = "https://llm.example.com/v1", True
    resp = await client.post(
        "/internal/runtime/model-credentials/resolve",
        json={"jobId": "job-1", "attemptNo": 1},
        headers=H,
    )
    assert resp.status_code == 200
    assert (resp.json()["baseUrl"], resp.json()["userBaseUrl"]) == (
        "https://llm.example.com/v1",
        True,
    )


async def test_openapi_describes_the_rules_and_codes(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    put_body = doc["components"]["schemas"]["CredentialPut"]["properties"]["baseUrl"]
    for word in ("USER_BASE_URLS", "USER_BASE_URL_PORTS", "EGRESS_ALLOW_CIDRS", "INVALID_BASE_URL"):
        assert word in put_body["description"], word
    put = doc["paths"]["/v1/me/model-credential"]["put"]["responses"]
    assert "INVALID_BASE_URL" in put["422"]["description"]
    assert "INVALID_ARGUMENT" in put["400"]["description"]
    job = doc["components"]["schemas"]["JobOut"]["properties"]["errorCode"]
    assert "EGRESS_BLOCKED" in job["description"]
    resolved = doc["components"]["schemas"]["ResolvedCredential"]["properties"]
    assert "EGRESS_BLOCKED" in resolved["userBaseUrl"]["description"]
