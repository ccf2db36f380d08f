"""A private MariaDB server for the harness (the machine's shared server is never touched).

:class:`PrivateMariaDB` initialises a throw-away data directory with
``mariadb-install-db``, runs ``mariadbd`` on a free port with its own socket,
and can SIGKILL and restart that one process (fault ``mariadb_restart``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pymysql

from launcher.plan import free_port

MARIADBD_CANDIDATES = ("/usr/sbin/mariadbd", "/usr/sbin/mysqld")
INSTALL_DB_CANDIDATES = ("mariadb-install-db", "mysql_install_db")


class MariaDBUnavailable(RuntimeError):
    """No MariaDB server binaries on this machine (the scenario is skipped)."""


def _find_binary(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def available() -> bool:
    """True when ``mariadbd`` and ``mariadb-install-db`` are installed."""
    return (
        _find_binary(MARIADBD_CANDIDATES) is not None
        and _find_binary(INSTALL_DB_CANDIDATES) is not None
    )


class PrivateMariaDB:
    """One ``mariadbd`` process on a private data directory and a free port.

    Args:
        base_dir: where the data directory, socket and log go (created).
        port: TCP port on 127.0.0.1 (0: a free one).

    Raises:
        MariaDBUnavailable: the server binaries are missing.
    """

    def __init__(self, base_dir: str | os.PathLike[str], port: int = 0) -> None:
        mariadbd = _find_binary(MARIADBD_CANDIDATES)
        install = _find_binary(INSTALL_DB_CANDIDATES)
        if mariadbd is None or install is None:
            raise MariaDBUnavailable("mariadbd / mariadb-install-db not installed")
        self._mariadbd = mariadbd
        self._install = install
        self.base = Path(base_dir).resolve()
        self.datadir = self.base / "data"
        self.socket = self.base / "mariadb.sock"
        self.log = self.base / "mariadbd.log"
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def url(self, database: str, driver: str = "mysql+aiomysql") -> str:
        """SQLAlchemy URL of ``database`` on this server (root, no password)."""
        return f"{driver}://root@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str | None = None, timeout: float = 5.0) -> pymysql.Connection:
        """A new autocommit pymysql connection (raises pymysql errors while down)."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password="",
            database=database,
            autocommit=True,
            connect_timeout=int(max(1, timeout)),
        )

    def start(self, timeout: float = 60.0) -> None:
        """Initialise the data directory (first time) and start the server; wait until it answers.

        Raises:
            RuntimeError: it did not answer within ``timeout`` seconds.
        """
        self.base.mkdir(parents=True, exist_ok=True)
        if not (self.datadir / "mysql").exists():
            subprocess.run(
                [
                    self._install,
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        argv = [
            self._mariadbd,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            f"--socket={self.socket}",
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=500",
            f"--pid-file={self.base / 'mariadbd.pid'}",
            f"--log-error={self.log}",
        ]
        if os.geteuid() == 0:
            argv.append("--user=root")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the server accepts a query; returns the seconds waited.

        Raises:
            RuntimeError: the process died or did not answer in time.
        """
        began = time.monotonic()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                raise RuntimeError(f"mariadbd exited with {self.proc.returncode}:\n{tail}")
            try:
                conn = self.connect(timeout=1.0)
            except pymysql.MySQLError:
                if time.monotonic() - began > timeout:
                    raise RuntimeError(f"mariadbd not ready after {timeout:.0f} s") from None
                time.sleep(0.1)
                continue
            conn.close()
            return time.monotonic() - began

    def kill(self) -> None:
        """SIGKILL the server (a crash: InnoDB recovers at the next start)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Kill, stay down ``down_seconds``, start again on the same port and data."""
        self.kill()
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.restarts += 1
        self.start(timeout)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s) and delete its files."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (utf8mb4)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
