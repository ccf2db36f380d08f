"""The console's reads (reference §9.5): counts for a filter, the time-range list, a job
explained attempt by attempt, jobs ended per minute. On SQLite and MariaDB."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, inspect

from airuntime_common.enums import JOB_STATUS
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.timeutil import to_timestamp
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from job_service.services.inputs import ModelCallInput
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, Server, new_job
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

CAPS = ["learning_state_analysis"]


def _call(outcome: str, code: str | None, latency: int) -> ModelCallInput:
    return ModelCallInput(
        "deepseek", "deepseek-chat", None, None, 100, 20, 0, latency, outcome, code, "req-1"
    )


async def _failed_twice(domain: JobDomain) -> str:
    """u1's job: attempt 1 on w1 ends MODEL_TIMEOUT (retried), attempt 2 on w2 MODEL_BAD_REQUEST."""
    job = await new_job(domain, max_retry_count=1)
    assert [j.job_id for j in await domain.claim("w1", CAPS, 1, 0)] == [job.job_id]
    await domain.fail(
        Lease(job.job_id, "w1", 1),
        error_code="MODEL_TIMEOUT",
        error_message="slow",
        calls=[_call("failed", "MODEL_TIMEOUT", 3000)],
    )
    assert [j.job_id for j in await domain.claim("w2", CAPS, 1, 0)] == [job.job_id]
    await domain.start(Lease(job.job_id, "w2", 2))
    after = await domain.fail(
        Lease(job.job_id, "w2", 2),
        error_code="MODEL_BAD_REQUEST",
        error_message="400 from the model",
        calls=[_call("failed", "MODEL_BAD_REQUEST", 40)],
    )
    assert after.status == "failed"
    return job.job_id


async def _succeeded(domain: JobDomain, user: str) -> str:
    job = await new_job(domain, user_id=user)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.submit_result(
        Lease(job.job_id, "w1", 1),
        prompt_version="p1",
        output_schema_version="v1",
        output=ANALYSIS_OUTPUT,
        calls=[_call("succeeded", None, 120)],
    )
    return job.job_id


async def test_a_failed_job_is_explained_attempt_by_attempt(domain: JobDomain) -> None:
    job_id = await _failed_twice(domain)
    told = await domain.explain(job_id)
    assert told.job.error_code == "MODEL_BAD_REQUEST"
    assert [a.attempt_no for a in told.attempts] == [1, 2]
    first, second = told.attempts
    assert (first.runtime_instance_id, first.outcome, first.error_code) == (
        "w1",
        "pending",
        "MODEL_TIMEOUT",
    )
    assert [i.error_code for i in first.invocations] == ["MODEL_TIMEOUT"]
    assert first.latency_ms == 3000
    assert (second.runtime_instance_id, second.outcome, second.error_code) == (
        "w2",
        "failed",
        "MODEL_BAD_REQUEST",
    )
    assert [e.to_status for e in second.events] == ["locked", "running", "failed"]
    assert second.started_at is not None and second.ended_at is not None
    assert second.started_at <= second.ended_at
    # every event is in the timeline; only the creation belongs to no attempt
    assert len(told.events) == 1 + len(first.events) + len(second.events)
    assert told.events[0].to_status == "pending" and told.events[0].attempt_no == 0
    assert told.snapshot is not None and told.snapshot.snapshot_id == told.job.snapshot_id
    assert told.snapshot.payload_bytes > 0


