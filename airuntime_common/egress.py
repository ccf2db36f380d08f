"""The egress rules of user-supplied base URLs (reference §10.5), pure and shared.

A learner's own key may come with the learner's own OpenAI-compatible endpoint. That
makes the worker send an HTTP request, with a key in it, wherever a user says: the
classic request forger. The same rules run when the URL is stored
(credential_service, 422 ``INVALID_BASE_URL``) and again before every model call
(runtime_worker, ``EGRESS_BLOCKED``):

1. **Shape** (:func:`parse_base_url`, no network): printable ASCII only; scheme
   ``https`` (``http`` only for addresses inside ``EGRESS_ALLOW_CIDRS``, judged once the
   addresses are known); no user info, no query, no fragment, no backslash; port 443 or
   one of ``USER_BASE_URL_PORTS``; a host that is a DNS name or a bracketed IPv6
   literal (no zone).
2. **Addresses** (:func:`check_base_url`): the host is resolved with the system resolver
   (``getaddrinfo``, which also reads ``2130706433``, ``0177.0.0.1``, ``0x7f.1`` and
   ``127.1``: what it returns is judged, whatever the notation) and EVERY address must
   be allowed by :func:`address_refusal`: multicast never; then inside
   ``EGRESS_ALLOW_CIDRS`` yes; else only globally routable addresses as IANA's
   special-purpose registries say, with the IPv4 inside IPv4-mapped, NAT64
   (64:ff9b::/96) and 6to4 (2002::/16) addresses judged as that IPv4. A name that
   resolves to nothing is refused.

The caller then connects to one of the returned :attr:`CheckedTarget.addresses`, never
looking the name up again (DNS rebinding changes nothing), with TLS verified against
:attr:`BaseUrl.host`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, field_validator
from pydantic_settings import NoDecode

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The one port always allowed (HTTPS); others only when listed in ``USER_BASE_URL_PORTS``.
HTTPS_PORT = 443
DEFAULT_PORTS = {"https": 443, "http": 80}
#: Longest base URL taken (characters).
MAX_URL_CHARS = 2048
MAX_HOST_CHARS = 253
#: How long a store-time lookup may take (s); the call-time one runs under the call's deadline.
RESOLVE_SECONDS = 5.0

#: A resolver: ``(host, port)`` → the addresses as text (what ``getaddrinfo`` gives).
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


class Rule(StrEnum):
    """Which rule refused a base URL (``details.rule`` of ``INVALID_BASE_URL``)."""

    SYNTAX = "syntax"
    SCHEME = "scheme"
    USER_INFO = "user_info"
    QUERY = "query"
    FRAGMENT = "fragment"
    PORT = "port"
    UNRESOLVABLE = "unresolvable"
    ADDRESS = "address"


class EgressRefused(Exception):
    """A base URL broke a rule; the message names the rule and never holds a key.

    Attributes:
        rule: the rule broken.
        message: one sentence for the user (names the host and address, if any).
    """

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message


class ResolutionUnavailable(Exception):
    """The resolver failed for now (``EAI_AGAIN`` and the like), not "no such name":
    at call time a retryable ``NETWORK_ERROR``, no connection opened."""


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's settings the rules read (reference §10.5).

    Attributes:
        ports: ``USER_BASE_URL_PORTS``: ports allowed besides 443.
        allow: ``EGRESS_ALLOW_CIDRS``: the operator's own networks, allowed although
            not globally routable (an IPv4-mapped IPv6 form of an allowed IPv4 address
            is that address); ``http`` is allowed only for these.
    """

    ports: frozenset[int] = frozenset()
    allow: tuple[IPNetwork, ...] = ()

    def port_allowed(self, port: int) -> bool:
        """Whether a base URL may name ``port``."""
        return port == HTTPS_PORT or port in self.ports

    def operator_allowed(self, ip: IPAddress) -> bool:
        """Whether ``ip`` (an IPv4-mapped form taken as its IPv4) is in ``allow``."""
        ip = _unmapped(ip)
        return any(ip.version == net.version and ip in net for net in self.allow)


def parse_ports(value: Any) -> tuple[int, ...]:
    """``USER_BASE_URL_PORTS``: comma-separated (or a JSON list of) ports 1..65535.

    Raises:
        ValueError: a value that is not a port.
    """
    items = _items(value)
    ports: list[int] = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise ValueError(f"{text!r} is not a port (1..65535)")
        if int(text) not in ports:
            ports.append(int(text))
    return tuple(ports)


