"""SSRF payloads from public lists against users' base URLs (reference §10.5).

Every payload runs twice against a sinkhole of its own on loopback (127.0.0.1 and
[::1], one port, listed in ``USER_BASE_URL_PORTS`` so only the rule under attack can
refuse it):

* stored: credential_service's store refuses it 422 ``INVALID_BASE_URL`` with the
  expected ``details.rule``, and stores nothing;
* called: the worker's guarded provider (the real DeepSeek provider behind the real
  guard) refuses it ``EGRESS_BLOCKED`` before any connection.

Either way the sinkhole sees no connection and the HTTP client starts none (a spy on
its connects), so a payload that got through fails the test, even one aimed at an
address no sinkhole can hold (metadata, private ranges).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airuntime_common.errors import AppError, ErrorCode
from runtime_worker.providers.base import ModelError

from .support import (
    NAMES,
    PAYLOADS,
    USER_KEY,
    ConnectSpy,
    Names,
    Payload,
    credential_store,
    policy,
    request,
    sinkhole,
    sqlite_url,
    worker_provider,
)


def test_the_list_is_long_and_varied() -> None:
    assert len(PAYLOADS) >= 40
    assert len({p.label for p in PAYLOADS}) == len(PAYLOADS)
    assert {p.source for p in PAYLOADS} >= {"PATT", "HT", "cloud"}
    rules = set().union(*(p.rules for p in PAYLOADS))
    assert rules >= {"address", "user_info", "port", "scheme", "syntax", "query", "fragment"}


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.label)
async def test_refused_when_stored(payload: Payload, tmp_path: Path, connects: ConnectSpy) -> None:
    async with (
        sinkhole() as hole,
        credential_store(
            sqlite_url(tmp_path), Names(NAMES), USER_BASE_URL_PORTS=str(hole.port)
        ) as store,
    ):
        with pytest.raises(AppError) as refused:
            await store.put("u1", "deepseek", USER_KEY, payload.at(hole.port))
        assert refused.value.code == ErrorCode.INVALID_BASE_URL, refused.value
        assert refused.value.details is not None
        assert refused.value.details["rule"] in payload.rules, refused.value.message
        assert USER_KEY not in refused.value.message
        with pytest.raises(AppError) as none:
            await store.get("u1")
        assert none.value.code == ErrorCode.NOT_FOUND  # nothing was stored
    assert hole.hits == [] and connects.attempts == []


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.label)
async def test_refused_at_call_time_with_no_connection(
    payload: Payload, connects: ConnectSpy
) -> None:
    async with sinkhole() as hole, worker_provider(policy(hole.port), Names(NAMES)) as provider:
        with pytest.raises(ModelError) as blocked:
            await provider.complete(request(payload.at(hole.port)))
    assert hole.hits == [], f"{payload.label} reached the sinkhole"
    assert connects.attempts == [], f"{payload.label} connected to {connects.attempts}"
    assert blocked.value.code == ErrorCode.EGRESS_BLOCKED, blocked.value
    assert any(f"({rule})" in blocked.value.message for rule in payload.rules)
    assert blocked.value.http_status is None  # no answer: nothing was asked


async def test_a_platform_key_never_goes_to_a_user_url(connects: ConnectSpy) -> None:
    # a URL every rule allows (the operator's own network), but the attempt's key is a
    # platform key: refused before any lookup
    names = Names({"gateway.example.com": ["127.0.0.1"]})
    async with (
        sinkhole() as hole,
        worker_provider(policy(hole.port, allow="127.0.0.1/32"), names, user_key=False) as provider,
    ):
        with pytest.raises(ModelError) as blocked:
            await provider.complete(request(f"https://gateway.example.com:{hole.port}/v1"))
    assert blocked.value.code == ErrorCode.EGRESS_BLOCKED
    assert "user's own key" in blocked.value.message
    assert hole.hits == [] and connects.attempts == [] and names.lookups == []


async def test_off_on_the_worker_nothing_is_called(connects: ConnectSpy) -> None:
    names = Names({"gateway.example.com": ["127.0.0.1"]})
    async with (
        sinkhole() as hole,
        worker_provider(policy(hole.port, allow="127.0.0.1/32"), names, enabled=False) as provider,
    ):
        with pytest.raises(ModelError) as blocked:
            await provider.complete(request(f"https://gateway.example.com:{hole.port}/v1"))
    assert blocked.value.code == ErrorCode.EGRESS_BLOCKED
    assert "USER_BASE_URLS" in blocked.value.message
    assert hole.hits == [] and connects.attempts == []


async def test_a_name_that_changes_between_store_and_call(
    tmp_path: Path, connects: ConnectSpy
) -> None:
    names = Names({"rebind.attacker.test": ["93.184.216.34"]})
    async with sinkhole() as hole:
        url = f"https://rebind.attacker.test:{hole.port}/v1"
        async with credential_store(
            sqlite_url(tmp_path), names, USER_BASE_URL_PORTS=str(hole.port)
        ) as store:
            view = await store.put("u1", "deepseek", USER_KEY, url)
        assert view.base_url == url  # public when stored
        names.table["rebind.attacker.test"] = ["127.0.0.1"]  # loopback when called
        async with worker_provider(policy(hole.port), names) as provider:
            with pytest.raises(ModelError) as blocked:
                await provider.complete(request(url))
    assert blocked.value.code == ErrorCode.EGRESS_BLOCKED
    assert "127.0.0.1" in blocked.value.message and "loopback" in blocked.value.message
    assert hole.hits == [] and connects.attempts == []


async def test_no_second_lookup_within_a_call(connects: ConnectSpy) -> None:
    """DNS rebinding inside one call: the first answer is public, every later one is
    loopback. The call looks the name up once and connects to the public address it
    checked (which the spy refuses to reach), never to loopback."""

    class Rebinding(Names):
        async def __call__(self, host: str, port: int) -> list[str]:
            self.lookups.append(host)
            return ["93.184.216.34"] if len(self.lookups) == 1 else ["127.0.0.1"]

    names = Rebinding()
    async with sinkhole() as hole, worker_provider(policy(hole.port), names) as provider:
        with pytest.raises(ModelError) as failed:
            await provider.complete(request(f"https://rebind.attacker.test:{hole.port}/v1"))
    assert failed.value.code == ErrorCode.NETWORK_ERROR  # the spy kept it off the network
    assert names.lookups == ["rebind.attacker.test"]
    assert connects.attempts == [("93.184.216.34", hole.port)]
    assert hole.hits == []


async def test_a_resolver_that_fails_for_now_is_retryable_and_connects_nowhere(
    connects: ConnectSpy,
) -> None:
    import socket

    class Down(Names):
        async def __call__(self, host: str, port: int) -> list[str]:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    async with sinkhole() as hole, worker_provider(policy(hole.port), Down()) as provider:
        with pytest.raises(ModelError) as failed:
            await provider.complete(request(f"https://llm.example.com:{hole.port}/v1"))
    assert failed.value.code == ErrorCode.NETWORK_ERROR
    assert hole.hits == [] and connects.attempts == []
