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


@pytest.mark.parametrize("outer_transaction", [False, True])
def test_the_next_holder_sees_what_ran_under_the_lock(
    mysql_url: str, outer_transaction: bool
) -> None:
    # the lock is worth something only if the work done under it is committed before
    # another session can take it: a replica that got the lock while the first one's
    # version row was still uncommitted re-ran a migration (the version row's UPDATE then
    # matched 0 rows). A caller inside a transaction of its own is the case that broke.
    engine = create_engine(_sync_url(mysql_url))
    other = _admin_connect()
    db = make_url(mysql_url).database
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE TABLE airt_lock_probe (n INT)"))
            conn.commit()
            if outer_transaction:
                conn.begin()
            with migration_lock(conn, "airt-test-handover", timeout_s=1):
                conn.execute(text("INSERT INTO airt_lock_probe VALUES (1)"))
            with other.cursor() as cur:
                cur.execute("SELECT GET_LOCK('airt-test-handover', 1)")
                assert cur.fetchone()[0] == 1
                cur.execute(f"SELECT COUNT(*) FROM `{db}`.airt_lock_probe")
                seen = cur.fetchone()[0]
                cur.execute("SELECT RELEASE_LOCK('airt-test-handover')")
            assert seen == 1
            assert not conn.in_transaction() or not outer_transaction
    finally:
        other.close()
        with engine.connect() as conn:
            conn.execute(text("DROP TABLE IF EXISTS airt_lock_probe"))
            conn.commit()
        engine.dispose()
