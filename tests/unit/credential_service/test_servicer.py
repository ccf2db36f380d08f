"""CredentialService over real gRPC, with a fake JobService for leases (reference §3, §6)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from airuntime_common import metadata
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from credential_service.settings import STANDIN_PLATFORM_KEY
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.credential.v1 import message_pb2 as msg
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

from .conftest import INSTANCE, TOKEN, Env, Lease, StartFn, flip

KEY = "sk-live-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c1e"
USER_KEY_MODE = common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY
PLATFORM_MODE = common_pb2.API_KEY_MODE_PLATFORM_KEY


async def refused(call: Awaitable[Any]) -> AppError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return from_rpc_error(exc.value)


async def put(
    env: Env, user: str = "u1", key: str = KEY, provider: str = "deepseek"
) -> msg.Credential:
    reply = await env.stub.PutCredential(
        rr.PutCredentialRequest(user_id=user, provider=provider, api_key=key),
        metadata=env.md(None),
    )
    cred: msg.Credential = reply.credential
    return cred


async def resolve(env: Env, job: str, attempt: int, instance: str | None = INSTANCE) -> Any:
    return await env.stub.ResolveCredential(
        rr.ResolveCredentialRequest(job_id=job, attempt_no=attempt), metadata=env.md(instance)
    )


async def test_put_get_masked_view_never_contains_key(env: Env) -> None:
    cred = await put(env)
    assert cred.credential_id.startswith("cred_")
    assert cred.masked_key == "sk-****9c1e"
    assert cred.status == msg.CREDENTIAL_STATUS_VALID
    assert cred.provider == "deepseek" and cred.user_id == "u1" and cred.key_id == "k1"
    assert cred.HasField("created_at")
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    assert got.credential == cred
    for view in (cred, got):
        assert KEY not in str(view) and KEY.encode() not in view.SerializeToString()


async def test_put_replaces_with_new_credential_id(env: Env) -> None:
    first = await put(env)
    second = await put(env, key="sk-second-key-000000000000000000wxyz")
    assert second.credential_id != first.credential_id
    assert second.masked_key == "sk-****wxyz"
    rows = sqlite3.connect(env.db_path).execute("select count(*) from ai_model_credentials")
    assert rows.fetchone()[0] == 1


async def test_user_ids_are_taken_exactly_never_trimmed(env: Env) -> None:
    """``" vic1"``, ``"vic1 "`` or ``"vic1\t"`` is another user than ``vic1``, as in
    job_service: none reads, replaces, deletes or checks ``vic1``'s key."""
    mine = await put(env, user="vic1")
    for other in (" vic1", "vic1 ", "vic1\t", "vic1\n"):
        err = await refused(
            env.stub.GetCredential(rr.GetCredentialRequest(user_id=other), metadata=env.md())
        )
        assert err.code == ErrorCode.NOT_FOUND
        err = await refused(
            env.stub.DeleteCredential(rr.DeleteCredentialRequest(user_id=other), metadata=env.md())
        )
        assert err.code == ErrorCode.NOT_FOUND
        check = await env.stub.CheckCredential(
            rr.CheckCredentialRequest(user_id=other, api_key_mode=USER_KEY_MODE),
            metadata=env.md(),
        )
        assert not check.usable and check.credential_id != mine.credential_id
    theirs = await put(env, user=" vic1", key="sk-attacker-key-00000000000000000zzz5")
    assert theirs.user_id == " vic1" and theirs.credential_id != mine.credential_id
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="vic1"), metadata=env.md())
    assert got.credential == mine


@pytest.mark.parametrize(
    ("user", "provider", "key", "field"),
    [
        ("", "deepseek", KEY, "userId"),
        ("u1", "openai", KEY, "provider"),
        ("u1", "deepseek", "", "apiKey"),
        ("u1", "deepseek", "sk-1", "apiKey"),
        ("u1", "deepseek", "sk-with space-0000000000", "apiKey"),
        ("u1", "deepseek", "sk-" + "x" * 600, "apiKey"),
    ],
)
async def test_put_rejects_bad_input(
    env: Env, user: str, provider: str, key: str, field: str
) -> None:
    err = await refused(
        env.stub.PutCredential(
            rr.PutCredentialRequest(user_id=user, provider=provider, api_key=key),
            metadata=env.md(),
        )
    )
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert (err.details or {}).get("field") == field
    if len(key) > 4:
        assert key not in err.message and key not in str(err.details)


