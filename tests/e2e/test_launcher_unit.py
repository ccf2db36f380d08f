"""Unit tests of the launcher (secrets, env assembly, process lifecycle, tokens) and of
the demo's pure parts (knowledge points from headings, learning activity, citation check,
rendering, environment isolation)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import socket
import stat
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
import pytest

from demo.__main__ import (
    DEFAULT_DOCUMENT,
    DocumentError,
    demo_environment,
    resolve_document,
    summarize_log_line,
)
from demo.flow import document_title
from demo.knowledge import (
    ATTEMPTS_PER_KP,
    KnowledgePointPlan,
    check_citations,
    document_headings,
    plan_knowledge_points,
    plan_learning_activity,
)
from demo.render import (
    WIDTH,
    Lookup,
    pad,
    render_quiz,
    render_recommendations,
    render_weak_points,
    text_width,
    wrap,
)
from launcher.core import Launcher, LauncherError
from launcher.devsecrets import ensure_dev_secrets, parse_env_text, read_env_file
from launcher.plan import (
    LaunchPlan,
    PlanError,
    ServiceSpec,
    build_plan,
    free_port,
    grpc_address_list,
    port_in_use,
    split_hostport,
)
from launcher.token import TokenError, find_jwt_settings, mint_token
from launcher.token import main as token_main

SECRET_NAMES = ("RUNTIME_SERVICE_TOKEN", "JWT_SECRET", "CREDENTIAL_ENCRYPTION_KEYS")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    env.update(extra)
    return env


# -- dev secrets --------------------------------------------------------------------------


def test_secrets_generated_once_written_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "var" / "dev-secrets.env"
    values, generated = ensure_dev_secrets({}, path)
    assert generated == list(SECRET_NAMES)
    assert set(values) == set(SECRET_NAMES)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_env_file(path) == values
    kid, key = values["CREDENTIAL_ENCRYPTION_KEYS"].split(":", 1)
    assert kid == "dev1"
    assert len(base64.b64decode(key, validate=True)) == 32
    assert len(values["RUNTIME_SERVICE_TOKEN"]) >= 40
    assert values["RUNTIME_SERVICE_TOKEN"] != values["JWT_SECRET"]

    again, generated_again = ensure_dev_secrets({}, path)
    assert generated_again == []
    assert again == values  # same secrets: stored credentials stay decryptable


def test_secrets_generated_key_is_accepted_by_the_credential_keyring(tmp_path: Path) -> None:
    vault = pytest.importorskip("credential_service.vault")
    values, _ = ensure_dev_secrets({}, tmp_path / "s.env")
    keyring = vault.Keyring.from_env_value(values["CREDENTIAL_ENCRYPTION_KEYS"])
    assert keyring.key_ids == ("dev1",)


def test_secrets_from_environment_win_and_are_never_written(tmp_path: Path) -> None:
    path = tmp_path / "dev-secrets.env"
    env = {"JWT_SECRET": "from-env", "RUNTIME_SERVICE_TOKEN": "tok-env"}
    values, generated = ensure_dev_secrets(env, path)
    assert generated == ["CREDENTIAL_ENCRYPTION_KEYS"]
    assert set(values) == {"CREDENTIAL_ENCRYPTION_KEYS"}
    text = path.read_text()
    assert "from-env" not in text and "tok-env" not in text


def test_secrets_partial_file_keeps_stored_values(tmp_path: Path) -> None:
    path = tmp_path / "dev-secrets.env"
    path.write_text("JWT_SECRET=kept\n")
    path.chmod(0o644)
    values, generated = ensure_dev_secrets({}, path)
    assert values["JWT_SECRET"] == "kept"
    assert sorted(generated) == ["CREDENTIAL_ENCRYPTION_KEYS", "RUNTIME_SERVICE_TOKEN"]
    assert read_env_file(path)["JWT_SECRET"] == "kept"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_secrets_loose_permissions_are_tightened_on_reuse(tmp_path: Path) -> None:
    path = tmp_path / "dev-secrets.env"
    ensure_dev_secrets({}, path)
    path.chmod(0o644)
    ensure_dev_secrets({}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_parse_env_text() -> None:
    text = textwrap.dedent(
        """
        # comment
        export A=1
        B = "two words"
        C='x#y'
        D=plain # trailing comment
        not a line
        E=
        A=3
        """
    )
    assert parse_env_text(text) == {"A": "3", "B": "two words", "C": "x#y", "D": "plain", "E": ""}


# -- env assembly ---------------------------------------------------------------------------


def test_plan_defaults(tmp_path: Path) -> None:
    plan = build_plan(_clean_env(), var_dir=tmp_path / "var")
    kinds = [s.kind for s in plan.services]
    assert kinds == [
        "standin",
        "job_service",
        "credential_service",
        "runtime_worker",
        "api_gateway",
    ]
    var = (tmp_path / "var").resolve()
    assert plan.var_dir == var
    assert plan.env["DATABASE_URL"] == f"sqlite+aiosqlite:///{var}/job_service.db"
    assert plan.env["CREDENTIAL_DATABASE_URL"] == f"sqlite+aiosqlite:///{var}/credential_service.db"
    assert plan.env["JOB_SERVICE_ADDR"] == "127.0.0.1:50051"
    assert plan.env["CREDENTIAL_SERVICE_ADDR"] == "127.0.0.1:50052"
    assert plan.gateway_url == "http://127.0.0.1:3000"
    # no DeepSeek key → the stand-in, and the credential service may use it
    assert plan.standin_url == "http://127.0.0.1:8600"
    assert plan.env["DEEPSEEK_BASE_URL"] == "http://127.0.0.1:8600"
    assert plan.env["ALLOW_PLATFORM_KEY_STANDIN"] == "1"
    by_kind = {s.kind: s for s in plan.services}
    assert by_kind["job_service"].env["JOB_SERVICE_LISTEN"] == "127.0.0.1:50051"
    assert by_kind["job_service"].argv[1:] == ("-m", "job_service")
    assert by_kind["job_service"].probe == "grpc"
    assert by_kind["credential_service"].env["CREDENTIAL_SERVICE_LISTEN"] == "127.0.0.1:50052"
    assert by_kind["runtime_worker"].env["RUNTIME_WORKER_LISTEN"] == "127.0.0.1:50053"
    assert by_kind["api_gateway"].env["GATEWAY_PORT"] == "3000"
    assert by_kind["api_gateway"].target == "http://127.0.0.1:3000/healthz"
    assert by_kind["standin"].argv[-4:] == ("--host", "127.0.0.1", "--port", "8600")
    tiers = [by_kind[k].tier for k in kinds]
    assert tiers[0] == tiers[1] < tiers[2] < tiers[3] < tiers[4]  # stand-in beside job_service
    for spec in plan.services:
        for name in SECRET_NAMES:
            assert spec.env[name] == plan.env[name]
        assert spec.env["PYTHONUNBUFFERED"] == "1"
    assert plan.generated == list(SECRET_NAMES)
    # same var dir again: the same secrets
    assert (
        build_plan(_clean_env(), var_dir=tmp_path / "var").env["JWT_SECRET"]
        == plan.env["JWT_SECRET"]
    )


def test_plan_with_real_key_uses_deepseek_and_dev_mode_withholds_it(tmp_path: Path) -> None:
    env = _clean_env(DEEPSEEK_API_KEY="sk-real-key-123456")
    real = build_plan(env, var_dir=tmp_path)
    assert real.standin_url is None
    assert "standin" not in [s.kind for s in real.services]
    assert real.env["DEEPSEEK_API_KEY"] == "sk-real-key-123456"
    assert "ALLOW_PLATFORM_KEY_STANDIN" not in real.env
    assert "DEEPSEEK_BASE_URL" not in real.env  # the services' default (api.deepseek.com)

    dev = build_plan(env, var_dir=tmp_path, dev=True)
    assert dev.services[0].kind == "standin"
    assert dev.env["DEEPSEEK_BASE_URL"] == "http://127.0.0.1:8600"
    for spec in dev.services:
        assert "DEEPSEEK_API_KEY" not in spec.env  # never sent to the local stand-in


PROVIDERS = [
    {"name": "primary", "baseUrl": "https://api.deepseek.com", "apiKeyEnv": "PRIMARY_API_KEY"},
    {
        "name": "backup",
        "baseUrl": "https://llm.example.com/v1",
        "apiKeyEnv": "BACKUP_API_KEY",
        "models": {"deepseek-chat": "backup-chat", "deepseek-reasoner": "backup-r1"},
    },
]


def test_plan_with_several_providers_runs_one_stand_in_port_each(tmp_path: Path) -> None:
    """MODEL_PROVIDERS with no platform key set (or --dev): every provider gets its own
    stand-in port serving its model names, the list is pointed at them, and no
    platform key variable reaches a child."""
    env = _clean_env(MODEL_PROVIDERS=json.dumps(PROVIDERS), BACKUP_API_KEY="sk-real-backup-1")
    for plan in (
        build_plan(env, var_dir=tmp_path, dev=True),
        build_plan({**env, "BACKUP_API_KEY": ""}, var_dir=tmp_path),
    ):
        assert list(plan.standin_urls) == ["primary", "backup"]
        primary, backup = plan.standin_urls.values()
        assert primary == "http://127.0.0.1:8600" == plan.standin_url
        listed = json.loads(plan.env["MODEL_PROVIDERS"])
        assert [(p["name"], p["baseUrl"]) for p in listed] == [
            ("primary", primary),
            ("backup", backup),
        ]
        assert listed[1]["models"] == PROVIDERS[1]["models"]
        by_kind = {s.kind: s for s in plan.services}
        port = backup.rsplit(":", 1)[1]
        assert by_kind["standin"].argv[-2:] == (
            "--providers",
            f"primary=8600,backup={port}:backup-chat+backup-r1",
        )
        assert by_kind["standin"].target == f"{backup}/_standin/stats"
        assert plan.env["ALLOW_PLATFORM_KEY_STANDIN"] == "1"
        for spec in plan.services:
            assert "BACKUP_API_KEY" not in spec.env and "PRIMARY_API_KEY" not in spec.env


def test_plan_with_a_provider_key_calls_the_real_providers(tmp_path: Path) -> None:
    env = _clean_env(MODEL_PROVIDERS=json.dumps(PROVIDERS), BACKUP_API_KEY="sk-real-backup-1")
    plan = build_plan(env, var_dir=tmp_path)
    assert plan.standin_url is None and plan.standin_urls == {}
    assert "standin" not in [s.kind for s in plan.services]
    assert json.loads(plan.env["MODEL_PROVIDERS"]) == PROVIDERS
    assert plan.env["BACKUP_API_KEY"] == "sk-real-backup-1"
    assert "ALLOW_PLATFORM_KEY_STANDIN" not in plan.env


def test_plan_refuses_a_malformed_provider_list(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"MODEL_PROVIDERS: 0\.baseUrl"):
        build_plan(
            _clean_env(MODEL_PROVIDERS='[{"name": "a", "baseUrl": "ftp://x"}]'), var_dir=tmp_path
        )


def test_plan_honours_urls_ports_and_secrets_from_env(tmp_path: Path) -> None:
    env = _clean_env(
        DATABASE_URL="mysql+aiomysql://root@127.0.0.1:3306/airt",
        CREDENTIAL_DATABASE_URL="mysql+aiomysql://root@127.0.0.1:3306/creds",
        JOB_SERVICE_LISTEN="[::]:6051",
        CREDENTIAL_SERVICE_ADDR="localhost:6052",
        GATEWAY_PORT="8088",
        GATEWAY_HOST="0.0.0.0",
        STANDIN_PORT="9600",
        JWT_SECRET="given",
    )
    plan = build_plan(env, var_dir=tmp_path)
    by_kind = {s.kind: s for s in plan.services}
    assert plan.env["DATABASE_URL"] == "mysql+aiomysql://root@127.0.0.1:3306/airt"
    assert plan.env["CREDENTIAL_DATABASE_URL"] == "mysql+aiomysql://root@127.0.0.1:3306/creds"
    assert by_kind["job_service"].env["JOB_SERVICE_LISTEN"] == "[::]:6051"
    assert plan.env["JOB_SERVICE_ADDR"] == "127.0.0.1:6051"  # derived from the listen address
    assert by_kind["credential_service"].env["CREDENTIAL_SERVICE_LISTEN"] == "127.0.0.1:6052"
    assert plan.env["CREDENTIAL_SERVICE_ADDR"] == "localhost:6052"  # kept as given
    assert by_kind["credential_service"].target == "localhost:6052"
    assert plan.gateway_url == "http://127.0.0.1:8088"
    assert by_kind["api_gateway"].env["GATEWAY_HOST"] == "0.0.0.0"
    assert by_kind["job_service"].bind == ("[::]", 6051)
    assert by_kind["api_gateway"].bind == ("0.0.0.0", 8088)
    assert by_kind["standin"].bind == ("127.0.0.1", 9600)
    assert plan.standin_url == "http://127.0.0.1:9600"
    assert plan.env["JWT_SECRET"] == "given"
    assert plan.generated == ["RUNTIME_SERVICE_TOKEN", "CREDENTIAL_ENCRYPTION_KEYS"]


def test_plan_workers_get_own_ports_ids_and_metrics(tmp_path: Path) -> None:
    plan = build_plan(_clean_env(), var_dir=tmp_path, workers=3)
    workers = [s for s in plan.services if s.kind == "runtime_worker"]
    assert [w.name for w in workers] == ["runtime_worker-1", "runtime_worker-2", "runtime_worker-3"]
    assert [w.env["RUNTIME_WORKER_LISTEN"] for w in workers] == [
        "127.0.0.1:50053",
        "127.0.0.1:50054",
        "127.0.0.1:50055",
    ]
    assert [w.env["WORKER_METRICS_PORT"] for w in workers] == ["9103", "9104", "9105"]
    ids = [w.env["RUNTIME_INSTANCE_ID"] for w in workers]
    assert len(set(ids)) == 3
    assert plan.env["RUNTIME_WORKER_ADDRS"] == "127.0.0.1:50053,127.0.0.1:50054,127.0.0.1:50055"
    assert len({w.tier for w in workers}) == 1  # one tier: started and stopped together

    named = build_plan(_clean_env(RUNTIME_INSTANCE_ID="box"), var_dir=tmp_path, workers=2)
    assert [s.env["RUNTIME_INSTANCE_ID"] for s in named.services if s.kind == "runtime_worker"] == [
        "box-1",
        "box-2",
    ]
    none = build_plan(_clean_env(), var_dir=tmp_path, workers=0)
    assert "runtime_worker" not in [s.kind for s in none.services]
    with pytest.raises(PlanError):
        build_plan(_clean_env(), var_dir=tmp_path, workers=-1)


MYSQL_ENV = {"DATABASE_URL": "mysql+aiomysql://root@127.0.0.1:3306/airt"}


def test_plan_job_service_replicas_get_own_ports_and_one_round_robin_target(
    tmp_path: Path,
) -> None:
    plan = build_plan(_clean_env(**MYSQL_ENV), var_dir=tmp_path, job_services=3)
    jobs = [s for s in plan.services if s.kind == "job_service"]
    assert [j.name for j in jobs] == ["job_service-1", "job_service-2", "job_service-3"]
    # the first keeps the documented ports; the others take free ones, never another
    # service's (credential_service 50052, the worker 50053, metrics 9102, 9103)
    listens = [j.env["JOB_SERVICE_LISTEN"] for j in jobs]
    assert listens[0] == "127.0.0.1:50051"
    ports = [split_hostport(x, 0)[1] for x in listens]
    assert len(set(ports)) == 3 and 0 not in ports
    assert not {50052, 50053, 3000, 8600} & set(ports)
    assert [j.target for j in jobs] == listens
    metrics = [int(j.env["JOB_SERVICE_METRICS_PORT"]) for j in jobs]
    assert metrics[0] == 9101 and len(set(metrics)) == 3
    assert not {9102, 9103} & set(metrics)
    target = "ipv4:" + ",".join(listens)
    assert plan.env["JOB_SERVICE_ADDR"] == target
    # every client of job_service dials the list
    for spec in plan.services:
        assert spec.env["JOB_SERVICE_ADDR"] == target
    assert len({j.tier for j in jobs}) == 1  # started together; migrations take a lock

    off = build_plan(
        _clean_env(**MYSQL_ENV, JOB_SERVICE_LISTEN="127.0.0.1:0", JOB_SERVICE_METRICS_PORT="0"),
        var_dir=tmp_path,
        job_services=2,
    )
    listens = [s.env["JOB_SERVICE_LISTEN"] for s in off.services if s.kind == "job_service"]
    ports = [split_hostport(x, 0)[1] for x in listens]
    assert 0 not in ports and len(set(ports)) == 2
    assert [s.env["JOB_SERVICE_METRICS_PORT"] for s in off.services if s.kind == "job_service"] == [
        "0",
        "0",
    ]

    one = build_plan(_clean_env(**MYSQL_ENV), var_dir=tmp_path)
    assert [s.name for s in one.services if s.kind == "job_service"] == ["job_service"]
    assert one.env["JOB_SERVICE_ADDR"] == "127.0.0.1:50051"


def test_plan_job_service_replicas_refused_on_sqlite_or_below_one(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="shared server database"):
        build_plan(_clean_env(), var_dir=tmp_path / "var", job_services=2)
    assert not (tmp_path / "var").exists()  # refused before anything is written
    with pytest.raises(PlanError, match="1 or more"):
        build_plan(_clean_env(**MYSQL_ENV), var_dir=tmp_path, job_services=0)
    with pytest.raises(PlanError, match="not an IP address"):
        build_plan(
            _clean_env(**MYSQL_ENV, JOB_SERVICE_LISTEN="jobs.internal:50051"),
            var_dir=tmp_path,
            job_services=2,
        )


def test_grpc_address_list() -> None:
    assert grpc_address_list(["10.0.0.1:5"]) == "10.0.0.1:5"
    assert grpc_address_list(["10.0.0.1:5", "10.0.0.2:6"]) == "ipv4:10.0.0.1:5,10.0.0.2:6"
    assert grpc_address_list(["[::1]:5", "[::1]:6"]) == "ipv6:[::1]:5,[::1]:6"
    with pytest.raises(PlanError, match="mix"):
        grpc_address_list(["10.0.0.1:5", "[::1]:6"])
    with pytest.raises(PlanError, match="not an IP address"):
        grpc_address_list(["a.example:5", "b.example:6"])


def test_plan_port_zero_becomes_a_real_free_port(tmp_path: Path) -> None:
    env = _clean_env(
        JOB_SERVICE_LISTEN="127.0.0.1:0",
        CREDENTIAL_SERVICE_LISTEN="127.0.0.1:0",
        RUNTIME_WORKER_LISTEN="127.0.0.1:0",
        GATEWAY_PORT="0",
        STANDIN_PORT="0",
    )
    plan = build_plan(env, var_dir=tmp_path, workers=2)
    ports = []
    for spec in plan.services:
        host, port = split_hostport(spec.target.split("//")[-1].split("/")[0], 0)
        assert host == "127.0.0.1"
        assert port > 0
        ports.append(port)
    assert len(set(ports)) == len(ports)
    assert plan.env["JOB_SERVICE_ADDR"].endswith(f":{ports[1]}")


def test_plan_only_filters_services_but_keeps_addresses(tmp_path: Path) -> None:
    plan = build_plan(_clean_env(), var_dir=tmp_path, only="job,gateway")
    assert [s.kind for s in plan.services] == ["job_service", "api_gateway"]
    assert plan.services[1].env["CREDENTIAL_SERVICE_ADDR"] == "127.0.0.1:50052"
    with pytest.raises(PlanError, match="unknown service"):
        build_plan(_clean_env(), var_dir=tmp_path, only="job,nope")
    with pytest.raises(PlanError, match="GATEWAY_PORT"):
        build_plan(_clean_env(GATEWAY_PORT="http"), var_dir=tmp_path)
    with pytest.raises(PlanError, match="STANDIN_PORT"):
        build_plan(_clean_env(STANDIN_PORT="70000"), var_dir=tmp_path)


def test_split_hostport() -> None:
    assert split_hostport("[::]:50051", 1) == ("[::]", 50051)
    assert split_hostport("0.0.0.0:7", 1) == ("0.0.0.0", 7)
    assert split_hostport("localhost", 9) == ("localhost", 9)
    assert split_hostport("dns:///svc:5", 1) == ("svc", 5)
    with pytest.raises(PlanError):
        split_hostport("host:notaport", 1)


# -- tokens ---------------------------------------------------------------------------------


def test_mint_token_claims() -> None:
    secret = "s3cret-" * 6
    token = mint_token(secret, sub="u1", role="admin", plan="pro", ttl_seconds=60, issuer="me")
    claims = jwt.decode(token, secret, algorithms=["HS256"], issuer="me")
    assert claims["sub"] == "u1" and claims["role"] == "admin" and claims["plan"] == "pro"
    assert claims["exp"] - claims["iat"] == 60
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    plain = jwt.decode(mint_token(secret, sub="u2"), secret, algorithms=["HS256"])
    assert plain["role"] == "user" and "plan" not in plain and "iss" not in plain
    with pytest.raises(ValueError):
        mint_token("s", sub="u", role="root")


def test_token_secret_lookup_and_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TokenError):
        find_jwt_settings({}, var_dir=tmp_path)
    values, _ = ensure_dev_secrets({}, tmp_path / "dev-secrets.env")
    assert find_jwt_settings({}, var_dir=tmp_path) == (values["JWT_SECRET"], None)
    assert find_jwt_settings({"JWT_SECRET": "from-env"}, var_dir=tmp_path)[0] == "from-env"

    monkeypatch.delenv("JWT_SECRET", raising=False)
    monkeypatch.delenv("JWT_ISSUER", raising=False)
    assert token_main(["--var-dir", str(tmp_path), "--sub", "u9", "--role", "admin"]) == 0
    token = capsys.readouterr().out.strip()
    claims = jwt.decode(token, values["JWT_SECRET"], algorithms=["HS256"])
    assert claims["sub"] == "u9" and claims["role"] == "admin"
    assert token_main(["--var-dir", str(tmp_path / "empty"), "--sub", "u9"]) == 2


# -- the process lifecycle, with small stand-in services ----------------------------------

HTTP_SERVICE = """
import http.server, os, signal, sys
order = os.environ["ORDER_FILE"]
name = os.environ["NAME"]
def bye(*_):
    with open(order, "a") as f:
        f.write(name + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H)
