"""Fixtures shared by every test area.

``mysql_url`` gives each test its own MariaDB/MySQL database (created and
dropped around the test) from ``TEST_MYSQL_URL``; tests using it are skipped
when that variable is unset (CI always sets it, see ``.ci/run``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from airuntime_common.spawning import disable_grpc_fork_handlers

# before gRPC is imported: tests start services and tools as child processes
disable_grpc_fork_handlers()

from airuntime_common.db import mysql_async_driver  # noqa: E402


def _admin_connect():  # type: ignore[no-untyped-def]
    import pymysql

    url = make_url(os.environ["TEST_MYSQL_URL"])
    return pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        autocommit=True,
    )


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """A fresh, empty MariaDB database URL (``mysql+aiomysql://…/airt_<hex>``, or on
    asyncmy when ``TEST_MYSQL_URL`` names that driver)."""
    if not os.environ.get("TEST_MYSQL_URL"):
        pytest.skip("TEST_MYSQL_URL not set")
    name = f"airt_{uuid.uuid4().hex[:12]}"
    conn = _admin_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        base = make_url(os.environ["TEST_MYSQL_URL"]).set(
            drivername=mysql_async_driver(os.environ["TEST_MYSQL_URL"]), database=name
        )
        yield base.render_as_string(hide_password=False)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file database URL under the test's tmp dir."""
    return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long-running profiles (``@pytest.mark.slow``) run only when the marker expression
    asks for them (``-m slow``); the suite's own run keeps their short profiles."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="long profile: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
