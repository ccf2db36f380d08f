"""Users' own base URLs at credential_service (reference §10.5), over gRPC.

Off unless ``USER_BASE_URLS`` (a ``base_url`` → INVALID_ARGUMENT); on, every rule is
checked before anything is written (422 ``INVALID_BASE_URL``, ``details.rule``); the
masked view shows the normalized URL; a PUT without one removes it; a user-key
resolve carries it flagged ``user_base_url``, a platform-key resolve never does; the
URL is bound into the ciphertext's associated data; turned off later, the stored URL
is not used (create refused, resolve ``EGRESS_BLOCKED``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import pytest

from airuntime_common.errors import ErrorCode
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

from .conftest import INSTANCE, Env, Lease, StartFn
from .test_servicer import PLATFORM_MODE, USER_KEY_MODE, refused, resolve

KEY = "sk-user-own-gateway-key-00000001"
PUBLIC = "93.184.216.34"

#: What the test resolver answers (a name it does not know does not resolve).
NAMES = {
    "llm.example.com": [PUBLIC, "2606:2800:220:1:248:1893:25c8:1946"],
    "inside.example.com": ["10.20.0.7"],
    "rebind.example.com": [PUBLIC],
    "dual.example.com": [PUBLIC, "127.0.0.1"],
}


async def fake_resolver(host: str, port: int) -> Sequence[str]:
    import socket

    if host in NAMES:
        return NAMES[host]
    try:  # literals and numeric notations: as getaddrinfo reads them
        return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    except socket.gaierror:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None


async def start(start_env: StartFn, **overrides: object) -> Env:
    env = await start_env(**overrides)
    env.handle.store.resolver = fake_resolver
    return env


async def put(
    env: Env, base_url: str = "", user: str = "u1", key: str = KEY
) -> rr.PutCredentialResponse:
    reply: rr.PutCredentialResponse = await env.stub.PutCredential(
        rr.PutCredentialRequest(user_id=user, provider="deepseek", api_key=key, base_url=base_url),
        metadata=env.md(None),
    )
    return reply


def rows(env: Env) -> list[tuple[str, str | None]]:
    db = sqlite3.connect(env.db_path)
    try:
        return list(db.execute("select user_id, base_url from ai_model_credentials"))
    finally:
        db.close()


async def test_off_by_default_a_base_url_is_an_invalid_argument(start_env: StartFn) -> None:
    env = await start(start_env)
    err = await refused(put(env, "https://llm.example.com/v1"))
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert err.details == {"field": "baseUrl"} and "USER_BASE_URLS" in err.message
    assert rows(env) == []
    # without one the key is stored as ever
    assert (await put(env)).credential.base_url == ""


async def test_stored_normalized_shown_and_removed_by_a_put_without_it(start_env: StartFn) -> None:
    env = await start(start_env, USER_BASE_URLS=True, USER_BASE_URL_PORTS="8443")
    cred = (await put(env, "https://LLM.Example.com:8443/v1/")).credential
    assert cred.base_url == "https://llm.example.com:8443/v1"
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md(None))
    assert got.credential.base_url == "https://llm.example.com:8443/v1"
    assert rows(env) == [("u1", "https://llm.example.com:8443/v1")]
    # port 443 is left out of the normalized form
    assert (await put(env, "https://llm.example.com:443")).credential.base_url == (
        "https://llm.example.com"
    )
    # a PUT replaces the credential whole: without base_url, none is kept
    assert (await put(env)).credential.base_url == ""
    assert rows(env) == [("u1", None)]


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://llm.example.com/v1", "scheme"),
        ("ftp://llm.example.com/", "scheme"),
        ("https://me:pw@llm.example.com/", "user_info"),
        ("https://llm.example.com/v1?k=1", "query"),
        ("https://llm.example.com/v1#x", "fragment"),
        ("https://llm.example.com:22/", "port"),
        ("https://no-such-host.example/", "unresolvable"),
        ("https://inside.example.com/", "address"),
        ("https://dual.example.com/", "address"),
        ("https://2130706433/", "address"),
        ("https://[::ffff:169.254.169.254]/", "address"),
        ("https://llm.example.com\\@127.0.0.1/", "syntax"),
    ],
)
async def test_a_broken_rule_is_422_naming_it_and_stores_nothing(
    start_env: StartFn, url: str, rule: str
) -> None:
    env = await start(start_env, USER_BASE_URLS=True)
    await put(env, "https://llm.example.com/v1")
    before = rows(env)
    err = await refused(put(env, url, key="sk-another-key-000000000002"))
    assert err.code == ErrorCode.INVALID_BASE_URL
    assert err.details == {"field": "baseUrl", "rule": rule}
    assert f"({rule})" in err.message and "sk-another" not in err.message
    assert rows(env) == before  # the old credential is untouched


async def test_an_operator_network_and_http_inside_it(start_env: StartFn) -> None:
    env = await start(
        start_env, USER_BASE_URLS=True, EGRESS_ALLOW_CIDRS="10.20.0.0/16", USER_BASE_URL_PORTS="80"
    )
    assert (await put(env, "http://inside.example.com/v1")).credential.base_url == (
        "http://inside.example.com/v1"
    )
    err = await refused(put(env, "http://llm.example.com/v1"))  # http to a public address
    assert (err.code, err.details["rule"]) == (ErrorCode.INVALID_BASE_URL, "scheme")


async def test_resolve_carries_the_user_url_for_the_user_key_only(start_env: StartFn) -> None:
    env = await start(
        start_env, USER_BASE_URLS=True, DEEPSEEK_API_KEY="sk-platform-key-0000000000000009"
    )
    cred = (await put(env, "https://llm.example.com/v1")).credential
    env.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1"))
    env.fake.hold("job-p", INSTANCE, 1, Lease(user_id="u1", api_key_mode="platform_key"))
    mine = await resolve(env, "job-u", 1)
    assert mine.api_key_mode == USER_KEY_MODE and mine.api_key == KEY
    assert (mine.base_url, mine.user_base_url) == ("https://llm.example.com/v1", True)
    assert mine.credential_id == cred.credential_id
    # the same user's platform-key job: the provider's endpoint, never the user's
    platform = await resolve(env, "job-p", 1)
    assert platform.api_key_mode == PLATFORM_MODE
    assert (platform.base_url, platform.user_base_url) == ("http://127.0.0.1:9/standin", False)
    assert platform.api_key != KEY


async def test_a_url_changed_in_the_database_makes_the_key_unusable(start_env: StartFn) -> None:
    env = await start(start_env, USER_BASE_URLS=True)
    await put(env, "https://llm.example.com/v1")
    db = sqlite3.connect(env.db_path)
    with db:
        db.execute("update ai_model_credentials set base_url = 'https://attacker.example/v1'")
    db.close()
    env.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1"))
    err = await refused(resolve(env, "job-u", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    assert err.details["reason"] == "authentication_failed"
    check = await env.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=USER_KEY_MODE), metadata=env.md(None)
    )
    assert not check.usable


async def test_turned_off_later_the_stored_url_is_not_used(start_env: StartFn) -> None:
    on = await start(start_env, USER_BASE_URLS=True, db_name="shared.db")
    await put(on, "https://llm.example.com/v1")
    off = await start(start_env, db_name="shared.db")  # the same rows, USER_BASE_URLS off
    check = await off.stub.CheckCredential(
        rr.CheckCredentialRequest(user_id="u1", api_key_mode=USER_KEY_MODE), metadata=off.md(None)
    )
    assert not check.usable and "USER_BASE_URLS" in check.reason
    off.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1"))
    err = await refused(resolve(off, "job-u", 1))
    assert err.code == ErrorCode.EGRESS_BLOCKED
    assert err.details["reason"] == "user_base_urls_off"


async def test_rotation_reseals_a_row_with_a_base_url(start_env: StartFn) -> None:
    from .conftest import make_key

    k1 = make_key("k1")
    old = await start(start_env, keys=k1, USER_BASE_URLS=True, db_name="rot.db")
    await put(old, "https://llm.example.com/v1")
    new = await start(
        start_env, keys=f"{make_key('k2')},{k1}", USER_BASE_URLS=True, db_name="rot.db"
    )
    done = await new.stub.RotateKeys(rr.RotateKeysRequest(), metadata=new.md(None))
    assert (done.rotated, done.remaining) == (1, 0)
    new.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1"))
    got = await resolve(new, "job-u", 1)
    assert (got.api_key, got.base_url) == (KEY, "https://llm.example.com/v1")
