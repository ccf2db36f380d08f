"""Fair order across users (reference §10.1 (a)–(f)), on SQLite and MariaDB: which job a
claim takes next, whatever the length of each user's queue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from job_service.lifecycle import Lease
from job_service.maintenance.parking import ParkingLot
from job_service.services.domain import JobDomain
from job_service.services.fair_order import fair_vstart
from job_service.services.inputs import CreateJobInput
from job_service.store.records import JobRecord
from job_service.store.tables import jobs

CAPS = ["learning_state_analysis"]


async def create(domain: JobDomain, user: str, **kw: Any) -> JobRecord:
    job, _ = await domain.create(
        CreateJobInput(user, "learning_state_analysis", "user", user, **kw)
    )
    return job


async def claim_one(domain: JobDomain) -> JobRecord:
    [job] = await domain.claim("w", CAPS, 1, 0)
    return job


async def test_a_one_job_each_order_is_creation_order(domain: JobDomain) -> None:
    """(a) With no user holding more than one waiting job, the order is reference §2.6's."""
    made = [await create(domain, f"u{i}") for i in range(6)]
    got = [await claim_one(domain) for _ in made]
    assert [j.job_id for j in got] == [j.job_id for j in made]
    # and still so while jobs come and go
    more = [await create(domain, f"v{i}") for i in range(3)]
    assert [(await claim_one(domain)).job_id for _ in more] == [j.job_id for j in more]


async def test_b_a_backlog_does_not_hold_up_other_users(domain: JobDomain) -> None:
    """(b) A holds many waiting jobs; B, C, D create one each: each is taken within the
    next slots + 3 claims (here one claim a slot: within 4)."""
    for _ in range(120):
        await create(domain, "A")
    for _ in range(7):  # A is being served
        assert (await claim_one(domain)).user_id == "A"
    late = [await create(domain, u) for u in ("B", "C", "D")]
    order = [(await claim_one(domain)).job_id for _ in range(5)]
    for job in late:
        assert job.job_id in order[:4], order


async def test_c_weights_share_the_claims(make_domain: Callable[..., Any]) -> None:
    """(c) Two users with backlogs and weights 2 and 1 get 2:1 of the claims (± 10 %)."""
    domain: JobDomain = await make_domain(
        PLAN_SCHEDULING_WEIGHTS={"pro": 2, "free": 1}, USER_DAILY_JOB_QUOTA=0
    )
    for _ in range(250):
        await create(domain, "heavy", plan="pro")
        await create(domain, "light", plan="free")
    counts = Counter([(await claim_one(domain)).user_id for _ in range(300)])
    ratio = counts["heavy"] / counts["light"]
    assert 1.8 <= ratio <= 2.2, counts


async def test_d_a_user_alone_takes_every_slot(domain: JobDomain) -> None:
    """(d) A user alone fills every free slot: no slot idles while a job is claimable."""
    for _ in range(12):
        await create(domain, "solo")
    assert len(await domain.claim("w", CAPS, 8, 0)) == 8
    assert len(await domain.claim("w", CAPS, 8, 0)) == 4


async def test_e_priority_wins_and_a_retry_keeps_its_place(
    make_domain: Callable[..., Any],
) -> None:
    """(e) Priority comes before fairness; a job back to pending for a retry keeps its
    place (its virtual start), once its backoff has run out."""
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=1, RETRY_BACKOFF_MAX_SECONDS=300
    )
    for _ in range(5):
        await create(domain, "A")
    urgent = await create(domain, "B", priority=0)
    first = await claim_one(domain)
    assert first.user_id == "A"  # A's head is older; both at priority 0
    lazy = await create(domain, "C", priority=3)
    order = [(await claim_one(domain)).job_id for _ in range(2)]
    assert urgent.job_id in order and lazy.job_id not in order
    retried = await domain.fail(
        Lease(first.job_id, "w", 1), error_code="MODEL_TIMEOUT", error_message="slow"
    )
    assert retried.status == "pending" and retried.vstart == first.vstart
    async with domain.sessions() as s, s.begin():  # its backoff runs out
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == first.job_id)
            .values(available_at=domain.clock.plus(-1), parked_until=domain.clock.plus(-1))
        )
    waiting = await domain.poll("w", CAPS, 10, 0)
    assert first.job_id not in [j.job_id for j in waiting]  # parked until taken back
    assert await ParkingLot(domain.core).run_once() == 1
    again = await claim_one(domain)
    assert again.job_id == first.job_id  # ahead of A's later jobs and of C's lower priority


async def test_f_fifo_restores_creation_order(make_domain: Callable[..., Any]) -> None:
    """(f) ``SCHEDULING_POLICY=fifo``: oldest first across users, whatever their queues."""
    domain: JobDomain = await make_domain(SCHEDULING_POLICY="fifo")
    made = []
    for _ in range(10):
        made.append(await create(domain, "A"))
    made += [await create(domain, u) for u in ("B", "C")]
    made.append(await create(domain, "A"))
    got = [await claim_one(domain) for _ in made]
    assert [j.job_id for j in got] == [j.job_id for j in made]


async def test_a_retry_with_a_backoff_is_parked_out_of_the_claims_range(
    make_domain: Callable[..., Any],
) -> None:
    """A retried job waiting for its backoff is not where claims look: parked until its
    availableAt, then taken back by the scheduler."""
    domain: JobDomain = await make_domain(
        RETRY_BACKOFF_BASE_SECONDS=30, RETRY_BACKOFF_MAX_SECONDS=300
    )
    job = await create(domain, "A")
    await claim_one(domain)
    back = await domain.fail(
        Lease(job.job_id, "w", 1), error_code="NETWORK_ERROR", error_message="x"
    )
    assert back.status == "pending" and back.parked_until == back.available_at
    assert await ParkingLot(domain.core).run_once() == 0  # not yet
    assert await domain.claim("w", CAPS, 1, 0) == []


@pytest.mark.parametrize(
    ("policy", "weight", "user_last", "fresh_min", "taken", "expected"),
    [
        ("fair", 1.0, None, None, [None] * 5, 0.0),  # nothing ever: 0
        ("fair", 1.0, None, None, [3.0, None, 7.5, None, None], 7.5),  # largest taken
        ("fair", 1.0, None, 4.0, [9.0, None, None, None, None], 4.0),  # smallest waiting
        ("fair", 2.0, 4.0, 1.0, [None] * 5, 4.5),  # after the user's newest, by 1/weight
        ("fifo", 2.0, 4.0, 1.0, [None] * 5, 1.0),  # fifo: everyone at V
    ],
)
def test_a_new_jobs_virtual_start(
    policy: str, weight: float, user_last: Any, fresh_min: Any, taken: list[Any], expected: float
) -> None:
    assert fair_vstart(policy, weight, user_last, fresh_min, taken) == expected
