"""The completer: reports (results and fails) that queue end in one transaction, through
one body for 1..N reports, and each gets its own answer (reference §2.3, §2.4, §2.5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from job_service import metrics
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.grouping import GroupCommit
from job_service.services.inputs import ModelCallInput
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


def _one_at_a_time(domain: JobDomain) -> None:
    """One completer transaction at a time: whatever arrives while it runs is one group."""
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


async def test_queued_results_commit_as_one_group(domain: JobDomain) -> None:
    _one_at_a_time(domain)
    await asyncio.gather(*(new_job(domain) for _ in range(10)))
    running, _ = await domain.claim_started("w1", CAPS, 10, 0)
    assert len(running) == 10
    groups0, results0 = _groups_seen()
    outcomes = await _settled(
        *(_submit(domain, Lease(job.job_id, "w1", 1), calls=[_call()]) for job in running)
    )
    groups1, results1 = _groups_seen()
    # the first ran at once as a group of one, the nine that queued behind it together
    assert (groups1 - groups0, results1 - results0) == (2, 10)
    assert all(o.status == "succeeded" and not o.replayed for o in outcomes)
    assert len({o.result_id for o in outcomes}) == 10
    for job in running:
        done = await domain.get(job.job_id)
        assert done.status == "succeeded" and done.lock_until is None
        events, invocations = await domain.history(job.job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running", "succeeded"]
        assert len(invocations) == 1


async def test_each_report_of_a_group_gets_its_own_answer(domain: JobDomain) -> None:
    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(8)]
    await domain.claim_started("w1", CAPS, 8, 0)
    first, plain, replayed, intruder, invalid, conflict, failing, cancelled = (
        Lease(j.job_id, "w1", 1) for j in jobs
    )
    before = await _submit(domain, replayed)
    other = await _submit(domain, conflict)
    await domain.cancel(cancelled.job_id, user_id=None, actor="admin")
    groups0, results0 = _groups_seen()
    answers = await _settled(
        _submit(domain, first),
        _submit(domain, plain, calls=[_call()]),
        _submit(domain, plain, calls=[_call()]),  # the same result twice: the next group's
        _submit(domain, replayed),
        _submit(domain, Lease(intruder.job_id, "intruder", 1)),
        _submit(domain, invalid, output={"summary": 5}, calls=[_call()]),
        _submit(domain, conflict, output={**ANALYSIS_OUTPUT, "summary": "another"}),
        domain.fail(failing, error_code="MODEL_TIMEOUT", error_message="slow", calls=[_call()]),
        _submit(domain, cancelled),  # a result committed before the cancel is seen wins
    )
    groups1, results1 = _groups_seen()
    # alone at once, then one group of seven, then the repeat of ``plain`` alone
    assert (groups1 - groups0, results1 - results0) == (3, 9)
    twice_a, twice_b, again, refused, bad, clash, retried, won = answers[1:]
    assert twice_a.status == twice_b.status == "succeeded"
    assert twice_a.result_id == twice_b.result_id
    assert (twice_a.replayed, twice_b.replayed) == (False, True)
    assert (again.replayed, again.result_id) == (True, before.result_id)
    assert isinstance(refused, AppError) and refused.code == ErrorCode.LOCK_NOT_HELD
    assert isinstance(bad, AppError) and bad.code == ErrorCode.INVALID_SCHEMA
    assert isinstance(clash, AppError) and clash.code == ErrorCode.RESULT_ALREADY_EXISTS
    assert (retried.status, retried.retry_count, retried.error_code) == (
        "pending",
        1,
        "MODEL_TIMEOUT",
    )
    assert won.status == "succeeded" and not won.replayed
    assert other.status == "succeeded"
    failed = await domain.get(invalid.job_id)
    assert (failed.status, failed.error_code) == ("failed", "INVALID_SCHEMA")
    assert (await domain.get(intruder.job_id)).status == "running"  # the holder may still
    _, invocations = await domain.history(plain.job_id)
    assert len(invocations) == 1  # the replay logged none
    for lease in (invalid, failing):
        events, invocations = await domain.history(lease.job_id)
        assert len(invocations) == 1  # logged with the ending
        assert events[-1].actor == "runtime:w1" and events[-1].error_code in (
            "INVALID_SCHEMA",
            "MODEL_TIMEOUT",
        )


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
    ran: list[list[int]] = []
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        ran.append(list(items))
        if items == [0]:
            await gate.wait()
        return [i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(run, key=lambda i: i, max_size=3, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(6)]
    await asyncio.sleep(0)
    assert ran == [[0]] and gc.in_flight == 1
    gate.set()
    assert await asyncio.gather(*calls) == [0, 10, 20, 30, 40, 50]
    assert ran[1:] == [[1, 2, 3], [4, 5]]
    assert gc.in_flight == 0


async def test_requests_of_one_key_never_share_a_group() -> None:
    ran: list[list[str]] = []
    gate = asyncio.Event()

    async def run(items: list[str]) -> list[str]:
        ran.append(list(items))
        if items == ["x"]:
            await gate.wait()
        return items

    gc: GroupCommit[str, str] = GroupCommit(run, key=lambda s: s[0], max_size=10, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in ("x", "a1", "b", "a2", "c", "a3")]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*calls)
    assert ran == [["x"], ["a1", "b", "c"], ["a2"], ["a3"]]


async def test_a_group_that_fails_gives_each_request_its_error() -> None:
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        if items == [0]:
            await gate.wait()
            return [0]
        raise RuntimeError("the group's transaction failed")

    gc: GroupCommit[int, int] = GroupCommit(run, key=lambda i: i, max_size=10, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(4)]
    await asyncio.sleep(0)
    gate.set()
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[0] == 0
    assert all(isinstance(g, RuntimeError) for g in got[1:])
    assert gc.in_flight == 0


async def test_a_caller_that_goes_away_leaves_its_group_whole() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def run(items: list[int]) -> list[int]:
        if items == [0]:
            await gate.wait()
        await asyncio.sleep(0.01)
        done.extend(items)
        return list(items)

    gc: GroupCommit[int, int] = GroupCommit(run, key=lambda i: i, max_size=10, max_in_flight=1)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(4)]
    await asyncio.sleep(0)
    calls[2].cancel()
    gate.set()
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[0] == 0 and got[1] == 1 and got[3] == 3
    assert isinstance(got[2], asyncio.CancelledError)
    assert sorted(done) == [0, 1, 2, 3]  # the group still ended its third request
    assert gc.in_flight == 0


def test_bounds_below_one_are_refused() -> None:
    async def run(items: list[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError):
        GroupCommit(run, key=lambda i: i, max_size=0, max_in_flight=1)
    with pytest.raises(ValueError):
        GroupCommit(run, key=lambda i: i, max_size=1, max_in_flight=0)


async def test_a_groups_endings_write_what_each_would_alone(domain: JobDomain) -> None:
    """A group ends its jobs with one UPDATE per transition, each job under its own
    fencing token and with its own columns, and the very event a report alone appends."""
    _one_at_a_time(domain)
    holders = ["w1", "w1", "w1", "w2", "w2", "w2"]
    versions = ["v1", "v1", "v2", "v1", "v1", "v1"]
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
            for job, holder, version in zip(running[:5], holders, versions, strict=False)
        ),
        domain.fail(
            Lease(running[5].job_id, "w2", 1),
            error_code="MODEL_BAD_REQUEST",
            error_message="ours",
            calls=[_call()],
        ),
    )
    assert all(getattr(a, "status", None) in ("succeeded", "failed") for a in answers), answers
    groups1, results1 = _groups_seen()
    assert (groups1 - groups0, results1 - results0) == (2, 6)  # the first went alone
    ends = []
    for job, holder, version in zip(running, holders, versions, strict=True):
        got = await domain.get(job.job_id)
        assert got.status in ("succeeded", "failed") and got.lock_until is None
        if got.status == "succeeded":
            assert got.prompt_version == f"learning_state_analysis.{version}"
        assert got.finished_at == got.updated_at
        events, invocations = await domain.history(job.job_id)
        assert [e.to_status for e in events][:3] == ["pending", "locked", "running"]
        end = events[-1]
        assert end.at == got.updated_at
        assert (end.actor, end.attempt_no) == (f"runtime:{holder}", 1)
        assert len(invocations) == 1
        ends.append((end.from_status, end.to_status, end.error_code, end.model_provider))
    assert ends == [("running", "succeeded", None, None)] * 5 + [
        ("running", "failed", "MODEL_BAD_REQUEST", None)
    ]


async def test_a_lease_that_lapses_inside_a_group_breaks_its_fence_and_the_set_runs_again(
    domain: JobDomain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's read finds every lease live; one lapses before the UPDATE. The UPDATE
    matches fewer rows than it has jobs, its fence breaks, nothing of the group is
    kept, and the set runs again: its read refuses the lapsed lease, the rest commit."""
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
    learning = domain.core.learning
    prepare = learning.prepare_result
    waited: list[str] = []

    async def slow_prepare(db: Any, **kw: Any) -> Any:
        if kw["job_id"] == lapsing and not waited:
            waited.append(kw["job_id"])
            await asyncio.sleep(1.0)  # the lease lapses while the group is open
        return await prepare(db, **kw)

    monkeypatch.setattr(learning, "prepare_result", slow_prepare)
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
        assert len(invocations) == 1  # written once