def parse_cidrs(value: Any) -> tuple[IPNetwork, ...]:
    """``EGRESS_ALLOW_CIDRS``: comma-separated (or a JSON list of) networks.

    An IPv4-mapped IPv6 network (``::ffff:10.0.0.0/104``) is taken as its IPv4 network.

    Raises:
        ValueError: not a network, or one with host bits set (``10.0.0.1/8``).
    """
    nets: list[IPNetwork] = []
    for item in _items(value):
        text = str(item).strip()
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a network in CIDR notation ({exc})") from None
        if (
            isinstance(net, ipaddress.IPv6Network)
            and net.subnet_of(_MAPPED)
            and net.prefixlen >= 96
        ):
            mapped = net.network_address.ipv4_mapped
            assert mapped is not None
            net = ipaddress.IPv4Network(f"{mapped}/{net.prefixlen - 96}")
        if net.is_multicast:
            raise ValueError(f"{text!r} is multicast: never allowed")
        nets.append(net)
    return tuple(nets)


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    text = str(value).strip()
    if text.startswith("["):
        loaded = json.loads(text)
        if not isinstance(loaded, list):
            raise ValueError("must be a list")
        return loaded
    return [part for part in text.split(",") if part.strip()]


class EgressSettings(BaseModel):
    """The settings of user-supplied base URLs (mixed into the settings classes of
    credential_service and runtime_worker, which read them from the environment).

    Attributes:
        USER_BASE_URLS: whether a user's model credential may carry ``baseUrl``
            (default false: a ``baseUrl`` is refused 400 ``INVALID_ARGUMENT``; a URL
            stored while it was on is not used: its jobs are refused at create and end
            ``EGRESS_BLOCKED``).
        USER_BASE_URL_PORTS: ports a base URL may name besides 443, comma-separated
            (e.g. ``8443,9443``; default none). The worker's network policy must allow
            them too.
        EGRESS_ALLOW_CIDRS: the operator's own networks a base URL may reach although
            they are not globally routable, comma-separated CIDRs (e.g.
            ``10.20.0.0/16``; default none); ``http`` is allowed only inside them.
            Multicast is refused.
    """

    USER_BASE_URLS: bool = False
    USER_BASE_URL_PORTS: Annotated[tuple[int, ...], NoDecode] = ()
    EGRESS_ALLOW_CIDRS: Annotated[tuple[IPNetwork, ...], NoDecode] = ()

    @field_validator("USER_BASE_URL_PORTS", mode="before")
    @classmethod
    def _ports(cls, value: Any) -> tuple[int, ...]:
        return parse_ports(value)

    @field_validator("EGRESS_ALLOW_CIDRS", mode="before")
    @classmethod
    def _cidrs(cls, value: Any) -> tuple[IPNetwork, ...]:
        return parse_cidrs(value)

    def egress_policy(self) -> EgressPolicy:
        """The rules' view of these settings."""
        return EgressPolicy(frozenset(self.USER_BASE_URL_PORTS), tuple(self.EGRESS_ALLOW_CIDRS))


# ------------------------------------------------------------------------ addresses

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_6TO4 = ipaddress.IPv6Network("2002::/16")


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), what) for net, what in pairs)


#: Special-purpose blocks the IANA registries mark globally reachable although they sit
#: inside a larger non-global block (checked before :data:`SPECIAL`).
GLOBAL_EXCEPTIONS = _nets(
    ("192.0.0.9/32", "PCP anycast"),
    ("192.0.0.10/32", "TURN anycast"),
    ("2001:1::1/128", "PCP anycast"),
    ("2001:1::2/128", "TURN anycast"),
    ("2001:3::/32", "AMT"),
    ("2001:4:112::/48", "AS112-v6"),
    ("2001:20::/28", "ORCHIDv2"),
    ("2001:30::/28", "DRIP detector entity tags"),
)