print("hello from", name, flush=True)
print("second line", flush=True)
srv.serve_forever()
"""

GRPC_SERVICE = """
import asyncio, os
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
async def main():
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port("127.0.0.1:" + os.environ["PORT"])
    await server.start()
    await asyncio.sleep(0.3)  # NOT_SERVING first: the launcher must wait
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    print("grpc serving", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def _spec(
    name: str, kind: str, script: str, tmp_path: Path, *, probe: str = "http", **env: str
) -> ServiceSpec:
    port = free_port()
    child_env = dict(os.environ)
    child_env.update(
        {"PORT": str(port), "NAME": name, "ORDER_FILE": str(tmp_path / "order.txt"), **env}
    )
    target = f"127.0.0.1:{port}" if probe == "grpc" else f"http://127.0.0.1:{port}/healthz"
    tier = ("standin", "job_service", "credential_service", "runtime_worker", "api_gateway").index(
        kind
    )
    return ServiceSpec(
        name=name,
        kind=kind,
        argv=(sys.executable, "-c", script),
        env=child_env,
        probe=probe,  # type: ignore[arg-type]
        target=target,
        listen=target,
        tier=tier,
        bind=("127.0.0.1", port),
    )


def _plan(tmp_path: Path, services: list[ServiceSpec]) -> LaunchPlan:
    return LaunchPlan(
        services=services,
        env={},
        var_dir=tmp_path,
        secrets_file=tmp_path / "dev-secrets.env",
        gateway_url="http://gateway.invalid",
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); it is gone once reaped, which asyncio does
    return False


async def test_launcher_starts_in_order_prefixes_output_and_stops_in_reverse(
    tmp_path: Path,
) -> None:
    services = [
        _spec("first", "job_service", GRPC_SERVICE, tmp_path, probe="grpc"),
        _spec("second", "credential_service", HTTP_SERVICE, tmp_path),
        _spec("third", "api_gateway", HTTP_SERVICE, tmp_path),
    ]
    out = io.StringIO()
    launcher = Launcher(plan=_plan(tmp_path, services), out=out, stop_grace=5)
    await launcher.start()
    pids = launcher.pids()
    assert set(pids) == {"first", "second", "third"}
    table = launcher.describe()
    assert "second" in table and str(pids["second"]) in table
    await launcher.stop()
    for pid in pids.values():
        assert _gone(pid)
    text = out.getvalue()
    assert "second   | hello from second" in text
    assert "third    | second line" in text
    assert "first    | grpc serving" in text
    assert text.index("first ready") < text.index("second ready") < text.index("third ready")
    # reverse order: the gateway-like tier first (first has no handler; it dies by SIGTERM)
    assert (tmp_path / "order.txt").read_text().split() == ["third", "second"]


async def test_launcher_start_fails_when_a_child_exits_and_stops_the_rest(tmp_path: Path) -> None:
    services = [
        _spec("ok", "job_service", HTTP_SERVICE, tmp_path),
        _spec(
            "broken",
            "credential_service",
            "print('refusing: X is required'); raise SystemExit(3)",
            tmp_path,
        ),
        _spec("never", "api_gateway", HTTP_SERVICE, tmp_path),
    ]
    launcher = Launcher(plan=_plan(tmp_path, services), out=io.StringIO())
    with pytest.raises(LauncherError) as info:
        await launcher.start()
    message = str(info.value)
    assert "broken exited with status 3" in message
    assert "refusing: X is required" in message
    assert launcher.pids() == {}
    assert (tmp_path / "order.txt").read_text().split() == ["ok"]


async def test_launcher_start_times_out_when_never_ready(tmp_path: Path) -> None:
    sleeper = "import time; print('starting', flush=True); time.sleep(30)"
    launcher = Launcher(
        plan=_plan(tmp_path, [_spec("slow", "job_service", sleeper, tmp_path, probe="grpc")]),
        out=io.StringIO(),
        startup_timeout=0.6,
        stop_grace=2,
    )
    started = time.monotonic()
    with pytest.raises(LauncherError, match="slow not ready"):
        await launcher.start()
    assert time.monotonic() - started < 5
    assert launcher.pids() == {}


async def test_launcher_reports_an_unexpected_death(tmp_path: Path) -> None:
    services = [
        _spec("a", "job_service", HTTP_SERVICE, tmp_path),
        _spec("b", "api_gateway", HTTP_SERVICE, tmp_path),
    ]
    out = io.StringIO()
    launcher = Launcher(plan=_plan(tmp_path, services), out=out)
    await launcher.start()
    try:
        os.kill(launcher.pids()["a"], signal.SIGKILL)
        failure = await launcher.wait()
        assert failure.name == "a"
        assert failure.returncode == -signal.SIGKILL
        assert "hello from a" in failure.tail
        assert launcher.failure == failure
    finally:
        await launcher.stop()
    assert "a exited unexpectedly" in out.getvalue()
    assert launcher.pids() == {}


async def test_launcher_keeps_running_while_another_replica_of_the_dead_one_runs(
    tmp_path: Path,
) -> None:
    services = [
        _spec("job_service-1", "job_service", HTTP_SERVICE, tmp_path),
        _spec("job_service-2", "job_service", HTTP_SERVICE, tmp_path),
        _spec("b", "api_gateway", HTTP_SERVICE, tmp_path),
    ]
    out = io.StringIO()
    launcher = Launcher(plan=_plan(tmp_path, services), out=out)
    await launcher.start()
    try:
        waiting = asyncio.create_task(launcher.wait())
        os.kill(launcher.pids()["job_service-2"], signal.SIGKILL)
        for _ in range(100):
            if "job_service-2 exited unexpectedly" in out.getvalue():
                break
            await asyncio.sleep(0.05)
        assert "job_service-1 still running" in out.getvalue()
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the other replica serves on
        assert launcher.failure is not None and launcher.failure.name == "job_service-2"
        assert set(launcher.pids()) == {"job_service-1", "b"}
        # the last replica's death ends the wait
        os.kill(launcher.pids()["job_service-1"], signal.SIGKILL)
        fatal = await asyncio.wait_for(waiting, 10)
        assert fatal.name == "job_service-1"
        assert launcher.failure.name == "job_service-2"  # still the first one
    finally:
        await launcher.stop()


async def test_launcher_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    spec = _spec("stubborn", "job_service", HTTP_SERVICE, tmp_path, IGNORE_TERM="1")
    out = io.StringIO()
    launcher = Launcher(plan=_plan(tmp_path, [spec]), out=out, stop_grace=0.5)
    await launcher.start()
    pid = launcher.pids()["stubborn"]
    started = time.monotonic()
    await launcher.stop()
    assert time.monotonic() - started < 4
    assert _gone(pid)
    assert "SIGKILL" in out.getvalue()


async def test_launcher_writes_logs_to_files(tmp_path: Path) -> None:
    spec = _spec("svc", "job_service", HTTP_SERVICE, tmp_path)
    out = io.StringIO()
    async with Launcher(
        plan=_plan(tmp_path, [spec]), out=out, log_dir=tmp_path / "logs"
    ) as launcher:
        path = launcher.log_path("svc")
        assert path is not None
    assert "hello from svc" in path.read_text()
    assert "hello from svc" not in out.getvalue()  # not echoed when logging to files
    assert "svc ready" in out.getvalue()


# -- demo: knowledge points from headings ----------------------------------------------------


def _blocks(texts: list[str]) -> list[dict[str, Any]]:
    return [{"blockId": f"b{i}", "ordinal": i, "text": t} for i, t in enumerate(texts)]


DOC = textwrap.dedent(
    """\
    # Photosynthesis

    Intro paragraph.

    ## Light *reactions*

    Light hits chlorophyll.

    ### Photosystem II

    Water is split.

    ## The Calvin cycle

    Carbon is fixed.

    ```python
    # not a heading
    x = 1
    ```

    ## Limiting factors

    Light, CO2, temperature.

    ## Summary
    """
)


def test_kps_one_per_h2_section_from_the_real_splitter() -> None:
    split = pytest.importorskip("job_service.learning.markdown_split")
    blocks = _blocks([b.text for b in split.split_document(DOC)])
    plans = plan_knowledge_points(DOC, blocks)
    assert [p.name for p in plans] == [
        "Light reactions",
        "The Calvin cycle",
        "Limiting factors",
        "Summary",
    ]
    by_name = {p.name: p for p in plans}
    texts = {b["blockId"]: b["text"] for b in blocks}
    light = [texts[i] for i in by_name["Light reactions"].block_ids]
    assert light == ["Light hits chlorophyll.", "Water is split."]  # sub-heading left out
    calvin = [texts[i] for i in by_name["The Calvin cycle"].block_ids]
    assert calvin[0] == "Carbon is fixed." and len(calvin) == 2  # the code block belongs to it
    # an empty section keeps its heading block so the KP still links something
    assert [texts[i] for i in by_name["Summary"].block_ids] == ["Summary"]
    assert all(p.ordinals == tuple(int(i[1:]) for i in p.block_ids) for p in plans)


def test_kps_heading_text_with_hashes_in_blocks_and_code_fences_ignored() -> None:
    doc = "## One\n\ntext a\n\n```\n## fake\n```\n\n## Two\n\ntext b\n\n## Three\n\ntext c\n"
    assert [h.text for h in document_headings(doc)] == ["One", "Two", "Three"]
    blocks = _blocks(["## One", "text a", "## fake", "## Two", "text b", "## Three", "text c"])
    plans = plan_knowledge_points(doc, blocks)
    assert [p.name for p in plans] == ["One", "Two", "Three"]
    assert plans[0].block_ids == ("b1", "b2")


def test_kps_more_than_six_sections_keep_six_evenly_spread() -> None:
    doc = "\n\n".join(f"## Section {i}\n\nbody {i}" for i in range(1, 11))
    blocks = _blocks([x for i in range(1, 11) for x in (f"Section {i}", f"body {i}")])
    plans = plan_knowledge_points(doc, blocks)
    assert len(plans) == 6
    names = [p.name for p in plans]
    assert names[0] == "Section 1" and names[-1] == "Section 10"
    assert len(set(names)) == 6


def test_kps_without_headings_fall_back_to_three_parts() -> None:
    doc = "\n\n".join(f"Paragraph number {i} about binary search." for i in range(7))
    blocks = _blocks([f"Paragraph number {i} about binary search." for i in range(7)])
    plans = plan_knowledge_points(doc, blocks)
    assert len(plans) == 3
    assert [len(p.block_ids) for p in plans] == [3, 2, 2]
    assert plans[0].name.startswith("Part 1: Paragraph number 0")
    covered = [b for p in plans for b in p.block_ids]
    assert covered == [b["blockId"] for b in blocks]
    assert len(plan_knowledge_points("one", _blocks(["one"]))) == 1
    with pytest.raises(ValueError):
        plan_knowledge_points("x", [])


def test_kps_chinese_setext_and_duplicate_names() -> None:
    doc = "光合作用\n====\n\n## 光反应\n\n光能被吸收。\n\n## 暗反应\n\n二氧化碳被固定。\n\n## 小结\n\n内容。\n\n## 小结\n\n更多。\n"
    headings = document_headings(doc)
    assert headings[0].level == 1 and headings[0].text == "光合作用"
    blocks = _blocks(
        [
            "光合作用",
            "光反应",
            "光能被吸收。",
            "暗反应",
            "二氧化碳被固定。",
            "小结",
            "内容。",
            "小结",
            "更多。",
        ]
    )
    plans = plan_knowledge_points(doc, blocks)
    assert [p.name for p in plans] == ["光反应", "暗反应", "小结", "小结 (2)"]
    assert plans[1].block_ids == ("b4",)
    assert document_title(Path("x.md"), doc) == "光合作用"
    assert document_title(Path("binary-search.md"), "no heading") == "Binary Search"


# -- demo: learning activity, citations, rendering, environment ------------------------------


def test_learning_activity_is_mixed_per_kp_and_well_formed() -> None:
    plans = [
        ("kp1", KnowledgePointPlan("A", ("b1", "b2", "b3", "b4"), (1, 2, 3, 4))),
        ("kp2", KnowledgePointPlan("B", ("b5", "b6"), (5, 6))),
        ("kp3", KnowledgePointPlan("C", ("b7",), (7,))),
    ]
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    activity = plan_learning_activity(
        material_id="m1",
        knowledge_points=plans,
        block_texts={"b1": "x" * 3000, "b5": "short"},
        now=now,
        run_tag="t",
    )
    ids = [e["eventId"] for e in activity.events]
    assert len(ids) == len(set(ids))
    by_kp: dict[str, list[bool]] = {}
    for e in activity.quiz:
        assert e["type"] == "quiz_attempt" and e["materialId"] == "m1"
        by_kp.setdefault(e["knowledgePointId"], []).append(e["correct"])
    assert set(by_kp) == {"kp1", "kp2", "kp3"}
    for outcomes in by_kp.values():
        assert len(outcomes) == ATTEMPTS_PER_KP
        assert True in outcomes and False in outcomes  # mixed for every KP
    assert sum(by_kp["kp1"]) > sum(by_kp["kp2"])  # a strong and a weak one
    for e in activity.reading:
        assert e["type"] == "reading" and e["blockId"].startswith("b")
        assert 5.0 <= e["dwellSeconds"] <= 600.0
    assert {e["blockId"] for e in activity.reading} >= {"b1", "b5", "b7"}
    assert len([e for e in activity.reading if e["blockId"] in ("b5", "b6")]) == 1  # half read
    times = [
        datetime.fromisoformat(e["occurredAt"].replace("Z", "+00:00")) for e in activity.events
    ]
    assert all(t < now for t in times)
    assert activity.summary["kp2"] == (1, 2, 1, ATTEMPTS_PER_KP)


def test_citation_check() -> None:
    good: dict[str, list[dict[str, Any]]] = {
        "learning_state_analysis": [
            {"evidence": [{"blockId": "b1", "note": "n"}, {"knowledgePointId": "k1", "note": "n"}]}
        ],
        "weak_point_analysis": [{"knowledgePointId": "k1", "evidenceBlockIds": ["b2"]}],
        "next_action_planning": [
            {"targetType": "knowledge_point", "targetId": "k1"},
            {"targetType": "material", "targetId": "m1"},
            {"targetType": "user", "targetId": "u1"},
        ],
        "quiz_generation": [{"sourceBlockIds": ["b3"], "knowledgePointId": None}],
        "flashcard_generation": [{"sourceBlockIds": ["b1"]}],
    }
    kwargs: dict[str, Any] = {
        "block_ids": ["b1", "b2", "b3"],
        "kp_ids": ["k1"],
        "material_id": "m1",
        "user_id": "u1",
    }
    report = check_citations(good, **kwargs)
    assert report.ok
    assert report.blocks_cited == {"b1", "b2", "b3"}
    assert len(report.targets_cited) == 3

    bad = json.loads(json.dumps(good))
    bad["quiz_generation"][0]["sourceBlockIds"] = ["elsewhere"]
    bad["weak_point_analysis"][0]["knowledgePointId"] = "k-other"
    bad["next_action_planning"][2]["targetId"] = "u2"
    bad["flashcard_generation"][0]["sourceBlockIds"] = []
    report = check_citations(bad, **kwargs)
    assert not report.ok
    assert report.foreign_blocks == {"elsewhere"}
    assert report.foreign_kps == {"k-other"}
    assert report.foreign_targets == {("user", "u2")}
    assert report.items_without_source == ["flashcard_generation item 1"]


def test_rendering_uses_names_and_ordinals_not_ids() -> None:
    look = Lookup(
        block_ordinals={"blk-aaa": 12},
        kp_names={"kp-xyz": "Light reactions"},
        material_id="m1",
        material_title="Photosynthesis",
        user_id="u1",
    )
    quiz = render_quiz(
        [
            {
                "questionType": "single_choice",
                "difficulty": "medium",
                "stem": "Where does the light reaction happen?",
                "options": ["Stroma", "Thylakoid membrane"],
                "answer": "Thylakoid membrane",
                "explanation": "Photosystems sit in the thylakoid membrane.",
                "knowledgePointId": "kp-xyz",
                "sourceBlockIds": ["blk-aaa"],
            },
            {
                "questionType": "true_false",
                "difficulty": "easy",
                "stem": "Plants fix CO2.",
                "options": [],
                "answer": True,
                "explanation": "Yes.",
                "sourceBlockIds": ["blk-aaa"],
            },
        ],
        look,
    )
    text = "\n".join(quiz)
    assert "B) Thylakoid membrane" in text
    assert "Answer: B) Thylakoid membrane" in text
    assert "Answer: A) True" not in text  # no options given: the bare value
    assert "Answer: True" in text
    zh = render_quiz(
        [
            {
                "questionType": "true_false",
                "difficulty": "easy",
                "stem": "判断正误：植物的光合作用主要在叶片中进行。",
                "options": ["正确", "错误"],
                "answer": False,
                "explanation": "原文。",
                "sourceBlockIds": ["blk-aaa"],
            }
        ],
        look,
    )
    assert "       Answer: B) 错误" in zh
    assert "block #12" in text and "“Light reactions”" in text
    assert "blk-aaa" not in text and "kp-xyz" not in text
    weak = "\n".join(
        render_weak_points(
            [
                {
                    "knowledgePointId": "kp-xyz",
                    "severity": 0.8,
                    "reason": "r",
                    "evidenceBlockIds": [],
                }
            ],
            look,
        )
    )
    assert "“Light reactions”" in weak and "0.80" in weak
    recs = render_recommendations(
        [
            {
                "actionType": "review",
                "targetType": "knowledge_point",
                "targetId": "kp-xyz",
                "reason": "r",
                "priority": 2,
            },
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": "m1",
                "reason": "r",
                "priority": 1,
            },
        ],
        look,
    )
    assert "READ" in recs[0] and "“Photosynthesis”" in recs[0]  # ordered by priority


