"""Settings base: one pydantic-settings class per service derives from this (reference §7).

Values come from the environment (names exactly as reference §7 spells them).
A service that needs a secret and has none refuses to start and names the
variable: :func:`require`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from airuntime_common.aio import DEFAULT_EVENT_LOOP, EventLoopName

VAR_DIR = Path("var")
DEFAULT_JOB_DB = f"sqlite+aiosqlite:///{VAR_DIR}/job_service.db"
DEFAULT_CREDENTIAL_DB = f"sqlite+aiosqlite:///{VAR_DIR}/credential_service.db"
#: Upper bound of the duration settings (seconds): a day. A longer lease, backoff or
#: interval is a typo, and past the datetime range (``1e308``) it would fail every
#: create or lock instead of the start.
DAY = 86_400
#: Upper bound of the count and quota settings (fits every integer column and bind).
COUNT_MAX = 1_000_000_000


S = TypeVar("S", bound=BaseSettings)

#: The database drivers the services run on (reference §7: SQLite embedded, MySQL/MariaDB).
#: For MySQL/MariaDB both aiomysql (pure Python, reference §1) and asyncmy (compiled:
#: less CPU per result set) are supported; a ``mysql://`` or ``mariadb://`` URL that
#: names no driver runs on asyncmy (:data:`DEFAULT_MYSQL_DRIVER`).
DATABASE_DRIVERS = (
    "sqlite+aiosqlite",
    "mysql+aiomysql",
    "mariadb+aiomysql",
    "mysql+asyncmy",
    "mariadb+asyncmy",
)


#: The driver of a MySQL/MariaDB URL that names none: the compiled one (about 15 % less
#: CPU per job in the job service on ``make bench``; :mod:`airuntime_common.db` too).
DEFAULT_MYSQL_DRIVER = "asyncmy"


def _database_url(value: str) -> str:
    """A SQLAlchemy async URL on one of :data:`DATABASE_DRIVERS` (``mysql://`` and
    ``mariadb://`` get :data:`DEFAULT_MYSQL_DRIVER`), else ValueError."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError:
        raise ValueError(
            "must be a database URL like sqlite+aiosqlite:///var/job_service.db "
            "or mysql://user:password@host:3306/name"
        ) from None
    if url.drivername in ("mysql", "mariadb"):
        url = url.set(drivername=f"{url.drivername}+{DEFAULT_MYSQL_DRIVER}")
        value = url.render_as_string(hide_password=False)
    if url.drivername not in DATABASE_DRIVERS:
        raise ValueError(f"the driver must be one of {', '.join(DATABASE_DRIVERS)}")
    if not url.database:
        raise ValueError("names no database")
    return value


def _listen_address(value: str) -> str:
    """``host:port`` (``[::]:50051``, ``127.0.0.1:0``) with a port in 0..65535, else ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be host:port with a port in 0..65535, e.g. [::]:50051")
    return value


def _http_base_url(value: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (and a port in range, if any),
    else ValueError."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        _ = parts.port  # a port out of range or not a number raises
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL with a host, e.g. https://api.deepseek.com")
    return value


#: A gRPC server's listen address (``*_LISTEN``), checked at start: gRPC itself would
#: take ``:99999`` modulo 65536 and serve on another port.
ListenAddress = Annotated[str, AfterValidator(_listen_address)]

#: A ``DATABASE_URL``-like setting, checked at start (never echoed: it may hold a password).
DatabaseUrl = Annotated[str, AfterValidator(_database_url)]

#: A model endpoint's base URL (``DEEPSEEK_BASE_URL``), checked at start: a malformed
#: one would only show when a worker's model call raised on it (code INTERNAL).
HttpBaseUrl = Annotated[str, AfterValidator(_http_base_url)]


class MissingSetting(SystemExit):
    """Raised at start when a required variable is unset; exits with a clear message."""


class InvalidSetting(SystemExit):
    """Raised at start when a variable's value is refused; exits with one line per
    variable (its name and the rule it broke, never its value: it may be a secret)."""


def load(cls: type[S], prog: str) -> S:
    """Read ``cls`` from the environment.

    Args:
        cls: a settings class (e.g. ``JobServiceSettings``).
        prog: the process name the message starts with (e.g. ``"job_service"``).

    Raises:
        InvalidSetting: some variable failed validation, e.g. ``EVENT_LOOP=tokio``
            exits with ``job_service: refusing to start: EVENT_LOOP: Input should be
            'uvloop' or 'asyncio' (reference §7)`` instead of a traceback.
    """
    try:
        return cls()
    except ValidationError as exc:
        lines = [
            f"{prog}: refusing to start: {'.'.join(str(p) for p in err['loc'])}: {err['msg']} (reference §7)"
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise InvalidSetting("\n".join(lines)) from None
    except SettingsError as exc:  # e.g. a JSON-valued variable that is not JSON
        raise InvalidSetting(f"{prog}: refusing to start: {exc} (reference §7)") from None


class CommonSettings(BaseSettings):
    """Variables every service reads."""

    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=True)

    #: The internal token every internal call carries (``x-internal-api-key``);
    #: required by every service (the dev launcher generates one).
    RUNTIME_SERVICE_TOKEN: str = ""
    #: Log level of the process's JSON log lines (``DEBUG``, ``INFO``, ``WARNING``…).
    LOG_LEVEL: str = "INFO"
    #: The process's event loop (:mod:`airuntime_common.aio`): ``uvloop`` or ``asyncio``.
    EVENT_LOOP: EventLoopName = DEFAULT_EVENT_LOOP
    #: job_service's gRPC target: one address, a DNS name with several A records, or a
    #: list such as ``ipv4:10.0.0.5:50051,10.0.0.6:50051``; calls go round robin.
    JOB_SERVICE_ADDR: str = "localhost:50051"
    #: credential_service's gRPC target.
    CREDENTIAL_SERVICE_ADDR: str = "localhost:50052"
    #: A runtime worker's status address; the dev launcher places its first worker's
    #: status listener on its port.
    RUNTIME_WORKER_ADDR: str = "localhost:50053"
    #: PEM certificate (chain) of this process's gRPC listener; with the key set too the
    #: listener speaks only TLS.
    GRPC_TLS_CERT_FILE: str | None = None
    #: PEM private key of this process's gRPC listener.
    GRPC_TLS_KEY_FILE: str | None = None
    #: PEM CA that signed the listeners' certificates; set, every gRPC client of the
    #: process dials TLS and verifies the server.
    GRPC_TLS_CA_FILE: str | None = None


def require(settings: BaseSettings, *names: str) -> None:
    """Exit with ``"<NAME> is required"`` if any named setting is empty.

    Raises:
        MissingSetting: naming every missing variable.
    """
    missing = [n for n in names if not getattr(settings, n, None)]
    if missing:
        raise MissingSetting(
            f"refusing to start: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (reference §7)"
        )
