"""Batches (reference §10.3): a parent and its children made in one transaction, the
parent following every child transition in the same transaction (claim, lock, result,
fail, the reaper, cancel, revoke, erasure), cancel and retry of a parent. Every test
runs on SQLite and on MariaDB."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select, update

from airuntime_common.errors import AppError
from job_service.lifecycle import Lease
from job_service.maintenance.reaper import Reaper
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateBatchInput, CreateJobInput, RetryInput
from job_service.store.tables import PARENT_AVAILABLE_AT, jobs
from tests.unit.job_service.batch_support import (
    ANALYSIS,
    CAPS,
    children,
    counts,
    counts_hold,
    make_batch,
)
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, business_rows, new_job


async def _code(coro: Any) -> str:
    with pytest.raises(AppError) as err:
        await coro
    return str(err.value.code)


async def _result(domain: JobDomain, job_id: str, worker: str, attempt: int = 1) -> Any:
    return await domain.submit_result(
        Lease(job_id, worker, attempt),
        prompt_version=None,
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
    )


async def _fail(domain: JobDomain, job_id: str, worker: str, code: str, attempt: int = 1) -> Any:
    return await domain.fail(Lease(job_id, worker, attempt), error_code=code, error_message="x")


async def _jobs_of(domain: JobDomain, user: str) -> int:
    async with domain.sessions() as s:
        found = await s.execute(select(func.count()).where(jobs.c.user_id == user))
        return int(found.scalar_one())


async def test_a_batch_is_a_parent_and_its_children_never_claimed_itself(
    domain: JobDomain,
) -> None:
    parent = await make_batch(domain, 3)
    assert (parent.status, parent.target_type, parent.target_id) == ("pending", "user", "u1")
    assert parent.snapshot_id is None and parent.parent_job_id is None
    assert counts(parent) == (3, 3, 0, 0, 0, 0) and parent.min_success_ratio == 1.0
    assert parent.available_at == PARENT_AVAILABLE_AT
    kids = await children(domain, parent.job_id)
    assert [k.target_id for k in kids] == ["m0", "m1", "m2"]  # target order
    assert all(k.parent_job_id == parent.job_id and k.snapshot_id for k in kids)
    assert all(k.status == "pending" and k.batch_total is None for k in kids)
    assert max(k.seq for k in kids) < parent.seq  # children first: locked before it

    assert [j.job_id for j in await domain.poll("w1", CAPS, 50, 0)] == [k.job_id for k in kids]
    claimed = await domain.claim("w1", CAPS, 50, 0)
    assert sorted(j.job_id for j in claimed) == sorted(k.job_id for k in kids)
    running = await counts_hold(domain, parent.job_id)
    assert running.status == "running" and counts(running) == (3, 0, 3, 0, 0, 0)
    assert running.started_at is None and running.locked_by is None  # never leased
    assert await _code(domain.lock(parent.job_id, "w1")) == "INVALID_JOB_STATE"
    assert await domain.claim("w1", CAPS, 50, 0) == []


async def test_lock_of_a_pending_parent_is_refused_and_a_locked_child_counts(
    domain: JobDomain,
) -> None:
    parent = await make_batch(domain, 2)
    assert await _code(domain.lock(parent.job_id, "w1")) == "INVALID_JOB_STATE"
    kid = (await children(domain, parent.job_id))[0]
    await domain.lock(kid.job_id, "w1")
    after = await counts_hold(domain, parent.job_id)
    assert after.status == "running" and counts(after) == (2, 1, 1, 0, 0, 0)


@pytest.mark.parametrize(("ratio", "ending"), [(None, "failed"), (0.6, "succeeded")])
async def test_the_last_child_ends_the_parent_by_its_ratio(
    domain: JobDomain, ratio: float | None, ending: str
) -> None:
    parent = await make_batch(domain, 3, ratio=ratio)
    kids = await children(domain, parent.job_id)
    await domain.claim_started("w1", CAPS, 3, 0)
    await _result(domain, kids[0].job_id, "w1")
    assert (await counts_hold(domain, parent.job_id)).status == "running"
    await _fail(domain, kids[1].job_id, "w1", "INSUFFICIENT_BALANCE")  # final
    assert (await counts_hold(domain, parent.job_id)).status == "running"
    await _result(domain, kids[2].job_id, "w1")
    done = await counts_hold(domain, parent.job_id)
    assert counts(done) == (3, 0, 0, 2, 1, 0)
    assert done.status == ending and done.finished_at is not None
    assert done.error_code == (None if ending == "succeeded" else "CHILD_JOBS_FAILED")
    if ending == "failed":
        assert "2 of 3" in (done.error_message or "")


async def test_a_retried_child_goes_back_to_pending_in_its_parent(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(MAX_RETRY_COUNT=1)
    parent = await make_batch(domain, 1)
    kid = (await children(domain, parent.job_id))[0]
    await domain.claim("w1", CAPS, 1, 0)
    await _fail(domain, kid.job_id, "w1", "MODEL_TIMEOUT")  # retryable
    back = await counts_hold(domain, parent.job_id)
    assert back.status == "running" and counts(back) == (1, 1, 0, 0, 0, 0)
    await domain.claim("w1", CAPS, 1, 0)
    await _fail(domain, kid.job_id, "w1", "MODEL_TIMEOUT", attempt=2)  # retries used up
    assert (await counts_hold(domain, parent.job_id)).status == "failed"


async def test_every_count_change_moves_the_version_and_appends_an_event(
    domain: JobDomain,
) -> None:
    parent = await make_batch(domain, 2, ratio=0.5)
    kids = await children(domain, parent.job_id)
    versions = [parent.version]
    await domain.claim("w1", CAPS, 1, 0)
    versions.append((await domain.get(parent.job_id)).version)
    await _result(domain, kids[0].job_id, "w1")
    versions.append((await domain.get(parent.job_id)).version)
    await domain.cancel(kids[1].job_id, user_id="u1", actor="user:u1")
    versions.append((await domain.get(parent.job_id)).version)
    assert versions == sorted(set(versions)), versions
    events, _ = await domain.history(parent.job_id)
    steps = [(e.from_status, e.to_status, e.error_code) for e in events]
    assert steps == [
        (None, "pending", None),
        ("pending", "running", None),
        ("running", "running", None),  # a count alone: from = to
        ("running", "succeeded", None),  # 1 of 2 ≥ 0.5
    ]
    assert [e.actor for e in events][1:] == ["runtime:w1", "runtime:w1", "user:u1"]


async def test_the_quota_takes_the_whole_batch_or_none_of_it(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(USER_DAILY_JOB_QUOTA=5)
    await new_job(domain)
    await new_job(domain)
    assert await _code(make_batch(domain, 4)) == "QUOTA_EXCEEDED"
    assert await _jobs_of(domain, "u1") == 2  # nothing of it
    parent = await make_batch(domain, 3)  # 2 + 3 = 5: the parent is not counted
    assert parent.batch_total == 3
    assert await _code(new_job(domain)) == "QUOTA_EXCEEDED"


async def test_a_target_not_the_callers_creates_nothing(domain: JobDomain) -> None:
    req = CreateBatchInput("u1", ANALYSIS, targets=[("material", "m0"), ("material", "missing-1")])
    assert await _code(domain.create_batch(req)) == "NOT_FOUND"
    other = CreateBatchInput("u1", ANALYSIS, targets=[("user", "u2")])
    assert await _code(domain.create_batch(other)) == "NOT_FOUND"
    assert await _jobs_of(domain, "u1") == 0


@pytest.mark.parametrize(
    "change",
    [
        {"targets": []},
        {"targets": [("material", f"m{i}") for i in range(4)]},  # BATCH_MAX_CHILDREN 3
        {"targets": [("material", "a"), ("material", "a")]},
        {"targets": [("material", "a")], "targets_of": ("material", None)},
        {"targets": None},
        {"targets": [("lesson", "a")]},
        {"targets": [("material", "")]},
        {"min_success_ratio": 0.0},
        {"min_success_ratio": 1.5},
        {"min_success_ratio": float("nan")},
        {"params": {"count": 99}},
        {"job_type": "nope"},
    ],
)
async def test_bad_batches_are_refused_and_create_nothing(
    make_domain: Callable[..., Any], change: dict[str, Any]
) -> None:
    domain: JobDomain = await make_domain(BATCH_MAX_CHILDREN=3)
    args: dict[str, Any] = {"user_id": "u1", "job_type": ANALYSIS, "targets": [("material", "a")]}
    args.update(change)
    assert await _code(domain.create_batch(CreateBatchInput(**args))) == "INVALID_ARGUMENT"
    assert await _jobs_of(domain, "u1") == 0


async def test_targets_of_takes_the_users_targets_oldest_first(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(BATCH_MAX_CHILDREN=3)
    learning: Any = domain.learning
    of = CreateBatchInput("u1", ANALYSIS, targets_of=("material", None))
    assert await _code(domain.create_batch(of)) == "INVALID_ARGUMENT"  # none
    learning.materials["u1"] = ["old", "mid", "new"]
    parent, _ = await domain.create_batch(of)
    kids = await children(domain, parent.job_id)
    assert [(k.target_type, k.target_id) for k in kids] == [
        ("material", "old"),
        ("material", "mid"),
        ("material", "new"),
    ]
    learning.materials["u1"].append("newest")
    assert await _code(domain.create_batch(of)) == "INVALID_ARGUMENT"  # 4 > 3


async def test_an_idempotency_key_replays_the_parent(domain: JobDomain) -> None:
    first = await make_batch(domain, 2, idempotency_key="k1")
    again, replayed = await domain.create_batch(
        CreateBatchInput("u1", ANALYSIS, targets=[("material", "z")], idempotency_key="k1")
    )
    assert replayed and again.job_id == first.job_id
    assert await _jobs_of(domain, "u1") == 3


async def test_cancelling_a_parent_cancels_it_and_its_children(domain: JobDomain) -> None:
    parent = await make_batch(domain, 4)
    leased = await domain.claim_started("w1", CAPS, 2, 0)
    out = await domain.cancel(parent.job_id, user_id="u1", actor="user:u1")
    assert out.status == "cancelled" and out.cancelled_at is not None
    assert counts(await counts_hold(domain, parent.job_id)) == (4, 0, 2, 0, 0, 2)
    kids = {k.job_id: k for k in await children(domain, parent.job_id)}
    held = [j.job_id for j in leased[0]]
    assert all(kids[i].status == "running" and kids[i].cancel_requested for i in held)
    # a result for a child of a cancelled parent writes nothing: 409, the child ends cancelled
    assert await _code(_result(domain, held[0], "w1")) == "INVALID_JOB_STATE"
    assert (await domain.get(held[0])).status == "cancelled"
    assert await business_rows(domain, held[0]) == 0
    await _fail(domain, held[1], "w1", "CANCELLED")
    done = await counts_hold(domain, parent.job_id)
    assert counts(done) == (4, 0, 0, 0, 0, 4) and done.status == "cancelled"
    assert await _code(domain.cancel(parent.job_id, user_id="u1", actor="u")) == (
        "INVALID_JOB_STATE"
    )
    assert await _code(domain.cancel(parent.job_id, user_id="u2", actor="u")) == ("JOB_NOT_FOUND")


async def test_a_child_cancelled_alone_counts_as_cancelled(domain: JobDomain) -> None:
    parent = await make_batch(domain, 3, ratio=0.6)
    kids = await children(domain, parent.job_id)
    await domain.cancel(kids[0].job_id, user_id="u1", actor="user:u1")
    assert counts(await counts_hold(domain, parent.job_id)) == (3, 2, 0, 0, 0, 1)
    await domain.claim_started("w1", CAPS, 2, 0)
    await _result(domain, kids[1].job_id, "w1")
    await _result(domain, kids[2].job_id, "w1")
    assert (await counts_hold(domain, parent.job_id)).status == "succeeded"  # 2/3 ≥ 0.6


async def test_the_reaper_moves_its_childrens_counts(make_domain: Callable[..., Any]) -> None:
    domain: JobDomain = await make_domain(MAX_RETRY_COUNT=1)
    reaper = Reaper(domain.core)
    parent = await make_batch(domain, 1)
    for attempt, expect in ((1, (1, 1, 0, 0, 0, 0)), (2, (1, 0, 0, 0, 1, 0))):
        await domain.claim("w1", CAPS, 1, 0)
        async with domain.sessions() as s, s.begin():
            await s.execute(
                update(jobs)
                .where(jobs.c.parent_job_id == parent.job_id)
                .values(lock_until=domain.clock.plus(-1))
            )
        assert await reaper.sweep() == 1, attempt
        assert counts(await counts_hold(domain, parent.job_id)) == expect
    assert (await domain.get(parent.job_id)).error_code == "CHILD_JOBS_FAILED"


async def test_a_revoke_cancels_the_parent_and_its_children(domain: JobDomain) -> None:
    parent = await make_batch(domain, 3)
    await domain.claim("w1", CAPS, 1, 0)
    view = await domain.set_authorization("u1", False)
    assert (view.cancelled, view.cancel_requested) == (2, 1)
    after = await counts_hold(domain, parent.job_id)
    assert after.status == "cancelled" and counts(after) == (3, 0, 1, 0, 0, 2)


async def test_an_erasure_removes_the_batch_and_frees_its_leased_child(
    domain: JobDomain,
) -> None:
    parent = await make_batch(domain, 3)
    leased = (await domain.claim("w1", CAPS, 1, 0))[0]
    erased = await domain.erase_user("u1")
    assert erased.jobs_removed == 4
    assert await _code(domain.get(parent.job_id)) == "JOB_NOT_FOUND"
    kept = await domain.get(leased.job_id)
    assert kept.parent_job_id is None and kept.cancel_requested
    await _fail(domain, leased.job_id, "w1", "CANCELLED")  # its attempt ends: it goes too
    async with domain.sessions() as s:
        left = await s.execute(select(func.count()).where(jobs.c.job_id.in_([leased.job_id])))
        assert left.scalar_one() == 0


async def test_retrying_a_failed_parent_runs_the_targets_that_did_not_succeed(
    make_domain: Callable[..., Any],
) -> None:
    domain: JobDomain = await make_domain(USER_DAILY_JOB_QUOTA=6)
    parent = await make_batch(domain, 3, ratio=0.9, priority=4, params={})
    kids = await children(domain, parent.job_id)
    assert await _code(domain.retry(RetryInput(parent.job_id, user_id="u1"))) == (
        "INVALID_JOB_STATE"
    )
    await domain.cancel(kids[2].job_id, user_id="u1", actor="user:u1")
    await domain.claim_started("w1", CAPS, 2, 0)
    await _result(domain, kids[0].job_id, "w1")
    await _fail(domain, kids[1].job_id, "w1", "MODEL_BAD_REQUEST")
    assert (await domain.get(parent.job_id)).status == "failed"

    again, replayed = await domain.retry(
        RetryInput(parent.job_id, actor="user:u1", user_id="u1", idempotency_key="r1")
    )
    assert not replayed and again.retried_from_job_id == parent.job_id
    assert (again.min_success_ratio, again.priority, again.params) == (0.9, 4, parent.params)
    assert counts(again) == (2, 2, 0, 0, 0, 0)
    new_kids = await children(domain, again.job_id)
    assert [k.target_id for k in new_kids] == ["m1", "m2"]
    assert [k.retried_from_job_id for k in new_kids] == [kids[1].job_id, kids[2].job_id]
    assert all(k.priority == 4 for k in new_kids)
    same, replayed = await domain.retry(
        RetryInput(parent.job_id, actor="user:u1", user_id="u1", idempotency_key="r1")
    )
    assert replayed and same.job_id == again.job_id
    # the quota counts each child: 3 + 2 used of 6, 2 more do not fit
    assert await _code(domain.retry(RetryInput(parent.job_id, user_id="u1"))) == ("QUOTA_EXCEEDED")
    admin = await domain.rerun(parent.job_id, rebuild_snapshot=False, actor="admin:a")
    assert admin.batch_total == 2


async def test_one_group_ends_children_of_two_parents(domain: JobDomain) -> None:
    domain.completion.groups.max_in_flight = 1
    one = await make_batch(domain, 3, prefix="a")
    two = await make_batch(domain, 3, prefix="b")
    running, _ = await domain.claim_started("w1", CAPS, 10, 0)
    assert len(running) == 6
    await asyncio.gather(*(_result(domain, j.job_id, "w1") for j in running))
    for parent in (one, two):
        assert (await counts_hold(domain, parent.job_id)).status == "succeeded"


async def test_children_ending_at_once_on_two_replicas_lose_no_count(
    make_domain: Callable[..., Any],
) -> None:
    first: JobDomain = await make_domain()
    second: JobDomain = await make_domain()
    parent = await make_batch(first, 20)
    running, _ = await first.claim_started("w1", CAPS, 20, 0)
    pairs = [running[i : i + 2] for i in range(0, 20, 2)]
    for a, b in pairs:
        await asyncio.gather(_result(first, a.job_id, "w1"), _result(second, b.job_id, "w1"))
        await counts_hold(first, parent.job_id)
    done = await counts_hold(first, parent.job_id)
    assert counts(done) == (20, 0, 0, 20, 0, 0) and done.status == "succeeded"


async def test_a_single_job_is_no_batch(domain: JobDomain) -> None:
    job, _ = await domain.create(CreateJobInput("u1", ANALYSIS, "user", ""))
    assert job.parent_job_id is None and job.batch_total is None and not job.is_parent
    await domain.claim("w1", CAPS, 1, 0)
    await _result(domain, job.job_id, "w1")
    assert (await domain.get(job.job_id)).status == "succeeded"


def test_the_migrations_make_the_batch_columns_and_index(tmp_path: Any) -> None:
    """Migration 0014 makes what ``store/tables.py`` declares for batches, and the chain
    has one head."""
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, inspect

    from job_service.migrate import alembic_config, upgrade_head

    path = tmp_path / "migrated.db"
    url = f"sqlite+aiosqlite:///{path}"
    assert len(ScriptDirectory.from_config(alembic_config(url)).get_heads()) == 1
    upgrade_head(url)
    engine = create_engine(f"sqlite:///{path}")
    try:
        found = inspect(engine)
        columns = {c["name"] for c in found.get_columns(jobs.name)}
        indexes = {i["name"]: i["column_names"] for i in found.get_indexes(jobs.name)}
    finally:
        engine.dispose()
    names = ("parent_job_id", "batch_total", "batch_pending", "batch_running")
    assert set(names) | {"batch_succeeded", "batch_failed", "min_success_ratio"} <= columns
    assert indexes["ix_jobs_parent"] == ["parent_job_id", "status"]


async def test_a_parent_shows_a_new_jobs_available_at(domain: JobDomain) -> None:
    """The parent's row holds it out of the claim's range (its ``availableAt`` far in
    the future); the contract shows a new job's ``availableAt = createdAt`` (reference
    §2.4), as for its children."""
    from job_service.rpc.convert import job_to_proto

    parent = await make_batch(domain, 2)
    shown = job_to_proto(parent)
    assert shown.available_at.ToDatetime() == shown.created_at.ToDatetime()
    kid = (await children(domain, parent.job_id))[0]
    assert job_to_proto(kid).available_at == job_to_proto(kid).created_at