async def test_erase_user_credentials_is_idempotent(env: Env) -> None:
    """``DELETE /v1/me``'s credential half (reference §9.2): every row of the user goes,
    other users' stay, and a repeat removes nothing without an error."""
    await put(env, "u1")
    await put(env, "u2")
    first = await env.stub.EraseUserCredentials(
        rr.EraseUserCredentialsRequest(user_id="u1"), metadata=env.md()
    )
    assert first.removed == 1
    again = await env.stub.EraseUserCredentials(
        rr.EraseUserCredentialsRequest(user_id="u1"), metadata=env.md()
    )
    assert again.removed == 0
    err = await refused(
        env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    )
    assert err.code == ErrorCode.NOT_FOUND
    kept = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="u2"), metadata=env.md())
    assert kept.credential.masked_key


async def test_get_and_delete_not_found(env: Env) -> None:
    err = await refused(
        env.stub.GetCredential(rr.GetCredentialRequest(user_id="nobody"), metadata=env.md())
    )
    assert err.code == ErrorCode.NOT_FOUND
    err = await refused(
        env.stub.DeleteCredential(rr.DeleteCredentialRequest(user_id="nobody"), metadata=env.md())
    )
    assert err.code == ErrorCode.NOT_FOUND
    await put(env)
    await env.stub.DeleteCredential(rr.DeleteCredentialRequest(user_id="u1"), metadata=env.md())
    err = await refused(
        env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    )
    assert err.code == ErrorCode.NOT_FOUND


async def test_calls_without_service_token_are_refused(env: Env) -> None:
    for md in [(), (("x-internal-api-key", "wrong"),)]:
        err = await refused(
            env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=md)
        )
        assert err.code == ErrorCode.UNAUTHENTICATED


async def test_check_user_key(env: Env) -> None:
    req = rr.CheckCredentialRequest(user_id="u1", api_key_mode=USER_KEY_MODE)
    reply = await env.stub.CheckCredential(req, metadata=env.md())
    assert not reply.usable and reply.reason
    cred = await put(env)
    reply = await env.stub.CheckCredential(req, metadata=env.md())
    assert reply.usable and reply.credential_id == cred.credential_id
    await env.stub.MarkCredentialInvalid(
        rr.MarkCredentialInvalidRequest(credential_id=cred.credential_id, reason="HTTP 401"),
        metadata=env.md(),
    )
    reply = await env.stub.CheckCredential(req, metadata=env.md())
    assert not reply.usable and "invalid" in reply.reason
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    assert got.credential.status == msg.CREDENTIAL_STATUS_INVALID
    # storing a new key makes the user usable again
    new = await put(env)
    reply = await env.stub.CheckCredential(req, metadata=env.md())
    assert reply.usable and reply.credential_id == new.credential_id


async def test_check_unspecified_mode_is_invalid_argument(env: Env) -> None:
    err = await refused(
        env.stub.CheckCredential(rr.CheckCredentialRequest(user_id="u1"), metadata=env.md())
    )
    assert err.code == ErrorCode.INVALID_ARGUMENT


async def test_mark_invalid_unknown_id_not_found(env: Env) -> None:
    err = await refused(
        env.stub.MarkCredentialInvalid(
            rr.MarkCredentialInvalidRequest(credential_id="cred_nope", reason="x"),
            metadata=env.md(),
        )
    )
    assert err.code == ErrorCode.NOT_FOUND


@pytest.mark.parametrize(
    ("overrides", "usable", "key"),
    [
        ({}, False, None),
        ({"ALLOW_PLATFORM_KEY_STANDIN": True}, True, STANDIN_PLATFORM_KEY),
        (
            {"DEEPSEEK_API_KEY": "sk-platform-abcdef0123456789"},
            True,
            "sk-platform-abcdef0123456789",
        ),
        (
            {
                "DEEPSEEK_API_KEY": "sk-platform-abcdef0123456789",
                "ALLOW_PLATFORM_KEY_STANDIN": True,
            },
            True,
            "sk-platform-abcdef0123456789",
        ),
    ],
)
async def test_platform_key_check_and_resolve(
    start_env: StartFn, overrides: dict[str, Any], usable: bool, key: str | None
) -> None:
    env = await start_env(**overrides)
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=PLATFORM_MODE), metadata=env.md()
    )
    assert reply.usable is usable
    if not usable:
        assert "DEEPSEEK_API_KEY" in reply.reason
    env.fake.hold("job-p", INSTANCE, 1, Lease(user_id="u1", api_key_mode="platform_key"))
    if key is None:
        err = await refused(resolve(env, "job-p", 1))
        assert err.code == ErrorCode.INVALID_CREDENTIAL
        return
    got = await resolve(env, "job-p", 1)
    assert got.api_key == key
    assert got.api_key_mode == PLATFORM_MODE
    assert got.credential_id == ""
    assert got.base_url == env.settings.DEEPSEEK_BASE_URL
    assert (got.model_provider, got.model_name) == ("deepseek", "deepseek-chat")


