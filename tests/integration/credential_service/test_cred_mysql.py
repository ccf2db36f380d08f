"""credential_service on MariaDB/MySQL (``TEST_MYSQL_URL``; skipped when unset).

Same service, same gRPC surface as the SQLite unit tests, but with concurrency that
SQLite serialises away: racing puts for one user, two rotators at once, rotation under
load, and a ciphertext copied to another user's row.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from airuntime_common.errors import ErrorCode
from credential_service.rotate import rotate_all
from tests.conftest import _admin_connect
from tests.unit.credential_service import conftest as unit
from tests.unit.credential_service.conftest import INSTANCE, Env, Lease, StartFn, make_key
from tests.unit.credential_service.test_servicer import put, refused, resolve
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

pytestmark = pytest.mark.mysql

# The unit tests' fixtures: a fake JobService and an in-process credential_service.
start_env = unit.start_env
_clean_env = unit._clean_env


async def key_counts(env: Env) -> dict[str, int]:
    async with env.handle.engine.connect() as conn:
        rows = await conn.execute(
            text("select key_id, count(*) from ai_model_credentials group by key_id")
        )
        return {str(k): int(n) for k, n in rows.all()}


async def test_schema_and_round_trip_on_mysql(start_env: StartFn, mysql_url: str) -> None:
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url)
    cred = await put(env, "u1", "sk-mysql-round-trip-000000000000abcd")
    assert cred.masked_key == "sk-****abcd"
    env.fake.hold("job-1", INSTANCE, 1, Lease(user_id="u1", credential_id=cred.credential_id))
    assert (await resolve(env, "job-1", 1)).api_key == "sk-mysql-round-trip-000000000000abcd"
    async with env.handle.engine.connect() as conn:
        cols = await conn.execute(
            text(
                "select column_name, data_type, datetime_precision from information_schema.columns "
                "where table_schema = database() and table_name = 'ai_model_credentials'"
            )
        )
        info = {r[0]: (r[1], r[2]) for r in cols.all()}
    assert info["created_at"] == ("datetime", 6)
    assert info["ciphertext"][0] == "text"
    await env.stub.MarkCredentialInvalid(
        rr.MarkCredentialInvalidRequest(credential_id=cred.credential_id, reason="401"),
        metadata=env.md(),
    )
    err = await refused(resolve(env, "job-1", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    await env.stub.DeleteCredential(rr.DeleteCredentialRequest(user_id="u1"), metadata=env.md())
    err = await refused(
        env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    )
    assert err.code == ErrorCode.NOT_FOUND


async def test_racing_puts_for_one_user_leave_one_row(start_env: StartFn, mysql_url: str) -> None:
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url)
    keys = [f"sk-race-{i:02d}-00000000000000000000" for i in range(20)]
    creds = await asyncio.gather(*(put(env, "racer", k) for k in keys))
    assert len({c.credential_id for c in creds}) == 20
    async with env.handle.engine.connect() as conn:
        (n,) = (await conn.execute(text("select count(*) from ai_model_credentials"))).one()
    assert n == 1
    current = await env.stub.GetCredential(
        rr.GetCredentialRequest(user_id="racer"), metadata=env.md()
    )
    env.fake.hold("job-r", INSTANCE, 1, Lease(user_id="racer"))
    got = await resolve(env, "job-r", 1)
    assert got.credential_id == current.credential.credential_id
    assert got.api_key == keys[[c.credential_id for c in creds].index(got.credential_id)]


async def test_rotation_under_load_and_two_rotators(start_env: StartFn, mysql_url: str) -> None:
    k1, k2 = make_key("k1"), make_key("k2")
    before = await start_env(keys=k1, CREDENTIAL_DATABASE_URL=mysql_url)
    n = 30
    for i in range(n):
        await put(before, f"user{i:02d}", f"sk-rot-{i:02d}-000000000000000000000")
    await before.handle.stop()

    env = await start_env(keys=f"{k2},{k1}", CREDENTIAL_DATABASE_URL=mysql_url)
    for i in range(n):
        env.fake.hold(f"job{i:02d}", INSTANCE, 1, Lease(user_id=f"user{i:02d}"))

    async def resolver(offset: int) -> None:
        for j in range(20):
            i = (offset * 7 + j) % n
            got = await resolve(env, f"job{i:02d}", 1)
            assert got.api_key == f"sk-rot-{i:02d}-000000000000000000000"

    rotations = asyncio.gather(
        rotate_all(env.handle.store, batch_size=4), rotate_all(env.handle.store, batch_size=4)
    )
    load = asyncio.gather(*(resolver(o) for o in range(5)))
    ((t1, last1), (t2, last2)), _ = await asyncio.gather(rotations, load)
    assert t1 + t2 == n  # guarded updates: no row counted twice
    assert last1.remaining == 0 and last2.remaining == 0
    assert await key_counts(env) == {"k2": n}
    await env.handle.stop()

    after = await start_env(keys=k2, CREDENTIAL_DATABASE_URL=mysql_url)
    for i in range(n):
        after.fake.hold(f"job{i:02d}", INSTANCE, 1, Lease(user_id=f"user{i:02d}"))
        assert (await resolve(after, f"job{i:02d}", 1)).api_key == (
            f"sk-rot-{i:02d}-000000000000000000000"
        )


async def test_copied_ciphertext_is_refused_on_mysql(start_env: StartFn, mysql_url: str) -> None:
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url)
    await put(env, "alice", "sk-alice-000000000000000000000aaaa")
    bob = await put(env, "bob", "sk-bob-00000000000000000000000bbbb")
    async with env.handle.engine.begin() as conn:
        await conn.execute(
            text(
                "update ai_model_credentials b join ai_model_credentials a "
                "on a.user_id = 'alice' and b.user_id = 'bob' "
                "set b.nonce = a.nonce, b.ciphertext = a.ciphertext, b.key_id = a.key_id"
            )
        )
    env.fake.hold("job-b", INSTANCE, 1, Lease(user_id="bob", credential_id=bob.credential_id))
    err = await refused(resolve(env, "job-b", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL


def _kill_connections_of(database: str) -> int:
    """``KILL CONNECTION`` every session on ``database`` (as a failover or a DBA would)."""
    admin = _admin_connect()
    try:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST"
                " WHERE DB = %s AND ID <> CONNECTION_ID()",
                (database,),
            )
            ids = [int(r[0]) for r in cur.fetchall()]
            for conn_id in ids:
                cur.execute(f"KILL CONNECTION {conn_id}")
        return len(ids)
    finally:
        admin.close()


async def test_a_connection_cut_mid_transaction_is_retried_on_a_new_one(
    start_env: StartFn, mysql_url: str
) -> None:
    """reference §9.6: a write (and a read) whose connection dies before COMMIT — a Galera
    writer lost, HAProxy cutting sessions, ``KILL`` — runs again on a fresh connection;
    the caller sees one answer and one stored key."""
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url)
    database = str(make_url(mysql_url).database)
    await put(env, "u1", "sk-before-the-cut-0000000000000aaaa")
    cuts: list[int] = []

    def cut_once(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        # the first statement of the next transaction finds its connection gone
        if not cuts:
            cuts.append(_kill_connections_of(database))

    event.listen(env.handle.engine.sync_engine, "before_cursor_execute", cut_once)
    try:
        replaced = await put(env, "u1", "sk-after-the-cut-00000000000000bbbb")
    finally:
        event.remove(env.handle.engine.sync_engine, "before_cursor_execute", cut_once)
    assert cuts and cuts[0] >= 1
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
    assert got.credential.credential_id == replaced.credential_id
    assert got.credential.masked_key == "sk-****bbbb"
    async with env.handle.engine.connect() as conn:
        rows = await conn.execute(
            text("select count(*) from ai_model_credentials where user_id = 'u1'")
        )
        assert rows.scalar() == 1

    cuts.clear()
    event.listen(env.handle.engine.sync_engine, "before_cursor_execute", cut_once)
    try:
        env.fake.hold("job-1", INSTANCE, 1, Lease(user_id="u1"))
        assert (await resolve(env, "job-1", 1)).api_key == "sk-after-the-cut-00000000000000bbbb"
    finally:
        event.remove(env.handle.engine.sync_engine, "before_cursor_execute", cut_once)
    assert cuts and cuts[0] >= 1


async def test_a_database_that_stays_down_is_unavailable_not_internal(
    start_env: StartFn, mysql_url: str
) -> None:
    """Every attempt's connection cut: the call ends ``UNAVAILABLE`` (503 with
    ``Retry-After`` at the gateway, retried by workers), never ``INTERNAL``."""
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url)
    database = str(make_url(mysql_url).database)
    await put(env, "u1", "sk-down-000000000000000000000000aaaa")

    def cut(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        _kill_connections_of(database)

    event.listen(env.handle.engine.sync_engine, "before_cursor_execute", cut)
    try:
        err = await refused(
            env.stub.GetCredential(rr.GetCredentialRequest(user_id="u1"), metadata=env.md())
        )
    finally:
        event.remove(env.handle.engine.sync_engine, "before_cursor_execute", cut)
    assert err.code == ErrorCode.UNAVAILABLE
