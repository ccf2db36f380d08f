"""The pure egress rules of users' base URLs (reference §10.5): shapes, addresses in
every notation, the operator's networks, the settings and the resolver's errors."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from airuntime_common.egress import (
    SPECIAL,
    EgressPolicy,
    EgressRefused,
    EgressSettings,
    ResolutionUnavailable,
    Rule,
    address_refusal,
    check_base_url,
    parse_base_url,
    system_resolver,
)

POLICY = EgressPolicy(frozenset({8443}))
IPv4 = ipaddress.IPv4Address


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def refused(url: str, policy: EgressPolicy = POLICY, resolver: object = None) -> EgressRefused:
    with pytest.raises(EgressRefused) as exc:
        run(check_base_url(url, policy, resolver=resolver))  # type: ignore[arg-type]
    return exc.value


# ---------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("", Rule.SYNTAX),
        ("https://", Rule.SYNTAX),
        ("https:llm.example.com", Rule.SYNTAX),
        ("https:/llm.example.com", Rule.SYNTAX),
        ("https://llm.example.com/a b", Rule.SYNTAX),
        ("https://llm.example.com/\r\nHost: 127.0.0.1", Rule.SYNTAX),
        ("https://llm.exämple.com/", Rule.SYNTAX),
        ("https://１２７．０．０．１/", Rule.SYNTAX),  # fullwidth digits and dots
        ("https://127。0。0。1/", Rule.SYNTAX),  # ideographic full stops
        ("https://%31%32%37.0.0.1/", Rule.SYNTAX),
        ("https://llm.example.com\\@127.0.0.1/", Rule.SYNTAX),
        ("https://[fe80::1%25lo]/", Rule.SYNTAX),  # a zone
        ("https://[::1/", Rule.SYNTAX),
        ("https://[127.0.0.1]/", Rule.SYNTAX),
        ("https://llm.example.com:0/", Rule.SYNTAX),
        ("https://llm.example.com:65536/", Rule.SYNTAX),
        ("https://llm.example.com:+443/", Rule.SYNTAX),
        ("https://llm.example.com:/", Rule.SYNTAX),
        ("https://-bad-.example.com/", Rule.SYNTAX),
        ("https://" + "a" * 64 + ".example.com/", Rule.SYNTAX),
        ("https://llm.example.com/" + "v" * 2048, Rule.SYNTAX),
        ("https://llm.example.com/%zz", Rule.SYNTAX),
        ("file:///etc/passwd", Rule.SCHEME),
        ("gopher://127.0.0.1:70/_SLAVEOF", Rule.SCHEME),
        ("dict://127.0.0.1:11211/stats", Rule.SCHEME),
        ("ftp://llm.example.com/", Rule.SCHEME),
        ("ldap://llm.example.com/", Rule.SCHEME),
        ("jar:https://llm.example.com!/", Rule.SCHEME),
        ("//llm.example.com/v1", Rule.SCHEME),
        ("https://user@llm.example.com/", Rule.USER_INFO),
        ("https://user:pass@llm.example.com/", Rule.USER_INFO),
        ("https://llm.example.com@127.0.0.1/", Rule.USER_INFO),
        ("https://llm.example.com/v1?next=http://127.0.0.1/", Rule.QUERY),
        ("https://llm.example.com/v1?", Rule.QUERY),
        ("https://llm.example.com#@127.0.0.1/", Rule.FRAGMENT),
        ("https://llm.example.com/v1#", Rule.FRAGMENT),
        ("https://llm.example.com:22/", Rule.PORT),
        ("https://llm.example.com:6379/", Rule.PORT),
        ("http://llm.example.com/", Rule.SCHEME),  # http only inside EGRESS_ALLOW_CIDRS
    ],
)
def test_shape_rules(url: str, rule: Rule) -> None:
    with pytest.raises(EgressRefused) as exc:
        parse_base_url(url, POLICY)
    assert exc.value.rule is rule


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("https://LLM.Example.COM/v1/", "https://llm.example.com/v1"),
        ("HTTPS://llm.example.com:443", "https://llm.example.com"),
        ("https://llm.example.com:8443/openai/v1", "https://llm.example.com:8443/openai/v1"),
        ("https://[2606:4700:0:0::1111]/v1", "https://[2606:4700::1111]/v1"),
        ("https://llm.example.com./v1", "https://llm.example.com./v1"),
        ("https://xn--fsqu00a.example/v1;x=1/a%2Fb", "https://xn--fsqu00a.example/v1;x=1/a%2Fb"),
    ],
)
def test_normalized(url: str, normal: str) -> None:
    assert parse_base_url(url, POLICY).url == normal


def test_host_header_and_name() -> None:
    base = parse_base_url("https://llm.example.com:8443/v1", POLICY)
    assert (base.host, base.port, base.path, base.host_header) == (
        "llm.example.com",
        8443,
        "/v1",
        "llm.example.com:8443",
    )
    v6 = parse_base_url("https://[2606:4700::1111]/", POLICY)
    assert (v6.host, v6.host_header) == ("2606:4700::1111", "[2606:4700::1111]")


# ------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("10.1.2.3", "private"),
        ("172.31.255.255", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "shared"),
        ("100.100.100.200", "shared"),  # Alibaba Cloud metadata
        ("169.254.169.254", "link-local"),  # AWS/GCP/Azure metadata
        ("169.254.170.2", "link-local"),  # ECS task metadata
        ("192.0.0.170", "IETF"),
        ("192.0.2.1", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("192.88.99.1", "6to4 relay"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),  # deprecated whatever it carries
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:a9fe:a9fe", "link-local"),
        ("::ffff:0:7f00:1", "IPv4-translated"),
        ("64:ff9b::7f00:1", "NAT64 form of 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"),
        ("64:ff9b:1::a00:1", "local-use NAT64"),
        ("2002:7f00:1::", "6to4 form of 127.0.0.1"),
        ("2002:a9fe:a9fe::1", "6to4 form of 169.254.169.254"),
        ("2002:c0a8:101::", "6to4 form of 192.168.1.1"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("100::1", "discard-only"),
        ("5f00::1", "segment routing"),
        ("fc00::1", "unique local"),
        ("fd00:ec2::254", "unique local"),  # AWS metadata over IPv6
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("::ffff:224.0.0.1", "multicast"),
    ],
)
def test_refused_addresses_and_what_they_are_called(address: str, kind: str) -> None:
    why = address_refusal(ipaddress.ip_address(address), EgressPolicy())
    assert why is not None and kind in why


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "93.184.216.34",
        "192.0.0.9",  # PCP anycast: globally reachable although in 192.0.0.0/24
        "2606:4700::1111",
        "64:ff9b::808:808",  # NAT64 of a public address
        "2002:808:808::1",  # 6to4 of a public address
        "::ffff:8.8.8.8",
        "2001:4:112::1",  # AS112-v6, a global exception inside 2001::/23
    ],
)
def test_globally_routable_addresses_pass(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), EgressPolicy()) is None


def test_the_operator_s_networks_multicast_never() -> None:
    policy = EgressPolicy(
        allow=(ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("fd00::/8"))
    )
    assert address_refusal(ipaddress.ip_address("10.20.3.4"), policy) is None
    assert address_refusal(ipaddress.ip_address("::ffff:10.20.3.4"), policy) is None  # mapped
    assert address_refusal(ipaddress.ip_address("fd00:ec2::254"), policy) is None
    assert address_refusal(ipaddress.ip_address("10.21.0.1"), policy) is not None
    # the forms a translator or relay carries are not the operator's network
    assert address_refusal(ipaddress.ip_address("64:ff9b::a14:304"), policy) is not None
    assert address_refusal(ipaddress.ip_address("2002:a14:304::"), policy) is not None
    nat64 = EgressPolicy(allow=(ipaddress.ip_network("64:ff9b::/96"),))  # unless listed
    assert address_refusal(ipaddress.ip_address("64:ff9b::a14:304"), nat64) is None
    everything = EgressPolicy(
        allow=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
    )
    assert "multicast" in (address_refusal(ipaddress.ip_address("224.0.0.251"), everything) or "")
    assert "multicast" in (address_refusal(ipaddress.ip_address("ff02::fb"), everything) or "")


SPECIAL_V4 = [net for net, _ in SPECIAL if net.version == 4]


@st.composite
def non_global_ipv4(draw: st.DrawFn) -> IPv4:
    net = draw(st.sampled_from(SPECIAL_V4))
    offset = draw(st.integers(0, net.num_addresses - 1))
    address = IPv4(int(net.network_address) + offset)
    if address in (IPv4("192.0.0.9"), IPv4("192.0.0.10")):  # global exceptions
        address = IPv4("192.0.0.1")
    return address


def notations(ip: IPv4) -> list[str]:
    """The ways getaddrinfo (inet_aton) reads an IPv4 address besides dotted quads."""
    a, b, c, d = ip.packed
    n = int(ip)
    return [
        str(ip),
        str(n),  # decimal
        hex(n),  # hex
        "0" + format(n, "o"),  # octal
        ".".join(f"0{x:o}" for x in ip.packed),  # octal dotted
        ".".join(hex(x) for x in ip.packed),  # hex dotted
        f"{a}.{b}.{c * 256 + d}",  # short
        f"{a}.{b * 65536 + c * 256 + d}",  # shorter
        f"{hex(a)}.{b}.0{c:o}.{d}",  # mixed
    ]


@settings(max_examples=60, deadline=None)
@given(non_global_ipv4())
def test_any_notation_of_a_non_global_ipv4_is_refused(ip: IPv4) -> None:
    for text in notations(ip):
        assert refused(f"https://{text}/v1").rule is Rule.ADDRESS, text
    for v6 in (
        f"::ffff:{ip}",
        f"64:ff9b::{ip}",
        str(ipaddress.IPv6Address((0x2002 << 112) | (int(ip) << 80))),
    ):
        assert refused(f"https://[{v6}]/v1").rule is Rule.ADDRESS, v6


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1).map(IPv4))
def test_a_public_ipv4_in_its_embedded_forms_is_judged_as_itself(ip: IPv4) -> None:
    own = address_refusal(ip, EgressPolicy())
    for v6 in (
        f"::ffff:{ip}",
        f"64:ff9b::{ip}",
        str(ipaddress.IPv6Address((0x2002 << 112) | (int(ip) << 80))),
    ):
        assert (address_refusal(ipaddress.ip_address(v6), EgressPolicy()) is None) is (own is None)


# ----------------------------------------------------------------- resolution, whole


def names(table: dict[str, list[str]]) -> object:
    async def resolver(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolver


def test_every_address_must_pass() -> None:
    resolver = names({"good.test": ["93.184.216.34"], "mixed.test": ["93.184.216.34", "10.0.0.1"]})
    target = run(check_base_url("https://good.test:8443/v1", POLICY, resolver=resolver))
    assert target.addresses == (ipaddress.ip_address("93.184.216.34"),)  # type: ignore[union-attr]
    err = refused("https://mixed.test/v1", resolver=resolver)
    assert err.rule is Rule.ADDRESS and "10.0.0.1" in err.message and "mixed.test" in err.message


def test_no_address_is_refused_and_a_failing_resolver_is_not_a_refusal() -> None:
    assert refused("https://none.test/", resolver=names({})).rule is Rule.UNRESOLVABLE
    assert refused("https://empty.test/", resolver=names({"empty.test": []})).rule is (
        Rule.UNRESOLVABLE
    )

    async def again(host: str, port: int) -> Sequence[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(ResolutionUnavailable):
        run(check_base_url("https://llm.example.com/", POLICY, resolver=again))


def test_http_only_inside_the_operator_s_networks() -> None:
    policy = EgressPolicy(frozenset({80}), (ipaddress.ip_network("10.20.0.0/16"),))
    resolver = names({"inside.test": ["10.20.0.7"], "public.test": ["93.184.216.34"]})
    assert run(check_base_url("http://inside.test/v1", policy, resolver=resolver))
    assert refused("http://public.test/v1", policy, resolver).rule is Rule.SCHEME


def test_the_system_resolver_reads_what_ipaddress_refuses() -> None:
    for text in ("2130706433", "0x7f.1", "0177.0.0.1", "127.1"):
        with pytest.raises(ValueError):
            ipaddress.ip_address(text)
        assert run(system_resolver(text, 443)) == ["127.0.0.1"], text


# -------------------------------------------------------------------------- settings


class _Settings(EgressSettings):
    pass


def test_settings_parse_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    from credential_service.settings import CredentialSettings

    monkeypatch.setenv("USER_BASE_URLS", "true")
    monkeypatch.setenv("USER_BASE_URL_PORTS", " 8443, 9443,8443")
    monkeypatch.setenv("EGRESS_ALLOW_CIDRS", "10.20.0.0/16, ::ffff:192.168.0.0/112 ,fd00::/8")
    got = CredentialSettings()
    assert got.USER_BASE_URLS and got.USER_BASE_URL_PORTS == (8443, 9443)
    assert [str(n) for n in got.EGRESS_ALLOW_CIDRS] == [
        "10.20.0.0/16",
        "192.168.0.0/16",
        "fd00::/8",
    ]
    monkeypatch.setenv("USER_BASE_URL_PORTS", "[8443]")
    assert CredentialSettings().egress_policy().ports == {8443}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("USER_BASE_URL_PORTS", "0"),
        ("USER_BASE_URL_PORTS", "70000"),
        ("USER_BASE_URL_PORTS", "https"),
        ("EGRESS_ALLOW_CIDRS", "10.0.0.1/8"),
        ("EGRESS_ALLOW_CIDRS", "not-a-net"),
        ("EGRESS_ALLOW_CIDRS", "224.0.0.0/4"),
    ],
)
def test_settings_refuse_bad_values(name: str, value: str) -> None:
    with pytest.raises(ValidationError):
        EgressSettings.model_validate({name: value})


def test_defaults_are_off_and_empty() -> None:
    got = EgressSettings()
    assert not got.USER_BASE_URLS
    assert got.egress_policy() == EgressPolicy()
    assert got.egress_policy().port_allowed(443) and not got.egress_policy().port_allowed(8443)