async def test_resolve_user_key_for_holder(env: Env) -> None:
    cred = await put(env)
    env.fake.hold(
        "job-1", INSTANCE, 2, Lease(user_id="u1", credential_id=cred.credential_id, model_name="m")
    )
    got = await resolve(env, "job-1", 2)
    assert got.api_key == KEY
    assert got.credential_id == cred.credential_id
    assert got.api_key_mode == USER_KEY_MODE
    assert got.model_name == "m"
    assert got.base_url == "http://127.0.0.1:9/standin"
    # the fencing triple travelled to job_service, with the instance id in metadata too
    assert env.fake.calls[-1] == {
        "job_id": "job-1",
        "instance": INSTANCE,
        "attempt_no": 2,
        "md_instance": INSTANCE,
    }


async def test_resolve_refused_for_non_holder(env: Env) -> None:
    cred = await put(env)
    env.fake.hold("job-1", INSTANCE, 2, Lease(user_id="u1", credential_id=cred.credential_id))
    # another worker, an old attempt, a newer attempt: all LOCK_NOT_HELD, no key
    for instance, attempt in [("worker-b", 2), (INSTANCE, 1), (INSTANCE, 3)]:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await resolve(env, "job-1", attempt, instance)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert from_rpc_error(exc.value).code == ErrorCode.LOCK_NOT_HELD
        assert KEY not in (exc.value.details() or "")
        assert KEY not in str(exc.value.trailing_metadata())


async def test_resolve_unknown_job_passes_job_not_found(env: Env) -> None:
    err = await refused(resolve(env, "job-missing", 1))
    assert err.code == ErrorCode.JOB_NOT_FOUND


async def test_resolve_requires_instance_id(env: Env) -> None:
    err = await refused(resolve(env, "job-1", 1, instance=None))
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert env.fake.calls == []


async def test_resolve_job_service_down_is_unavailable(start_env: StartFn) -> None:
    env = await start_env(JOB_SERVICE_ADDR="127.0.0.1:1", VERIFY_LEASE_TIMEOUT_SECONDS=1.0)
    err = await refused(resolve(env, "job-1", 1))
    assert err.code == ErrorCode.UNAVAILABLE


