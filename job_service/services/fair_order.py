"""A new job's place in the fair order across users (reference §10.1).

Start-time fair queuing per priority: claims take ``priority, vstart, createdAt,
seq`` (:data:`job_service.store.scheduling.TAKE_ORDER`); this module says what
``vstart`` a new job gets from what the admission's read found
(:data:`job_service.store.scheduling.fair_start`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Place:
    """Where a new job goes in its priority's fair order (reference §10.1): asked for by
    a create (its priority and its user's weight), answered by the admission's read
    (:meth:`~job_service.services.admission.Admission.admit` sets ``vstart``)."""

    priority: int
    weight: float = 1.0
    vstart: float = 0.0


def fair_vstart(
    policy: str, weight: float, user_last: Any, fresh_min: Any, taken: Sequence[Any]
) -> float:
    """A new job's virtual start (reference §10.1, start-time fair queuing per priority).

    ``V``, the priority's virtual time, is the smallest virtual start of the claimable
    jobs never retried (``fresh_min``), or with none the largest taken (``taken``, one
    per taken state), else 0. Under ``fifo`` every job starts at ``V``, so ties fall to
    ``createdAt``: reference §2.6's order. Under ``fair`` a user with a job waiting
    there starts one ``1 / weight`` after their newest (``user_last``); a user with
    none starts at ``V``, level with the head of the line.

    Args:
        policy: ``SCHEDULING_POLICY`` (``fair`` or ``fifo``).
        weight: the user's weight (> 0).
    """
    seen = [float(t) for t in taken if t is not None]
    v = float(fresh_min) if fresh_min is not None else max(seen, default=0.0)
    if policy == "fair" and user_last is not None:
        return float(user_last) + 1.0 / weight
    return v