def test_demo_environment_is_isolated() -> None:
    base = {
        "PATH": "/bin",
        "JWT_SECRET": "prod",
        "DATABASE_URL": "mysql+aiomysql://prod",
        "DEEPSEEK_API_KEY": "sk-real",
        "JOB_SERVICE_ADDR": "job:50051",
        "RUNTIME_WORKER_LISTEN": "[::]:50053",
        "LOG_LEVEL": "DEBUG",
    }
    env = demo_environment(base)
    for gone in ("JWT_SECRET", "DATABASE_URL", "DEEPSEEK_API_KEY", "JOB_SERVICE_ADDR"):
        assert gone not in env
    assert env["LOG_LEVEL"] == "DEBUG" and env["PATH"] == "/bin"
    assert env["GATEWAY_PORT"] == "0" and env["JOB_SERVICE_LISTEN"] == "127.0.0.1:0"
    assert env["RUNTIME_WORKER_LISTEN"] == "127.0.0.1:0"
    assert env["JOB_SERVICE_METRICS_PORT"] == "0"
    assert env["POLL_INTERVAL_MS"] == "250"
    assert demo_environment({"POLL_INTERVAL_MS": "900"})["POLL_INTERVAL_MS"] == "900"


def test_resolve_document(tmp_path: Path) -> None:
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nhello\n", encoding="utf-8")
    assert resolve_document(str(doc), {}) == doc
    assert resolve_document(None, {"DEMO_FILE": str(doc)}) == doc
    with pytest.raises(DocumentError, match="not found"):
        resolve_document(str(tmp_path / "missing.md"), {})
    big = tmp_path / "big.txt"
    big.write_text("x" * (1024 * 1024 + 1))
    with pytest.raises(DocumentError, match="1 MiB"):
        resolve_document(str(big), {})
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DocumentError, match="UTF-8"):
        resolve_document(str(binary), {})
    if DEFAULT_DOCUMENT.exists():
        assert resolve_document(None, {}) == DEFAULT_DOCUMENT


