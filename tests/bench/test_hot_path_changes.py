"""Unit tests of the scheduling-path changes made for the benchmarks.

* :class:`job_service.maintenance.scheduler.PendingProbe`: one shared query per
  interval for all long-poll waiters, fail-open.
* :func:`airuntime_common.db._reset_if_in_transaction`: the pool's check-in
  ROLLBACK only when the server says a transaction is open.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from airuntime_common.db import _reset_if_in_transaction
from job_service.maintenance.scheduler import JobSignal, PendingProbe


async def test_probe_is_shared_by_concurrent_waiters_and_cached() -> None:
    calls = 0

    async def check() -> bool:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return False

    probe = PendingProbe(check, every=0.2)
    answers = await asyncio.gather(*(probe.claimable() for _ in range(50)))
    assert answers == [False] * 50
    assert calls == 1
    assert await probe.claimable() is False and calls == 1  # still fresh
    await asyncio.sleep(0.25)
    await probe.claimable()
    assert calls == 2


async def test_probe_fails_open() -> None:
    async def broken() -> bool:
        raise RuntimeError("db down")

    assert await PendingProbe(broken, every=1.0).claimable() is True


async def test_signal_wait_tells_wakeup_from_timeout() -> None:
    signal = JobSignal()
    assert await signal.wait(0.01) is False
    waiter = asyncio.create_task(signal.wait(5))
    await asyncio.sleep(0)
    signal.notify()
    assert await asyncio.wait_for(waiter, 1) is True


@dataclass
class _State:
    terminate_only: bool = False
    transaction_was_reset: bool = False


class _Inner:
    def __init__(self, in_trans: bool) -> None:
        self.in_trans = in_trans

    def get_transaction_status(self) -> bool:
        return self.in_trans


class _Conn:
    def __init__(self, in_trans: bool | None) -> None:
        if in_trans is not None:
            self._connection = _Inner(in_trans)
        self.rollbacks = 0

    def rollback(self) -> None:
        self.rollbacks += 1


def test_pool_reset_rolls_back_only_open_transactions() -> None:
    idle, busy, unknown = _Conn(False), _Conn(True), _Conn(None)
    for conn in (idle, busy, unknown):
        _reset_if_in_transaction(conn, None, _State())
    assert (idle.rollbacks, busy.rollbacks, unknown.rollbacks) == (0, 1, 1)
    done, gone = _Conn(True), _Conn(True)
    _reset_if_in_transaction(done, None, _State(transaction_was_reset=True))
    _reset_if_in_transaction(gone, None, _State(terminate_only=True))
    assert (done.rollbacks, gone.rollbacks) == (0, 0)
