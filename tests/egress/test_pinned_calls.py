"""How a call to a user's base URL that passed the rules is made (reference §10.5):
to the checked address only, TLS verified against the host name (SNI and ``Host``
carry it), no redirect followed, no proxy taken from the environment, a kept-alive
connection reused only for the address checked, the response cap kept, every call
checked again. The model is the stand-in over TLS (a test CA) on 127.0.0.x, which
``EGRESS_ALLOW_CIDRS`` admits, reached under a name the test resolver answers."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from airuntime_common.errors import ErrorCode
from model_standin.server import StandIn, mask_key
from runtime_worker.generation import generate
from runtime_worker.providers.base import ModelError
from tests.security.tls import TlsFiles, make_ca_and_server_cert

from .support import (
    PLATFORM_KEY,
    USER_KEY,
    ConnectSpy,
    Names,
    policy,
    quiz_prompt,
    request,
    sinkhole,
    worker_provider,
)

NAME = "api.user.test"


class CountingStandIn(StandIn):
    """The stand-in, counting the connections it accepted and the TLS names asked."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.connections = 0

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        await super()._on_connection(reader, writer)


def server_tls(files: TlsFiles, names_seen: list[str | None]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert_file, files.key_file)
    context.sni_callback = lambda _sock, name, _ctx: names_seen.append(name)  # type: ignore[assignment,misc,return-value]
    return context


@contextlib.asynccontextmanager
async def model(
    tmp: Path, hosts: tuple[str, ...] = ("127.0.0.2",), cert_names: tuple[str, ...] = (NAME,)
) -> AsyncIterator[tuple[list[CountingStandIn], TlsFiles, list[str | None]]]:
    """Stand-ins over TLS on ``hosts`` (one port), with a certificate for ``cert_names``."""
    files = make_ca_and_server_cert(tmp / "tls", hosts=cert_names, name="model")
    sni: list[str | None] = []
    servers: list[CountingStandIn] = []
    port = 0
    try:
        for host in hosts:
            server = CountingStandIn(host, port, tls=server_tls(files, sni))
            await server.start()
            port = server.port
            servers.append(server)
        yield servers, files, sni
    finally:
        for server in servers:
            await server.stop()


async def test_the_checked_address_the_host_s_name_for_tls_and_host(
    tmp_path: Path, connects: ConnectSpy
) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    async with model(tmp_path) as ([server], files, sni):
        rules = policy(server.port, allow="127.0.0.2/32")
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            answer = await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
    assert answer.content and answer.provider_request_id
    assert names.lookups == [NAME]
    assert connects.attempts == [("127.0.0.2", server.port)]
    assert sni == [NAME]
    [seen] = server.requests()
    assert seen["host"] == f"{NAME}:{server.port}"
    assert seen["path"] == "/v1/chat/completions"
    assert seen["keyMask"] == mask_key(USER_KEY)


async def test_tls_is_verified_against_the_name(tmp_path: Path, connects: ConnectSpy) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    # a certificate the test CA signed, but for another name (and for the address)
    async with model(tmp_path, cert_names=("other.test", "127.0.0.2")) as ([server], files, _):
        rules = policy(server.port, allow="127.0.0.2/32")
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            with pytest.raises(ModelError) as failed:
                await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
    assert failed.value.code == ErrorCode.NETWORK_ERROR
    assert server.requests() == []  # the key was never sent


async def test_a_redirect_to_an_internal_address_is_not_followed(
    tmp_path: Path, connects: ConnectSpy
) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    async with sinkhole() as hole, model(tmp_path) as ([server], files, _):
        for target in (f"http://127.0.0.1:{hole.port}/", "http://169.254.169.254/latest"):
            server.add_faults([{"kind": "status", "status": 302, "location": target}])
            rules = policy(server.port, allow="127.0.0.2/32")
            async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
                with pytest.raises(ModelError) as failed:
                    await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
            assert failed.value.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
            assert failed.value.http_status == 302
    assert hole.hits == []
    assert {host for host, _ in connects.attempts} == {"127.0.0.2"}


