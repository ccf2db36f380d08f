"""The cluster-wide migration lock Galera gets instead of ``GET_LOCK`` (reference §9.6).

:class:`airuntime_common.galera_lock.GaleraLock` is plain SQL on a leased row, so its rules
are checked here on the shared MariaDB: one holder at a time, a waiter that gives
up with the lock's name, a holder's renewals, a dead holder's lease taken over,
and a lease found lost. (Two nodes inserting the row at once is the harness's
``galera_multi_writer``, where both replicas migrate together.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pymysql
import pytest
from sqlalchemy.engine import make_url

from airuntime_common.galera_lock import GALERA_LOCK_TABLE, GaleraLock

pytestmark = pytest.mark.mysql

Connect = Callable[[], pymysql.Connection]


@pytest.fixture
def connect(mysql_url: str) -> Connect:
    url = make_url(mysql_url)

    def open_() -> pymysql.Connection:
        return pymysql.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 3306,
            user=url.username or "root",
            password=url.password or "",
            database=url.database,
            autocommit=True,
        )

    return open_


def _rows(connect: Connect) -> list[tuple[str, str]]:
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT name, holder FROM `{GALERA_LOCK_TABLE}`")
            return [(str(a), str(b)) for a, b in cur.fetchall()]
    finally:
        conn.close()


def test_one_holder_at_a_time_and_a_waiter_times_out_naming_the_lock(connect: Connect) -> None:
    first = GaleraLock(connect, "airt-migrate", lease_s=30, holder="a")
    first.acquire(5)
    assert _rows(connect) == [("airt-migrate", "a")]
    second = GaleraLock(connect, "airt-migrate", lease_s=30, holder="b")
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="airt-migrate"):
        second.acquire(1)
    assert 1 <= time.monotonic() - began < 5
    other = GaleraLock(connect, "another-lock", lease_s=30, holder="c")
    other.acquire(1)  # another name is another lock
    other.release()
    first.release()
    assert _rows(connect) == []
    second.acquire(1)
    assert _rows(connect) == [("airt-migrate", "b")]
    second.release()


def test_a_holder_renews_its_lease_and_a_dead_holders_lease_is_taken_over(
    connect: Connect,
) -> None:
    live = GaleraLock(connect, "airt-migrate", lease_s=0.9, holder="live")
    live.acquire(5)
    time.sleep(2.0)  # more than two leases: renewed every 0.3 s
    waiter = GaleraLock(connect, "airt-migrate", lease_s=0.9, holder="waiter")
    with pytest.raises(TimeoutError):
        waiter.acquire(0.5)
    assert not live.lost
    live.release()

    dead = GaleraLock(connect, "airt-migrate", lease_s=0.9, holder="dead")
    dead.acquire(5)
    dead._stop.set()  # the holder's process died: no more renewals
    assert dead._renewer is not None
    dead._renewer.join()
    began = time.monotonic()
    waiter.acquire(10)
    assert 0.3 < time.monotonic() - began < 5
    assert _rows(connect) == [("airt-migrate", "waiter")]
    waiter.release()


def test_a_lease_found_gone_is_reported_lost(connect: Connect) -> None:
    lock = GaleraLock(connect, "airt-migrate", lease_s=0.6, holder="me")
    lock.acquire(5)
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM `{GALERA_LOCK_TABLE}`")
    finally:
        conn.close()
    deadline = time.monotonic() + 5
    while not lock.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.lost
    lock.release()  # nothing left to delete: no error
