"""What the launcher starts, where it listens, and with which environment.

:func:`build_plan` is pure apart from the dev-secrets file: it turns a base
environment into one :class:`ServiceSpec` per child process, in start order:

====================  ===============================  =====================================
service               command                          listens (default)
====================  ===============================  =====================================
standin               python -m model_standin  HTTP 127.0.0.1:8600 (``STANDIN_PORT``), one
                                                       port per provider of ``MODEL_PROVIDERS``
job_service           python -m job_service             gRPC ``JOB_SERVICE_LISTEN`` :50051
credential_service    python -m credential_service      gRPC ``CREDENTIAL_SERVICE_LISTEN`` :50052
runtime_worker[-i]    python -m runtime_worker          gRPC ``RUNTIME_WORKER_LISTEN`` :50053+i
api_gateway           python -m api_gateway             HTTP ``GATEWAY_HOST``:``GATEWAY_PORT`` :3000
====================  ===============================  =====================================

Internal services bind 127.0.0.1 unless a ``*_LISTEN`` variable says
otherwise (a local run never exposes them); the matching ``*_ADDR`` that
clients dial is derived from the listen address unless set. A port of 0 is
replaced with a free port chosen here, so the launcher can probe it.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from airuntime_common.model_providers import DEFAULT_DEEPSEEK_BASE_URL, parse_model_providers
from launcher.devsecrets import DEV_SECRETS_FILE, ensure_dev_secrets

#: Start order; stop order is the reverse.
SERVICE_ORDER: tuple[str, ...] = (
    "standin",
    "job_service",
    "credential_service",
    "runtime_worker",
    "api_gateway",
)

#: Start tier of each service: a tier starts once the previous one is ready. The
#: stand-in depends on nothing and nothing needs it before the worker, so it
#: starts alongside job_service.
_TIERS: dict[str, int] = {
    "standin": 0,
    "job_service": 0,
    "credential_service": 1,
    "runtime_worker": 2,
    "api_gateway": 3,
}

#: Short names accepted by ``--only``.
ALIASES: dict[str, str] = {
    "standin": "standin",
    "stand-in": "standin",
    "job": "job_service",
    "jobs": "job_service",
    "job_service": "job_service",
    "credential": "credential_service",
    "credentials": "credential_service",
    "credential_service": "credential_service",
    "worker": "runtime_worker",
    "workers": "runtime_worker",
    "runtime_worker": "runtime_worker",
    "gateway": "api_gateway",
    "api_gateway": "api_gateway",
}

DEFAULT_STANDIN_PORT = 8600
DEFAULT_JOB_PORT = 50051
DEFAULT_CREDENTIAL_PORT = 50052
DEFAULT_WORKER_PORT = 50053
DEFAULT_GATEWAY_PORT = 3000
#: Prometheus ports the services default to (0 turns one off); worker i gets 9103 + i.
DEFAULT_JOB_METRICS_PORT = 9101
DEFAULT_CREDENTIAL_METRICS_PORT = 9102
DEFAULT_WORKER_METRICS_PORT = 9103
LOCAL_HOST = "127.0.0.1"
_WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}

#: Secrets are never echoed in full (e.g. in the table of services).
SECRET_NAMES = frozenset(
    {"RUNTIME_SERVICE_TOKEN", "JWT_SECRET", "CREDENTIAL_ENCRYPTION_KEYS", "DEEPSEEK_API_KEY"}
)


class PlanError(ValueError):
    """A launcher option or variable that cannot be honoured (bad name, bad address)."""


@dataclass(frozen=True)
class ServiceSpec:
    """One child process.

    Attributes:
        name: display name and log prefix (``runtime_worker-2`` for the second worker).
        kind: one of :data:`SERVICE_ORDER`.
        argv: the full command line.
        env: the child's complete environment.
        probe: ``"grpc"`` (``grpc.health.v1`` overall status SERVING) or ``"http"``.
        target: what the probe dials: ``host:port`` (gRPC) or a URL (HTTP).
        listen: a human-readable "where it listens" for the table.
        tier: position in the start order; children of one tier start and stop together.
        bind: ``(host, port)`` the child will listen on, checked to be free before it
            starts (so another instance on that port is never mistaken for it).
    """

    name: str
    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    probe: Literal["grpc", "http"]
    target: str
    listen: str
    tier: int
    bind: tuple[str, int] | None = None


@dataclass
class LaunchPlan:
    """Everything the launcher will start.

    Attributes:
        services: children in start order.
        env: the environment shared by every child (secrets, addresses, database URLs).
        var_dir: absolute directory for SQLite files, secrets and logs.
        secrets_file: the dev-secrets file (may not exist when every secret was given).
        generated: names of secrets generated by this plan (first start).
        gateway_url: base URL of the public REST API.
        standin_url: base URL of the model stand-in, or None when a real key is used.
        standin_urls: with ``MODEL_PROVIDERS`` set, each provider's stand-in base URL.
    """

    services: list[ServiceSpec]
    env: dict[str, str]
    var_dir: Path
    secrets_file: Path
    generated: list[str] = field(default_factory=list)
    gateway_url: str = ""
    standin_url: str | None = None
    standin_urls: dict[str, str] = field(default_factory=dict)


#: Variables that tie a launch to another installation (secrets, databases,
#: addresses, model endpoint); :func:`isolated_env` drops them.
_ISOLATED = frozenset(
    {
        "RUNTIME_SERVICE_TOKEN",
        "JWT_SECRET",
        "JWT_ISSUER",
        "CREDENTIAL_ENCRYPTION_KEYS",
        "DEEPSEEK_API_KEY",
        "DEEPSEEK_BASE_URL",
        "DATABASE_URL",
        "CREDENTIAL_DATABASE_URL",
        "GATEWAY_HOST",
        "GATEWAY_PORT",
        "STANDIN_PORT",
        "RUNTIME_INSTANCE_ID",
        "RUNTIME_WORKER_ADDRS",
        "GRPC_TLS_CERT_FILE",
        "GRPC_TLS_KEY_FILE",
        "GRPC_TLS_CA_FILE",
    }
)
_ISOLATED_SUFFIXES = ("_LISTEN", "_ADDR", "_METRICS_PORT")


def _standin_providers(env: dict[str, str], dev: bool) -> tuple[list[str], dict[str, str]]:
    """Point the services at the local stand-in when no real platform key is given (or
    ``dev``), editing ``env`` in place; returns the stand-in's port arguments and
    ``{provider: base URL}`` ({} when real providers are used).

    Without ``MODEL_PROVIDERS``: one stand-in on ``STANDIN_PORT`` is DeepSeek
    (``DEEPSEEK_BASE_URL``). With it: one stand-in port per provider (the first on
    ``STANDIN_PORT``, the others free), serving the model names its ``models`` map
    to, and ``MODEL_PROVIDERS`` rewritten to those ports. Either way every platform
    key variable is withheld from the children (never sent to a stand-in, nor a
    stand-in key to a real provider) and the stand-in key is allowed.

    Raises:
        PlanError: ``MODEL_PROVIDERS`` is malformed (as the services would refuse it).
    """
    raw = env.get("MODEL_PROVIDERS", "")
    try:
        providers = parse_model_providers(
            raw, deepseek_base_url=env.get("DEEPSEEK_BASE_URL") or DEFAULT_DEEPSEEK_BASE_URL
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PlanError(f"MODEL_PROVIDERS: {where}: {first['msg']}") from None
    key_vars = {p.apiKeyEnv for p in providers if p.apiKeyEnv}
    if not dev and any(env.get(v, "").strip() for v in key_vars):
        return [], {}
    port = _port_var(env, "STANDIN_PORT", DEFAULT_STANDIN_PORT) or free_port()
    for var in key_vars | {"DEEPSEEK_API_KEY"}:
        env.pop(var, None)
    env["ALLOW_PLATFORM_KEY_STANDIN"] = "1"
    if not raw.strip():
        url = f"http://{LOCAL_HOST}:{port}"
        env["DEEPSEEK_BASE_URL"] = url
        return ["--port", str(port)], {providers.first.name: url}
    urls: dict[str, str] = {}
    specs: list[str] = []
    rewritten: list[dict[str, object]] = []
    for i, p in enumerate(providers):
        p_port = port if i == 0 else free_port()
        urls[p.name] = f"http://{LOCAL_HOST}:{p_port}"
        models = sorted(set(p.models.values()))
        odd = [m for m in models if any(c in m for c in ",+:")]
        if odd:
            raise PlanError(
                f"MODEL_PROVIDERS: the local stand-in cannot serve model {odd[0]!r} of"
                f" {p.name!r} (a ',', '+' or ':' in its name)"
            )
        specs.append(f"{p.name}={p_port}" + (":" + "+".join(models) if models else ""))
        rewritten.append({**p.model_dump(), "baseUrl": urls[p.name]})
    env["MODEL_PROVIDERS"] = json.dumps(rewritten)
    return ["--providers", ",".join(specs)], urls


def isolated_env(base: Mapping[str, str]) -> dict[str, str]:
    """An environment for a self-contained system (the demo, end-to-end tests).

    Secrets, database URLs, addresses and the model endpoint of ``base`` are
    dropped (the launcher then generates secrets into its var directory and
    uses SQLite there, and the stand-in model), every port is 0 (free ports
    are chosen, so a system already running on the default ports is not
    disturbed), and the Prometheus endpoints are off. Other variables (e.g.
    ``LOG_LEVEL``, lease and poll tunables) are kept.
    """
    env = {
        k: v for k, v in base.items() if k not in _ISOLATED and not k.endswith(_ISOLATED_SUFFIXES)
    }
    env.update(
        {
            "JOB_SERVICE_LISTEN": f"{LOCAL_HOST}:0",
            "CREDENTIAL_SERVICE_LISTEN": f"{LOCAL_HOST}:0",
            "RUNTIME_WORKER_LISTEN": f"{LOCAL_HOST}:0",
            "GATEWAY_PORT": "0",
            "STANDIN_PORT": "0",
            "JOB_SERVICE_METRICS_PORT": "0",
            "CREDENTIAL_SERVICE_METRICS_PORT": "0",
            "WORKER_METRICS_PORT": "0",
        }
    )
    return env


def normalize_only(only: Iterable[str] | str | None) -> set[str] | None:
    """``--only`` value (comma list or iterable, aliases allowed) → set of service kinds.

    Raises:
        PlanError: an unknown name.
    """
    if only is None:
        return None
    items = only.split(",") if isinstance(only, str) else list(only)
    kinds: set[str] = set()
    for item in items:
        name = item.strip().lower()
        if not name:
            continue
        if name not in ALIASES:
            raise PlanError(f"unknown service {item!r}; choose from {', '.join(SERVICE_ORDER)}")
        kinds.add(ALIASES[name])
    if not kinds:
        raise PlanError("--only names no service")
    return kinds


def split_hostport(address: str, default_port: int) -> tuple[str, int]:
    """``"[::]:50051"`` → ``("[::]", 50051)``; ``"host"`` → ``("host", default_port)``.

    Raises:
        PlanError: a port that is not a number in 0..65535.
    """
    address = address.strip()
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if address.startswith(prefix):
            address = address[len(prefix) :]
    if address.startswith("["):
        end = address.find("]")
        host, rest = address[: end + 1], address[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    elif address.count(":") == 1:
        host, port_text = address.split(":")
    elif ":" in address:  # bare IPv6 literal without a port
        host, port_text = f"[{address}]", ""
    else:
        host, port_text = address, ""
    if not port_text:
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise PlanError(f"bad port in address {address!r}") from None
    if not 0 <= port <= 65535:
        raise PlanError(f"bad port in address {address!r}")
    return host, port


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on ``host:port`` (a bind fails with EADDRINUSE).

    Wildcard hosts check the wildcard address of their family. Other bind
    errors (an address not on this machine, a name that does not resolve)
    are not "in use": the service itself then reports the problem.
    """
    bare = host.strip("[]")
    if bare in ("", "*"):
        bare = "0.0.0.0"
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bare, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def connect_host(host: str) -> str:
    """The host a local client dials for a listen host (wildcards → 127.0.0.1)."""
    return LOCAL_HOST if host in _WILDCARDS else host