async def test_no_proxy_from_the_environment(
    tmp_path: Path, connects: ConnectSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    async with sinkhole() as proxy, model(tmp_path) as ([server], files, _):
        for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        rules = policy(server.port, allow="127.0.0.2/32")
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
    assert proxy.hits == []
    assert len(server.requests()) == 1


async def test_a_kept_alive_connection_serves_only_the_address_checked(
    tmp_path: Path, connects: ConnectSpy
) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    async with model(tmp_path, hosts=("127.0.0.2", "127.0.0.3")) as ([two, three], files, _):
        url = f"https://{NAME}:{two.port}/v1"
        rules = policy(two.port, allow="127.0.0.0/29")
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            await provider.complete(request(url))
            await provider.complete(request(url))
            assert (two.connections, len(two.requests())) == (1, 2)  # kept alive, reused
            names.table[NAME] = ["127.0.0.3"]  # the name now answers another address
            await provider.complete(request(url))
            assert (three.connections, len(three.requests())) == (1, 1)
            assert (two.connections, len(two.requests())) == (1, 2)  # not over the old one
            names.table[NAME] = ["127.0.0.2"]
            await provider.complete(request(url))
            assert (two.connections, len(two.requests())) == (1, 3)
    assert names.lookups == [NAME] * 4  # every call looked it up once


async def test_the_next_checked_address_when_one_refuses(
    tmp_path: Path, connects: ConnectSpy
) -> None:
    names = Names({NAME: ["127.0.0.4", "127.0.0.2"]})  # nothing listens on .4
    async with model(tmp_path) as ([server], files, _):
        rules = policy(server.port, allow="127.0.0.0/29")
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
    assert connects.attempts == [("127.0.0.4", server.port), ("127.0.0.2", server.port)]
    assert len(server.requests()) == 1


async def test_the_response_cap_holds(tmp_path: Path, connects: ConnectSpy) -> None:
    names = Names({NAME: ["127.0.0.2"]})
    async with model(tmp_path) as ([server], files, _):
        server.add_faults([{"kind": "huge_body", "totalBytes": 4_000_000}])
        rules = policy(server.port, allow="127.0.0.2/32")
        async with worker_provider(
            rules, names, ca_file=files.ca_file, max_response_bytes=64 * 1024
        ) as provider:
            with pytest.raises(ModelError) as failed:
                await provider.complete(request(f"https://{NAME}:{server.port}/v1"))
    assert failed.value.code == ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert "MODEL_MAX_RESPONSE_BYTES" in failed.value.message


async def test_a_re_ask_is_checked_again(tmp_path: Path, connects: ConnectSpy) -> None:
    """Every call of an attempt runs the rules: the re-ask after an unusable answer
    finds the name moved to loopback and is refused, with nothing sent."""

    class MovesAfterOne(Names):
        async def __call__(self, host: str, port: int) -> list[str]:
            self.lookups.append(host)
            return ["127.0.0.2"] if len(self.lookups) == 1 else ["127.0.0.1"]

    names = MovesAfterOne()
    async with model(tmp_path) as ([server], files, _):
        server.add_faults([{"kind": "invalid_json"}])
        rules = policy(server.port, allow="127.0.0.2/32")
        prompt = quiz_prompt()
        calls: list[Any] = []
        async with worker_provider(rules, names, ca_file=files.ca_file) as provider:
            with pytest.raises(ModelError) as failed:
                await generate(
                    provider,
                    job_type="quiz_generation",
                    prompt=prompt,
                    model="deepseek-chat",
                    api_key=USER_KEY,
                    base_url=f"https://{NAME}:{server.port}/v1",
                    job_deadline=time.monotonic() + 60,
                    max_call_seconds=10,
                    invocations=calls,
                )
    assert failed.value.code == ErrorCode.EGRESS_BLOCKED
    assert names.lookups == [NAME, NAME]
    assert [c.error_code for c in calls] == ["INVALID_SCHEMA", "EGRESS_BLOCKED"]
    assert len(server.requests()) == 1
    assert PLATFORM_KEY not in str(server.requests())
