"""JobService over real gRPC: transition matrix, error codes, runtime contract (reference §2.3, §3, §4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, TOKEN, Server
from zhixi.airuntime.common.v1 import message_pb2 as common
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

LSA = common.JOB_TYPE_LEARNING_STATE_ANALYSIS
ST = common.JobStatus


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


async def expect(code: str, grpc_code: grpc.StatusCode, call: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc_code
    assert from_rpc_error(err.value).code == code


async def create(srv: Server, **kw: Any) -> Any:
    req = rr.CreateJobRequest(
        user_id=kw.pop("user_id", "u1"),
        job_type=kw.pop("job_type", LSA),
        target_type=kw.pop("target_type", common.TARGET_TYPE_USER),
        target_id=kw.pop("target_id", "u1"),
        actor="user:u1",
        **kw,
    )
    return await srv.stub.CreateJob(req, metadata=srv.md())


async def job_in_state(srv: Server, state: str) -> str:
    """A job in ``state``, leased (if ever) by w1 as attempt 1."""
    job_id: str = (await create(srv)).job.job_id
    if state == "pending":
        return job_id
    if state == "cancelled":
        await srv.stub.CancelJob(
            rr.CancelJobRequest(job_id=job_id, actor="user:u1"), metadata=srv.md()
        )
        return job_id
    await srv.stub.LockJob(rr.LockJobRequest(job_id=job_id), metadata=srv.md("w1"))
    if state == "locked":
        return job_id
    if state == "running":
        await srv.stub.StartJob(
            rr.StartJobRequest(job_id=job_id, attempt_no=1), metadata=srv.md("w1")
        )
    elif state == "succeeded":
        await srv.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=job_id,
                attempt_no=1,
                output_schema_version="v1",
                output=_struct(ANALYSIS_OUTPUT),
            ),
            metadata=srv.md("w1"),
        )
    elif state == "failed":
        await srv.stub.FailJob(
            rr.FailJobRequest(
                job_id=job_id, attempt_no=1, error_code="MODEL_BAD_REQUEST", error_message="x"
            ),
            metadata=srv.md("w1"),
        )
    return job_id


STATES = ["pending", "locked", "running", "succeeded", "failed", "cancelled"]
OK = "OK"
NH = ("LOCK_NOT_HELD", grpc.StatusCode.FAILED_PRECONDITION)
IS = ("INVALID_JOB_STATE", grpc.StatusCode.FAILED_PRECONDITION)
AL = ("JOB_ALREADY_LOCKED", grpc.StatusCode.ABORTED)
RE = ("RESULT_ALREADY_EXISTS", grpc.StatusCode.ALREADY_EXISTS)

# operation → caller → {state: expected}
MATRIX: dict[tuple[str, str], dict[str, Any]] = {
    ("lock", "other"): {
        "pending": OK,
        "locked": AL,
        "running": AL,
        "succeeded": IS,
        "failed": IS,
        "cancelled": IS,
    },
    ("start", "holder"): {
        "pending": NH,
        "locked": OK,
        "running": OK,
        "succeeded": NH,
        "failed": NH,
        "cancelled": NH,
    },
    ("start", "other"): dict.fromkeys(STATES, NH),
    ("heartbeat", "holder"): {
        "pending": NH,
        "locked": OK,
        "running": OK,
        "succeeded": NH,
        "failed": NH,
        "cancelled": NH,
    },
    ("heartbeat", "other"): dict.fromkeys(STATES, NH),
    ("result", "holder"): {
        "pending": NH,
        "locked": OK,
        "running": OK,
        "succeeded": OK,
        "failed": NH,
        "cancelled": NH,
    },
    ("result", "other"): {**dict.fromkeys(STATES, NH), "succeeded": RE},
    ("fail", "holder"): {
        "pending": NH,
        "locked": OK,
        "running": OK,
        "succeeded": NH,
        "failed": OK,
        "cancelled": NH,
    },
    ("fail", "other"): dict.fromkeys(STATES, NH),
    ("cancel", "user"): {
        "pending": OK,
        "locked": OK,
        "running": OK,
        "succeeded": IS,
        "failed": IS,
        "cancelled": IS,
    },
}


async def _call(srv: Server, op: str, caller: str, job_id: str) -> Any:
    inst = "w1" if caller == "holder" else "w2"
    md = srv.md(inst)
    if op == "lock":
        return await srv.stub.LockJob(rr.LockJobRequest(job_id=job_id), metadata=md)
    if op == "start":
        return await srv.stub.StartJob(rr.StartJobRequest(job_id=job_id, attempt_no=1), metadata=md)
    if op == "heartbeat":
        return await srv.stub.Heartbeat(
            rr.HeartbeatRequest(job_id=job_id, attempt_no=1), metadata=md
        )
    if op == "result":
        output = ANALYSIS_OUTPUT if caller == "holder" else {**ANALYSIS_OUTPUT, "summary": "other"}
        return await srv.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=job_id, attempt_no=1, output_schema_version="v1", output=_struct(output)
            ),
            metadata=md,
        )
    if op == "fail":
        return await srv.stub.FailJob(
            rr.FailJobRequest(
                job_id=job_id, attempt_no=1, error_code="MODEL_BAD_REQUEST", error_message="x"
            ),
            metadata=md,
        )
    return await srv.stub.CancelJob(
        rr.CancelJobRequest(job_id=job_id, user_id="u1", actor="user:u1"), metadata=srv.md()
    )


async def test_transition_matrix(server: Server) -> None:
    for (op, caller), row in MATRIX.items():
        for state, expected in row.items():
            job_id = await job_in_state(server, state)
            get = rr.GetJobRequest(job_id=job_id, include_history=True)
            before = await server.stub.GetJob(get, metadata=server.md())
            where = f"{op}/{caller}/{state}"
            if expected == OK:
                await _call(server, op, caller, job_id)
                continue
            code, grpc_code = expected
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(server, op, caller, job_id)
            assert (from_rpc_error(err.value).code, err.value.code()) == (code, grpc_code), where
            after = await server.stub.GetJob(get, metadata=server.md())
            assert after == before, f"job changed on refused {where}"


async def test_runtime_flow_and_views(server: Server) -> None:
    created = await create(server, idempotency_key="k1")
    again = await create(server, idempotency_key="k1")
    assert not created.replayed and again.replayed and again.job.job_id == created.job.job_id
    job = created.job
    assert job.status == ST.Value("JOB_STATUS_PENDING") and job.HasField("created_at")
    assert not job.HasField("lock_until") and not job.HasField("locked_by")

    polled = await server.stub.PollJobs(
        # a repeated capability is kept once (the health view below lists [LSA])
        rr.PollJobsRequest(capabilities=[LSA, LSA], limit=5, status_address="127.0.0.1:1"),
        metadata=server.md("w1"),
    )
    assert [j.job_id for j in polled.jobs] == [job.job_id]
    claimed = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA, LSA], limit=5), metadata=server.md("w1")
    )
    [c] = claimed.jobs
    assert c.status == ST.Value("JOB_STATUS_LOCKED") and c.locked_by == "w1" and c.attempt_no == 1
    assert c.HasField("lock_until")

    verify = await server.stub.VerifyLease(
        rr.VerifyLeaseRequest(job_id=c.job_id, runtime_instance_id="w1", attempt_no=1),
        metadata=server.md(),
    )
    assert verify.user_id == "u1" and verify.api_key_mode == common.API_KEY_MODE_PLATFORM_KEY
    await expect(
        "LOCK_NOT_HELD",
        grpc.StatusCode.FAILED_PRECONDITION,
        server.stub.VerifyLease(
            rr.VerifyLeaseRequest(job_id=c.job_id, runtime_instance_id="w2", attempt_no=1),
            metadata=server.md(),
        ),
    )
    snap = await server.stub.GetSnapshot(
        rr.GetSnapshotRequest(job_id=c.job_id, attempt_no=1), metadata=server.md("w1")
    )
    assert snap.snapshot_id == c.snapshot_id and snap.payload["userId"] == "u1"
    # reading the snapshot implied start
    view = await server.stub.GetJob(rr.GetJobRequest(job_id=c.job_id), metadata=server.md())
    assert view.job.status == ST.Value("JOB_STATUS_RUNNING") and view.job.HasField("started_at")

    beat = await server.stub.HeartbeatLeases(
        rr.HeartbeatLeasesRequest(
            leases=[{"job_id": c.job_id, "attempt_no": 1}, {"job_id": "nope", "attempt_no": 1}]
        ),
        metadata=server.md("w1"),
    )
    assert [x.held for x in beat.leases] == [True, False]

    inv = await server.stub.RecordInvocation(
        rr.RecordInvocationRequest(
            job_id=c.job_id,
            attempt_no=1,
            model_provider="deepseek",
            model_name="deepseek-chat",
            api_key_mode=common.API_KEY_MODE_PLATFORM_KEY,
            prompt_tokens=1000,
            completion_tokens=500,
            cache_hit_tokens=200,
            latency_ms=1200,
            outcome="succeeded",
            provider_request_id="req-1",
        ),
        metadata=server.md("w1"),
    )
    assert inv.id
    res = await server.stub.SubmitResult(
        rr.SubmitResultRequest(
            job_id=c.job_id,
            attempt_no=1,
            prompt_version="learning_state_analysis.v1",
            output_schema_version="v1",
            output=_struct(ANALYSIS_OUTPUT),
        ),
        metadata=server.md("w1"),
    )
    assert res.status == ST.Value("JOB_STATUS_SUCCEEDED") and res.result_id and not res.replayed
    replay = await server.stub.SubmitResult(
        rr.SubmitResultRequest(
            job_id=c.job_id,
            attempt_no=1,
            output_schema_version="v1",
            output=_struct(ANALYSIS_OUTPUT),
        ),
        metadata=server.md("w1"),
    )
    assert (
        replay.replayed
        and replay.result_id == res.result_id
        and replay.output_hash == res.output_hash
    )

    full = await server.stub.GetJob(
        rr.GetJobRequest(job_id=c.job_id, include_history=True), metadata=server.md()
    )
    assert [e.to_status for e in full.events] == [
        ST.Value("JOB_STATUS_PENDING"),
        ST.Value("JOB_STATUS_LOCKED"),
        ST.Value("JOB_STATUS_RUNNING"),
        ST.Value("JOB_STATUS_SUCCEEDED"),
    ]
    assert full.events[0].from_status == 0
    [logged] = full.invocations
    assert (
        logged.prompt_tokens == 1000
        and logged.cost_usd > 0
        and logged.provider_request_id == "req-1"
    )

    health = await server.stub.GetRuntimeHealth(rr.GetRuntimeHealthRequest(), metadata=server.md())
    assert health.status == "SERVING"
    [w] = [
        x for x in health.workers if not x.instance_id.startswith("biz-")
    ]  # FakeLearning markers
    assert (
        w.instance_id == "w1"
        and list(w.capabilities) == [LSA]
        and w.status_address == "127.0.0.1:1"
    )

    listed = await server.stub.ListJobs(
        rr.ListJobsRequest(user_id="u1", page_size=10), metadata=server.md()
    )
    assert [j.job_id for j in listed.jobs] == [c.job_id] and listed.next_page_token == ""
    costs = await server.stub.GetCosts(
        rr.GetCostsRequest(from_date="2000-01-01", to_date="2100-01-01", group_by="jobType"),
        metadata=server.md(),
    )
    assert [(r.key, r.calls, r.prompt_tokens) for r in costs.rows] == [
        ("learning_state_analysis", 1, 1000)
    ]
    breaker = await server.stub.GetCircuitBreaker(
        rr.GetCircuitBreakerRequest(), metadata=server.md()
    )
    assert breaker.breaker.state == 1  # closed
    reset = await server.stub.ResetCircuitBreaker(
        rr.ResetCircuitBreakerRequest(), metadata=server.md()
    )
    assert reset.breaker.state == 1


async def test_errors_over_grpc(server: Server) -> None:
    stub = server.stub
    await expect(
        "UNAUTHENTICATED",
        grpc.StatusCode.UNAUTHENTICATED,
        stub.GetJob(rr.GetJobRequest(job_id="x"), metadata=(("x-internal-api-key", "wrong"),)),
    )
    await expect(
        "JOB_NOT_FOUND",
        grpc.StatusCode.NOT_FOUND,
        stub.GetJob(rr.GetJobRequest(job_id="x"), metadata=server.md()),
    )
    job_id = (await create(server)).job.job_id
    await expect(
        "JOB_NOT_FOUND",
        grpc.StatusCode.NOT_FOUND,
        stub.GetJob(rr.GetJobRequest(job_id=job_id, user_id="u2"), metadata=server.md()),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.CreateJob(
            rr.CreateJobRequest(user_id="u1", target_type=common.TARGET_TYPE_USER, target_id="u1"),
            metadata=server.md(),
        ),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.CreateJob(
            rr.CreateJobRequest(
                user_id="u1",
                job_type=LSA,
                target_type=99,  # type: ignore[arg-type]
                target_id="u1",
            ),
            metadata=server.md(),
        ),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        create(
            server,
            job_type=common.JOB_TYPE_QUIZ_GENERATION,
            target_type=common.TARGET_TYPE_MATERIAL,
            target_id="m1",
            params=_struct({"count": 99}),
        ),
    )
    await expect(
        "NOT_FOUND",
        grpc.StatusCode.NOT_FOUND,
        create(server, target_type=common.TARGET_TYPE_MATERIAL, target_id="missing-m"),
    )
    # runtime calls need the instance id
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.PollJobs(rr.PollJobsRequest(capabilities=[LSA]), metadata=server.md()),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.PollJobs(rr.PollJobsRequest(capabilities=[]), metadata=server.md("w")),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.ClaimJobs(rr.ClaimJobsRequest(capabilities=[LSA], limit=-1), metadata=server.md("w")),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.PollJobs(
            rr.PollJobsRequest(capabilities=[LSA], wait_ms=20001), metadata=server.md("w")
        ),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.Heartbeat(rr.HeartbeatRequest(job_id=job_id, attempt_no=0), metadata=server.md("w")),
    )
    await expect(
        "JOB_NOT_FOUND",
        grpc.StatusCode.NOT_FOUND,
        stub.LockJob(rr.LockJobRequest(job_id="nope"), metadata=server.md("w")),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.ListJobs(rr.ListJobsRequest(page_size=101), metadata=server.md()),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.GetCosts(
            rr.GetCostsRequest(from_date="x", to_date="y", group_by="day"), metadata=server.md()
        ),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.RecordInvocation(
            rr.RecordInvocationRequest(job_id=job_id, outcome="meh"), metadata=server.md("w")
        ),
    )
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.FailJob(
            rr.FailJobRequest(job_id=job_id, attempt_no=1, error_code=""), metadata=server.md("w")
        ),
    )


async def test_invalid_schema_result_over_grpc(server: Server) -> None:
    job_id = await job_in_state(server, "running")
    await expect(
        "INVALID_SCHEMA",
        grpc.StatusCode.INVALID_ARGUMENT,
        server.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=job_id,
                attempt_no=1,
                output_schema_version="v1",
                output=_struct({"items": []}),
            ),
            metadata=server.md("w1"),
        ),
    )
    view = await server.stub.GetJob(rr.GetJobRequest(job_id=job_id), metadata=server.md())
    assert (
        view.job.status == ST.Value("JOB_STATUS_FAILED") and view.job.error_code == "INVALID_SCHEMA"
    )


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
async def test_a_number_json_cannot_carry_is_invalid_argument_and_changes_nothing(
    server: Server, number: float
) -> None:
    """A Struct can hold NaN and ±Infinity, a JSON document cannot: a result or params
    holding one is refused at the boundary (it used to be a 500), anywhere in it."""
    job_id = await job_in_state(server, "running")
    output = {**ANALYSIS_OUTPUT, "extra": {"deep": [1, number]}}
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        server.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=job_id, attempt_no=1, output_schema_version="v1", output=_struct(output)
            ),
            metadata=server.md("w1"),
        ),
    )
    view = await server.stub.GetJob(rr.GetJobRequest(job_id=job_id), metadata=server.md())
    assert view.job.status == ST.Value("JOB_STATUS_RUNNING")
    params = struct_pb2.Struct()
    params.update({"count": number})
    await expect(
        "INVALID_ARGUMENT",
        grpc.StatusCode.INVALID_ARGUMENT,
        create(server, job_type=common.JOB_TYPE_FLASHCARD_GENERATION, params=params),
    )


async def test_authorization_rpcs(server: Server) -> None:
    job_id = await job_in_state(server, "pending")
    got = await server.stub.GetAiAuthorization(
        rr.GetAiAuthorizationRequest(user_id="u1"), metadata=server.md()
    )
    assert got.granted and not got.HasField("changed_at")
    off = await server.stub.SetAiAuthorization(
        rr.SetAiAuthorizationRequest(user_id="u1", granted=False), metadata=server.md()
    )
    assert (off.granted, off.cancelled, off.cancel_requested) == (False, 1, 0) and off.HasField(
        "changed_at"
    )
    await expect("AI_NOT_AUTHORIZED", grpc.StatusCode.PERMISSION_DENIED, create(server))
    view = await server.stub.GetJob(rr.GetJobRequest(job_id=job_id), metadata=server.md())
    assert view.job.status == ST.Value("JOB_STATUS_CANCELLED")


async def test_rerun_over_grpc(server: Server) -> None:
    job_id = await job_in_state(server, "failed")
    new = await server.stub.RerunJob(
        rr.RerunJobRequest(job_id=job_id, actor="admin:a"), metadata=server.md()
    )
    assert new.job.retried_from_job_id == job_id and new.job.status == ST.Value(
        "JOB_STATUS_PENDING"
    )
    await expect(
        "INVALID_JOB_STATE",
        grpc.StatusCode.FAILED_PRECONDITION,
        server.stub.RerunJob(rr.RerunJobRequest(job_id=new.job.job_id), metadata=server.md()),
    )


async def test_serve_runs_migrations_and_health(
    make_server: Callable[..., Any], tmp_path: Any
) -> None:
    from job_service.app import serve
    from tests.unit.job_service.conftest import make_settings

    url = f"sqlite+aiosqlite:///{tmp_path / 'migrated.db'}"
    app = await serve(make_settings(url, JOB_SERVICE_MIGRATE_ON_START=True), credentials=None)
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        async with grpc.aio.insecure_channel(app.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            resp = await health.Check(
                health_pb2.HealthCheckRequest(service="zhixi.airuntime.job.v1.JobService")
            )
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            from zhixi.airuntime.job.v1 import service_pb2_grpc

            stub = service_pb2_grpc.JobServiceStub(ch)
            listed = await stub.ListJobs(
                rr.ListJobsRequest(), metadata=(("x-internal-api-key", TOKEN),)
            )
            assert list(listed.jobs) == []
    finally:
        await app.stop(grace=0.1)


async def test_result_and_fail_carry_their_model_calls(server: Server) -> None:
    """SubmitResult/FailJob ``invocations`` (``ModelCall``): logged with the ending, once;
    a bad one is INVALID_ARGUMENT naming ``invocations[i].<field>`` and changes nothing."""
    call = msg.ModelCall(
        model_provider="deepseek",
        model_name="deepseek-chat",
        api_key_mode=common.API_KEY_MODE_PLATFORM_KEY,
        prompt_tokens=900,
        completion_tokens=90,
        cache_hit_tokens=300,
        latency_ms=1200,
        outcome="succeeded",
        provider_request_id="req-9",
    )
    ok_id = await job_in_state(server, "locked")
    # no model name, or only whitespace (it would be priced 0), beside a good call or alone
    for name, reported in (("", [call]), ("   ", [])):
        bad = msg.ModelCall()
        bad.CopyFrom(call)
        bad.model_name = name
        await expect(
            "INVALID_ARGUMENT",
            grpc.StatusCode.INVALID_ARGUMENT,
            server.stub.SubmitResult(
                rr.SubmitResultRequest(
                    job_id=ok_id,
                    attempt_no=1,
                    output_schema_version="v1",
                    output=_struct(ANALYSIS_OUTPUT),
                    invocations=[*reported, bad],
                ),
                metadata=server.md("w1"),
            ),
        )
    view = await server.stub.GetJob(rr.GetJobRequest(job_id=ok_id), metadata=server.md())
    assert view.job.status == ST.JOB_STATUS_LOCKED
    for _ in range(2):  # the second is a replay: nothing logged again
        await server.stub.SubmitResult(
            rr.SubmitResultRequest(
                job_id=ok_id,
                attempt_no=1,
                output_schema_version="v1",
                output=_struct(ANALYSIS_OUTPUT),
                invocations=[call],
            ),
            metadata=server.md("w1"),
        )
    full = await server.stub.GetJob(
        rr.GetJobRequest(job_id=ok_id, include_history=True), metadata=server.md()
    )
    [logged] = full.invocations
    assert (logged.attempt_no, logged.provider_request_id, logged.cache_hit_tokens) == (
        1,
        "req-9",
        300,
    )

    fail_id = await job_in_state(server, "locked")
    failed = msg.ModelCall()
    failed.CopyFrom(call)
    failed.outcome = "failed"
    failed.error_code = "MODEL_TIMEOUT"
    await server.stub.FailJob(
        rr.FailJobRequest(
            job_id=fail_id, attempt_no=1, error_code="MODEL_TIMEOUT", invocations=[failed]
        ),
        metadata=server.md("w1"),
    )
    full = await server.stub.GetJob(
        rr.GetJobRequest(job_id=fail_id, include_history=True), metadata=server.md()
    )
    assert [(i.outcome, i.error_code) for i in full.invocations] == [("failed", "MODEL_TIMEOUT")]


async def test_an_unreachable_database_is_unavailable_not_internal(server: Server) -> None:
    """A database that cannot be reached answers UNAVAILABLE (503 at the gateway), which
    callers retry, not INTERNAL."""
    from airuntime_common.db import make_engine, make_sessionmaker

    dead = make_engine("mysql+aiomysql://root@127.0.0.1:1/nothing_listens_here")
    domain = server.domain
    saved = (domain.sessions, domain.store.engine)
    domain.sessions = make_sessionmaker(dead)
    domain.store.engine = dead
    try:
        await expect(
            "UNAVAILABLE",
            grpc.StatusCode.UNAVAILABLE,
            server.stub.GetJob(rr.GetJobRequest(job_id="f" * 32), metadata=server.md()),
        )
        await expect(
            "UNAVAILABLE",
            grpc.StatusCode.UNAVAILABLE,
            server.stub.ClaimJobs(
                rr.ClaimJobsRequest(capabilities=[LSA], limit=1), metadata=server.md("w1")
            ),
        )
    finally:
        domain.sessions, domain.store.engine = saved
        await dead.dispose()


async def test_refused_heartbeats_do_not_register_an_instance(server: Server) -> None:
    """The health view lists instances that polled, claimed or hold live leases, not a
    caller whose heartbeats were all refused."""
    job = (await create(server, idempotency_key="hb")).job
    await expect(
        "LOCK_NOT_HELD",
        grpc.StatusCode.FAILED_PRECONDITION,
        server.stub.Heartbeat(
            rr.HeartbeatRequest(job_id=job.job_id, attempt_no=1), metadata=server.md("probe-1")
        ),
    )
    beat = await server.stub.HeartbeatLeases(
        rr.HeartbeatLeasesRequest(leases=[{"job_id": job.job_id, "attempt_no": 1}]),
        metadata=server.md("probe-2"),
    )
    assert [x.held for x in beat.leases] == [False]
    await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=1), metadata=server.md("w1")
    )
    held = await server.stub.HeartbeatLeases(
        rr.HeartbeatLeasesRequest(leases=[{"job_id": job.job_id, "attempt_no": 1}]),
        metadata=server.md("w1"),
    )
    assert [x.held for x in held.leases] == [True]
    health = await server.stub.GetRuntimeHealth(rr.GetRuntimeHealthRequest(), metadata=server.md())
    seen = {w.instance_id for w in health.workers if not w.instance_id.startswith("biz-")}
    assert seen == {"w1"}


async def test_claim_with_snapshots_starts_the_jobs_and_answers_their_snapshots(
    server: Server,
) -> None:
    made = [(await create(server, idempotency_key=f"ws{i}")).job for i in range(2)]
    claimed = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=5, with_snapshots=True),
        metadata=server.md("w1"),
    )
    assert [j.job_id for j in claimed.jobs] == [j.job_id for j in made]
    assert set(claimed.snapshots) == {j.job_id for j in made}
    for job in claimed.jobs:
        assert job.status == ST.Value("JOB_STATUS_RUNNING") and job.HasField("started_at")
        assert job.locked_by == "w1" and job.attempt_no == 1
        snap = claimed.snapshots[job.job_id]
        assert snap.snapshot_id == job.snapshot_id and snap.payload["userId"] == "u1"
        # the same answer GetSnapshot gives the holder, which starts nothing more
        again = await server.stub.GetSnapshot(
            rr.GetSnapshotRequest(job_id=job.job_id, attempt_no=1), metadata=server.md("w1")
        )
        assert again == snap
        view = await server.stub.GetJob(rr.GetJobRequest(job_id=job.job_id), metadata=server.md())
        assert view.job.started_at == job.started_at
    # without the flag a claim only locks, and answers no snapshot
    plain_job = (await create(server, idempotency_key="plain")).job
    plain = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=5), metadata=server.md("w1")
    )
    assert [j.job_id for j in plain.jobs] == [plain_job.job_id]
    assert plain.jobs[0].status == ST.Value("JOB_STATUS_LOCKED") and not plain.snapshots


async def test_claim_answers_the_snapshots_that_fit_its_budget(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from job_service.rpc import runtime as servicer

    first = (await create(server, idempotency_key="b0")).job
    one = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=1, with_snapshots=True),
        metadata=server.md("w1"),
    )
    size = one.snapshots[first.job_id].ByteSize()
    made = [(await create(server, idempotency_key=f"b{i}")).job for i in range(1, 4)]
    monkeypatch.setattr(servicer, "CLAIM_SNAPSHOTS_MAX_BYTES", size * 2 + size // 2)
    claimed = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=5, with_snapshots=True),
        metadata=server.md("w1"),
    )
    assert [j.job_id for j in claimed.jobs] == [j.job_id for j in made]
    assert set(claimed.snapshots) == {j.job_id for j in made[:2]}
    # the one left out is running too; its holder reads it with GetSnapshot
    left = claimed.jobs[2]
    assert left.status == ST.Value("JOB_STATUS_RUNNING")
    snap = await server.stub.GetSnapshot(
        rr.GetSnapshotRequest(job_id=left.job_id, attempt_no=1), metadata=server.md("w1")
    )
    assert snap.snapshot_id == left.snapshot_id


async def test_a_snapshot_that_cannot_be_answered_leaves_the_others_in_the_claim(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from job_service.rpc import JobServiceServicer

    made = [(await create(server, idempotency_key=f"bad{i}")).job for i in range(3)]
    original = JobServiceServicer._snapshot_proto

    def broken(self: Any, view: Any) -> Any:
        if view.snapshot_id == made[1].snapshot_id:
            raise ValueError("cannot convert")
        return original(self, view)

    monkeypatch.setattr(JobServiceServicer, "_snapshot_proto", broken)
    claimed = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=5, with_snapshots=True),
        metadata=server.md("w1"),
    )
    assert [j.job_id for j in claimed.jobs] == [j.job_id for j in made]
    assert set(claimed.snapshots) == {made[0].job_id, made[2].job_id}


async def test_verify_leases_fails_one_lease_it_cannot_answer_alone(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from job_service.rpc import runtime as servicer

    ok = (await create(server, idempotency_key="v1")).job
    bad = (await create(server, user_id="u2", target_id="u2", idempotency_key="v2")).job
    await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=5), metadata=server.md("w1")
    )
    original = servicer._lease_holder

    def broken(job: Any) -> Any:
        if job.user_id == "u2":
            raise AppError(ErrorCode.INTERNAL, "bad row")
        return original(job)

    monkeypatch.setattr(servicer, "_lease_holder", broken)
    reply = await server.stub.VerifyLeases(
        rr.VerifyLeasesRequest(
            leases=[
                rr.VerifyLeaseRequest(job_id=j.job_id, runtime_instance_id="w1", attempt_no=1)
                for j in (ok, bad)
            ]
        ),
        metadata=server.md(),
    )
    assert reply.verdicts[0].held.user_id == "u1"
    assert reply.verdicts[1].error_code == ErrorCode.INTERNAL
    assert not reply.verdicts[1].HasField("held")


async def test_two_providers_claim_answers_and_breakers(
    make_server: Callable[..., Any],
) -> None:
    """reference §9.4 over gRPC: a claim answer names the attempt's provider with its model
    name and base URL; GetCircuitBreaker lists each provider; a reset names one or
    none, an unconfigured name is INVALID_ARGUMENT."""
    import json

    providers = [
        {"name": "primary", "baseUrl": "http://primary.test", "apiKeyEnv": "P_KEY"},
        {
            "name": "backup",
            "baseUrl": "http://backup.test/v1",
            "apiKeyEnv": "B_KEY",
            "models": {"deepseek-chat": "backup-chat"},
        },
    ]
    server: Server = await make_server(
        MODEL_PROVIDERS=json.dumps(providers), BREAKER_FAILURE_THRESHOLD=1, MAX_RETRY_COUNT=3
    )
    job_id = (await create(server)).job.job_id
    first = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=1), metadata=server.md("w1")
    )
    [c] = first.jobs
    assert (c.model_provider, c.model_name) == ("primary", "deepseek-chat")
    assert (c.provider_model_name, c.provider_base_url) == ("deepseek-chat", "http://primary.test")
    await server.stub.FailJob(
        rr.FailJobRequest(job_id=job_id, attempt_no=1, error_code="TEMPORARY_PROVIDER_ERROR"),
        metadata=server.md("w1"),
    )
    again = await server.stub.ClaimJobs(
        rr.ClaimJobsRequest(capabilities=[LSA], limit=1), metadata=server.md("w1")
    )
    [c] = again.jobs
    assert (c.model_provider, c.model_name) == ("backup", "deepseek-chat")
    assert (c.provider_model_name, c.provider_base_url) == ("backup-chat", "http://backup.test/v1")
    verify = await server.stub.VerifyLease(
        rr.VerifyLeaseRequest(job_id=job_id, runtime_instance_id="w1", attempt_no=2),
        metadata=server.md(),
    )
    assert verify.model_provider == "backup"  # what credential_service resolves for
    view = (
        await server.stub.GetCircuitBreaker(rr.GetCircuitBreakerRequest(), metadata=server.md())
    ).breaker
    assert view.state == msg.BREAKER_STATE_OPEN and view.consecutive_failures == 1
    assert [(p.name, p.state) for p in view.providers] == [
        ("primary", msg.BREAKER_STATE_OPEN),
        ("backup", msg.BREAKER_STATE_CLOSED),
    ]
    assert view.providers[0].HasField("opened_at")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.ResetCircuitBreaker(
            rr.ResetCircuitBreakerRequest(provider="nope"), metadata=server.md()
        )
    assert from_rpc_error(err.value).code == ErrorCode.INVALID_ARGUMENT
    reset = await server.stub.ResetCircuitBreaker(
        rr.ResetCircuitBreakerRequest(provider="primary"), metadata=server.md()
    )
    assert reset.breaker.state == msg.BREAKER_STATE_CLOSED
    assert [p.state for p in reset.breaker.providers] == [msg.BREAKER_STATE_CLOSED] * 2