#: Ports recently handed out by :func:`free_port` in this process: the OS may give
#: a just-released port again, and two services of one plan must not share one.
_HANDED_OUT: deque[int] = deque(maxlen=256)


def free_port(host: str = LOCAL_HOST) -> int:
    """A TCP port free right now on ``host`` (the OS picks it), never one this process
    handed out recently (so the services of one plan get distinct ports)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    port = 0
    for _ in range(64):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host.strip("[]"), 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            break
    _HANDED_OUT.append(port)
    return port


def _resolve(
    env: Mapping[str, str], listen_var: str, addr_var: str, default_port: int
) -> tuple[str, str]:
    """(listen address, client address) of a gRPC service from its two variables."""
    listen = env.get(listen_var, "").strip()
    addr = env.get(addr_var, "").strip()
    if listen:
        host, port = split_hostport(listen, default_port)
    elif addr:
        _, port = split_hostport(addr, default_port)
        host = LOCAL_HOST
    else:
        host, port = LOCAL_HOST, default_port
    if port == 0:
        port = free_port(connect_host(host))
    listen = f"{host}:{port}"
    if not addr or split_hostport(addr, default_port)[1] == 0:
        addr = f"{connect_host(host)}:{port}"
    return listen, addr


def grpc_address_list(addresses: list[str]) -> str:
    """One gRPC target for several ``host:port`` addresses of replicas.

    ``["127.0.0.1:50051", "127.0.0.1:50052"]`` → ``"ipv4:127.0.0.1:50051,127.0.0.1:50052"``
    (``ipv6:`` when the hosts are IPv6 literals; a single address is returned as it
    is). Only IP literals can be listed this way; a host name is refused.

    Raises:
        PlanError: a host that is not an IP literal, or IPv4 and IPv6 mixed.
    """
    if len(addresses) == 1:
        return addresses[0]
    families = {_ip_family(address) for address in addresses}
    if len(families) != 1:
        raise PlanError("replica addresses mix IPv4 and IPv6")
    return f"ipv{families.pop()}:" + ",".join(addresses)


def _ip_family(address: str) -> int:
    """4 or 6 for a ``host:port`` whose host is an IP literal (``[::1]:5`` too).

    Raises:
        PlanError: the host is a name, not an IP literal.
    """
    try:
        return ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]")).version
    except ValueError:
        raise PlanError(f"replica address {address!r} is not an IP address") from None


def _port_var(env: Mapping[str, str], name: str, default: int) -> int:
    """A port variable (empty → ``default``).

    Raises:
        PlanError: not a number in 0..65535.
    """
    value = env.get(name, "").strip()
    try:
        port = int(value) if value else default
    except ValueError:
        raise PlanError(f"{name} must be a port number, not {value!r}") from None
    if not 0 <= port <= 65535:
        raise PlanError(f"{name} must be a port number, not {value!r}")
    return port


def _metrics_port(env: Mapping[str, str], name: str, default: int) -> int:
    """A service's Prometheus port as it will read it (0 = off)."""
    return _port_var(env, name, default)