async def test_launcher_stop_and_restart_one_service_on_purpose(tmp_path: Path) -> None:
    services = [
        _spec("dep", "job_service", HTTP_SERVICE, tmp_path),
        _spec("svc", "api_gateway", HTTP_SERVICE, tmp_path),
    ]
    launcher = Launcher(plan=_plan(tmp_path, services), out=io.StringIO())
    await launcher.start()
    try:
        old = launcher.pids()["dep"]
        assert await launcher.stop_service("dep", signal.SIGKILL) == -signal.SIGKILL
        assert "dep" not in launcher.pids()
        await launcher.restart_service("dep")
        new = launcher.pids()["dep"]
        assert new != old
        assert launcher.failure is None  # deliberate stops are not failures
        os.kill(new, signal.SIGKILL)  # but a crash after the restart is
        assert (await launcher.wait()).name == "dep"
    finally:
        await launcher.stop()
    with pytest.raises(KeyError):
        await launcher.stop_service("nope")


def test_summarize_log_line() -> None:
    line = json.dumps(
        {
            "ts": "2026-11-30T15:33:02.591Z",
            "level": "ERROR",
            "msg": "unexpected error in SubmitResult",
            "jobId": "j1",
            "exc": "Traceback (most recent call last):\n  ...\nOperationalError: no such table: x\n",
        }
    )
    text = summarize_log_line(line)
    assert text == (
        "2026-11-30T15:33:02.591Z ERROR unexpected error in SubmitResult (jobId=j1)"
        " | OperationalError: no such table: x"
    )
    assert summarize_log_line("plain " * 100, limit=20) == ("plain " * 100)[:20] + " …"
    sqla = json.dumps(
        {
            "level": "ERROR",
            "msg": "m",
            "exc": "Traceback:\n  File x\nsqlalchemy.exc.OperationalError: no such table: t\n"
            "[SQL: INSERT INTO t]\n(Background on this error at: https://sqlalche.me/e/21/e3q8)",
        }
    )
    assert summarize_log_line(sqla).endswith("| sqlalchemy.exc.OperationalError: no such table: t")


