"""Erasing a user (reference §9.2 ``DELETE /v1/me``, the right to erasure): one transaction.

Under the user's admission lock (no create of theirs runs meanwhile), their jobs
are ended (pending → cancelled, leased → ``cancelRequested``) and then removed with
their events — a leased one stays until its attempt ends, with the user's id replaced
by the pseudonym and nothing of theirs on it, so the model call in flight still logs
its tokens and cost (its result writes nothing: its snapshot is gone); every learning-room row of theirs goes (through the learning port);
so do their ratings of generated items, their AI switch and admission row. What the platform must keep stays, with no
way back to the user: the invocation logs of their jobs keep tokens and cost under
:func:`pseudonym` (as their ``job_id``, without the credential), the platform spend
rows never named a user, and the number of jobs they created today moves to
``ai_runtime_erased_usage`` under the pseudonym, which the daily quota counts: an
erasure does not give a user a fresh quota. A second erasure finds nothing and
changes nothing. A result or heartbeat for a removed job finds no job and writes
nothing. The credential service's rows are erased by its own call (the gateway
makes both).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.states import LEASED
from job_service.prompts.feedback import erase_user_feedback
from job_service.services.admission import Admission
from job_service.services.cancellation import end_jobs
from job_service.services.core import Core
from job_service.services.pseudonyms import pseudonym
from job_service.store import statements as st
from job_service.store.batch import run_one

log = logging.getLogger("job_service.erasure")

_CHUNK: Final = 500


@dataclass(frozen=True)
class Erased:
    """What an erasure did: jobs cancelled, asked to cancel, removed."""

    cancelled: int
    cancel_requested: int
    jobs_removed: int


class Erasure:
    """Erases users.

    Args:
        core: the shared core.
        admission: the users' admission lock rows (and their cache).
    """

    def __init__(self, core: Core, admission: Admission) -> None:
        self.core = core
        self.admission = admission

    def pseudonym(self, user_id: str) -> str:
        """:func:`pseudonym` under this service's key (the admission's, which counts it)."""
        return pseudonym(self.admission.pseudonym_key, user_id)

    async def erase_user(self, user_id: str) -> Erased:
        """Erase every row of the user in job_service (module docstring).

        Raises:
            AppError: ``INVALID_ARGUMENT`` without a user id.
        """
        if not user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        await self.admission.ensure_admission_row(user_id)
        clock, name = self.core.clock, self.pseudonym(user_id)

        async def body(session: AsyncSession) -> Erased:
            await run_one(session, st.admission_lock.sql(clock, {"a_user": user_id}))
            rows = [tuple(r) for r in (await session.execute(st.jobs_of_user(clock, user_id)))]
            ended = await end_jobs(clock, session, f"user:{user_id}", [r[:5] for r in rows])
            today = sum(int(r[5]) for r in rows)
            if today:
                usage = {"pseudonym": name, "jobs": today}
                await run_one(session, st.add_erased_usage.sql(clock, usage))
            job_ids = [str(r[0]) for r in rows]
            # leased jobs stay until their attempt ends; a running parent leases nothing
            leased = {str(r[0]) for r in rows if r[1] in LEASED and not r[4]}
            await self.core.learning.erase_user(session, user_id, job_ids)
            await erase_user_feedback(session, user_id)  # their ratings (reference §10.4)
            for start in range(0, max(len(job_ids), 1), _CHUNK):
                chunk = job_ids[start : start + _CHUNK]
                kept = [j for j in chunk if j in leased]
                for stmt in st.erase_jobs(clock, user_id, chunk, name, kept):
                    await session.execute(stmt)
            return Erased(ended[0], ended[1], len(rows))

        erased = await self.core.store.tx(body)
        self.admission.admission_rows.pop(user_id)
        log.info(
            "user erased",
            extra={"fields": {"pseudonym": name, "jobsRemoved": erased.jobs_removed}},
        )
        return erased