def _metrics_note(port: int) -> str:
    return f", metrics :{port}" if port else ""


def _sqlite_url(var_dir: Path, name: str) -> str:
    return f"sqlite+aiosqlite:///{var_dir / name}"


def _check_counts(base_env: Mapping[str, str], workers: int, job_services: int) -> None:
    """Refuse impossible counts before anything is written (var dir, dev secrets)."""
    if workers < 0:
        raise PlanError("--workers must be 0 or more")
    if job_services < 1:
        raise PlanError("--job-services must be 1 or more")
    if job_services > 1 and str(base_env.get("DATABASE_URL") or "sqlite").startswith("sqlite"):
        raise PlanError(
            "--job-services above 1 needs a shared server database: set DATABASE_URL"
            " to MySQL/MariaDB (each replica would lock the SQLite file in turn)"
        )


def _common_env(
    base_env: Mapping[str, str], var: Path, secrets_file: Path
) -> tuple[dict[str, str], list[str]]:
    """Every child's environment before its addresses: the launcher's, the dev
    secrets, unbuffered output, loopback outside any proxy, this repository on
    ``PYTHONPATH``, SQLite databases under ``var`` unless set; and the secrets
    generated."""
    env: dict[str, str] = {k: v for k, v in base_env.items() if isinstance(v, str)}
    secret_values, generated = ensure_dev_secrets(env, secrets_file)
    env.update(secret_values)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for proxy_var in ("NO_PROXY", "no_proxy"):
        hosts = [h for h in env.get(proxy_var, "").split(",") if h.strip()]
        for local in ("127.0.0.1", "localhost", "::1"):
            if local not in hosts:
                hosts.append(local)
        env[proxy_var] = ",".join(hosts)
    repo_root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if repo_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([repo_root, *paths])
    if not env.get("DATABASE_URL"):
        env["DATABASE_URL"] = _sqlite_url(var, "job_service.db")
    if not env.get("CREDENTIAL_DATABASE_URL"):
        env["CREDENTIAL_DATABASE_URL"] = _sqlite_url(var, "credential_service.db")
    return env, generated


