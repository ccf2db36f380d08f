"""The scheduler of parked jobs (reference §2.4, §10.2).

A pending job that may not be claimed yet is *parked*: its ``parkedUntil`` keeps it
out of ``ix_jobs_poll``'s claimable range, so claims never scan past it. A job is
parked by a retry with a backoff (until its ``availableAt``) and by a claim that
found no provider with room for it (until room is expected). Every
:data:`INTERVAL_SECONDS` the scheduler takes back the jobs whose time has come (one
UPDATE over the range ``parkedUntil <= now`` of the same index), wakes this
process's long polls if it took any, and deletes the provider grants of attempts
that ended more than a minute ago (they no longer count in any window).

Idempotent: every replica runs one; two taking back the same job both write NULL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from job_service.services.core import Core
from job_service.store import scheduling as sched
from job_service.store.batch import new_batch
from job_service.store.engine import DbExec

log = logging.getLogger("job_service.parking")

#: How often parked jobs whose time has come are taken back (s): a retry is claimable
#: at most this long after its ``availableAt``.
INTERVAL_SECONDS = 0.5
#: Most jobs taken back by one UPDATE (the next run takes the rest).
BATCH = 5_000


class ParkingLot:
    """Takes parked jobs back into the claim's range when their time comes (module doc).

    Args:
        core: the shared core.
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    async def run_once(self) -> int:
        """Take back the jobs due now and forget old grants; returns how many jobs."""
        clock = self.core.clock

        async def body(db: DbExec) -> int:
            batch = new_batch(db)
            taken = batch.add(sched.unpark.sql(clock, {"n": BATCH}))
            batch.add(sched.forget_old_grants.sql(clock, {}))
            out = await batch.run()
            return out[taken].rowcount

        taken = await self.core.store.lean_tx(body)
        if taken:
            self.core.signal.notify()
        return taken

    async def run(self, stop: asyncio.Event) -> None:
        """Run :meth:`run_once` every :data:`INTERVAL_SECONDS` until ``stop`` is set."""
        while not stop.is_set():
            try:
                while await self.run_once() >= BATCH:
                    pass
            except Exception:
                log.exception("taking parked jobs back failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), INTERVAL_SECONDS)