async def test_a_platform_success_after_failures_in_one_group_resets_the_breaker(
    domain: JobDomain,
) -> None:
    """Breaker feeding inside one set goes in report order, each on the row as the set's
    earlier endings left it: two failures, then a success, leave it closed at 0."""
    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(4)]
    await domain.claim_started("w1", CAPS, 4, 0)
    leases = [Lease(j.job_id, "w1", 1) for j in jobs]
    await _settled(
        _submit(domain, leases[0]),
        domain.fail(leases[1], error_code="MODEL_TIMEOUT", error_message="slow"),
        domain.fail(leases[2], error_code="TEMPORARY_PROVIDER_ERROR", error_message="503"),
        _submit(domain, leases[3]),
    )
    view = await domain.breaker_view()
    assert (view.state, view.consecutive_failures) == ("closed", 0)


async def test_queued_results_share_one_claim_of_their_next_jobs(domain: JobDomain) -> None:
    """Each result asks for the next job of its slot (``claim_next``): a group's claims
    are one round of picks in the group's transaction, each result its own job, none
    handed out twice, each started with its snapshot."""
    _one_at_a_time(domain)
    made = [await new_job(domain) for _ in range(20)]
    running, _ = await domain.claim_started("w1", CAPS, 10, 0)
    outcomes = await _settled(
        *(
            _submit(domain, Lease(job.job_id, "w1", 1), calls=[_call()], claim_next=(CAPS, 1))
            for job in running
        )
    )
    assert all(o.status == "succeeded" and not o.replayed for o in outcomes), outcomes
    claimed = [job for o in outcomes for job in o.claimed.jobs]
    assert all(len(o.claimed.jobs) == 1 for o in outcomes)
    assert len({job.job_id for job in claimed}) == 10  # no job handed out twice
    assert {job.job_id for job in claimed} == {j.job_id for j in made} - {j.job_id for j in running}
    for o in outcomes:
        [job] = o.claimed.jobs
        assert job.status == "running" and job.locked_by == "w1"
        assert o.claimed.snapshots[job.job_id].snapshot_id == job.snapshot_id
        events, _ = await domain.history(job.job_id)
        assert [e.to_status for e in events] == ["pending", "locked", "running"]