async def test_a_running_attempt_has_no_outcome(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("w1", CAPS, 1, 0)
    await domain.cancel(job.job_id, user_id=None, actor="admin:a")  # leased: a request only
    (attempt,) = (await domain.explain(job.job_id)).attempts
    assert attempt.outcome is None and attempt.ended_at is None
    assert [e.to_status for e in attempt.events] == ["locked", "locked"]


async def test_explain_an_unknown_job_is_job_not_found(domain: JobDomain) -> None:
    with pytest.raises(AppError) as err:
        await domain.explain("no-such-job")
    assert err.value.code == ErrorCode.JOB_NOT_FOUND


async def test_counts_follow_every_filter_but_the_status(domain: JobDomain) -> None:
    failed = await _failed_twice(domain)
    await _succeeded(domain, "u2")
    pending = (await new_job(domain, job_type="weak_point_analysis")).job_id

    mine = await domain.job_counts(user_id="u1", job_type=None, created_from=None, created_to=None)
    assert mine == {
        "pending": 1,
        "locked": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 1,
        "cancelled": 0,
    }
    everyone = await domain.job_counts(
        user_id=None, job_type=None, created_from=None, created_to=None
    )
    assert (everyone["pending"], everyone["failed"], everyone["succeeded"]) == (1, 1, 1)
    typed = await domain.job_counts(
        user_id=None, job_type="weak_point_analysis", created_from=None, created_to=None
    )
    assert sum(typed.values()) == typed["pending"] == 1

    created = (await domain.get(pending)).created_at
    later = await domain.job_counts(
        user_id=None,
        job_type=None,
        created_from=created + timedelta(hours=1),
        created_to=created + timedelta(hours=2),
    )
    assert sum(later.values()) == 0
    rows, token = await domain.list_jobs(
        user_id="u1",
        status=None,
        job_type=None,
        page_size=10,
        page_token="",
        created_from=created - timedelta(hours=1),
        created_to=created + timedelta(hours=1),
    )
    assert [j.job_id for j in rows] == [pending, failed] and token == ""
    rows, _ = await domain.list_jobs(
        user_id=None,
        status="failed",
        job_type=None,
        page_size=10,
        page_token="",
        created_from=created + timedelta(seconds=1),
        created_to=None,
    )
    assert rows == []


async def test_an_empty_creation_range_is_invalid(domain: JobDomain) -> None:
    job = await new_job(domain)
    with pytest.raises(AppError) as err:
        await domain.job_counts(
            user_id=None, job_type=None, created_from=job.created_at, created_to=job.created_at
        )
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert err.value.details == {"field": "createdFrom"}


async def test_throughput_counts_ended_jobs_per_minute(domain: JobDomain) -> None:
    empty = await domain.throughput(1)
    assert (empty.minutes, empty.failure_rate) == ([], None)
    failed = await _failed_twice(domain)
    await _succeeded(domain, "u2")
    await _succeeded(domain, "u3")
    cancelled = await new_job(domain, user_id="u4")
    await domain.cancel(cancelled.job_id, user_id=None, actor="admin:a")
    await new_job(domain, user_id="u5")  # pending: not ended

    view = await domain.throughput(0)
    assert view.until - view.since == timedelta(hours=6)
    assert (view.succeeded, view.failed, view.cancelled) == (2, 1, 1)
    assert view.failure_rate == pytest.approx(1 / 3)
    assert sum(m[1] + m[2] + m[3] for m in view.minutes) == 4
    ended = (await domain.get(failed)).finished_at
    assert ended is not None
    minute = ended.replace(second=0, microsecond=0)
    assert minute in [m[0] for m in view.minutes]
    assert all(view.since - timedelta(minutes=1) <= m[0] <= view.until for m in view.minutes)


@pytest.mark.parametrize("hours", [-1, 169])
async def test_throughput_hours_are_bounded(domain: JobDomain, hours: int) -> None:
    with pytest.raises(AppError) as err:
        await domain.throughput(hours)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


async def test_the_console_rpcs_over_grpc(server: Server) -> None:
    job_id = await _failed_twice(server.domain)
    created = (await server.domain.get(job_id)).created_at
    listed = await server.stub.ListJobs(
        rr.ListJobsRequest(
            include_counts=True,
            created_from=to_timestamp(created - timedelta(minutes=1)),
            created_to=to_timestamp(created + timedelta(minutes=1)),
        ),
        metadata=server.md(),
    )
    assert [j.job_id for j in listed.jobs] == [job_id]
    counts = {JOB_STATUS.to_str(c.status): c.count for c in listed.counts}
    assert counts["failed"] == 1 and sum(counts.values()) == 1 and len(counts) == 6

    told = await server.stub.GetJob(
        rr.GetJobRequest(job_id=job_id, include_history=True), metadata=server.md()
    )
    assert [a.attempt_no for a in told.attempts] == [1, 2]
    assert told.attempts[1].error_code == "MODEL_BAD_REQUEST"
    assert JOB_STATUS.to_str(told.attempts[0].outcome) == "pending"
    assert told.attempts[1].invocations[0].latency_ms == 40
    assert told.HasField("snapshot") and told.snapshot.snapshot_id

    rate = await server.stub.GetJobThroughput(
        rr.GetJobThroughputRequest(hours=2), metadata=server.md()
    )
    assert (rate.failed, rate.succeeded, rate.failure_rate) == (1, 0, 1.0)
    assert rate.to_time.ToDatetime() - rate.from_time.ToDatetime() == timedelta(hours=2)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.ListJobs(
            rr.ListJobsRequest(
                created_from=to_timestamp(created), created_to=to_timestamp(created)
            ),
            metadata=server.md(),
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.GetJobThroughput(
            rr.GetJobThroughputRequest(hours=1000), metadata=server.md()
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_migrations_make_the_console_indexes(tmp_path: Path) -> None:
    """Migration 0011 makes the indexes ``store/tables.py`` declares for these reads."""
    from job_service.migrate import upgrade_head
    from job_service.store.tables import jobs

    path = tmp_path / "migrated.db"
    upgrade_head(f"sqlite+aiosqlite:///{path}")
    engine = create_engine(f"sqlite:///{path}")
    try:
        found = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes(jobs.name)}
    finally:
        engine.dispose()
    for name in ("ix_jobs_created_status", "ix_jobs_finished_status"):
        declared = next(i for i in jobs.indexes if i.name == name)
        assert found[name] == [c.name for c in declared.columns]
