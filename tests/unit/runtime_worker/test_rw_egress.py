"""Which calls the worker guards (reference §10.5): a resolve answer flagged
``user_base_url`` gets the guard with the worker's own settings, any other answer (a
configured provider's endpoint, the worker's own platform key) the provider as is."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest

from airuntime_common.egress import EgressPolicy
from airuntime_common.errors import ErrorCode
from runtime_worker.attempt import ModelKey
from runtime_worker.egress import GuardedProvider, guard
from runtime_worker.providers.base import ModelError, ModelRequest
from runtime_worker.settings import WorkerSettings
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr


class Fake:
    name = "deepseek"
    accepts_pinned = True

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        return "answered"


@dataclass
class W:
    provider: Any
    settings: WorkerSettings


def worker(**env: Any) -> W:
    return W(Fake(), WorkerSettings(RUNTIME_SERVICE_TOKEN="t", **env))


def answer(user_base_url: bool, mode: int = common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY) -> Any:
    return cred_rr.ResolveCredentialResponse(
        api_key_mode=mode,  # type: ignore[arg-type]
        api_key="sk-user-000000000001",
        base_url="https://llm.example.com/v1",
        user_base_url=user_base_url,
    )


def test_a_configured_endpoint_is_not_guarded() -> None:
    w = worker(USER_BASE_URLS=True)
    assert guard(w.provider, w.settings, answer(False)) is w.provider
    held = ModelKey(common_pb2.API_KEY_MODE_PLATFORM_KEY, "", "sk-p", "deepseek", "m", "https://x")
    assert guard(w.provider, w.settings, held) is w.provider


def test_a_user_s_endpoint_is_guarded_with_the_worker_s_settings() -> None:
    w = worker(USER_BASE_URLS=True, USER_BASE_URL_PORTS="8443", EGRESS_ALLOW_CIDRS="10.0.0.0/8")
    guarded = guard(w.provider, w.settings, answer(True))
    assert isinstance(guarded, GuardedProvider) and guarded.inner is w.provider
    assert guarded.policy == EgressPolicy(frozenset({8443}), (ipaddress.ip_network("10.0.0.0/8"),))
    assert guarded.enabled and guarded.user_key
    assert not guard(
        w.provider, w.settings, answer(True, common_pb2.API_KEY_MODE_PLATFORM_KEY)
    ).user_key  # type: ignore[attr-defined]
    assert not guard(Fake(), worker().settings, answer(True)).enabled  # type: ignore[attr-defined]


async def test_the_guarded_call_is_pinned_to_what_was_checked() -> None:
    async def names(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    inner = Fake()
    guarded = GuardedProvider(inner, EgressPolicy(), enabled=True, user_key=True, resolver=names)
    request = ModelRequest("m", [], 10, "sk-k", "https://llm.example.com/v1", 5.0)
    assert await guarded.complete(request) == "answered"
    [sent] = inner.requests
    assert sent.pinned is not None and sent.pinned.base.host == "llm.example.com"
    assert [str(a) for a in sent.pinned.addresses] == ["93.184.216.34"]
    assert 0 < sent.timeout_seconds <= 5.0


async def test_a_provider_that_cannot_pin_is_never_called() -> None:
    class Unpinned(Fake):
        accepts_pinned = False

    inner = Unpinned()
    guarded = GuardedProvider(inner, EgressPolicy(), enabled=True, user_key=True)
    with pytest.raises(ModelError) as blocked:
        await guarded.complete(ModelRequest("m", [], 10, "k", "https://8.8.8.8/v1", 5.0))
    assert blocked.value.code == ErrorCode.EGRESS_BLOCKED and inner.requests == []
