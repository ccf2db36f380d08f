"""A canary key goes through every operation and must never show up in a log line,
an error, a masked view or the database files (reference §6)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import grpc
import pytest

from airuntime_common.logs import JsonFormatter, RedactionFilter
from credential_service.rotate import rotate_all
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

from .conftest import INSTANCE, Lease, StartFn, make_key
from .test_servicer import put, resolve

#: Deliberately not shaped like ``sk-…`` so the redaction filter cannot hide a leak:
#: this test proves the key is never logged at all, not merely scrubbed.
CANARY = "CANARYkey7Qw9Zp2Lm4Xc6Vb8Nn1Rt3Yu5Io0"


def db_files(db_path: Path) -> bytes:
    data = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{db_path}{suffix}")
        if p.exists():
            data += p.read_bytes()
    return data


async def test_canary_never_in_logs_errors_or_database(
    start_env: StartFn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    k1, k2 = make_key("k1"), make_key("k2")
    first = await start_env(keys=k1, db_name="canary.db")
    cred = await put(first, "canary-user", CANARY)
    assert CANARY not in str(cred)
    await first.handle.stop()

    env = await start_env(keys=f"{k2},{k1}", db_name="canary.db")
    md = env.md()
    got = await env.stub.GetCredential(rr.GetCredentialRequest(user_id="canary-user"), metadata=md)
    assert CANARY not in str(got)
    await env.stub.CheckCredential(
        rr.CheckCredentialRequest(
            user_id="canary-user", api_key_mode=common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY
        ),
        metadata=md,
    )
    env.fake.hold("job-c", INSTANCE, 1, Lease(user_id="canary-user"))
    resolved = await resolve(env, "job-c", 1)
    assert resolved.api_key == CANARY  # the lease holder, and only it, gets the key
    assert CANARY not in repr(env.handle.store)
    for instance in ("intruder", None):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await resolve(env, "job-c", 1, instance)
        assert CANARY not in str(exc.value)
    # a bad put carrying the canary: refused without echoing it
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await env.stub.PutCredential(
            rr.PutCredentialRequest(user_id="canary-user", provider="nope", api_key=CANARY),
            metadata=md,
        )
    assert CANARY not in str(exc.value)
    await rotate_all(env.handle.store, batch_size=1)
    await env.stub.MarkCredentialInvalid(
        rr.MarkCredentialInvalidRequest(credential_id=cred.credential_id, reason="HTTP 401"),
        metadata=md,
    )
    await env.handle.stop()

    # every captured record, fully formatted, as the service's JSON handler would write it
    assert caplog.records, "expected the service to log"
    formatter = JsonFormatter("credential_service")
    for record in caplog.records:
        assert CANARY not in record.getMessage()
        assert CANARY not in str(record.__dict__)
        RedactionFilter().filter(record)
        assert CANARY not in formatter.format(record)
    assert CANARY not in caplog.text

    # the database never holds the plaintext: raw files and a full SQL dump
    raw = db_files(env.db_path)
    assert raw
    assert CANARY.encode() not in raw
    assert CANARY.encode("utf-16-le") not in raw
    db = sqlite3.connect(env.db_path)
    try:
        dump = "\n".join(db.iterdump())
        rows = db.execute("select * from ai_model_credentials").fetchall()
    finally:
        db.close()
    assert CANARY not in dump
    assert CANARY.encode().hex() not in dump.lower()
    assert len(rows) == 1 and all(CANARY not in str(col) for col in rows[0])