async def test_claims_of_one_group_never_hand_out_a_job_twice(domain: JobDomain) -> None:
    """Callers with overlapping capabilities in one group: their picks run in one
    transaction and skip no row it locked itself, so they see the same first rows; the
    claims share them out, each job once, and leave none behind."""
    _one_at_a_time(domain)
    holders = ["w1", "w1", "w1", "w2"]
    running = []
    for holder in holders:
        await new_job(domain)
        running += (await domain.claim_started(holder, CAPS, 1, 0))[0]
    waiting = [await new_job(domain) for _ in range(5)]
    # the first goes alone and claims nothing; the other three queue as one group
    wants = [None, (CAPS, 2), ([*CAPS, "quiz_generation"], 2), (CAPS, 2)]
    answers = await _settled(
        *(
            _submit(domain, Lease(job.job_id, holder, 1), claim_next=want)
            for job, holder, want in zip(running, holders, wants, strict=True)
        )
    )
    assert all(getattr(a, "status", None) == "succeeded" for a in answers), answers
    got = [a.claimed.jobs if a.claimed else [] for a in answers]
    ids = [job.job_id for jobs in got for job in jobs]
    assert len(ids) == len(set(ids))  # no job handed out twice
    assert set(ids) == {job.job_id for job in waiting}  # and none left behind
    assert [len(jobs) for jobs in got] == [0, 2, 2, 1]
    for jobs, holder in zip(got, holders, strict=True):
        assert all(job.locked_by == holder and job.status == "running" for job in jobs)


async def test_a_group_whose_results_are_refused_leaves_its_picks_pending(
    domain: JobDomain,
) -> None:
    """Only a result taken claims: invalid outputs (INVALID_SCHEMA) claim nothing, and
    the jobs their picks read stay pending, untouched."""
    _one_at_a_time(domain)
    jobs = [await new_job(domain) for _ in range(3)]
    await domain.claim_started("w1", CAPS, 3, 0)
    waiting = [await new_job(domain) for _ in range(3)]
    answers = await _settled(
        *(
            _submit(domain, Lease(job.job_id, "w1", 1), output={"summary": 5}, claim_next=(CAPS, 1))
            for job in jobs
        )
    )
    assert all(isinstance(a, AppError) and a.code == ErrorCode.INVALID_SCHEMA for a in answers)
    for job in waiting:
        got = await domain.get(job.job_id)
        assert (got.status, got.locked_by, got.attempt_no) == ("pending", None, 0)
