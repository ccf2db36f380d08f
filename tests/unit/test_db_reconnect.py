"""How the shared database helpers survive a lost connection (reference §9.6): a Galera
node outside the Primary component counts as one, a transaction whose connection
died before COMMIT is run again, at once and then with backoff."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from airuntime_common import db
from airuntime_common.db import DisconnectedBeforeCommit, before_commit, retry_transient


def _error(code: int, message: str) -> OperationalError:
    return OperationalError("SELECT 1", None, pymysql.err.OperationalError(code, message))


def test_a_node_outside_the_primary_component_counts_as_a_lost_connection() -> None:
    context = SimpleNamespace(
        original_exception=pymysql.err.OperationalError(
            1047, "WSREP has not yet prepared node for application use"
        ),
        is_disconnect=False,
    )
    db._wsrep_not_ready_is_a_disconnect(context)
    assert context.is_disconnect is True
    deadlock = SimpleNamespace(
        original_exception=pymysql.err.OperationalError(1213, "Deadlock found"),
        is_disconnect=False,
    )
    db._wsrep_not_ready_is_a_disconnect(deadlock)
    assert deadlock.is_disconnect is False  # retried as a deadlock, on the same connection


async def test_before_commit_marks_only_invalidated_connections() -> None:
    lost = _error(2013, "Lost connection to MySQL server during query")
    lost.connection_invalidated = True

    async def dies(_: Any) -> None:
        raise lost

    with pytest.raises(DisconnectedBeforeCommit) as err:
        await before_commit(dies, None)
    assert err.value.error is lost

    async def deadlocks(_: Any) -> None:
        raise _error(1213, "Deadlock found")

    with pytest.raises(OperationalError):
        await before_commit(deadlocks, None)


async def test_a_lost_connection_is_retried_at_once_then_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    calls = 0
    lost = _error(2013, "Lost connection")
    lost.connection_invalidated = True

    async def fails_four_times() -> str:
        nonlocal calls
        calls += 1
        if calls <= 4:
            raise DisconnectedBeforeCommit(lost)
        return "done"

    assert await retry_transient(fails_four_times) == "done"
    assert calls == 5
    # the first retry at once (a stale pooled connection), then growing waits
    assert len(slept) == 3 and slept[0] < slept[-1]

    calls = 0

    async def always_lost() -> str:
        nonlocal calls
        calls += 1
        raise DisconnectedBeforeCommit(lost)

    with pytest.raises(OperationalError):
        await retry_transient(always_lost, attempts=3)
    assert calls == 3
