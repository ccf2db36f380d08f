"""Replicas migrating one database at once take turns (``airuntime_common.db.migration_lock``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from airuntime_common.db import migration_lock
from tests.conftest import _admin_connect

pytestmark = pytest.mark.mysql


def _sync_url(url: str) -> str:
    return make_url(url).set(drivername="mysql+pymysql").render_as_string(hide_password=False)


@pytest.mark.parametrize("service", ["job_service", "credential_service"])
def test_three_replicas_migrating_an_empty_database_at_once_all_succeed(
    mysql_url: str, service: str
) -> None:
    # separate processes, as replicas are (Alembic's context is one per process)
    env = {
        **os.environ,
        "DATABASE_URL": mysql_url,
        "CREDENTIAL_DATABASE_URL": mysql_url,
        "LOG_LEVEL": "WARNING",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", service, "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    engine = create_engine(_sync_url(mysql_url))
    try:
        with engine.connect() as conn:
            version_table, table = {
                "job_service": ("alembic_version", "ai_runtime_jobs"),
                "credential_service": ("credential_alembic_version", "ai_model_credentials"),
            }[service]
            versions = conn.execute(text(f"SELECT version_num FROM {version_table}")).all()
            tables = conn.execute(text(f"SHOW TABLES LIKE '{table}'")).all()
    finally:
        engine.dispose()
    assert len(versions) == 1 and len(tables) == 1


def test_a_held_lock_times_out_with_a_clear_error_then_frees(mysql_url: str) -> None:
    holder = _admin_connect()  # another session on the same server
    engine = create_engine(_sync_url(mysql_url))
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT GET_LOCK('airt-test-migrate', 10)")
        with engine.connect() as conn:
            with (
                pytest.raises(TimeoutError, match="airt-test-migrate"),
                migration_lock(conn, "airt-test-migrate", timeout_s=1),
            ):
                pass
            with holder.cursor() as cur:
                cur.execute("SELECT RELEASE_LOCK('airt-test-migrate')")
            with migration_lock(conn, "airt-test-migrate", timeout_s=1):
                owner = conn.execute(text("SELECT IS_USED_LOCK('airt-test-migrate')")).scalar()
                me = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
                assert owner == me
            assert conn.execute(text("SELECT IS_FREE_LOCK('airt-test-migrate')")).scalar() == 1
    finally:
        holder.close()
        engine.dispose()
