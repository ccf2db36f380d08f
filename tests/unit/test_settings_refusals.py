"""Settings refused at start: one line naming the variable and the rule (reference §7).

A value past the datetime range (``LOCK_LEASE_SECONDS=1e308``) or an integer column
(``JOB_TIMEOUT_SECONDS=1e20``) used to be taken and then fail every create or lock
with a 500; a listen port past 65535 was taken modulo 65536; a JSON variable that was
not JSON, a URL that was not a database's and a database that does not exist ended in
tracebacks.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from airuntime_common.db import DatabaseUnavailable, mysql_async_driver, opening_database
from airuntime_common.settings import InvalidSetting, load
from api_gateway.settings import GatewaySettings
from credential_service.settings import CredentialSettings
from job_service.settings import JobServiceSettings
from runtime_worker.settings import WorkerSettings

CASES = [
    (JobServiceSettings, "LOCK_LEASE_SECONDS", "1e308", "less than or equal to 86400"),
    (
        JobServiceSettings,
        "JOB_TIMEOUT_SECONDS",
        "99999999999999999999",
        "less than or equal to 3600",
    ),
    (JobServiceSettings, "RETRY_BACKOFF_MAX_SECONDS", "inf", "less than or equal to 86400"),
    (JobServiceSettings, "USER_DAILY_JOB_QUOTA", "1" + "0" * 20, "less than or equal to"),
    (
        JobServiceSettings,
        "PLAN_DAILY_JOB_QUOTAS",
        "{bad",
        'error parsing value for field "PLAN_DAILY_JOB_QUOTAS"',
    ),
    (JobServiceSettings, "PLAN_DAILY_JOB_QUOTAS", '{"pro": -1}', "PLAN_DAILY_JOB_QUOTAS.pro: "),
    (JobServiceSettings, "MODEL_PRICES", "{bad", 'error parsing value for field "MODEL_PRICES"'),
    (JobServiceSettings, "DATABASE_URL", "garbage", "must be a database URL"),
    (
        JobServiceSettings,
        "DATABASE_URL",
        "postgresql://u:secret-pw@h/db",
        "the driver must be one of",
    ),
    (
        JobServiceSettings,
        "DATABASE_URL",
        "mysql+aiomysql://root@127.0.0.1:3306",
        "names no database",
    ),
    (JobServiceSettings, "JOB_SERVICE_LISTEN", "127.0.0.1:99999", "port in 0..65535"),
    (CredentialSettings, "CREDENTIAL_SERVICE_LISTEN", "50052", "port in 0..65535"),
    (CredentialSettings, "CREDENTIAL_SERVICE_METRICS_PORT", "70000", "less than or equal to 65535"),
    (
        CredentialSettings,
        "CREDENTIAL_DATABASE_URL",
        "sqlite:///var/c.db",
        "the driver must be one of",
    ),
    # a model base URL no call could use (it failed each job's model call with INTERNAL)
    *(
        (CredentialSettings, "DEEPSEEK_BASE_URL", url, "must be an http(s) URL with a host")
        for url in ("http://[::1", "ftp://api.deepseek.com", "api.deepseek.com", "https://")
    ),
    (CredentialSettings, "DEEPSEEK_BASE_URL", "http://h:99999", "http(s) URL"),
    (GatewaySettings, "GATEWAY_PORT", "-1", "greater than or equal to 0"),
    (WorkerSettings, "RUNTIME_WORKER_LISTEN", "[::]:", "port in 0..65535"),
    (WorkerSettings, "HEARTBEAT_INTERVAL_SECONDS", "1e300", "less than or equal to 86400"),
]


@pytest.mark.parametrize(("cls", "name", "value", "rule"), CASES)
def test_refused_at_start_with_the_variable_and_the_rule(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, value: str, rule: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidSetting) as exc:
        load(cls, "svc")
    message = str(exc.value.code)
    assert message.startswith("svc: refusing to start: ") and message.endswith("(reference §7)")
    assert name in message and rule in message
    assert "secret-pw" not in message


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (JobServiceSettings, "DATABASE_URL", "sqlite+aiosqlite:///var/job_service.db"),
        (JobServiceSettings, "DATABASE_URL", "mysql+aiomysql://u:p@db:3306/airuntime"),
        (JobServiceSettings, "DATABASE_URL", "mysql+asyncmy://u:p@db:3306/airuntime"),
        (CredentialSettings, "CREDENTIAL_DATABASE_URL", "mariadb+asyncmy://u:p@db/creds"),
        (JobServiceSettings, "LOCK_LEASE_SECONDS", "86400.0"),
        (JobServiceSettings, "JOB_SERVICE_LISTEN", "[::]:0"),
        (CredentialSettings, "CREDENTIAL_DATABASE_URL", "mariadb+aiomysql://u:p@db/creds"),
        (CredentialSettings, "DEEPSEEK_BASE_URL", "http://127.0.0.1:8600/v1"),
        (CredentialSettings, "DEEPSEEK_BASE_URL", "http://[::1]:8600"),
    ],
)
def test_the_bounds_themselves_are_taken(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    assert str(getattr(load(cls, "svc"), name)) == value


async def test_a_database_that_cannot_be_opened_is_one_line() -> None:
    with pytest.raises(DatabaseUnavailable) as exc:
        async with opening_database("job_service", "DATABASE_URL"):
            raise OperationalError("SELECT 1", {}, Exception(1049, "Unknown database 'x'"))
    assert str(exc.value.code) == (
        "job_service: refusing to start: the database of DATABASE_URL cannot be opened: "
        "(1049, \"Unknown database 'x'\")"
    )


@pytest.mark.parametrize("address", ["no-such-host.invalid:1", "taken"])
async def test_an_address_that_cannot_be_bound_is_one_line(address: str) -> None:
    import socket

    from airuntime_common.grpc_server import CannotListen, GrpcServer

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        if address == "taken":
            address = f"127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(CannotListen) as exc:
            GrpcServer(token="t" * 32, address=address, service_names=[], register=lambda s: None)
    assert str(exc.value.code).startswith(f"refusing to start: cannot listen on {address}: ")


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("mysql+aiomysql://root@h/x", "mysql+aiomysql"),
        ("mariadb+aiomysql://root@h/x", "mysql+aiomysql"),
        ("mysql+asyncmy://root@h/x", "mysql+asyncmy"),
        ("mysql://root@h/x", "mysql+aiomysql"),
        ("mysql+pymysql://root@h/x", "mysql+aiomysql"),
    ],
)
def test_a_test_or_bench_url_picks_its_async_driver(url: str, driver: str) -> None:
    assert mysql_async_driver(url) == driver


@pytest.mark.parametrize(
    ("module", "variable", "argv"),
    [
        ("job_service", "DATABASE_URL", ["migrate"]),
        ("credential_service", "CREDENTIAL_DATABASE_URL", ["migrate"]),
        ("credential_service", "CREDENTIAL_DATABASE_URL", ["rotate-keys"]),
    ],
)
def test_the_one_shot_commands_report_an_unopenable_database_in_one_line(
    monkeypatch: pytest.MonkeyPatch, module: str, variable: str, argv: list[str]
) -> None:
    """``migrate`` (the compose file's one-shot step) and ``rotate-keys`` stop as
    ``serve`` does: one line naming the variable, no traceback, no password."""
    import importlib

    monkeypatch.setenv(variable, "mysql+aiomysql://root:secret-pw@127.0.0.1:1/nothing_listens")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", "k1:" + "A" * 43 + "=")
    main = importlib.import_module(f"{module}.__main__").main
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", root.handlers[:])  # main() sets up its own
    monkeypatch.setattr(root, "level", root.level)
    with pytest.raises(DatabaseUnavailable) as exc:
        main(argv)
    message = str(exc.value.code)
    assert message.startswith(
        f"{module}: refusing to start: the database of {variable} cannot be opened: "
    )
    assert "\n" not in message and "secret-pw" not in message


def test_a_mysql_url_without_a_driver_runs_on_the_compiled_one() -> None:
    from airuntime_common.db import make_engine
    from job_service.settings import JobServiceSettings

    settings = JobServiceSettings(
        RUNTIME_SERVICE_TOKEN="t", DATABASE_URL="mysql://u:p@127.0.0.1:3306/airuntime"
    )
    assert settings.DATABASE_URL == "mysql+asyncmy://u:p@127.0.0.1:3306/airuntime"
    assert make_engine("mariadb://u@127.0.0.1/x").dialect.driver == "asyncmy"