#: The special-purpose blocks (IANA's IPv4 and IPv6 registries) that are not globally
#: reachable, named so a refusal says which; checked in order, before Python's own
#: flags (which lag the registries by Python version) as a last net.
SPECIAL = _nets(
    ("0.0.0.0/32", "unspecified"),
    ("0.0.0.0/8", "'this network' (0.0.0.0/8)"),
    ("10.0.0.0/8", "private (10.0.0.0/8)"),
    ("100.64.0.0/10", "shared address space (100.64.0.0/10)"),
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
    ("169.254.0.0/16", "link-local (169.254.0.0/16, cloud metadata included)"),
    ("172.16.0.0/12", "private (172.16.0.0/12)"),
    ("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"),
    ("192.0.2.0/24", "documentation (192.0.2.0/24)"),
    ("192.88.99.0/24", "6to4 relay anycast (192.88.99.0/24, deprecated)"),
    ("192.168.0.0/16", "private (192.168.0.0/16)"),
    ("198.18.0.0/15", "benchmarking (198.18.0.0/15)"),
    ("198.51.100.0/24", "documentation (198.51.100.0/24)"),
    ("203.0.113.0/24", "documentation (203.0.113.0/24)"),
    ("255.255.255.255/32", "limited broadcast"),
    ("240.0.0.0/4", "reserved (240.0.0.0/4)"),
    ("::/128", "unspecified (::)"),
    ("::1/128", "loopback (::1)"),
    ("::/96", "IPv4-compatible IPv6 (::/96, deprecated)"),
    ("::ffff:0:0:0/96", "IPv4-translated IPv6 (::ffff:0:0:0/96)"),
    ("64:ff9b:1::/48", "local-use NAT64 (64:ff9b:1::/48)"),
    ("100::/64", "discard-only (100::/64)"),
    ("100:0:0:1::/64", "dummy prefix (100:0:0:1::/64)"),
    ("2001::/32", "Teredo tunnel (2001::/32)"),
    ("2001:2::/48", "benchmarking (2001:2::/48)"),
    ("2001:db8::/32", "documentation (2001:db8::/32)"),
    ("2001::/23", "IETF protocol assignments (2001::/23)"),
    ("3fff::/20", "documentation (3fff::/20)"),
    ("5f00::/16", "segment routing SIDs (5f00::/16)"),
    ("fc00::/7", "unique local (fc00::/7)"),
    ("fe80::/10", "link-local (fe80::/10)"),
    ("fec0::/10", "site-local (fec0::/10, deprecated)"),
    ("::/8", "reserved (::/8)"),
)


