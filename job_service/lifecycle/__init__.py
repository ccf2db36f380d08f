"""The job lifecycle: states, the transition table and how an attempt ends (reference §2.3, §2.4).

Pure rules, no SQL: :mod:`job_service.store` turns them into statements and
:mod:`job_service.services` applies them.
"""

from airuntime_common.states import LEASED, LIVE, TERMINAL, JobStatus
from job_service.lifecycle.endings import (
    AttemptEnding,
    Ending,
    RetryPolicy,
    backoff_seconds,
    end_attempt,
)
from job_service.lifecycle.lease import Lease
from job_service.lifecycle.transitions import (
    ALL_STATES,
    CANCELLED,
    EXPIRED,
    FAILED,
    LOCKED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TRANSITIONS,
    Op,
    Transition,
    allowed_targets,
)

__all__ = [
    "ALL_STATES",
    "CANCELLED",
    "EXPIRED",
    "FAILED",
    "LEASED",
    "LIVE",
    "LOCKED",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL",
    "TRANSITIONS",
    "AttemptEnding",
    "Ending",
    "JobStatus",
    "Lease",
    "Op",
    "RetryPolicy",
    "Transition",
    "allowed_targets",
    "backoff_seconds",
    "end_attempt",
]
