"""credential_service's lease checks against a real job_service: the resolves that
arrive together are verified in one ``VerifyLeases`` call, each with its own verdict,
and an older job_service without it is asked one ``VerifyLease`` per lease."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from sqlalchemy import update

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from credential_service.lease import MAX_CALLS_IN_FLIGHT, GrpcLeaseVerifier
from job_service.store.tables import jobs
from tests.unit.job_service.conftest import (  # noqa: F401  (fixtures)
    TOKEN,
    Server,
    db_url,
    make_server,
    new_job,
)
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

CAPS = ["learning_state_analysis"]


@pytest.fixture
async def server(make_server: Callable[..., Any]) -> Server:  # noqa: F811
    """A real job_service gRPC server on SQLite."""
    return await make_server()  # type: ignore[no-any-return]


async def _leased(server: Server, n: int, instance: str = "w1") -> list[str]:
    ids = [(await new_job(server.domain)).job_id for _ in range(n)]
    claimed = await server.domain.claim(instance, CAPS, n, 0)
    assert [j.job_id for j in claimed] == ids
    return ids


async def _one_by_one(server: Server, job_id: str, instance: str, attempt: int) -> Any:
    """What a single VerifyLease answers: the reply, or the refusal as an AppError."""
    try:
        return await server.stub.VerifyLease(
            rr.VerifyLeaseRequest(job_id=job_id, runtime_instance_id=instance, attempt_no=attempt),
            metadata=server.md(),
        )
    except grpc.aio.AioRpcError as exc:
        return from_rpc_error(exc)


async def test_resolves_that_arrive_together_share_one_call(server: Server) -> None:
    ids = await _leased(server, 6)
    verifier = GrpcLeaseVerifier(server.app.address, TOKEN)
    try:
        infos = await asyncio.gather(*(verifier.verify(j, "w1", 1, None) for j in ids))
        assert verifier.calls == 1 and verifier.leases_sent == 6
        assert {i.user_id for i in infos} == {"u1"}
        assert {i.api_key_mode for i in infos} == {"platform_key"}
        # a lone resolve goes at once, in a call of its own
        await verifier.verify(ids[0], "w1", 1, None)
        assert verifier.calls == 2 and verifier.leases_sent == 7
    finally:
        await verifier.close()


async def test_each_lease_gets_the_verdict_verify_lease_would_give(server: Server) -> None:
    held, lapsed, other = await _leased(server, 3)
    async with server.domain.sessions() as s, s.begin():
        await s.execute(
            update(jobs)
            .where(jobs.c.job_id == lapsed)
            .values(lock_until=server.domain.clock.plus(-5))
        )
    asks = [
        (held, "w1", 1),
        (held, "w1", 2),  # another attempt
        (held, "intruder", 1),
        (lapsed, "w1", 1),  # past lockUntil: dead before the reaper runs
        ("no-such-job", "w1", 1),
        (other, "w1", 1),
    ]
    verifier = GrpcLeaseVerifier(server.app.address, TOKEN)
    try:
        got = await asyncio.gather(
            *(verifier.verify(j, i, a, None) for j, i, a in asks), return_exceptions=True
        )
    finally:
        await verifier.close()
    assert verifier.calls == 1
    for (job_id, instance, attempt), answer in zip(asks, got, strict=True):
        alone = await _one_by_one(server, job_id, instance, attempt)
        if isinstance(alone, AppError):
            assert isinstance(answer, AppError), (job_id, instance, attempt)
            assert (answer.code, answer.message, answer.details) == (
                alone.code,
                alone.message,
                alone.details,
            )
        else:
            assert not isinstance(answer, BaseException)
            assert answer.user_id == alone.user_id and answer.model_name == alone.model_name
    codes = [a.code if isinstance(a, AppError) else "held" for a in got]
    assert codes == [
        "held",
        ErrorCode.LOCK_NOT_HELD,
        ErrorCode.LOCK_NOT_HELD,
        ErrorCode.LOCK_NOT_HELD,
        ErrorCode.JOB_NOT_FOUND,
        "held",
    ]


async def test_verify_leases_judges_a_bad_item_alone_and_caps_the_batch(server: Server) -> None:
    [held] = await _leased(server, 1)
    reply = await server.stub.VerifyLeases(
        rr.VerifyLeasesRequest(
            leases=[
                rr.VerifyLeaseRequest(job_id=held, runtime_instance_id="w1", attempt_no=0),
                rr.VerifyLeaseRequest(job_id="", runtime_instance_id="w1", attempt_no=1),
                rr.VerifyLeaseRequest(job_id=held, runtime_instance_id="", attempt_no=1),
                rr.VerifyLeaseRequest(job_id=held, runtime_instance_id="w1", attempt_no=1),
            ]
        ),
        metadata=server.md(),
    )
    assert [v.error_code for v in reply.verdicts] == [ErrorCode.INVALID_ARGUMENT] * 3 + [""]
    assert reply.verdicts[3].HasField("held") and reply.verdicts[3].held.user_id == "u1"
    assert not any(v.HasField("held") for v in reply.verdicts[:3])
    too_many = rr.VerifyLeasesRequest(
        leases=[rr.VerifyLeaseRequest(job_id=held, runtime_instance_id="w1", attempt_no=1)] * 501
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.VerifyLeases(too_many, metadata=server.md())
    assert from_rpc_error(caught.value).code == ErrorCode.INVALID_ARGUMENT


async def test_more_resolves_than_call_slots_wait_and_go_together(server: Server) -> None:
    ids = await _leased(server, 20)
    verifier = GrpcLeaseVerifier(server.app.address, TOKEN)
    try:
        # one lease per loop turn: the first few take the call slots, the rest queue
        tasks = []
        for job_id in ids:
            tasks.append(asyncio.ensure_future(verifier.verify(job_id, "w1", 1, None)))
            await asyncio.sleep(0)
        infos = await asyncio.gather(*tasks)
    finally:
        await verifier.close()
    assert len(infos) == 20 and verifier.leases_sent == 20
    assert MAX_CALLS_IN_FLIGHT <= verifier.calls < 20


async def test_a_caller_that_gives_up_does_not_disturb_the_others(server: Server) -> None:
    ids = await _leased(server, 3)
    verifier = GrpcLeaseVerifier(server.app.address, TOKEN)
    try:
        tasks = [asyncio.ensure_future(verifier.verify(j, "w1", 1, None)) for j in ids]
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        assert done[0].user_id == done[2].user_id == "u1"  # type: ignore[union-attr]
    finally:
        await verifier.close()


class _OlderJobService(job_grpc.JobServiceServicer):  # type: ignore[misc]
    """A job_service from before VerifyLeases: it answers VerifyLease only."""

    def __init__(self) -> None:
        self.single = 0

    async def VerifyLease(self, request: Any, context: Any) -> Any:
        self.single += 1
        return rr.VerifyLeaseResponse(user_id="u9", api_key_mode=1, model_name="m")


async def test_an_older_job_service_is_asked_one_lease_at_a_time() -> None:
    older = _OlderJobService()
    srv = grpc.aio.server()
    job_grpc.add_JobServiceServicer_to_server(older, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    verifier = GrpcLeaseVerifier(f"127.0.0.1:{port}", TOKEN)
    try:
        infos = await asyncio.gather(*(verifier.verify(f"j{i}", "w1", 1, None) for i in range(3)))
        assert [i.user_id for i in infos] == ["u9"] * 3 and older.single == 3
        await verifier.verify("j4", "w1", 1, None)  # straight to VerifyLease from now on
        assert older.single == 4 and verifier.calls == 1
    finally:
        await verifier.close()
        await srv.stop(None)


class _OddJobService(job_grpc.JobServiceServicer):  # type: ignore[misc]
    """Answers VerifyLeases with one verdict the verifier cannot use (no key mode)."""

    async def VerifyLeases(self, request: Any, context: Any) -> Any:
        out = rr.VerifyLeasesResponse()
        for item in request.leases:
            mode = 0 if item.job_id == "odd" else 1
            out.verdicts.add(held=rr.VerifyLeaseResponse(user_id="u1", api_key_mode=mode))
        return out


async def test_a_verdict_that_cannot_be_used_fails_its_lease_alone() -> None:
    srv = grpc.aio.server()
    job_grpc.add_JobServiceServicer_to_server(_OddJobService(), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    verifier = GrpcLeaseVerifier(f"127.0.0.1:{port}", TOKEN)
    try:
        got = await asyncio.gather(
            *(verifier.verify(j, "w1", 1, None) for j in ("a", "odd", "b")),
            return_exceptions=True,
        )
    finally:
        await verifier.close()
        await srv.stop(None)
    assert verifier.calls == 1
    assert isinstance(got[1], AppError) and got[1].code == ErrorCode.INTERNAL
    assert [g.user_id for g in (got[0], got[2])] == ["u1", "u1"]  # type: ignore[union-attr]