def _unmapped(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as its IPv4 address; any other unchanged."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def embedded_ipv4(ip: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address carries to a translator or relay, as
    ``(form, ipv4)``: NAT64's well-known prefix (last 32 bits) or 6to4 (bits 16..47);
    None for any other address."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _6TO4 and ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    return None


def address_refusal(ip: IPAddress, policy: EgressPolicy) -> str | None:
    """Why a resolved address may not be connected to, or None when it may.

    In order: an IPv4-mapped address is its IPv4 address; multicast is refused,
    always; inside ``EGRESS_ALLOW_CIDRS`` is allowed; a NAT64 or 6to4 address is
    judged by the IPv4 address it carries, as globally routable or not (the allowed
    networks do not extend to it: the connection goes to a translator or relay); the
    registries' global exceptions are
    allowed; any block of :data:`SPECIAL`, and anything Python's ``ipaddress`` finds
    not global, private, reserved, loopback, link-local or unspecified, is refused.

    Args:
        ip: one address the host resolved to (or the host itself, a literal).
        policy: the operator's settings.

    Returns:
        A short phrase naming the kind of address (``"loopback (127.0.0.0/8)"``), or
        None (allowed). Reference §10.5.
    """
    ip = _unmapped(ip)
    if ip.is_multicast:
        return "multicast (never allowed)"
    if policy.operator_allowed(ip):
        return None
    carried = embedded_ipv4(ip)
    if carried is not None:
        # judged on its own: the connection goes to a translator or relay, not into
        # the operator's network (list the prefix itself in EGRESS_ALLOW_CIDRS for that)
        form, inner = carried
        why = address_refusal(inner, EgressPolicy())
        return f"{form} form of {inner}: {why}" if why is not None else None
    if any(ip.version == net.version and ip in net for net, _ in GLOBAL_EXCEPTIONS):
        return None
    for net, what in SPECIAL:
        if ip.version == net.version and ip in net:
            return what
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return "not globally routable (IANA special-purpose)"
    return None


# ------------------------------------------------------------------------------ URLs


@dataclass(frozen=True)
class BaseUrl:
    """A base URL that passed the shape rules, normalized.

    Attributes:
        scheme: ``https`` or ``http``.
        host: lower-case DNS name (as given, a trailing dot kept) or IPv6 literal
            (no brackets): the name TLS is verified against and ``Host`` carries.
        port: the port, explicit or the scheme's default.
        path: ``""`` or a path without a trailing slash (``/v1``).
    """

    scheme: str
    host: str
    port: int
    path: str

    @property
    def is_ipv6_literal(self) -> bool:
        """Whether :attr:`host` is an IPv6 literal."""
        return ":" in self.host

    @property
    def host_header(self) -> str:
        """The ``Host`` header: host (bracketed when IPv6), and the port unless default."""
        host = f"[{self.host}]" if self.is_ipv6_literal else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The normalized URL, as stored and handed to the worker."""
        return f"{self.scheme}://{self.host_header}{self.path}"

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class CheckedTarget:
    """A base URL whose every address passed, at the moment it was checked.

    Attributes:
        base: the parsed URL.
        addresses: every address the host resolved to, in the resolver's order (all
            allowed); the call connects to one of these and to nothing else.
    """

    base: BaseUrl
    addresses: tuple[IPAddress, ...]


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_NAME_RE = re.compile(
    r"^(?:[a-z0-9_](?:[a-z0-9_\-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_\-]{0,61}[a-z0-9_])?\.?$"
)
_PATH_RE = re.compile(r"^(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*$")


def parse_base_url(text: str, policy: EgressPolicy) -> BaseUrl:
    """Check the shape rules (no network) and normalize.

    Args:
        text: the URL as the user gave it.
        policy: the operator's settings (the ports).

    Returns:
        The normalized :class:`BaseUrl` (a path's trailing slashes dropped).

    Raises:
        EgressRefused: ``syntax``, ``scheme`` (not http(s)), ``user_info``, ``query``,
            ``fragment`` or ``port``. Reference §10.5.
    """
    if not isinstance(text, str) or not text:
        raise EgressRefused(Rule.SYNTAX, "the base URL is empty")
    if len(text) > MAX_URL_CHARS:
        raise EgressRefused(Rule.SYNTAX, f"the base URL is longer than {MAX_URL_CHARS} characters")
    if not all(33 <= ord(c) <= 126 for c in text):
        raise EgressRefused(
            Rule.SYNTAX,
            "the base URL must be printable ASCII without spaces (write an "
            "internationalized name in its xn-- form)",
        )
    found = _SCHEME_RE.match(text)
    scheme = found.group(1).lower() if found else ""
    if scheme not in DEFAULT_PORTS:
        raise EgressRefused(Rule.SCHEME, f"the scheme must be https, not {scheme or 'none'!r}")
    if scheme == "http" and not policy.allow:
        raise EgressRefused(
            Rule.SCHEME, "the scheme must be https (http only inside EGRESS_ALLOW_CIDRS, none set)"
        )
    rest = text[len(scheme) + 1 :]
    if not rest.startswith("//"):
        raise EgressRefused(Rule.SYNTAX, "the base URL must be scheme://host[:port][/path]")
    if "\\" in text:
        raise EgressRefused(Rule.SYNTAX, "a backslash is not allowed in a base URL")
    if "#" in text:
        raise EgressRefused(Rule.FRAGMENT, "a base URL has no fragment (#…)")
    if "?" in text:
        raise EgressRefused(Rule.QUERY, "a base URL has no query (?…)")
    authority, slash, path = rest[2:].partition("/")
    path = slash + path
    if "@" in authority:
        raise EgressRefused(Rule.USER_INFO, "a base URL carries no user name or password (…@)")
    host, port = _split_authority(authority)
    if port is None:
        port = DEFAULT_PORTS[scheme]
    if not policy.port_allowed(port):
        raise EgressRefused(
            Rule.PORT, f"port {port} is not allowed (443 or one of USER_BASE_URL_PORTS)"
        )
    if not _PATH_RE.match(path):
        raise EgressRefused(Rule.SYNTAX, "the path has characters a URL path cannot hold")
    return BaseUrl(scheme, host, port, path.rstrip("/"))


def _split_authority(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` or ``[v6][:port]`` → ``(host, port or None)``.

    Raises:
        EgressRefused: ``syntax`` for anything else.
    """
    if authority.startswith("["):
        literal, bracket, after = authority[1:].partition("]")
        try:
            if "%" in literal:  # a zone names an interface, not a destination
                raise ValueError(literal)
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise EgressRefused(Rule.SYNTAX, "the host's IPv6 literal is malformed") from None
        if not bracket or (after and not after.startswith(":")):
            raise EgressRefused(Rule.SYNTAX, "the host's IPv6 literal is malformed")
        return str(ipaddress.IPv6Address(literal)), _port(after[1:]) if after else None
    host, colon, port_text = authority.partition(":")
    host = host.lower()
    if not host or len(host) > MAX_HOST_CHARS or not _NAME_RE.match(host):
        raise EgressRefused(Rule.SYNTAX, "the host must be a DNS name or a bracketed IPv6 address")
    return host, _port(port_text) if colon else None


def _port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or not 1 <= int(text) <= 65535:
        raise EgressRefused(Rule.SYNTAX, "the port must be a number in 1..65535")
    return int(text)


# ------------------------------------------------------------------------ resolution

#: ``getaddrinfo`` errors that mean "this name has no address" (refused); any other
#: resolver error is :class:`ResolutionUnavailable` (try again later).
_NO_SUCH_NAME = frozenset(
    code
    for code in (
        getattr(socket, "EAI_NONAME", None),
        getattr(socket, "EAI_NODATA", None),
        getattr(socket, "EAI_ADDRFAMILY", None),
        getattr(socket, "EAI_FAIL", None),
    )
    if code is not None
)


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives ``host`` (``loop.getaddrinfo``, TCP).

    Raises:
        socket.gaierror: as ``getaddrinfo`` raises it.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]