async def test_resolve_uses_the_current_key_and_refuses_an_invalid_or_missing_one(
    env: Env,
) -> None:
    """A job recorded the key it was created with; resolve answers the user's current
    valid key (reference §9.4), refusing only a key marked invalid, or none at all."""
    old = await put(env)
    new = await put(env, key="sk-replacement-0000000000000000zzzz")
    env.fake.hold("job-old", INSTANCE, 1, Lease(user_id="u1", credential_id=old.credential_id))
    got = await resolve(env, "job-old", 1)
    assert (got.api_key, got.credential_id) == (
        "sk-replacement-0000000000000000zzzz",
        new.credential_id,
    )

    # a job without a recorded credential id uses the user's current key too
    env.fake.hold("job-any", INSTANCE, 1, Lease(user_id="u1"))
    assert (await resolve(env, "job-any", 1)).api_key == "sk-replacement-0000000000000000zzzz"

    await env.stub.MarkCredentialInvalid(
        rr.MarkCredentialInvalidRequest(credential_id=new.credential_id, reason="HTTP 401"),
        metadata=env.md(),
    )
    env.fake.hold("job-new", INSTANCE, 1, Lease(user_id="u1", credential_id=new.credential_id))
    err = await refused(resolve(env, "job-new", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert (err.details or {})["reason"] == "credential_invalid"

    env.fake.hold("job-u2", INSTANCE, 1, Lease(user_id="u2"))
    err = await refused(resolve(env, "job-u2", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert (err.details or {})["reason"] == "no_credential"


async def test_ciphertext_copied_to_other_users_row_is_refused(env: Env) -> None:
    a = await put(env, "alice", "sk-alice-000000000000000000000aaaa")
    b = await put(env, "bob", "sk-bob-00000000000000000000000bbbb")
    db = sqlite3.connect(env.db_path)
    with db:
        nonce, ct, kid = db.execute(
            "select nonce, ciphertext, key_id from ai_model_credentials where user_id='alice'"
        ).fetchone()
        db.execute(
            "update ai_model_credentials set nonce=?, ciphertext=?, key_id=? where user_id='bob'",
            (nonce, ct, kid),
        )
    db.close()
    env.fake.hold("job-b", INSTANCE, 1, Lease(user_id="bob", credential_id=b.credential_id))
    err = await refused(resolve(env, "job-b", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert "sk-alice" not in err.message and "sk-alice" not in str(err.details)
    # and the check reports bob's key unusable; alice is untouched
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="bob", api_key_mode=USER_KEY_MODE), metadata=env.md()
    )
    assert not reply.usable
    env.fake.hold("job-a", INSTANCE, 1, Lease(user_id="alice", credential_id=a.credential_id))
    assert (await resolve(env, "job-a", 1)).api_key == "sk-alice-000000000000000000000aaaa"


async def test_tampered_row_is_invalid_credential_not_a_crash(env: Env) -> None:
    cred = await put(env)
    db = sqlite3.connect(env.db_path)
    with db:
        (ct,) = db.execute("select ciphertext from ai_model_credentials").fetchone()
        tampered = flip(ct)
        db.execute("update ai_model_credentials set ciphertext = ?", (tampered,))
    db.close()
    env.fake.hold("job-1", INSTANCE, 1, Lease(user_id="u1", credential_id=cred.credential_id))
    err = await refused(resolve(env, "job-1", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL


async def test_unknown_kid_row_is_invalid_credential(start_env: StartFn) -> None:
    from .conftest import make_key

    first = await start_env(keys=make_key("gone"), db_name="shared.db")
    cred = await put(first)
    await first.handle.stop()
    env = await start_env(keys=make_key("k9"), db_name="shared.db")
    env.fake.hold("job-1", INSTANCE, 1, Lease(user_id="u1", credential_id=cred.credential_id))
    err = await refused(resolve(env, "job-1", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert (err.details or {})["reason"] == "unknown_key_id"


async def test_health_and_reflection_are_served(env: Env) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(env.channel)
    reply = await health.Check(
        health_pb2.HealthCheckRequest(service="zhixi.airuntime.credential.v1.CredentialService")
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_metadata_helper_sends_instance_id() -> None:
    assert (metadata.RUNTIME_INSTANCE_ID, INSTANCE) in metadata.outgoing(TOKEN, INSTANCE)


async def test_job_service_refusing_our_token_is_unavailable(start_env: StartFn) -> None:
    """A misconfigured internal token is not reported to the worker as its own fault."""
    from airuntime_common.grpc_server import GrpcServer
    from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

    from .conftest import FakeJobService

    fake = FakeJobService()
    other = GrpcServer(
        token="another-token",
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.job.v1.JobService"],
        register=lambda s: job_grpc.add_JobServiceServicer_to_server(fake, s),
    )
    await other.start()
    try:
        env = await start_env(JOB_SERVICE_ADDR=f"127.0.0.1:{other.port}")
        err = await refused(resolve(env, "job-1", 1))
        assert err.code == ErrorCode.UNAVAILABLE
        assert (err.details or {}).get("upstreamCode") == ErrorCode.UNAUTHENTICATED
        assert fake.calls == []
    finally:
        await other.stop(grace=0.1)


async def test_metrics_endpoint_counts_resolves(start_env: StartFn) -> None:
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = await start_env(CREDENTIAL_SERVICE_METRICS_PORT=port, ALLOW_PLATFORM_KEY_STANDIN=True)
    env.fake.hold("job-m", INSTANCE, 1, Lease(user_id="u1", api_key_mode="platform_key"))
    await resolve(env, "job-m", 1)
    await refused(resolve(env, "job-m", 2))
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    assert 'credential_resolves_total{api_key_mode="platform_key",outcome="ok"}' in body
    assert 'outcome="LOCK_NOT_HELD"' in body
    assert STANDIN_PLATFORM_KEY not in body
