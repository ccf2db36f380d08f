"""``RuntimeSession``: the runtime calls over one stream (reference §3), on the real job_service.

The contract suite runs whole over the session (``transport_kind == "session"``);
these tests cover what only a stream has: calls answered out of order, a late call
cancelled on the server, the stream's own refusal, a break failing the calls in
flight as retryable, and the unary fallback for a job_service without the method.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from airuntime_common import metadata
from airuntime_common.enums import JOB_TYPE
from airuntime_common.errors import ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import RPC_SECONDS
from runtime_worker.session import RuntimeSession
from tests.contract.conftest import TOKEN, RuntimeStack
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

LSA = "learning_state_analysis"


def _claim(wait_ms: int = 0) -> rr.ClaimJobsRequest:
    return rr.ClaimJobsRequest(
        capabilities=[JOB_TYPE.to_proto(LSA)],  # type: ignore[list-item]
        limit=1,
        wait_ms=wait_ms,
    )


def _ask(call_id: int) -> rr.RuntimeSessionRequest:
    """A heartbeat with no leases: answered at once, touches nothing."""
    return rr.RuntimeSessionRequest(id=call_id, heartbeat_leases=rr.HeartbeatLeasesRequest())


def _session(stack: RuntimeStack, instance: str = "w1", token: str = TOKEN) -> RuntimeSession:
    session = RuntimeSession(stack.stub, metadata.outgoing(token, instance))
    stack.sessions.append(session)
    return session


def _samples(method: str) -> float:
    for metric in RPC_SECONDS.collect():
        for sample in metric.samples:
            if (
                sample.name.endswith("_count")
                and sample.labels.get("method") == method
                and sample.labels.get("code") == "OK"
            ):
                return float(sample.value)
    return 0.0


async def test_calls_on_one_stream_answer_in_any_order(stack: RuntimeStack) -> None:
    """A long-polling claim in flight does not hold up a heartbeat sent after it; the
    claim then answers with the job created meanwhile. One stream carried both."""
    session = _session(stack)
    claims_before = _samples("JobService/ClaimJobs")
    claim = asyncio.create_task(session.call("claim_jobs", _claim(5000), deadline_s=10))
    await asyncio.sleep(0.2)
    beat = await session.call("heartbeat_leases", rr.HeartbeatLeasesRequest(), deadline_s=5)
    assert not claim.done() and list(beat.leases) == []
    job = await stack.create()
    answer = await claim
    assert [j.job_id for j in answer.jobs] == [job["jobId"]]
    assert session.opened == 1
    # a call on the session is observed under its own method, as the unary one is
    assert _samples("JobService/ClaimJobs") == claims_before + 1


async def test_a_refusal_is_the_unary_calls_rich_status(stack: RuntimeStack) -> None:
    """A result for a lease the caller does not hold is refused with the same reference §4
    code as over a unary call, and the stream goes on serving."""
    session = _session(stack)
    job = await stack.create()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await session.call(
            "fail_job",
            rr.FailJobRequest(job_id=job["jobId"], attempt_no=1, error_code="MODEL_TIMEOUT"),
            deadline_s=5,
        )
    assert from_rpc_error(refused.value).code == ErrorCode.LOCK_NOT_HELD
    claimed = await session.call("claim_jobs", _claim(), deadline_s=5)
    assert [j.job_id for j in claimed.jobs] == [job["jobId"]]
    assert session.opened == 1


async def test_a_late_call_is_cancelled_on_the_server(stack: RuntimeStack) -> None:
    """A claim past its deadline fails DEADLINE_EXCEEDED and is stopped on the server:
    the job created afterwards is not leased to it but to the next claim."""
    session = _session(stack)
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await session.call("claim_jobs", _claim(5000), deadline_s=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.2)
    job = await stack.create()
    claimed = await session.call("claim_jobs", _claim(), deadline_s=5)
    assert [j.job_id for j in claimed.jobs] == [job["jobId"]]


async def test_a_wrong_token_refuses_the_stream(stack: RuntimeStack) -> None:
    session = _session(stack, token="not-the-token-0123456789abcdef")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await session.call("claim_jobs", _claim(), deadline_s=5)
    assert from_rpc_error(refused.value).code == ErrorCode.UNAUTHENTICATED


async def test_a_broken_stream_fails_its_calls_unavailable(stack: RuntimeStack) -> None:
    """job_service going away mid-call fails the call UNAVAILABLE (retryable, as a unary
    call cut the same way), and the session is ready to open a new stream."""
    session = _session(stack)
    claim = asyncio.create_task(session.call("claim_jobs", _claim(10000), deadline_s=15))
    await asyncio.sleep(0.3)
    await stack.jobs.stop(grace=0)
    with pytest.raises(grpc.aio.AioRpcError) as broken:
        await claim
    assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
    assert session._stream is None


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(rr.RuntimeSessionRequest(id=1), id="no-call"),
        pytest.param(rr.RuntimeSessionRequest(id=0, claim_jobs=_claim()), id="id-0"),
        pytest.param(rr.RuntimeSessionRequest(id=2, cancel=0), id="cancel-0"),
        pytest.param(rr.RuntimeSessionRequest(batch=rr.RuntimeSessionBatch()), id="empty-batch"),
        pytest.param(
            rr.RuntimeSessionRequest(
                batch=rr.RuntimeSessionBatch(
                    calls=[rr.RuntimeSessionRequest(batch=rr.RuntimeSessionBatch(calls=[_ask(1)]))]
                )
            ),
            id="batch-in-batch",
        ),
        pytest.param(
            rr.RuntimeSessionRequest(
                batch=rr.RuntimeSessionBatch(
                    calls=[_ask(1), rr.RuntimeSessionRequest(id=0, claim_jobs=_claim())]
                )
            ),
            id="batch-with-id-0",
        ),
    ],
)
async def test_a_message_no_caller_sends_ends_the_stream(
    stack: RuntimeStack, message: rr.RuntimeSessionRequest
) -> None:
    stream = stack.stub.RuntimeSession(metadata=metadata.outgoing(TOKEN, "w1"))
    await stream.write(message)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async for _ in stream:
            pass
    assert from_rpc_error(ended.value).code == ErrorCode.INVALID_ARGUMENT


async def _answers(stream: Any, want: int) -> tuple[dict[int, rr.RuntimeSessionResponse], int]:
    """Read until ``want`` answers came; the answers by id and the messages they took."""
    got: dict[int, rr.RuntimeSessionResponse] = {}
    messages = 0
    async for message in stream:
        messages += 1
        batch = message.batch.answers if message.WhichOneof("answer") == "batch" else [message]
        for answer in batch:
            got[answer.id] = answer
        if len(got) >= want:
            break
    return got, messages


async def test_a_batch_runs_each_call_and_answers_may_come_together(stack: RuntimeStack) -> None:
    """A batch of calls runs each as if it came alone (a refusal stays that call's); to
    a caller that asks for batches, answers ready together come in one message."""
    md = (*metadata.outgoing(TOKEN, "w1"), (metadata.SESSION_BATCH, "1"))
    stream = stack.stub.RuntimeSession(metadata=md)
    initial = dict(await stream.initial_metadata())
    assert initial.get(metadata.SESSION_BATCH) == "1"  # the server says it takes batches
    bad = rr.RuntimeSessionRequest(id=3, claim_jobs=rr.ClaimJobsRequest(limit=1))
    await stream.write(
        rr.RuntimeSessionRequest(
            batch=rr.RuntimeSessionBatch(calls=[_ask(1), _ask(2), bad, _ask(4)])
        )
    )
    got, messages = await _answers(stream, 4)
    assert sorted(got) == [1, 2, 3, 4]
    assert [got[i].WhichOneof("answer") for i in (1, 2, 4)] == ["heartbeat_leases"] * 3
    assert got[3].WhichOneof("answer") == "error"
    assert got[3].error.grpc_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert messages < 4  # answers that were ready together shared a message
    stream.cancel()


async def test_without_asking_answers_come_one_per_message(stack: RuntimeStack) -> None:
    stream = stack.stub.RuntimeSession(metadata=metadata.outgoing(TOKEN, "w1"))
    await stream.write(
        rr.RuntimeSessionRequest(batch=rr.RuntimeSessionBatch(calls=[_ask(1), _ask(2), _ask(3)]))
    )
    got, messages = await _answers(stream, 3)
    assert sorted(got) == [1, 2, 3] and messages == 3
    stream.cancel()


async def test_the_session_sends_calls_that_queue_as_one_message(stack: RuntimeStack) -> None:
    """Calls made while the stream is busy go out together; each gets its own answer."""
    session = _session(stack)
    await session.call("heartbeat_leases", rr.HeartbeatLeasesRequest(), deadline_s=5)
    assert session.messages_written == 1 and session.batches_written == 0  # alone: at once
    jobs = [await stack.create() for _ in range(3)]
    claims = await asyncio.gather(
        *(session.call("claim_jobs", _claim(), deadline_s=5) for _ in range(3)),
        *(
            session.call("heartbeat_leases", rr.HeartbeatLeasesRequest(), deadline_s=5)
            for _ in range(5)
        ),
    )
    claimed = sorted(j.job_id for answer in claims[:3] for j in answer.jobs)
    assert claimed == sorted(job["jobId"] for job in jobs)  # each job once, to one claim
    assert session.messages_written == 2 and session.batches_written == 1
    assert session.opened == 1


class _NoBatches(job_grpc.JobServiceServicer):  # type: ignore[misc]
    """A job_service of an earlier release: a RuntimeSession without batches (it would
    end the stream on one); it answers each heartbeat, one message each."""

    def __init__(self) -> None:
        self.kinds: list[str | None] = []

    async def RuntimeSession(self, requests: Any, context: Any) -> Any:
        async for request in requests:
            self.kinds.append(request.WhichOneof("call"))
            await asyncio.sleep(0.01)  # a busy server: the caller's calls queue meanwhile
            yield rr.RuntimeSessionResponse(
                id=request.id, heartbeat_leases=rr.HeartbeatLeasesResponse()
            )


async def test_a_server_that_takes_no_batches_gets_none() -> None:
    servicer = _NoBatches()
    server = grpc.aio.server()
    job_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    session = RuntimeSession(job_grpc.JobServiceStub(channel), metadata.outgoing(TOKEN, "w1"))
    try:
        await session.call("heartbeat_leases", rr.HeartbeatLeasesRequest(), deadline_s=5)
        await asyncio.gather(
            *(
                session.call("heartbeat_leases", rr.HeartbeatLeasesRequest(), deadline_s=5)
                for _ in range(6)
            )
        )
        assert servicer.kinds == ["heartbeat_leases"] * 7
        assert session.messages_written == 7 and session.batches_written == 0
    finally:
        await session.close()
        await channel.close()
        await server.stop(0)