def _job_service_listens(
    env: Mapping[str, str], job_listen: str, job_addr: str, job_services: int
) -> tuple[list[tuple[str, str]], str]:
    """(listen, address) of each job_service replica, and the address clients use
    (all of them, round robin, for several)."""
    if job_services == 1:
        return [(job_listen, job_addr)], job_addr
    # the replicas' own addresses (an address set for one service is not theirs)
    j_host, j_port = split_hostport(job_listen, DEFAULT_JOB_PORT)
    j_connect = connect_host(j_host)
    first = f"{j_connect}:{j_port}"
    _ip_family(first)  # an IP literal, or refused before any port is taken
    listens = [(job_listen, first)]
    for _ in range(1, job_services):
        port = free_port(j_connect)
        listens.append((f"{j_host}:{port}", f"{j_connect}:{port}"))
    return listens, grpc_address_list([addr for _, addr in listens])


def _worker_listens(env: dict[str, str], workers: int) -> list[tuple[str, str, str]]:
    """(listen, address, instance id) of each worker; the first's address and all of
    them go into ``env`` (``RUNTIME_WORKER_ADDR``, ``RUNTIME_WORKER_ADDRS``)."""
    worker_base = env.get("RUNTIME_WORKER_LISTEN", "").strip()
    if not worker_base and env.get("RUNTIME_WORKER_ADDR", "").strip():
        addr_port = split_hostport(env["RUNTIME_WORKER_ADDR"], DEFAULT_WORKER_PORT)[1]
        worker_base = f"{LOCAL_HOST}:{addr_port}"
    w_host, w_port = split_hostport(worker_base or LOCAL_HOST, DEFAULT_WORKER_PORT)
    base_instance = env.get("RUNTIME_INSTANCE_ID", "").strip()
    hostname = socket.gethostname().split(".")[0] or "local"
    listens: list[tuple[str, str, str]] = []
    for i in range(workers):
        port = free_port(connect_host(w_host)) if w_port == 0 else w_port + i
        if base_instance:
            instance = base_instance if workers == 1 else f"{base_instance}-{i + 1}"
        else:
            instance = f"{hostname}-worker-{i + 1}"
        listens.append((f"{w_host}:{port}", f"{connect_host(w_host)}:{port}", instance))
    if listens:
        env["RUNTIME_WORKER_ADDR"] = listens[0][1]
        env.setdefault("RUNTIME_WORKER_ADDRS", ",".join(w[1] for w in listens))
    return listens


