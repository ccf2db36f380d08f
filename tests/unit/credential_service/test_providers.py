"""Several providers (reference §9.4, cases P5, P6): resolve answers for the provider the
lease names (a platform key) or the key's own (a user key), with that provider's base
URL, platform key and model name; a key is never sent to another provider; a key
stored while jobs wait is the one they run on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airuntime_common.errors import ErrorCode
from credential_service.settings import STANDIN_PLATFORM_KEY
from model_standin import key_fingerprint, run_standins
from runtime_worker.prompts import render_prompt
from runtime_worker.providers.base import ModelRequest
from runtime_worker.providers.deepseek import DeepSeekProvider
from runtime_worker.snapshot import validate_snapshot
from tests.unit.runtime_worker.rw_helpers import snapshot_payload
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

from .conftest import INSTANCE, Env, Lease, StartFn
from .test_servicer import PLATFORM_MODE, USER_KEY_MODE, put, refused, resolve

PRIMARY_KEY = "sk-primary-platform-000000000001"
BACKUP_KEY = "sk-backup-platform-0000000000002"
USER_KEY = "sk-user-own-backup-key-000000003"


def providers(primary_url: str, backup_url: str) -> list[dict[str, Any]]:
    return [
        {"name": "primary", "baseUrl": primary_url, "apiKeyEnv": "PRIMARY_API_KEY"},
        {
            "name": "backup",
            "baseUrl": backup_url,
            "apiKeyEnv": "BACKUP_API_KEY",
            "models": {"deepseek-chat": "backup-chat"},
        },
        {"name": "keyless", "baseUrl": "http://127.0.0.1:9/keyless", "apiKeyEnv": "NO_SUCH_KEY"},
    ]


@pytest.fixture
def platform_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMARY_API_KEY", PRIMARY_KEY)
    monkeypatch.setenv("BACKUP_API_KEY", f"  {BACKUP_KEY}\n")  # trimmed
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)


async def start(start_env: StartFn, **overrides: Any) -> Env:
    return await start_env(
        MODEL_PROVIDERS=providers("http://127.0.0.1:9/primary", "http://127.0.0.1:9/backup"),
        **overrides,
    )


@pytest.mark.usefixtures("platform_keys")
async def test_a_platform_key_job_resolves_for_its_lease_s_provider(start_env: StartFn) -> None:
    env = await start(start_env)
    for job, provider in [("job-p", "primary"), ("job-b", "backup")]:
        env.fake.hold(
            job,
            INSTANCE,
            1,
            Lease(user_id="u1", api_key_mode="platform_key", model_provider=provider),
        )
    got = await resolve(env, "job-p", 1)
    assert (got.model_provider, got.base_url, got.api_key, got.model_name) == (
        "primary",
        "http://127.0.0.1:9/primary",
        PRIMARY_KEY,
        "deepseek-chat",  # no models table: the job's own name
    )
    got = await resolve(env, "job-b", 1)
    assert (got.model_provider, got.base_url, got.api_key, got.model_name) == (
        "backup",
        "http://127.0.0.1:9/backup",
        BACKUP_KEY,
        "backup-chat",  # the provider's name for the job's deepseek-chat
    )
    assert got.api_key_mode == PLATFORM_MODE and got.credential_id == ""


@pytest.mark.usefixtures("platform_keys")
@pytest.mark.parametrize(
    ("lease", "reason"),
    [
        (
            Lease(user_id="u1", api_key_mode="platform_key", model_provider="gone"),
            "unknown_provider",
        ),
        (
            Lease(user_id="u1", api_key_mode="platform_key", model_provider="keyless"),
            "no_platform_key",
        ),
        (
            Lease(
                user_id="u1",
                api_key_mode="platform_key",
                model_provider="backup",
                model_name="deepseek-reasoner",
            ),
            "model_not_served",
        ),
    ],
)
async def test_a_platform_key_lease_the_providers_cannot_serve_is_refused(
    start_env: StartFn, lease: Lease, reason: str
) -> None:
    env = await start(start_env)
    env.fake.hold("job-x", INSTANCE, 1, lease)
    err = await refused(resolve(env, "job-x", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert (err.details or {})["reason"] == reason
    assert PRIMARY_KEY not in str(err) and BACKUP_KEY not in str(err)


@pytest.mark.usefixtures("platform_keys")
async def test_a_lease_naming_no_provider_gets_the_first_with_a_key_that_serves_it(
    start_env: StartFn,
) -> None:
    env = await start(start_env)
    env.fake.hold(
        "job-n", INSTANCE, 1, Lease(user_id="u1", api_key_mode="platform_key", model_provider="")
    )
    assert (await resolve(env, "job-n", 1)).model_provider == "primary"


@pytest.mark.usefixtures("platform_keys")
async def test_check_names_the_providers_a_job_may_run_on(start_env: StartFn) -> None:
    env = await start(start_env)
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=PLATFORM_MODE), metadata=env.md()
    )
    assert reply.usable and list(reply.providers) == ["primary", "backup"]  # keyless has none
    await put(env, key=USER_KEY, provider="backup")
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=USER_KEY_MODE), metadata=env.md()
    )
    assert reply.usable and list(reply.providers) == ["backup"]


async def test_the_stand_in_key_stands_in_for_every_provider_without_one(
    start_env: StartFn,
) -> None:
    env = await start(start_env, ALLOW_PLATFORM_KEY_STANDIN=True)
    env.fake.hold(
        "job-k",
        INSTANCE,
        1,
        Lease(user_id="u1", api_key_mode="platform_key", model_provider="keyless"),
    )
    assert (await resolve(env, "job-k", 1)).api_key == STANDIN_PLATFORM_KEY
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=PLATFORM_MODE), metadata=env.md()
    )
    assert list(reply.providers) == ["primary", "backup", "keyless"]


async def test_no_provider_with_a_platform_key_refuses_platform_jobs(start_env: StartFn) -> None:
    env = await start(start_env)  # none of the three variables is set
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=PLATFORM_MODE), metadata=env.md()
    )
    assert not reply.usable and list(reply.providers) == []
    assert "PRIMARY_API_KEY" in reply.reason and "BACKUP_API_KEY" in reply.reason


@pytest.mark.usefixtures("platform_keys")
async def test_a_user_key_is_stored_for_any_configured_provider(start_env: StartFn) -> None:
    env = await start(start_env)
    stored = await put(env, key=USER_KEY, provider=" Backup ")
    assert stored.provider == "backup"
    default = await put(env, "u2", key=USER_KEY, provider="")
    assert default.provider == "primary"  # none named: the first configured
    err = await refused(
        env.stub.PutCredential(
            rr.PutCredentialRequest(user_id="u3", provider="openai", api_key=USER_KEY),
            metadata=env.md(None),
        )
    )
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert (err.details or {}).get("field") == "provider"
    assert "primary, backup, keyless" in err.message
    assert USER_KEY not in err.message


@pytest.mark.usefixtures("platform_keys")
async def test_a_user_key_job_runs_on_its_key_s_provider(start_env: StartFn) -> None:
    """Whatever provider the lease names (job_service's platform choice), a user key
    goes with its own provider's base URL and model name, never another's."""
    env = await start(start_env)
    cred = await put(env, key=USER_KEY, provider="backup")
    env.fake.hold(
        "job-u",
        INSTANCE,
        1,
        Lease(user_id="u1", credential_id=cred.credential_id, model_provider="primary"),
    )
    got = await resolve(env, "job-u", 1)
    assert (got.model_provider, got.base_url, got.api_key, got.model_name) == (
        "backup",
        "http://127.0.0.1:9/backup",
        USER_KEY,
        "backup-chat",
    )
    assert (got.api_key_mode, got.credential_id) == (USER_KEY_MODE, cred.credential_id)


async def test_a_user_key_of_a_provider_no_longer_configured_is_refused(
    start_env: StartFn,
) -> None:
    first = await start(start_env, db_name="shared.db")
    cred = await put(first, key=USER_KEY, provider="backup")
    keys = first.settings.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value()
    await first.handle.stop()
    env = await start_env(keys=keys, db_name="shared.db")  # MODEL_PROVIDERS unset: deepseek
    env.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1", credential_id=cred.credential_id))
    err = await refused(resolve(env, "job-u", 1))
    assert (err.code, (err.details or {})["reason"]) == (
        ErrorCode.INVALID_CREDENTIAL,
        "provider_not_configured",
    )
    reply = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=USER_KEY_MODE), metadata=env.md()
    )
    assert not reply.usable and "backup" in reply.reason


async def test_p5_jobs_queued_on_key_a_run_on_key_b_once_it_is_stored(env: Env) -> None:
    """Case P5: ten user-key jobs recorded key A at create; the user stores key B before
    a worker reaches them: every resolve answers B (and B's credential id, which the job
    follows), none fails ``credential_replaced``."""
    key_a = await put(env, key="sk-user-key-a-00000000000000aaaa")
    jobs = [f"job-{n}" for n in range(10)]
    for job in jobs:
        env.fake.hold(job, INSTANCE, 1, Lease(user_id="u1", credential_id=key_a.credential_id))
    key_b = await put(env, key="sk-user-key-b-00000000000000bbbb")
    answers = await asyncio.gather(*(resolve(env, job, 1) for job in jobs))
    assert {(a.api_key, a.credential_id) for a in answers} == {
        ("sk-user-key-b-00000000000000bbbb", key_b.credential_id)
    }


@pytest.mark.usefixtures("platform_keys")
async def test_p6_each_provider_is_sent_only_its_own_keys(
    start_env: StartFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case P6's key rule, on the wire: two stand-in providers record every key they
    are sent. Platform-key jobs on each, and a user key of the backup, go through
    resolve and the worker's provider: each provider saw its own keys only."""
    async with run_standins({"primary": {}, "backup": {"models": ["backup-chat"]}}) as s:
        env = await start_env(
            MODEL_PROVIDERS=providers(s["primary"].base_url, s["backup"].base_url)
        )
        cred = await put(env, key=USER_KEY, provider="backup")
        leases = {
            "job-platform-primary": Lease(
                user_id="u1", api_key_mode="platform_key", model_provider="primary"
            ),
            "job-platform-backup": Lease(
                user_id="u1", api_key_mode="platform_key", model_provider="backup"
            ),
            # a user-key job whose lease names the primary (the job's default provider)
            "job-user": Lease(
                user_id="u1", credential_id=cred.credential_id, model_provider="primary"
            ),
        }
        snapshot = validate_snapshot(
            snapshot_payload("flashcard_generation"),
            schema_version="v1",
            job_type="flashcard_generation",
        )
        prompt = render_prompt("flashcard_generation", snapshot, {"count": 1})
        model = DeepSeekProvider()
        try:
            for job, lease in leases.items():
                env.fake.hold(job, INSTANCE, 1, lease)
                got = await resolve(env, job, 1)
                answer = await model.complete(
                    ModelRequest(
                        model=got.model_name,
                        messages=prompt.messages,
                        max_tokens=prompt.max_tokens,
                        api_key=got.api_key,
                        base_url=got.base_url,
                        timeout_seconds=10,
                    )
                )
                assert answer.finish_reason == "stop"  # answered: key and model were right
        finally:
            await model.aclose()
        assert s["primary"].seen_keys() == {key_fingerprint(PRIMARY_KEY)}
        assert s["backup"].seen_keys() == {key_fingerprint(BACKUP_KEY), key_fingerprint(USER_KEY)}
        assert s["primary"].seen()["models"] == {"deepseek-chat": 1}
        assert s["backup"].seen()["models"] == {"backup-chat": 2}
