"""The worker loop against fake JobService + CredentialService gRPC servers:
happy path, cancel mid-call, lease lost mid-call, drain/SIGTERM, startup refusal."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE
from airuntime_common.errors import ErrorCode
from airuntime_common.settings import MissingSetting
from runtime_worker import metrics as worker_metrics
from runtime_worker.app import WorkerApp, run
from runtime_worker.attempt import CallWindow
from runtime_worker.providers.base import ModelError, ModelRequest, ModelResponse, Usage
from runtime_worker.snapshot import struct_to_dict
from tests.unit.runtime_worker.rw_helpers import (
    QUIZ_OUTPUT,
    TOKEN,
    FakeBackend,
    ScriptedProvider,
    block_forever,
    envelope,
    make_job,
    snapshot_payload,
    worker_settings,
    write_response,
)
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

Backend = tuple[FakeBackend, int, int]


def quiz_response() -> ModelResponse:
    """A valid quiz answer from the model."""
    return ModelResponse(json.dumps(QUIZ_OUTPUT), "stop", Usage(1, 1, 0), "r", 5)


@pytest.fixture
async def apps() -> AsyncIterator[list[WorkerApp]]:
    started: list[WorkerApp] = []
    yield started
    for app in started:
        if app.server is not None and not app.worker.draining:
            await app.stop(0.1)


async def start_app(
    backend: Backend, apps: list[WorkerApp], provider: Any = "scripted", **overrides: Any
) -> WorkerApp:
    """Start a worker; ``provider=None`` means the real DeepSeek provider."""
    _, job_port, cred_port = backend
    if provider == "scripted":
        provider = ScriptedProvider()
    app = WorkerApp(worker_settings(job_port, cred_port, **overrides), provider)
    await app.start()
    apps.append(app)
    return app


async def test_happy_path_submits_result_and_records_invocation(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.add_job(make_job("job-1"))
    provider = ScriptedProvider()
    app = await start_app(backend, apps, provider)
    await b.wait_for(lambda: bool(b.results))
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)

    result = b.results[0]
    assert (result.job_id, result.attempt_no) == ("job-1", 1)
    assert result.prompt_version == "quiz_generation.v1"
    assert result.output_schema_version == "v1"
    assert struct_to_dict(result.output) == QUIZ_OUTPUT
    assert b.fails == []
    names = b.names()
    # the claim started the job and carried its snapshot: no StartJob, no GetSnapshot
    assert "StartJob" not in names and "GetSnapshot" not in names
    assert "ResolveCredential" in names
    assert b.instance_ids == {"worker-test-1"}
    assert any(addr.startswith("127.0.0.1:") for addr in b.status_addresses)

    # the prompt protocol the stand-in relies on
    request = provider.requests[0]
    system, user = request.messages[0]["content"], request.messages[1]["content"]
    assert system.splitlines()[0] == "TASK: quiz_generation"
    snap = json.loads(user.split("<snapshot>")[1].split("</snapshot>")[0])
    assert snap["blocks"][0]["blockId"] == "b1"
    params = json.loads(user.split("<params>")[1].split("</params>")[0])
    assert params["count"] == 1 and isinstance(params["count"], int)
    assert request.api_key == "sk-secretsecret1234"
    assert request.model == "deepseek-chat"

    await b.wait_for(lambda: bool(b.invocations))
    inv = b.invocations[0]
    # logged with the result, in its transaction: no separate RecordInvocation
    assert b.invocation_routes == ["SubmitResult"]
    assert "RecordInvocation" not in b.names()
    assert inv.outcome == "succeeded"
    assert (inv.prompt_tokens, inv.completion_tokens, inv.cache_hit_tokens) == (100, 20, 64)
    assert inv.provider_request_id == "req-1"
    assert inv.api_key_mode == API_KEY_MODE.to_proto("platform_key")
    assert not inv.HasField("error_code")


async def test_an_answer_longer_than_the_count_submits_the_first_count(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    second = {**QUIZ_OUTPUT["items"][0], "stem": "What shrinks each call?"}

    async def two_questions(_request: ModelRequest) -> ModelResponse:
        content = json.dumps({"items": [*QUIZ_OUTPUT["items"], second]})
        return ModelResponse(content, "stop", Usage(1, 1, 0), "r", 5)

    b.add_job(make_job("job-count"))  # count 1
    await start_app(backend, apps, provider=ScriptedProvider(two_questions))
    await b.wait_for(lambda: bool(b.results))
    assert struct_to_dict(b.results[0].output) == QUIZ_OUTPUT


async def test_claims_only_free_slots(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    for i in range(3):
        b.add_job(make_job(f"job-{i}"))
    provider = ScriptedProvider(block_forever)
    app = await start_app(backend, apps, provider, WORKER_CONCURRENCY=2)
    await b.wait_for(lambda: len(app.worker.runs) == 2)
    await asyncio.sleep(0.15)
    claims = [r for n, r in b.calls if n == "ClaimJobs"]
    assert all(r.limit <= 2 for r in claims)
    assert claims[0].wait_ms == 50
    assert len(b.queue) == 1  # the third job was left for others
    assert len(app.worker.runs) == 2


async def test_claims_wait_briefly_to_batch_freed_slots(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """With jobs in flight, one slot freed to the claim loop (a fail's: a result's
    claims its own next job) waits up to ``GATHER_SECONDS`` for a quarter of the slots
    to be free, then one claim asks for all of them."""
    b = backend[0]
    for i in range(8):
        b.add_job(make_job(f"job-{i}"))
    gates = [asyncio.Event() for _ in range(12)]
    calls: list[int] = []

    async def held(_r: ModelRequest) -> ModelResponse:
        n = len(calls)
        gate = gates[n]  # the n-th model call waits for the n-th gate
        calls.append(1)
        await gate.wait()
        if n < 2:
            raise ModelError(ErrorCode.MODEL_TIMEOUT, "slow")
        return quiz_response()

    app = await start_app(backend, apps, ScriptedProvider(held), WORKER_CONCURRENCY=8)
    await b.wait_for(lambda: len(app.worker.runs) == 8)
    for i in range(4):
        b.add_job(make_job(f"job-new-{i}"))
    claims_before = len([n for n, _ in b.calls if n == "ClaimJobs"])
    gates[0].set()
    gates[1].set()
    await b.wait_for(lambda: len([n for n, _ in b.calls if n == "ClaimJobs"]) > claims_before)
    first = [r for n, r in b.calls if n == "ClaimJobs"][claims_before]
    assert first.limit == 2  # the two freed slots in one claim
    for event in gates:
        event.set()


async def test_a_result_claims_the_next_job_for_its_slot(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """Each SubmitResult carries ``claim_next`` (its slot, limit 1), and the job it
    claims runs without a ClaimJobs call (nor a GetSnapshot: its snapshot came too)."""
    b = backend[0]
    for i in range(4):
        b.add_job(make_job(f"job-{i}"))
    gate = asyncio.Event()
    calls: list[str] = []

    async def first_waits(r: ModelRequest) -> ModelResponse:
        calls.append(r.model)
        if len(calls) == 1:
            await gate.wait()  # the claim loop's first answer is in before any result
        return quiz_response()

    app = await start_app(backend, apps, ScriptedProvider(first_waits), WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: len(calls) == 1)
    gate.set()
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 4)
    assert [r.job_id for r in b.results] == [f"job-{i}" for i in range(4)]
    assert b.fails == []
    assert all(r.claim_next.limit == 1 for r in b.results)
    assert {tuple(r.claim_next.capabilities) for r in b.results} == {
        tuple(JOB_TYPE.to_proto(c) for c in app.worker.capabilities)
    }
    # jobs 1..3 came with the results of 0..2: between the first result and the last,
    # no ClaimJobs and no GetSnapshot
    names = b.names()
    first = names.index("SubmitResult")
    last = len(names) - 1 - names[::-1].index("SubmitResult")
    assert "ClaimJobs" not in names[first:last]
    assert "GetSnapshot" not in names[first:last]


async def test_a_result_whose_answer_was_lost_is_sent_again_without_its_claim(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """A SubmitResult cut by UNAVAILABLE is sent again (it is idempotent by its key),
    without ``claim_next``: a retry must not claim twice."""
    b = backend[0]
    b.add_job(make_job("job-a"))
    b.unavailable["SubmitResult"] = 1
    before = {code: rpc_count("SubmitResult", code) for code in ("OK", "UNAVAILABLE")}
    app = await start_app(backend, apps, WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)
    sent = [r for n, r in b.calls if n == "SubmitResult"]
    assert [r.HasField("claim_next") for r in sent] == [True, False]  # no second claim
    assert len(b.results) == 1 and b.fails == []
    # each try is timed under the code it ended with (airt_worker_rpc_seconds)
    assert rpc_count("SubmitResult", "UNAVAILABLE") == before["UNAVAILABLE"] + 1
    assert rpc_count("SubmitResult", "OK") == before["OK"] + 1


def rpc_count(rpc: str, code: str) -> float:
    """Calls counted by ``airt_worker_rpc_seconds`` for ``rpc`` ending with ``code``."""
    for metric in worker_metrics.RPC_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels == {"rpc": rpc, "code": code}:
                return float(sample.value)
    return 0.0


async def drain_during_a_result(
    backend: Backend, apps: list[WorkerApp], grace: float, answer_after: float
) -> FakeBackend:
    """One slot, jobs a and b: a's SubmitResult (with claim_next) is held, the worker
    is stopped with ``grace``, and a's answer (carrying b) comes ``answer_after``
    seconds into the drain. Returns the backend once the worker has stopped."""
    b = backend[0]
    b.add_job(make_job("job-a"))
    b.add_job(make_job("job-b"))
    b.hold["SubmitResult"] = asyncio.Event()
    app = await start_app(backend, apps, WORKER_CONCURRENCY=1, SHUTDOWN_GRACE_SECONDS=grace)
    await b.wait_for(lambda: "SubmitResult" in b.names())
    assert next(r for n, r in b.calls if n == "SubmitResult").HasField("claim_next")
    stop = asyncio.create_task(app.stop())
    await b.wait_for(lambda: app.worker.draining)
    await asyncio.sleep(answer_after)
    b.hold.pop("SubmitResult").set()
    await asyncio.wait_for(stop, 15)
    assert not app.worker.runs
    return b


async def test_a_job_claimed_by_a_result_in_flight_when_the_drain_began_gets_the_grace(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """The drain begins while a SubmitResult with claim_next is in flight: the job its
    answer brings runs within the grace (not failed WORKER_SHUTDOWN at once)."""
    b = await drain_during_a_result(backend, apps, grace=5.0, answer_after=0.0)
    assert [r.job_id for r in b.results] == ["job-a", "job-b"]
    assert b.fails == []


async def test_a_job_claimed_by_a_result_answered_after_the_grace_is_still_reported(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """The answer arrives after the grace ran out: the job it claimed is stopped and
    reported (WORKER_SHUTDOWN) before the worker exits, not left to lease expiry."""
    b = await drain_during_a_result(backend, apps, grace=0.3, answer_after=0.6)
    assert [r.job_id for r in b.results] == ["job-a"]
    assert [(f.job_id, f.error_code) for f in b.fails] == [("job-b", ErrorCode.WORKER_SHUTDOWN)]


async def test_a_draining_worker_claims_nothing_with_its_results(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.add_job(make_job("job-d"))
    b.add_job(make_job("job-e"))
    gate = asyncio.Event()

    async def held(_r: ModelRequest) -> ModelResponse:
        await gate.wait()
        return quiz_response()

    app = await start_app(backend, apps, ScriptedProvider(held), WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: len(app.worker.runs) == 1)
    stop = asyncio.create_task(app.stop(5.0))
    await b.wait_for(lambda: app.worker.draining)
    gate.set()
    await stop
    assert len(b.results) == 1
    assert not b.results[0].HasField("claim_next")
    assert [j.job_id for j in b.queue] == ["job-e"]  # left for other workers


async def test_a_slot_frees_only_when_its_result_is_answered(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """One slot: job-0's SubmitResult is held; the slot waits for its answer (which
    brings the slot's next job), so job-1's model call waits too."""
    b = backend[0]
    for i in range(2):
        b.add_job(make_job(f"job-{i}"))
    b.hold["SubmitResult"] = asyncio.Event()
    provider = ScriptedProvider()
    app = await start_app(backend, apps, provider, WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: "SubmitResult" in b.names())
    await asyncio.sleep(0.2)
    assert len(provider.requests) == 1
    b.hold.pop("SubmitResult").set()
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 2)


async def test_a_fail_hands_its_slot_on_while_it_reports(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """One slot: job-0's model call fails and its FailJob is held; the slot was handed
    to the claim loop when the work ended, so job-1 runs meanwhile."""
    b = backend[0]
    for i in range(2):
        b.add_job(make_job(f"job-{i}"))
    b.hold["FailJob"] = asyncio.Event()
    seen: list[str] = []

    async def first_fails(_r: ModelRequest) -> ModelResponse:
        seen.append("call")
        if len(seen) == 1:
            raise ModelError(ErrorCode.MODEL_TIMEOUT, "slow")
        return quiz_response()

    app = await start_app(backend, apps, ScriptedProvider(first_fails), WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)
    assert b.fails == []  # job-0's fail still held
    b.hold.pop("FailJob").set()
    await b.wait_for(lambda: len(b.fails) == 1)
    assert [r.job_id for r in b.results] == ["job-1"]


async def test_one_slot_runs_one_model_call_at_a_time(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """However fast results report, a slot never holds two model calls at once."""
    b = backend[0]
    for i in range(5):
        b.add_job(make_job(f"job-{i}"))
    running = most = 0

    async def counted(_r: ModelRequest) -> ModelResponse:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.01)
            return quiz_response()
        finally:
            running -= 1

    app = await start_app(backend, apps, ScriptedProvider(counted), WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 5)
    assert most == 1
    assert all(r.limit == 1 for n, r in b.calls if n == "ClaimJobs")


async def test_cancel_mid_call_fails_cancelled(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.add_job(make_job("job-c"))
    provider = ScriptedProvider(block_forever)
    app = await start_app(backend, apps, provider)
    await asyncio.wait_for(provider.started.wait(), 5)
    b.leases[("job-c", 1)].cancel_requested = True
    await b.wait_for(lambda: bool(b.fails))
    assert provider.cancelled.is_set()
    assert b.fails[0].error_code == ErrorCode.CANCELLED
    assert b.results == []
    await b.wait_for(lambda: bool(b.invocations))
    assert b.invocations[0].outcome == "failed"
    assert b.invocations[0].error_code == ErrorCode.CANCELLED
    assert b.invocation_routes == ["FailJob"]
    await b.wait_for(lambda: not app.worker.runs)
    assert app.worker.counters["failed:CANCELLED"] == 1


async def test_lease_lost_mid_call_reports_nothing(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.add_job(make_job("job-l"))
    provider = ScriptedProvider(block_forever)
    app = await start_app(backend, apps, provider)
    await asyncio.wait_for(provider.started.wait(), 5)
    b.leases[("job-l", 1)].held = False
    await asyncio.wait_for(provider.cancelled.wait(), 5)
    await b.wait_for(lambda: not app.worker.runs)
    await asyncio.sleep(0.1)
    assert b.results == []
    assert b.fails == []
    assert "SubmitResult" not in b.names() and "FailJob" not in b.names()
    assert app.worker.counters["lease_lost"] == 1
    # the aborted call still costs: it is logged on its own
    await b.wait_for(lambda: bool(b.invocations))
    assert b.invocation_routes == ["RecordInvocation"]
    assert b.invocations[0].error_code == ErrorCode.LOCK_NOT_HELD


async def test_result_refused_for_lost_lease_is_not_retried_or_failed(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """Case L3 from the worker's side: a paused worker's late result gets LOCK_NOT_HELD;
    it stops quietly (no FailJob, no second submit)."""
    b = backend[0]
    b.add_job(make_job("job-late"))

    async def lapse(_r: ModelRequest) -> ModelResponse:
        b.leases[("job-late", 1)].held = False  # lapsed before the next heartbeat
        return quiz_response()

    app = await start_app(
        backend, apps, ScriptedProvider(lapse), HEARTBEAT_INTERVAL_SECONDS=5, LOCK_LEASE_SECONDS=15
    )
    await b.wait_for(lambda: app.worker.counters["lease_lost"] == 1)
    assert b.names().count("SubmitResult") == 1
    assert b.results == [] and "FailJob" not in b.names()
    # the refused result logged nothing: the call is logged on its own, once
    await b.wait_for(lambda: bool(b.invocations))
    assert b.invocation_routes == ["RecordInvocation"]
    assert b.invocations[0].outcome == "succeeded"


def test_metrics_collector_reads_worker_state() -> None:
    from runtime_worker.metrics import WorkerCollector

    class W:
        def __init__(self) -> None:
            self.runs = {("j", 1): object()}
            self.draining = True
            self.counters = {"succeeded": 3, "failed:CANCELLED": 1}

    families = {f.name: f for f in WorkerCollector(W()).collect()}  # type: ignore[arg-type]
    assert families["airt_worker_in_flight"].samples[0].value == 1
    assert families["airt_worker_draining"].samples[0].value == 1
    outcomes = {s.labels["outcome"]: s.value for s in families["airt_worker_attempts"].samples}
    assert outcomes == {"failed:CANCELLED": 1, "succeeded": 3}


async def test_long_job_short_lease_keeps_heartbeating(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """Case L1: a job longer than the lease heartbeats on schedule and succeeds once."""
    b = backend[0]
    b.add_job(make_job("job-long"))

    async def slow(_r: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0.6)
        return ModelResponse(json.dumps(QUIZ_OUTPUT), "stop", Usage(1, 1, 0), "r", 600)

    app = await start_app(backend, apps, ScriptedProvider(slow), LOCK_LEASE_SECONDS=0.3)
    await b.wait_for(lambda: bool(b.results))
    assert b.heartbeats >= 4  # every 0.1 s, well within the 0.3 s lease
    beats = [r for n, r in b.calls if n == "HeartbeatLeases"]
    assert all(len(r.leases) == 1 for r in beats)  # one batched call per beat
    assert len(b.results) == 1 and b.fails == []
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)


async def test_batched_heartbeat_covers_all_leases(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    for i in range(3):
        b.add_job(make_job(f"job-{i}"))
    app = await start_app(backend, apps, ScriptedProvider(block_forever))
    await b.wait_for(lambda: len(app.worker.runs) == 3)
    before = b.heartbeats
    await b.wait_for(lambda: b.heartbeats >= before + 2)
    last = [r for n, r in b.calls if n == "HeartbeatLeases"][-1]
    assert sorted(ref.job_id for ref in last.leases) == ["job-0", "job-1", "job-2"]


async def test_drain_fails_unfinished_jobs_with_worker_shutdown(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.add_job(make_job("job-s1"))
    b.add_job(make_job("job-s2"))
    provider = ScriptedProvider(block_forever)
    app = await start_app(backend, apps, provider)
    await b.wait_for(lambda: len(app.worker.runs) == 2 and len(provider.requests) == 2)

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    health = health_pb2_grpc.HealthStub(channel)
    stop = asyncio.create_task(app.stop(0.2))
    await b.wait_for(lambda: app.worker.draining)
    answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
    claims_at_drain = b.names().count("ClaimJobs")
    await asyncio.wait_for(stop, 5)
    await channel.close()

    assert sorted(f.job_id for f in b.fails) == ["job-s1", "job-s2"]
    assert {f.error_code for f in b.fails} == {ErrorCode.WORKER_SHUTDOWN}
    assert b.results == []
    assert b.names().count("ClaimJobs") == claims_at_drain  # stopped claiming
    assert {i.error_code for i in b.invocations} == {ErrorCode.WORKER_SHUTDOWN}


async def test_drain_lets_jobs_finish_within_grace(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.add_job(make_job("job-g"))
    release = asyncio.Event()

    async def waits(_r: ModelRequest) -> ModelResponse:
        await release.wait()
        return quiz_response()

    provider = ScriptedProvider(waits)
    app = await start_app(backend, apps, provider)
    await asyncio.wait_for(provider.started.wait(), 5)
    stop = asyncio.create_task(app.stop(3.0))
    await b.wait_for(lambda: app.worker.draining)
    release.set()
    await asyncio.wait_for(stop, 5)
    assert [r.job_id for r in b.results] == ["job-g"]
    assert b.fails == []


async def test_run_stops_on_stop_event_sigterm_path(backend: Backend) -> None:
    b, job_port, cred_port = backend
    b.add_job(make_job("job-t"))
    provider = ScriptedProvider(block_forever)
    stop = asyncio.Event()
    settings = worker_settings(job_port, cred_port, SHUTDOWN_GRACE_SECONDS=0.1)
    task = asyncio.create_task(run(settings, stop, provider))
    await asyncio.wait_for(provider.started.wait(), 5)
    stop.set()  # what SIGTERM does in __main__
    await asyncio.wait_for(task, 5)
    assert [(f.job_id, f.error_code) for f in b.fails] == [("job-t", ErrorCode.WORKER_SHUTDOWN)]


@pytest.mark.parametrize(("interval", "lease"), [(20.1, 60.0), (60.0, 60.0)])
async def test_heartbeat_above_third_of_lease_refused_at_start(
    backend: Backend, interval: float, lease: float
) -> None:
    b, job_port, cred_port = backend
    settings = worker_settings(
        job_port, cred_port, HEARTBEAT_INTERVAL_SECONDS=interval, LOCK_LEASE_SECONDS=lease
    )
    with pytest.raises(MissingSetting, match="HEARTBEAT_INTERVAL_SECONDS"):
        await run(settings, asyncio.Event())
    assert b.calls == []  # never claimed anything


async def test_invalid_snapshot_fails_before_any_model_call(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    bad = snapshot_payload()
    del bad["userId"]
    b.add_job(make_job("job-bad"), bad)
    b.add_job(make_job("job-ver"), snapshot_payload(), version="v9")
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: len(b.fails) == 2)
    assert {f.error_code for f in b.fails} == {ErrorCode.INVALID_SNAPSHOT}
    # the key may have been resolved alongside the snapshot read, but never used
    assert provider.requests == []


async def test_the_key_is_resolved_while_the_snapshot_is_read(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """A claim answer with no room for a snapshot: the worker reads it with GetSnapshot,
    and resolves the key at the same time."""
    b = backend[0]
    b.answer_snapshots = False
    b.hold["GetSnapshot"] = asyncio.Event()
    b.add_job(make_job("job-both"))
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    # the snapshot read is still held when the key is asked for
    await b.wait_for(lambda: "ResolveCredential" in b.names())
    assert "GetSnapshot" in b.names() and not b.hold["GetSnapshot"].is_set()
    b.hold["GetSnapshot"].set()
    await b.wait_for(lambda: bool(b.results))
    assert b.fails == [] and len(provider.requests) == 1


async def test_a_snapshot_in_the_claim_answer_saves_the_get_snapshot_call(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.add_job(make_job("job-inline"))
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: bool(b.results))
    claims = [req for name, req in b.calls if name == "ClaimJobs"]
    assert claims and all(req.with_snapshots for req in claims)
    assert "GetSnapshot" not in b.names()
    assert b.fails == [] and len(provider.requests) == 1


async def test_a_snapshot_from_the_claim_is_validated_like_one_read_alone(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.add_job(make_job("job-bad-inline"), version="v9")
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: bool(b.fails))
    assert b.fails[0].error_code == ErrorCode.INVALID_SNAPSHOT
    assert "GetSnapshot" not in b.names() and provider.requests == []


async def test_a_long_poll_s_wait_before_the_claim_does_not_count_against_the_job(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """A long poll that waited before it claimed: the job started when it was claimed
    (its startedAt), not when the poll was sent (reference §2.2: timeoutSeconds from
    startedAt). Counting from the send cut a 10 s budget to what was left of the
    poll's wait."""
    b = backend[0]
    b.hold["ClaimJobs"] = asyncio.Event()
    b.add_job(make_job("job-budget", timeout_seconds=10))
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: "ClaimJobs" in b.names())
    await asyncio.sleep(1.5)  # the poll waits 1.5 s before it claims
    b.hold["ClaimJobs"].set()
    await b.wait_for(lambda: bool(b.results))
    [request] = provider.requests
    assert request.timeout_is_job_deadline
    assert 10 - 0.5 < request.timeout_seconds <= 10


