"""The job states of reference §2.3, defined once for every service.

job_service's state machine (:mod:`job_service.lifecycle`), the gateway's
schemas and the proto mapping (:data:`airuntime_common.enums.JOB_STATUS`) all
derive from :class:`JobStatus`; a test checks it against the proto enum
``zhixi.airuntime.common.v1.JobStatus``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class JobStatus(StrEnum):
    """Where a job is in its life (reference §2.3). Members compare equal to their strings.

    Each member says which component moves a job into it and out of it.
    """

    #: Waiting to be claimed. In: create, admin re-run, a retryable ending with
    #: retries left (fail, reaper). Out: lock/claim by a worker; cancel.
    PENDING = "pending"
    #: Leased to one runtime instance, not started. In: lock/claim. Out: start
    #: (explicit, or implied by a heartbeat or snapshot read), result, fail, reaper.
    LOCKED = "locked"
    #: Leased and started; the holder heartbeats. In: start. Out: result, fail, reaper.
    RUNNING = "running"
    #: Final: the result and its business rows are stored. In: result.
    SUCCEEDED = "succeeded"
    #: Final: a non-retryable code, retries used up, or an invalid result. In: fail,
    #: result (INVALID_SCHEMA), reaper. Out: only an admin re-run (a new job).
    FAILED = "failed"
    #: Final: never polled again. In: cancel of a pending job, a fail while a
    #: cancel is requested (or with code CANCELLED), reaper with a cancel requested.
    CANCELLED = "cancelled"
    #: Only a step inside one reaper transaction, never a resting state: the
    #: same transaction moves the job on to pending, failed or cancelled.
    EXPIRED = "expired"


#: Held by a runtime instance's lease.
LEASED: Final = frozenset({JobStatus.LOCKED, JobStatus.RUNNING})
#: Never change again.
TERMINAL: Final = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
#: Not terminal: may still run.
LIVE: Final = frozenset({JobStatus.PENDING, JobStatus.LOCKED, JobStatus.RUNNING})
