"""A cluster-wide named lock on MariaDB Galera (reference §9.6): a leased row of
:data:`GALERA_LOCK_TABLE`, since ``GET_LOCK`` is local to one node and not replicated.

:func:`airuntime_common.db.migration_lock` takes it around a migration on a Galera
node; the rules (insert by autocommit, certification picks one holder, a renewed
lease, a dead holder's lease taken over) are in its docstring and :class:`GaleraLock`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pymysql

log = logging.getLogger(__name__)

#: ER_UNKNOWN_COM_ERROR, as a Galera node answers every statement while it is not
#: part of the Primary component or not yet synced: "WSREP has not yet prepared node
#: for application use". Nothing ran; another node (the proxy's next writer) can.
WSREP_NOT_READY = 1047

#: Galera: the table holding one row per cluster-wide migration lock held
#: (made by :func:`airuntime_common.db.migration_lock` on first use; no migration owns it).
GALERA_LOCK_TABLE = "airt_migration_locks"
#: Galera: a held migration lock's lease (s). Its holder renews it every third of
#: that, so the lock of a holder that died is free again within this long.
GALERA_LOCK_LEASE_SECONDS = 30.0


_PYMYSQL_PARAMS = frozenset(inspect.signature(pymysql.connections.Connection).parameters)


def pymysql_connector(connection: Any) -> Callable[[], pymysql.Connection]:
    """A function opening a new autocommit pymysql connection to the server and
    database of a sync SQLAlchemy ``Connection`` (its URL's host, port, user,
    password, socket and TLS options, as its own dialect reads them)."""
    _, params = connection.dialect.create_connect_args(connection.engine.url)
    renamed = {"db": "database", "passwd": "password"}
    kwargs = {renamed.get(k, k): v for k, v in params.items()}
    kwargs = {k: v for k, v in kwargs.items() if k in _PYMYSQL_PARAMS}
    kwargs.update(autocommit=True, connect_timeout=10, read_timeout=30, write_timeout=30)

    def connect() -> pymysql.Connection:
        return pymysql.connect(**kwargs)

    return connect


class GaleraLock:
    """A cluster-wide named lock on MariaDB Galera: a leased row (see :func:`airuntime_common.db.migration_lock`).

    Args:
        connect: opens a new autocommit pymysql connection to the database.
        name: the lock's name (the row's key, at most 64 characters).
        lease_s: seconds the lock stays held without a renewal.
        holder: this holder's id (default: host, pid and a random part).
    """

    def __init__(
        self,
        connect: Callable[[], pymysql.Connection],
        name: str,
        *,
        lease_s: float = GALERA_LOCK_LEASE_SECONDS,
        holder: str | None = None,
    ) -> None:
        self._connect = connect
        self.name = name
        self.lease_s = lease_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: True once a renewal found the row gone or another holder's (lease lost).
        self.lost = False
        self._conn: pymysql.Connection | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _execute(self, sql: str, args: Any = None) -> int:
        if self._conn is None:
            self._conn = self._connect()
        try:
            with self._conn.cursor() as cur:
                return int(cur.execute(sql, args))
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (2006, 2013, 1927, WSREP_NOT_READY):
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None  # the next call reconnects
            raise

    def acquire(self, timeout_s: float) -> None:
        """Wait until the lock is this holder's; then renew it in a background thread.

        Raises:
            TimeoutError: another holder kept it for ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        self._execute(
            f"CREATE TABLE IF NOT EXISTS `{GALERA_LOCK_TABLE}` ("
            " name VARCHAR(64) NOT NULL PRIMARY KEY,"
            " holder VARCHAR(191) NOT NULL,"
            " acquired_at DATETIME(6) NOT NULL,"
            " expires_at DATETIME(6) NOT NULL"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        waited = False
        while True:
            try:
                self._execute(
                    f"INSERT INTO `{GALERA_LOCK_TABLE}` (name, holder, acquired_at, expires_at)"
                    " VALUES (%s, %s, NOW(6), NOW(6) + INTERVAL %s MICROSECOND)",
                    (self.name, self.holder, int(self.lease_s * 1e6)),
                )
                break
            except pymysql.MySQLError as exc:
                # 1062: held; 1213: a concurrent insert on another node won certification;
                # a lost connection or a node leaving the cluster: try again
                code = exc.args[0] if exc.args else None
                if code not in (1062, 1213, 1205, 2006, 2013, 1927, WSREP_NOT_READY):
                    raise
            with contextlib.suppress(pymysql.MySQLError):  # a holder that died: its lease ran out
                if self._execute(
                    f"DELETE FROM `{GALERA_LOCK_TABLE}` WHERE name = %s AND expires_at < NOW(6)",
                    (self.name,),
                ):
                    log.warning(
                        "took over an expired migration lock", extra={"fields": {"lock": self.name}}
                    )
                    continue
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"another process held the migration lock {self.name!r} for {timeout_s} s"
                )
            if not waited:
                log.info("waiting for the migration lock", extra={"fields": {"lock": self.name}})
                waited = True
            time.sleep(0.2 + 0.3 * random.random())
        self._renewer = threading.Thread(target=self._renew, name=f"lock-{self.name}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                kept = self._execute(
                    f"UPDATE `{GALERA_LOCK_TABLE}` SET expires_at = NOW(6) + INTERVAL %s"
                    " MICROSECOND WHERE name = %s AND holder = %s",
                    (int(self.lease_s * 1e6), self.name, self.holder),
                )
            except pymysql.MySQLError:
                continue  # a failover or a conflict: the next renewal tries again
            if not kept and not self.lost:
                self.lost = True
                log.error(
                    "migration lock lost: its lease ran out before a renewal",
                    extra={"fields": {"lock": self.name}},
                )

    def release(self) -> None:
        """Stop renewing and delete the row (if it is still this holder's); close."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        for _ in range(5):
            try:
                self._execute(
                    f"DELETE FROM `{GALERA_LOCK_TABLE}` WHERE name = %s AND holder = %s",
                    (self.name, self.holder),
                )
                break
            except pymysql.MySQLError:  # left as it is, its lease frees it
                time.sleep(0.2)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


#: The async MySQL/MariaDB drivers (aiomysql first: reference §1's, the default).