def test_wrap_and_pad_count_cjk_columns() -> None:
    text = "已阅读 1/1 份资料，平均进度 43%。" * 6
    lines = wrap(text, "  ", "> ")
    assert len(lines) > 1
    assert all(text_width(line) <= WIDTH for line in lines)
    assert "".join(line[2:] for line in lines).replace(" ", "") == text.replace(" ", "")
    assert not any(line[2:].startswith(("，", "。")) for line in lines[1:])
    assert pad("光合作用", 5) == "光合 " and text_width(pad("光合作用", 5)) == 5
    assert pad("abc", 5) == "abc  "
    english = wrap("word " * 60, "    ")
    assert all(len(line) <= WIDTH for line in english) and english[1].startswith("    word")


async def test_launcher_refuses_a_port_already_in_use(tmp_path: Path) -> None:
    first = _spec("first", "job_service", HTTP_SERVICE, tmp_path)
    spec = _spec("svc", "api_gateway", HTTP_SERVICE, tmp_path)
    assert spec.bind is not None
    with socket.socket() as squatter:
        squatter.bind(spec.bind)
        squatter.listen()
        assert port_in_use(*spec.bind)
        out = io.StringIO()
        launcher = Launcher(plan=_plan(tmp_path, [first, spec]), out=out)
        with pytest.raises(LauncherError, match=r"already in use: svc \(127.0.0.1:"):
            await launcher.start()
        assert launcher.pids() == {}
        assert "first ready" not in out.getvalue()  # checked before anything starts
    assert not port_in_use(*spec.bind)


def test_free_port_never_repeats_a_recent_port() -> None:
    from launcher.plan import free_port

    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
