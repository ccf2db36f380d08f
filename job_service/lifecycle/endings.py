"""How an attempt ends: one pure decision, used by fail, result and the reaper (reference §2.3, §2.4).

An attempt ends when its worker fails it (FailJob), when its result is
refused as invalid (SubmitResult with ``INVALID_SCHEMA``), or when the reaper
finds its lease lapsed (``LEASE_EXPIRED``) or its time used up
(``JOB_TIMEOUT``). :func:`end_attempt` decides what follows from the job's
facts and the code alone, in the order of reference §2.3:

1. a cancel was requested, or the code is ``CANCELLED`` (the worker
   acknowledging one) → :attr:`Ending.CANCEL`, never retried;
2. a retryable code (reference §4) while ``retryCount < maxRetryCount`` →
   :attr:`Ending.RETRY`, pollable again after :func:`backoff_seconds`;
3. anything else → :attr:`Ending.FAIL`.

The transition that carries the decision out, and the columns it sets, are
the store's (:func:`job_service.store.transitions.ending_values`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from airuntime_common.errors import ErrorCode, is_retryable
from airuntime_common.states import JobStatus
from job_service.lifecycle.transitions import Op


class Ending(StrEnum):
    """What follows an attempt that did not succeed."""

    #: Back to ``pending``: ``retryCount + 1``, ``availableAt = now + backoff``.
    RETRY = "retry"
    #: ``failed``, with the attempt's code: final.
    FAIL = "fail"
    #: ``cancelled``: a cancel was requested (or acknowledged); never retried.
    CANCEL = "cancel"

    @property
    def to_state(self) -> JobStatus:
        """The state the job rests in afterwards."""
        return _STATES[self]

    def op(self, *, expired: bool = False) -> Op:
        """The transition carrying this ending out: from a leased state (the holder's
        fail or result), or from ``expired`` (the reaper's second step)."""
        return (_EXPIRED_OPS if expired else _HOLDER_OPS)[self]


_STATES = {
    Ending.RETRY: JobStatus.PENDING,
    Ending.FAIL: JobStatus.FAILED,
    Ending.CANCEL: JobStatus.CANCELLED,
}
_HOLDER_OPS = {Ending.RETRY: Op.RETRY, Ending.FAIL: Op.FAIL, Ending.CANCEL: Op.ACK_CANCEL}
_EXPIRED_OPS = {
    Ending.RETRY: Op.EXPIRED_RETRY,
    Ending.FAIL: Op.EXPIRED_FAIL,
    Ending.CANCEL: Op.EXPIRED_CANCEL,
}


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff of a retried job (reference §2.4; ``RETRY_BACKOFF_*_SECONDS``).

    Attributes:
        base_seconds: the first retry's delay before jitter.
        max_seconds: the cap of any delay before jitter.
    """

    base_seconds: float
    max_seconds: float


@dataclass(frozen=True)
class AttemptEnding:
    """The decision of :func:`end_attempt`.

    Attributes:
        ending: retry, fail or cancel.
        code: the attempt's error code (as given, at most 64 characters).
        delay_seconds: for a retry, seconds until the job is pollable again; else 0.
    """

    ending: Ending
    code: str
    delay_seconds: float = 0.0


def backoff_seconds(
    policy: RetryPolicy,
    retry_count: int,
    code: str,
    retry_after: float | None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Delay before a retried job is pollable again (reference §2.4), in seconds.

    ``base × 2^(retryCount−1)`` capped at ``max``, ±10 % jitter; on a
    ``MODEL_RATE_LIMIT`` a longer ``retry_after`` (the provider's
    ``Retry-After``) wins, and on any other code it is ignored;
    ``WORKER_SHUTDOWN`` retries at once (0).

    Args:
        retry_count: the retry count *after* this retry was granted (≥ 1).
        retry_after: seconds, or None.
        rng: a uniform [0, 1) source (the jitter).
    """
    if code == ErrorCode.WORKER_SHUTDOWN:
        return 0.0
    base = float(policy.base_seconds) * float(2 ** max(0, retry_count - 1))
    delay = min(base, policy.max_seconds) * (0.9 + 0.2 * rng())
    if code != ErrorCode.MODEL_RATE_LIMIT:
        return delay
    if retry_after is not None and retry_after > delay:
        delay = float(retry_after)
    return delay


def end_attempt(
    *,
    cancel_requested: bool,
    retry_count: int,
    max_retry_count: int,
    code: str,
    retry_after: float | None,
    policy: RetryPolicy,
    rng: Callable[[], float] = random.random,
) -> AttemptEnding:
    """Decide how an attempt that did not succeed ends (module doc; reference §2.3, §2.4).

    Args:
        cancel_requested: the job's ``cancelRequested``.
        retry_count / max_retry_count: the job's counters before this ending.
        code: the attempt's error code (an unknown code is final, reference §4).
        retry_after: a ``MODEL_RATE_LIMIT`` fail's ``retryAfterSeconds``, or None.
        policy: the backoff settings.
        rng: the jitter's source.
    """
    if cancel_requested or code == ErrorCode.CANCELLED:
        return AttemptEnding(Ending.CANCEL, code)
    if is_retryable(code) and retry_count < max_retry_count:
        delay = backoff_seconds(policy, retry_count + 1, code, retry_after, rng)
        return AttemptEnding(Ending.RETRY, code, delay)
    return AttemptEnding(Ending.FAIL, code)
