"""Helpers of the batch tests (reference §10.3): make a batch, read its children, and
check that a parent's counts equal its children's states."""

from __future__ import annotations

from collections import Counter
from typing import Any

from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateBatchInput
from job_service.services.parents import BUCKETS
from job_service.store.parents import MOVING_COUNTS
from job_service.store.records import JobRecord

ANALYSIS = "learning_state_analysis"
CAPS = [ANALYSIS]


async def make_batch(
    domain: JobDomain,
    n: int = 3,
    *,
    user: str = "u1",
    ratio: float | None = None,
    prefix: str = "m",
    **kw: Any,
) -> JobRecord:
    """A batch of ``n`` analyses on materials ``<prefix>0..`` of ``user``."""
    req = CreateBatchInput(
        user_id=user,
        job_type=ANALYSIS,
        targets=[("material", f"{prefix}{i}") for i in range(n)],
        min_success_ratio=ratio,
        **kw,
    )
    parent, _ = await domain.create_batch(req)
    return parent


async def children(domain: JobDomain, parent_id: str) -> list[JobRecord]:
    """The batch's children, oldest first (target order)."""
    rows, token = await domain.list_jobs(
        user_id=None,
        status=None,
        job_type=None,
        page_size=100,
        page_token="",
        parent_job_id=parent_id,
    )
    assert not token
    return sorted(rows, key=lambda j: j.seq)


async def counts_hold(domain: JobDomain, parent_id: str) -> JobRecord:
    """The parent, after checking that its counts equal its children's states."""
    parent = await domain.get(parent_id)
    kids = await children(domain, parent_id)
    assert parent.batch_total == len(kids), (parent, len(kids))
    seen = Counter(BUCKETS[k.status] for k in kids)
    found = {c: getattr(parent, c) for c in MOVING_COUNTS}
    assert found == {c: seen.get(c, 0) for c in MOVING_COUNTS}, (found, seen)
    return parent


def counts(job: JobRecord) -> tuple[int | None, ...]:
    """``(total, pending, running, succeeded, failed, cancelled)`` of a parent."""
    return (
        job.batch_total,
        job.batch_pending,
        job.batch_running,
        job.batch_succeeded,
        job.batch_failed,
        job.batch_cancelled,
    )
