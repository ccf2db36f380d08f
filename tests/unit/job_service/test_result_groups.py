"""Group commit of results: results that queue go in one transaction, and each gets the
answer it would have had alone (SPEC §2.3 result, §2.5 idempotency, §3 claim_next)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.grouping import GroupCommit
from job_service.services.inputs import ClaimNext, ModelCallInput
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

CAPS = ["learning_state_analysis"]


def _call() -> ModelCallInput:
    return ModelCallInput(
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode="platform_key",
        credential_id=None,
        prompt_tokens=1000,
        completion_tokens=100,
        cache_hit_tokens=0,
        latency_ms=250,
        outcome="succeeded",
    )


def _groups_seen() -> tuple[float, float]:
    """(groups, results in them) observed so far by the group-size histogram."""
    count = total = 0.0
    for metric in metrics.RESULT_GROUP_SIZE.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    return count, total


def _alone_seen() -> float:
    """Results of groups left to their own transaction so far."""
    return float(metrics.RESULT_GROUP_ALONE._value.get())


def _one_at_a_time(domain: JobDomain) -> None:
    """One result transaction at a time: whatever arrives while it runs is one group."""
    domain.completion.groups.max_in_flight = 1


async def _submit(domain: JobDomain, lease: Lease, output: Any = None, **kw: Any) -> Any:
    return await domain.submit_result(
        lease,
        prompt_version="learning_state_analysis.v1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT if output is None else output,
        **kw,
    )


async def _settled(*calls: Any) -> list[Any]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def test_queued_results_commit_as_one_group_and_share_its_claim(domain: JobDomain) -> None:
    _one_at_a_time(domain)
    made = [await new_job(domain) for _ in range(20)]
    running, _ = await domain.claim_started("w1", CAPS, 10, 0)
    assert len(running) == 10
    groups0, results0 = _groups_seen()
    alone0 = _alone_seen()
    outcomes = await _settled(
        *(
            _submit(
                domain,
                Lease(job.job_id, "w1", 1),
                calls=[_call()],
                claim_next=ClaimNext(CAPS, 1),
            )
            for job in running
        )
    )
    groups1, results1 = _groups_seen()
    # the first ran alone at once, the nine that queued behind it went together
    assert (groups1 - groups0, results1 - results0) == (1, 9)
    assert _alone_seen() == alone0  # all nine taken by the group itself
    assert all(o.status == "succeeded" and not o.replayed for o in outcomes)
    assert len({o.result_id for o in outcomes}) == 10
    claimed = [job for o in outcomes for job in o.claimed]
    assert all(len(o.claimed) == 1 for o in outcomes)
    assert len({job.job_id for job in claimed}) == 10  # no job handed out twice
    assert {job.job_id for job in claimed} == {j.job_id for j in made} - {j.job_id for j in running}
    for o in outcomes:
        [job] = o.claimed
        assert job.status == "running" and job.locked_by == "w1"
        assert o.snapshots[job.job_id].snapshot_id == job.snapshot_id
    for job in running:
        done = await domain.get(job.job_id)
        assert done.status == "succeeded" and done.lock_until is None
        events, invocations = await domain.history(job.job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running", "succeeded"]
        assert len(invocations) == 1


async def test_each_result_of_a_group_gets_its_own_answer(domain: JobDomain) -> None:
    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(6)]
    await domain.claim_started("w1", CAPS, 6, 0)
    first, plain, replayed, intruder, invalid, conflict = (Lease(j.job_id, "w1", 1) for j in jobs)
    before = await _submit(domain, replayed)
    other = await _submit(domain, conflict)
    groups0, results0 = _groups_seen()
    alone0 = _alone_seen()
    answers = await _settled(
        _submit(domain, first),
        _submit(domain, plain, calls=[_call()]),
        _submit(domain, plain, calls=[_call()]),  # the same result twice in one group
        _submit(domain, replayed),
        _submit(domain, Lease(intruder.job_id, "intruder", 1)),
        _submit(domain, invalid, output={"summary": 5}),
        _submit(domain, conflict, output={**ANALYSIS_OUTPUT, "summary": "another"}),
    )
    groups1, results1 = _groups_seen()
    assert (groups1 - groups0, results1 - results0) == (1, 6)
    assert _alone_seen() - alone0 == 5  # all but the plain result went alone
    twice_a, twice_b, again, refused, bad, clash = answers[1:]
    assert twice_a.status == twice_b.status == "succeeded"
    assert twice_a.result_id == twice_b.result_id
    assert sorted([twice_a.replayed, twice_b.replayed]) == [False, True]
    assert (again.replayed, again.result_id) == (True, before.result_id)
    assert isinstance(refused, AppError) and refused.code == ErrorCode.LOCK_NOT_HELD
    assert isinstance(bad, AppError) and bad.code == ErrorCode.INVALID_SCHEMA
    assert isinstance(clash, AppError) and clash.code == ErrorCode.RESULT_ALREADY_EXISTS
    assert other.status == "succeeded"
    assert (await domain.get(invalid.job_id)).status == "failed"
    assert (await domain.get(intruder.job_id)).status == "running"  # the holder may still
    _, invocations = await domain.history(plain.job_id)
    assert len(invocations) == 1  # the replay logged none


async def test_a_lapsed_lease_in_a_group_is_refused_and_the_rest_commit(
    domain: JobDomain,
) -> None:
    from sqlalchemy import update

    from job_service.store.tables import jobs as jobs_table

    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(4)]
    await domain.claim_started("w1", CAPS, 4, 0)
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs_table)
            .where(jobs_table.c.job_id == jobs[2].job_id)
            .values(lock_until=domain.clock.plus(-5))
        )
    answers = await _settled(*(_submit(domain, Lease(j.job_id, "w1", 1)) for j in jobs))
    assert isinstance(answers[2], AppError) and answers[2].code == ErrorCode.LOCK_NOT_HELD
    assert [getattr(a, "status", None) for i, a in enumerate(answers) if i != 2] == [
        "succeeded"
    ] * 3


async def test_group_commit_runs_a_lone_request_at_once_and_groups_what_queues() -> None:
    ran: list[list[int] | int] = []
    gate = asyncio.Event()

    async def one(item: int) -> int:
        ran.append(item)
        if item == 0:
            await gate.wait()
        return item * 10

    async def group(items: list[int]) -> list[int | None]:
        ran.append(list(items))
        return [None if i % 2 else i * 10 for i in items]  # odd ones go alone

    gc: GroupCommit[int, int] = GroupCommit(group, one, max_size=3, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(6)]
    await asyncio.sleep(0)
    assert ran == [0] and gc.in_flight == 1
    gate.set()
    assert await asyncio.gather(*calls) == [0, 10, 20, 30, 40, 50]
    assert ran[1] == [1, 2, 3] and [4, 5] in ran
    assert gc.in_flight == 0


async def test_a_group_that_fails_answers_each_request_alone() -> None:
    gate = asyncio.Event()

    async def one(item: int) -> int:
        if item == 0:
            await gate.wait()
        if item == 2:
            raise AppError(ErrorCode.LOCK_NOT_HELD, "no", None)
        return item

    async def group(items: list[int]) -> list[int | None]:
        raise RuntimeError("the group's transaction failed")

    gc: GroupCommit[int, int] = GroupCommit(group, one, max_size=10, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(4)]
    await asyncio.sleep(0)
    gate.set()
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[0] == 0 and got[1] == 1 and got[3] == 3
    assert isinstance(got[2], AppError) and got[2].code == ErrorCode.LOCK_NOT_HELD


async def test_a_caller_that_goes_away_leaves_its_group_whole() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def one(item: int) -> int:
        if item == 0:
            await gate.wait()
        return item

    async def group(items: list[int]) -> list[int | None]:
        await asyncio.sleep(0.01)
        done.extend(items)
        return list(items)

    gc: GroupCommit[int, int] = GroupCommit(group, one, max_size=10, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(4)]
    await asyncio.sleep(0)
    calls[2].cancel()
    gate.set()
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[0] == 0 and got[1] == 1 and got[3] == 3
    assert isinstance(got[2], asyncio.CancelledError)
    assert gc.in_flight == 0


def test_bounds_below_one_are_refused() -> None:
    async def one(item: int) -> int:
        return item

    async def group(items: list[int]) -> list[int | None]:
        return list(items)

    with pytest.raises(ValueError):
        GroupCommit(group, one, max_size=0, max_in_flight=1)
    with pytest.raises(ValueError):
        GroupCommit(group, one, max_size=1, max_in_flight=0)


async def test_claims_of_one_group_never_hand_out_a_job_twice(domain: JobDomain) -> None:
    """Callers with overlapping capabilities in one group: their picks run in one
    transaction before any lock and skip no row it locked itself, so they see the same
    first rows; the claims share them out, each job once, and leave none behind."""
    _one_at_a_time(domain)
    holders = ["w1", "w1", "w1", "w2"]
    running = []
    for holder in holders:
        await new_job(domain)
        running += (await domain.claim_started(holder, CAPS, 1, 0))[0]
    waiting = [await new_job(domain) for _ in range(5)]
    # the first goes alone and claims nothing; the other three queue as one group
    wants = [None, ClaimNext(CAPS, 2), ClaimNext([*CAPS, "quiz_generation"], 2), ClaimNext(CAPS, 2)]
    answers = await _settled(
        *(
            _submit(domain, Lease(job.job_id, holder, 1), claim_next=want)
            for job, holder, want in zip(running, holders, wants, strict=True)
        )
    )
    assert all(getattr(a, "status", None) == "succeeded" for a in answers), answers
    claimed = [(job.job_id, job.locked_by) for a in answers for job in a.claimed]
    ids = [job_id for job_id, _ in claimed]
    assert len(ids) == len(set(ids))  # no job handed out twice
    assert set(ids) == {job.job_id for job in waiting}  # and none left behind
    assert [len(a.claimed) for a in answers] == [0, 2, 2, 1]
    for a, holder in zip(answers, holders, strict=True):
        assert all(job.locked_by == holder and job.status == "running" for job in a.claimed)
    for job_id, holder in claimed:
        got = await domain.get(job_id)
        assert (got.status, got.locked_by, got.attempt_no) == ("running", holder, 1)
        events, _ = await domain.history(job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running"]


async def test_a_group_whose_results_are_refused_leaves_its_picks_pending(
    domain: JobDomain,
) -> None:
    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(3)]
    await domain.claim_started("w1", CAPS, 3, 0)
    waiting = [await new_job(domain) for _ in range(3)]
    answers = await _settled(
        *(
            _submit(
                domain,
                Lease(job.job_id, "w1", 1),
                output={"summary": 5},
                claim_next=ClaimNext(CAPS, 1),
            )
            for job in jobs
        )
    )
    assert all(isinstance(a, AppError) and a.code == ErrorCode.INVALID_SCHEMA for a in answers)
    for job in waiting:
        got = await domain.get(job.job_id)
        assert (got.status, got.locked_by, got.attempt_no) == ("pending", None, 0)


async def test_a_groups_succeeds_write_what_each_would_alone(domain: JobDomain) -> None:
    """A group's succeeds go as one UPDATE per run of holder, attempt, state and values;
    each job still gets its own columns and the very event a result alone appends."""
    _one_at_a_time(domain)
    holders = ["w1", "w1", "w1", "w2", "w2"]
    versions = ["v1", "v1", "v2", "v1", "v1"]
    running = []
    for holder in holders:
        await new_job(domain)
        running += (await domain.claim_started(holder, CAPS, 1, 0))[0]
    groups0, results0 = _groups_seen()
    answers = await _settled(
        *(
            domain.submit_result(
                Lease(job.job_id, holder, 1),
                prompt_version=f"learning_state_analysis.{version}",
                output_schema_version="v1",
                output=ANALYSIS_OUTPUT,
                calls=[_call()],
            )
            for job, holder, version in zip(running, holders, versions, strict=True)
        )
    )
    assert all(getattr(a, "status", None) == "succeeded" for a in answers), answers
    groups1, results1 = _groups_seen()
    assert (groups1 - groups0, results1 - results0) == (1, 4)  # the first went alone
    ends = []
    for job, holder, version in zip(running, holders, versions, strict=True):
        got = await domain.get(job.job_id)
        assert got.status == "succeeded" and got.lock_until is None
        assert got.prompt_version == f"learning_state_analysis.{version}"
        assert got.finished_at == got.updated_at
        events, invocations = await domain.history(job.job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running", "succeeded"]
        end = events[-1]
        assert end.at == got.updated_at
        assert (end.actor, end.attempt_no) == (f"runtime:{holder}", 1)
        assert len(invocations) == 1
        ends.append((end.from_status, end.to_status, end.error_code, end.model_provider))
    # the lone result's event and the group's are alike
    assert ends == [("running", "succeeded", None, None)] * len(running)


async def test_a_lease_that_lapses_inside_a_group_breaks_its_fence_and_each_runs_alone(
    domain: JobDomain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's read finds every lease live; one lapses before the UPDATE of its run.
    That UPDATE matches fewer rows than the run has, its fence breaks, nothing of the
    group is kept, and each result is answered alone: the lapsed one refused."""
    from sqlalchemy import update

    from job_service.store.tables import jobs as jobs_table

    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(4)]
    await domain.claim_started("w1", CAPS, 4, 0)
    lapsing = jobs[2].job_id
    async with domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs_table)
            .where(jobs_table.c.job_id == lapsing)
            .values(lock_until=domain.clock.plus(0.5))
        )
    completion = domain.completion
    prepare = completion._prepare
    waited: list[str] = []

    async def slow_prepare(db: Any, facts: Any, sub: Any) -> Any:
        if facts.job_id == lapsing and not waited:
            waited.append(facts.job_id)
            await asyncio.sleep(1.0)  # the lease lapses while the group is open
        return await prepare(db, facts, sub)

    monkeypatch.setattr(completion, "_prepare", slow_prepare)
    answers = await _settled(
        *(_submit(domain, Lease(j.job_id, "w1", 1), calls=[_call()]) for j in jobs)
    )
    assert waited == [lapsing]
    assert isinstance(answers[2], AppError) and answers[2].code == ErrorCode.LOCK_NOT_HELD
    assert [getattr(a, "status", None) for i, a in enumerate(answers) if i != 2] == [
        "succeeded"
    ] * 3
    got = await domain.get(lapsing)
    assert got.status == "running"  # left to the reaper, nothing of the group kept
    events, invocations = await domain.history(lapsing)
    assert [e.to_status for e in events] == ["pending", "locked", "running"]
    assert invocations == []
    for job in (jobs[1], jobs[3]):
        events, invocations = await domain.history(job.job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running", "succeeded"]
        assert len(invocations) == 1  # written once, by its own transaction