def _gateway_address(env: dict[str, str]) -> tuple[str, int, str]:
    """The gateway's host, port (a free one for 0) and URL; host and port go into ``env``."""
    gw_host = env.get("GATEWAY_HOST", "").strip() or LOCAL_HOST
    gw_port = _port_var(env, "GATEWAY_PORT", DEFAULT_GATEWAY_PORT)
    if gw_port == 0:
        gw_port = free_port(connect_host(gw_host))
    env["GATEWAY_HOST"] = gw_host
    env["GATEWAY_PORT"] = str(gw_port)
    gw_connect = connect_host(gw_host)
    if ":" in gw_connect and not gw_connect.startswith("["):
        gw_connect = f"[{gw_connect}]"
    return gw_host, gw_port, f"http://{gw_connect}:{gw_port}"


@dataclass
class _Services:
    """The plan's children, each with the common environment and its own."""

    env: Mapping[str, str]
    kinds: set[str] | None
    python: str
    specs: list[ServiceSpec] = field(default_factory=list)

    def add(
        self,
        name: str,
        kind: str,
        args: list[str],
        extra: Mapping[str, str],
        probe: Literal["grpc", "http"],
        target: str,
        listen: str,
        bind: str,
    ) -> None:
        """One child (unless ``only`` leaves its kind out)."""
        if self.kinds is not None and kind not in self.kinds:
            return
        child_env = dict(self.env)
        child_env.update(extra)
        self.specs.append(
            ServiceSpec(
                name=name,
                kind=kind,
                argv=(self.python, "-m", *args),
                env=child_env,
                probe=probe,
                target=target,
                listen=listen,
                tier=_TIERS[kind],
                bind=split_hostport(bind, 0),
            )
        )

    def standin(self, args: list[str], urls: dict[str, str]) -> None:
        last_url = list(urls.values())[-1]  # started last: up means all are
        self.add(
            "standin",
            "standin",
            ["model_standin", "--host", LOCAL_HOST, *args],
            {},
            "http",
            f"{last_url}/_standin/stats",
            ", ".join(urls.values()),
            last_url.removeprefix("http://"),
        )

    def job_services(self, listens: list[tuple[str, str]]) -> None:
        job_metrics = _metrics_port(self.env, "JOB_SERVICE_METRICS_PORT", DEFAULT_JOB_METRICS_PORT)
        for i, (listen, addr) in enumerate(listens):
            metrics = job_metrics if i == 0 or not job_metrics else free_port()
            self.add(
                "job_service" if len(listens) == 1 else f"job_service-{i + 1}",
                "job_service",
                ["job_service"],
                {"JOB_SERVICE_LISTEN": listen, "JOB_SERVICE_METRICS_PORT": str(metrics)},
                "grpc",
                addr,
                f"grpc {listen}{_metrics_note(metrics)}",
                listen,
            )

    def credential_service(self, listen: str, addr: str) -> None:
        metrics = _metrics_port(
            self.env, "CREDENTIAL_SERVICE_METRICS_PORT", DEFAULT_CREDENTIAL_METRICS_PORT
        )
        self.add(
            "credential_service",
            "credential_service",
            ["credential_service"],
            {"CREDENTIAL_SERVICE_LISTEN": listen},
            "grpc",
            addr,
            f"grpc {listen}" + _metrics_note(metrics),
            listen,
        )

    def workers(self, listens: list[tuple[str, str, str]]) -> None:
        worker_metrics = _metrics_port(self.env, "WORKER_METRICS_PORT", DEFAULT_WORKER_METRICS_PORT)
        for i, (listen, addr, instance) in enumerate(listens):
            metrics = worker_metrics + i if worker_metrics else 0
            self.add(
                "runtime_worker" if len(listens) == 1 else f"runtime_worker-{i + 1}",
                "runtime_worker",
                ["runtime_worker"],
                {
                    "RUNTIME_WORKER_LISTEN": listen,
                    "RUNTIME_WORKER_ADDR": addr,
                    "RUNTIME_INSTANCE_ID": instance,
                    "WORKER_METRICS_PORT": str(metrics),
                },
                "grpc",
                addr,
                f"grpc {listen} ({instance}){_metrics_note(metrics)}",
                listen,
            )

    def gateway(self, host: str, port: int, url: str) -> None:
        self.add(
            "api_gateway",
            "api_gateway",
            ["api_gateway"],
            {},
            "http",
            f"{url}/healthz",
            f"{url}  (docs {url}/docs, console {url}/admin/console)",
            f"{host}:{port}" if ":" not in host or host.startswith("[") else f"[{host}]:{port}",
        )