async def test_a_job_started_by_its_claim_counts_its_time_from_its_start(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """job_service set startedAt when the claim ran and the answer took 0.6 s to come
    back: the worker's time budget must not end after the reaper's (JOB_TIMEOUT
    counts from startedAt)."""
    b = backend[0]
    b.claim_answer_delay = 0.6
    b.add_job(make_job("job-budget", timeout_seconds=10))
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: bool(b.results))
    [request] = provider.requests
    assert request.timeout_is_job_deadline
    assert request.timeout_seconds <= 10 - 0.6


async def test_no_resolved_key_fails_invalid_credential_without_a_call(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    b = backend[0]
    b.api_key = ""
    b.add_job(make_job("job-nokey"))
    provider = ScriptedProvider()
    await start_app(backend, apps, provider)
    await b.wait_for(lambda: bool(b.fails))
    assert b.fails[0].error_code == ErrorCode.INVALID_CREDENTIAL
    assert provider.requests == []


@pytest.mark.parametrize(("header", "sent"), [("7", 7.0), ("100000", 86400.0)])
async def test_model_rate_limit_through_real_provider(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, header: str, sent: float
) -> None:
    """Case D7 end to end: 429 + Retry-After → FailJob(MODEL_RATE_LIMIT, retryAfterSeconds=7).
    A Retry-After past a day is sent as a day, the most job_service accepts: refused,
    the fail would leave the job to its lease's expiry and lose the code."""
    b = backend[0]

    async def limited(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 429, b'{"error":{"message":"slow down"}}', {"Retry-After": header})

    http = await raw_http(limited)
    b.base_url = http.base_url
    b.add_job(make_job("job-429"))
    await start_app(backend, apps, provider=None)
    await b.wait_for(lambda: bool(b.fails))
    fail = b.fails[0]
    assert fail.error_code == ErrorCode.MODEL_RATE_LIMIT
    assert fail.HasField("retry_after_seconds") and fail.retry_after_seconds == sent
    assert b.refused_fails == []
    assert len(http.requests) == 1
    await b.wait_for(lambda: bool(b.invocations))
    assert b.invocations[0].error_code == ErrorCode.MODEL_RATE_LIMIT


async def test_real_provider_success_and_invalid_credential(
    backend: Backend, apps: list[WorkerApp], raw_http: Any
) -> None:
    b = backend[0]
    answers = [(200, envelope(json.dumps(QUIZ_OUTPUT))), (401, b'{"error":{"message":"bad"}}')]

    async def respond(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        status, body = answers.pop(0)
        await write_response(w, status, body)

    http = await raw_http(respond)
    b.base_url = http.base_url
    b.add_job(make_job("job-ok"))
    await start_app(backend, apps, provider=None, WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: bool(b.results))
    b.add_job(make_job("job-401"))
    await b.wait_for(lambda: bool(b.fails))
    assert b.fails[0].job_id == "job-401"
    assert b.fails[0].error_code == ErrorCode.INVALID_CREDENTIAL
    assert http.requests[0]["headers"]["authorization"] == "Bearer sk-secretsecret1234"


async def test_idempotent_calls_survive_job_service_restart(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """Case L4-like: SubmitResult answered UNAVAILABLE twice is retried and lands once."""
    b = backend[0]
    b.unavailable = {"SubmitResult": 2, "StartJob": 1, "GetSnapshot": 1, "ResolveCredential": 1}
    b.add_job(make_job("job-r"))
    await start_app(backend, apps)
    await b.wait_for(lambda: bool(b.results))
    assert b.names().count("SubmitResult") == 3
    assert len(b.results) == 1


async def test_claim_failures_back_off(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.unavailable = {"ClaimJobs": 1000}
    await start_app(backend, apps, POLL_INTERVAL_MS=100)
    await asyncio.sleep(0.5)
    assert 2 <= b.names().count("ClaimJobs") <= 7  # about one per poll interval, no spin


async def test_heartbeat_retried_while_unavailable(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.unavailable = {"HeartbeatLeases": 2}
    b.add_job(make_job("job-hb"))
    app = await start_app(backend, apps, ScriptedProvider(block_forever))
    await b.wait_for(lambda: app.worker.keeper.beats >= 2)
    assert app.worker.runs  # the job kept running through the outage
    assert b.fails == []


async def test_key_never_logged(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    b = backend[0]

    async def reject(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 401, b'{"error":{"message":"Authentication Fails"}}')

    http = await raw_http(reject)
    b.base_url = http.base_url
    b.add_job(make_job("job-k"))
    await start_app(backend, apps, provider=None)
    await b.wait_for(lambda: bool(b.fails) and bool(b.invocations))
    assert b.fails[0].error_code == ErrorCode.INVALID_CREDENTIAL
    assert "secretsecret" not in caplog.text
    assert "secretsecret" not in b.fails[0].error_message


async def test_status_service_reports_and_drains(backend: Backend, apps: list[WorkerApp]) -> None:
    b = backend[0]
    b.add_job(make_job("job-st"))
    provider = ScriptedProvider(block_forever)
    app = await start_app(backend, apps, provider)
    await asyncio.wait_for(provider.started.wait(), 5)

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    stub = wgrpc.WorkerStatusServiceStub(channel)
    md = metadata.outgoing(TOKEN)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetStatus(wrr.GetStatusRequest())  # no token
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    status = await stub.GetStatus(wrr.GetStatusRequest(), metadata=md)
    assert status.instance_id == "worker-test-1"
    assert status.version
    assert len(status.capabilities) == 5
    assert [j.job_id for j in status.in_flight] == ["job-st"]
    assert status.in_flight[0].job_type == JOB_TYPE.to_proto("quiz_generation")
    assert status.in_flight[0].age_seconds > 0
    assert not status.draining
    assert status.concurrency == 4

    drained = await stub.Drain(wrr.DrainRequest(grace_seconds=0.1), metadata=md)
    assert drained.in_flight == 1
    await b.wait_for(lambda: bool(b.fails))
    assert b.fails[0].error_code == ErrorCode.WORKER_SHUTDOWN
    # the worker counts the fail once its answer is back, a moment after the backend
    # has it
    for _ in range(100):
        status = await stub.GetStatus(wrr.GetStatusRequest(), metadata=md)
        if status.counters["failed:WORKER_SHUTDOWN"]:
            break
        await asyncio.sleep(0.05)
    assert status.draining
    assert status.counters["failed:WORKER_SHUTDOWN"] == 1
    await channel.close()
    await app.stop(0.1)


def test_a_skewed_clock_keeps_the_start_within_the_call() -> None:
    """startedAt is placed on the worker's clock, but never before the claim was sent
    nor after its answer arrived, however far the two clocks disagree."""
    window = CallWindow(sent_mono=100.0, sent_wall=1_000_000.0, answered_mono=102.0)
    job = make_job("job-skew")
    assert window.start_of(job) == 100.0  # no startedAt: from the send
    for started_wall, expected in (
        (1_000_001.5, 101.5),  # in step: the moment itself
        (1_000_000.0 - 3600, 100.0),  # the database an hour behind
        (1_000_000.0 + 3600, 102.0),  # an hour ahead
    ):
        job.started_at.FromMicroseconds(int(started_wall * 1e6))
        assert window.start_of(job) == pytest.approx(expected)


async def test_a_worker_holding_the_platform_key_runs_platform_jobs_without_a_resolve(
    backend: Backend, apps: list[WorkerApp]
) -> None:
    """A worker with a provider's platform key in its environment (reference §9.4: the
    claim names the attempt's provider): a platform-key job runs on that key, with no
    ResolveCredential call; a user-key job, or a provider it holds no key for, resolves."""
    b = backend[0]
    b.add_job(make_job("job-platform"))
    user = make_job("job-user")
    user.api_key_mode = API_KEY_MODE.to_proto("user_deepseek_key")
    b.add_job(user)
    other = make_job("job-other")
    other.model_provider = "elsewhere"
    b.add_job(other)
    provider = ScriptedProvider()
    app = await start_app(
        backend,
        apps,
        provider,
        DEEPSEEK_API_KEY="sk-held-by-the-worker-0001",
    )
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 3)
    resolved = [r.job_id for n, r in b.calls if n == "ResolveCredential"]
    assert sorted(resolved) == ["job-other", "job-user"]
    keys = {r.api_key for r in provider.requests}
    assert "sk-held-by-the-worker-0001" in keys
    platform_call = next(i for i in b.invocations if i.job_id == "job-platform")
    assert platform_call.api_key_mode == API_KEY_MODE.to_proto("platform_key")
    assert not platform_call.HasField("credential_id")


def test_platform_keys_are_held_when_the_environment_has_them() -> None:
    from runtime_worker.settings import WorkerSettings

    assert WorkerSettings(RUNTIME_SERVICE_TOKEN="t").platform_keys(env={}) == {}
    held = WorkerSettings(RUNTIME_SERVICE_TOKEN="t", DEEPSEEK_API_KEY="sk-x-123456789")
    assert held.platform_keys(env={}) == {"deepseek": "sk-x-123456789"}
    # a key only credential_service holds (its stand-in key too) is resolved per attempt
    standin = WorkerSettings(RUNTIME_SERVICE_TOKEN="t", ALLOW_PLATFORM_KEY_STANDIN=True)
    assert standin.platform_keys(env={}) == {}
