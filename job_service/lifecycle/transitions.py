"""The job state machine of reference §2.3, defined once as a table (no SQL here).

Every operation of the services and the reaper applies a :class:`Transition`:
one conditional UPDATE whose WHERE clause is the transition's guard
(from-states, and for lease-holder operations the fencing token plus a lease
that has not lapsed on the database clock), then its event row, in the
caller's transaction (:mod:`job_service.store.transitions` builds the SQL).
0 rows matched means "refused"; the caller then reads the job to pick the
exact error code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from airuntime_common.states import LEASED, JobStatus

PENDING: Final = JobStatus.PENDING
LOCKED: Final = JobStatus.LOCKED
RUNNING: Final = JobStatus.RUNNING
SUCCEEDED: Final = JobStatus.SUCCEEDED
FAILED: Final = JobStatus.FAILED
CANCELLED: Final = JobStatus.CANCELLED
EXPIRED: Final = JobStatus.EXPIRED
ALL_STATES: Final = frozenset(JobStatus)


class Op(StrEnum):
    """Transitions of reference §2.3 (one per table row and effect)."""

    CREATE = "create"
    LOCK = "lock"
    START = "start"
    RENEW = "renew"
    SUCCEED = "succeed"
    RETRY = "retry"
    FAIL = "fail"
    ACK_CANCEL = "ack_cancel"
    CANCEL_PENDING = "cancel_pending"
    REQUEST_CANCEL = "request_cancel"
    EXPIRE = "expire"
    EXPIRED_RETRY = "expired_retry"
    EXPIRED_FAIL = "expired_fail"
    EXPIRED_CANCEL = "expired_cancel"


@dataclass(frozen=True)
class Transition:
    """One row of the reference §2.3 table.

    Attributes:
        op: the operation.
        from_states: states the job may be in (the WHERE guard).
        to_state: the resulting state; None keeps the current state.
        holder_only: the caller must hold a live lease (fencing token + ``lockUntil ≥ now``).
        records_event: whether an event row is appended.
    """

    op: Op
    from_states: frozenset[str]
    to_state: str | None
    holder_only: bool = False
    records_event: bool = True


def _t(
    op: Op, frm: set[str] | frozenset[str], to: str | None, holder: bool = False, ev: bool = True
) -> Transition:
    return Transition(op, frozenset(frm), to, holder, ev)


#: The whole machine. `expired` is only ever a step inside one reaper transaction.
TRANSITIONS: dict[Op, Transition] = {
    t.op: t
    for t in (
        _t(Op.CREATE, set(), PENDING),
        _t(Op.LOCK, {PENDING}, LOCKED),
        _t(Op.START, {LOCKED}, RUNNING, holder=True),
        _t(Op.RENEW, {RUNNING}, None, holder=True, ev=False),
        _t(Op.SUCCEED, LEASED, SUCCEEDED, holder=True),
        _t(Op.RETRY, LEASED, PENDING, holder=True),
        _t(Op.FAIL, LEASED, FAILED, holder=True),
        _t(Op.ACK_CANCEL, LEASED, CANCELLED, holder=True),
        _t(Op.CANCEL_PENDING, {PENDING}, CANCELLED),
        _t(Op.REQUEST_CANCEL, LEASED, None),
        _t(Op.EXPIRE, LEASED, EXPIRED),
        _t(Op.EXPIRED_RETRY, {EXPIRED}, PENDING),
        _t(Op.EXPIRED_FAIL, {EXPIRED}, FAILED),
        _t(Op.EXPIRED_CANCEL, {EXPIRED}, CANCELLED),
    )
}


def allowed_targets(state: str) -> set[str]:
    """States reachable in one step from ``state`` (used by the invariant tests)."""
    out: set[str] = set()
    for t in TRANSITIONS.values():
        if state in t.from_states:
            out.add(t.to_state or state)
    return out