def build_plan(
    base_env: Mapping[str, str],
    *,
    var_dir: str | os.PathLike[str] = "var",
    dev: bool = False,
    workers: int = 1,
    job_services: int = 1,
    only: Iterable[str] | str | None = None,
    python: str | None = None,
) -> LaunchPlan:
    """Assemble the children's environments (LAUNCHER brief; reference §7).

    Args:
        base_env: the launcher's environment (``os.environ`` plus any env file).
        var_dir: directory for SQLite files and the dev secrets; created, made absolute.
        dev: force the local model stand-in even when ``DEEPSEEK_API_KEY`` is set
            (the real key is then withheld from the children).
        workers: number of runtime workers (each its own status port and instance id).
        job_services: job_service replicas, each its own process: the first on
            ``JOB_SERVICE_LISTEN`` and ``JOB_SERVICE_METRICS_PORT``, the others on free
            ports of the same host (the next ports belong to the other services).
            With more than one, ``JOB_SERVICE_ADDR`` lists them all
            (``ipv4:127.0.0.1:50051,127.0.0.1:41234``) and clients spread their calls
            round robin; they need a shared server database (MySQL/MariaDB).
        only: start only these services (names or aliases); the environment is
            assembled as for the full system, so the rest may run elsewhere.
        python: interpreter for the children (default: this one).

    Returns:
        The plan; generating missing dev secrets writes ``var_dir/dev-secrets.env``.

    Raises:
        PlanError: bad ``only`` name, negative ``workers``, ``job_services`` < 1, several
            job_services on SQLite, or a malformed address.
    """
    _check_counts(base_env, workers, job_services)
    kinds = normalize_only(only)
    var = Path(var_dir).expanduser().resolve()
    var.mkdir(parents=True, exist_ok=True)
    secrets_file = var / DEV_SECRETS_FILE
    env, generated = _common_env(base_env, var, secrets_file)
    standin_args, standin_urls = _standin_providers(env, dev)
    standin_url = next(iter(standin_urls.values()), None)
    job_listen, job_addr = _resolve(env, "JOB_SERVICE_LISTEN", "JOB_SERVICE_ADDR", DEFAULT_JOB_PORT)
    cred_listen, cred_addr = _resolve(
        env, "CREDENTIAL_SERVICE_LISTEN", "CREDENTIAL_SERVICE_ADDR", DEFAULT_CREDENTIAL_PORT
    )
    job_listens, env["JOB_SERVICE_ADDR"] = _job_service_listens(
        env, job_listen, job_addr, job_services
    )
    env["CREDENTIAL_SERVICE_ADDR"] = cred_addr
    worker_listens = _worker_listens(env, workers)
    gw_host, gw_port, gateway_url = _gateway_address(env)

    services = _Services(env, kinds, python or sys.executable)
    if standin_url is not None:
        services.standin(standin_args, standin_urls)
    services.job_services(job_listens)
    services.credential_service(cred_listen, cred_addr)
    services.workers(worker_listens)
    services.gateway(gw_host, gw_port, gateway_url)
    return LaunchPlan(
        services=services.specs,
        env=env,
        var_dir=var,
        secrets_file=secrets_file,
        generated=generated,
        gateway_url=gateway_url,
        standin_url=standin_url,
        standin_urls=standin_urls if env.get("MODEL_PROVIDERS") else {},
    )