async def resolve(host: str, port: int, resolver: Resolver | None = None) -> list[IPAddress]:
    """Every address of ``host``, in the resolver's order, duplicates dropped.

    Raises:
        EgressRefused: ``unresolvable``: no such name, or no address.
        ResolutionUnavailable: the resolver failed for now.
    """
    try:
        texts = await (resolver or system_resolver)(host, port)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_NAME:
            raise EgressRefused(Rule.UNRESOLVABLE, f"{host} does not resolve") from None
        raise ResolutionUnavailable(f"{host} could not be resolved now ({exc.strerror})") from None
    except OSError as exc:
        raise ResolutionUnavailable(f"{host} could not be resolved now ({exc})") from None
    out: list[IPAddress] = []
    for text in texts:
        try:
            ip = ipaddress.ip_address(str(text).split("%", 1)[0])
        except ValueError:
            raise EgressRefused(
                Rule.UNRESOLVABLE, f"{host} resolved to something that is not an address"
            ) from None
        if ip not in out:
            out.append(ip)
    if not out:
        raise EgressRefused(Rule.UNRESOLVABLE, f"{host} resolves to no address")
    return out


async def check_base_url(
    text: str, policy: EgressPolicy, *, resolver: Resolver | None = None
) -> CheckedTarget:
    """Every rule of reference §10.5: the shape, then every address the host resolves to.

    Args:
        text: the base URL as given (or as stored).
        policy: the operator's settings.
        resolver: how names are resolved; default :func:`system_resolver`.

    Returns:
        The target with its checked addresses: connect to one of them, never to a
        fresh lookup's answer.

    Raises:
        EgressRefused: the rule broken (for ``address``, the message names the host,
            the address and its kind).
        ResolutionUnavailable: the resolver failed for now (nothing was judged).
    """
    base = parse_base_url(text, policy)
    addresses = await resolve(base.host, base.port, resolver)
    for ip in addresses:
        why = address_refusal(ip, policy)
        if why is not None:
            shown = "" if ip == _literal(base.host) else f" resolves to {ip}, which is"
            raise EgressRefused(
                Rule.ADDRESS, f"{base.host}{shown or ' is'} {why}: not allowed as a base URL"
            )
    if base.scheme == "http" and not all(policy.operator_allowed(ip) for ip in addresses):
        raise EgressRefused(
            Rule.SCHEME, "http is allowed only for addresses inside EGRESS_ALLOW_CIDRS; use https"
        )
    return CheckedTarget(base, tuple(addresses))


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


__all__ = [
    "BaseUrl",
    "CheckedTarget",
    "EgressPolicy",
    "EgressRefused",
    "EgressSettings",
    "ResolutionUnavailable",
    "Resolver",
    "Rule",
    "address_refusal",
    "check_base_url",
    "parse_base_url",
    "parse_cidrs",
    "parse_ports",
    "resolve",
    "system_resolver",
]
