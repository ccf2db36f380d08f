"""Master-key rotation: rows move to the new key id, the old one can then be removed,
and rotation while serving loses nothing (reference §6)."""

from __future__ import annotations

import asyncio
import random
import sqlite3

from airuntime_common.errors import ErrorCode
from credential_service.domain import CredentialStore, RotationResult
from credential_service.rotate import rotate_all
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

from .conftest import INSTANCE, Env, Lease, StartFn, flip, make_key
from .test_servicer import put, refused, resolve


def user_key(i: int, generation: int = 0) -> str:
    return f"sk-user{i:03d}-gen{generation}-{'0' * 20}{i:04d}"


def key_ids(env: Env) -> dict[str, int]:
    db = sqlite3.connect(env.db_path)
    try:
        rows = db.execute("select key_id, count(*) from ai_model_credentials group by key_id")
        return dict(rows.fetchall())
    finally:
        db.close()


async def seed(env: Env, n: int) -> dict[str, str]:
    """n users with keys; holds a lease for job-<user> so tests can resolve them."""
    ids = {}
    for i in range(n):
        cred = await put(env, f"user{i:03d}", user_key(i))
        ids[f"user{i:03d}"] = cred.credential_id
        env.fake.hold(f"job-user{i:03d}", INSTANCE, 1, Lease(user_id=f"user{i:03d}"))
    return ids


def hold_all(env: Env, n: int) -> None:
    for i in range(n):
        env.fake.hold(f"job-user{i:03d}", INSTANCE, 1, Lease(user_id=f"user{i:03d}"))


async def test_rotation_moves_rows_and_old_key_can_be_removed(start_env: StartFn) -> None:
    k1, k2 = make_key("k1"), make_key("k2")
    before = await start_env(keys=k1, db_name="rot.db")
    await seed(before, 25)
    assert key_ids(before) == {"k1": 25}
    await before.handle.stop()

    during = await start_env(keys=f"{k2},{k1}", db_name="rot.db")
    hold_all(during, 25)
    # new writes already use the current key
    await put(during, "user024", user_key(24, 1))
    seen = []
    while True:
        reply = await during.stub.RotateKeys(
            rr.RotateKeysRequest(batch_size=10), metadata=during.md()
        )
        seen.append((reply.rotated, reply.remaining))
        if reply.remaining == 0:
            break
    assert seen == [(10, 14), (10, 4), (4, 0)]
    assert key_ids(during) == {"k2": 25}
    again = await during.stub.RotateKeys(rr.RotateKeysRequest(), metadata=during.md())
    assert (again.rotated, again.remaining) == (0, 0)
    await during.handle.stop()

    after = await start_env(keys=k2, db_name="rot.db")
    hold_all(after, 25)
    for i in range(25):
        got = await resolve(after, f"job-user{i:03d}", 1)
        assert got.api_key == user_key(i, 1 if i == 24 else 0)


async def test_rotation_while_serving_loses_nothing(start_env: StartFn) -> None:
    k1, k2 = make_key("k1"), make_key("k2")
    before = await start_env(keys=k1, db_name="busy.db")
    await seed(before, 40)
    await before.handle.stop()

    env = await start_env(keys=f"{k2},{k1}", db_name="busy.db")
    hold_all(env, 40)
    expected = {i: user_key(i) for i in range(40)}
    accepted = {i: {user_key(i)} for i in range(40)}
    store: CredentialStore = env.handle.store
    failures: list[str] = []

    async def resolver(seed_: int) -> int:
        rnd = random.Random(seed_)
        done = 0
        for _ in range(30):
            i = rnd.randrange(40)
            got = await resolve(env, f"job-user{i:03d}", 1)
            # a replacement in flight may answer either its old or its new key
            if got.api_key not in accepted[i]:
                failures.append(f"user{i}")
            done += 1
        return done

    async def replacer() -> None:
        for i in range(0, 40, 7):
            accepted[i].add(user_key(i, 2))  # before the put: a resolve may see it at once
            await put(env, f"user{i:03d}", user_key(i, 2))
            expected[i] = user_key(i, 2)
            await asyncio.sleep(0)

    async def rotator() -> int:
        total, last = await rotate_all(store, batch_size=3)
        assert last.remaining == 0
        return total

    load = asyncio.gather(*(resolver(s) for s in range(6)))
    rotated, _, resolved = await asyncio.gather(rotator(), replacer(), load)
    assert failures == []
    assert sum(resolved) == 180
    assert rotated > 0
    # a second pass picks up anything a concurrent writer raced past
    _, last = await rotate_all(store, batch_size=3)
    assert last.remaining == 0
    assert key_ids(env) == {"k2": 40}
    await env.handle.stop()

    after = await start_env(keys=k2, db_name="busy.db")
    hold_all(after, 40)
    for i in range(40):
        assert (await resolve(after, f"job-user{i:03d}", 1)).api_key == expected[i]


async def test_undecryptable_and_unknown_kid_rows_do_not_block_rotation(
    start_env: StartFn,
) -> None:
    k1, k2, gone = make_key("k1"), make_key("k2"), make_key("gone")
    a = await start_env(keys=gone, db_name="mixed.db")
    await put(a, "orphan", user_key(1))
    await a.handle.stop()
    b = await start_env(keys=k1, db_name="mixed.db")
    await put(b, "good", user_key(2))
    await put(b, "tampered", user_key(3))
    await b.handle.stop()
    db = sqlite3.connect(b.db_path)
    with db:
        (ct,) = db.execute(
            "select ciphertext from ai_model_credentials where user_id='tampered'"
        ).fetchone()
        db.execute(
            "update ai_model_credentials set ciphertext=? where user_id='tampered'",
            (flip(ct),),
        )
    db.close()

    env = await start_env(keys=f"{k2},{k1}", db_name="mixed.db")
    batches: list[RotationResult] = []
    total, last = await rotate_all(env.handle.store, batch_size=1, progress=batches.append)
    assert total == 1
    assert sum(b.undecryptable for b in batches) == 1
    assert last.remaining == 1  # the orphan on a key id that is not configured
    assert last.unknown_key_ids == ("gone",)
    assert key_ids(env) == {"k2": 1, "k1": 1, "gone": 1}
    got = await env.stub.GetCredential(
        rr.GetCredentialRequest(user_id="tampered"), metadata=env.md()
    )
    assert got.credential.status == 2  # CREDENTIAL_STATUS_INVALID
    env.fake.hold("job-t", INSTANCE, 1, Lease(user_id="tampered"))
    err = await refused(resolve(env, "job-t", 1))
    assert err.code == ErrorCode.INVALID_CREDENTIAL
    env.fake.hold("job-g", INSTANCE, 1, Lease(user_id="good"))
    assert (await resolve(env, "job-g", 1)).api_key == user_key(2)


async def test_rotate_keys_rejects_negative_batch(env: Env) -> None:
    err = await refused(env.stub.RotateKeys(rr.RotateKeysRequest(batch_size=-1), metadata=env.md()))
    assert err.code == ErrorCode.INVALID_ARGUMENT
