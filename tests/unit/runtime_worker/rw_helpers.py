"""Helpers for runtime_worker tests: a raw HTTP responder (to send blank
keep-alive lines, cut bodies, …) and fake JobService / CredentialService gRPC
servers implementing just what the worker calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.grpc_server import GrpcServer
from airuntime_common.timeutil import to_timestamp, utcnow
from job_service.rpc.session import SessionRpcs
from runtime_worker.providers.base import ModelRequest, ModelResponse, Usage
from runtime_worker.settings import WorkerSettings
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import message_pb2 as job_msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

TOKEN = "test-token-123"

# --------------------------------------------------------------- raw HTTP


Responder = Callable[[dict[str, Any], asyncio.StreamWriter], Awaitable[None]]


def envelope(
    content: str | None,
    finish_reason: str = "stop",
    usage: dict[str, int] | None = None,
    rid: str = "req-abc",
) -> bytes:
    """A DeepSeek chat completion body."""
    return json.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "model": "deepseek-chat",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage
            or {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "total_tokens": 120,
                "prompt_cache_hit_tokens": 64,
                "prompt_cache_miss_tokens": 36,
            },
        }
    ).encode()


async def write_response(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> None:
    """Write a complete HTTP/1.1 response and close."""
    head = [
        f"HTTP/1.1 {status} X",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head.append("Connection: close")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    writer.close()


class RawHttpServer:
    """A tiny HTTP/1.1 server whose every answer is written by a test callback."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def close(self) -> None:
        for task in list(self._conns):
            task.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            request_line = await reader.readline()
            if not request_line:
                return
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            method, path, _ = request_line.decode().split(" ", 2)
            req = {
                "method": method,
                "path": path,
                "headers": headers,
                "json": json.loads(body) if body else None,
            }
            self.requests.append(req)
            await self.responder(req, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(task)
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture
async def raw_http() -> AsyncIterator[Callable[[Responder], Awaitable[RawHttpServer]]]:
    servers: list[RawHttpServer] = []

    async def make(responder: Responder) -> RawHttpServer:
        server = RawHttpServer(responder)
        await server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        await s.close()


# ------------------------------------------------------- job data helpers


def snapshot_payload(job_type: str = "quiz_generation", **overrides: Any) -> dict[str, Any]:
    """A valid snapshot payload v1."""
    payload: dict[str, Any] = {
        "jobType": job_type,
        "targetType": "material",
        "targetId": "m1",
        "userId": "u1",
        "params": {"count": 1, "difficulty": "medium", "questionTypes": ["single_choice"]},
        "materials": [
            {
                "materialId": "m1",
                "title": "Recursion",
                "blockCount": 2,
                "readBlockCount": 1,
                "progress": 0.5,
            }
        ],
        "blocks": [
            {
                "blockId": "b1",
                "materialId": "m1",
                "ordinal": 0,
                "text": "A base case stops recursion.",
            },
            {
                "blockId": "b2",
                "materialId": "m1",
                "ordinal": 1,
                "text": "Each call shrinks the input.",
            },
        ],
        "knowledgePoints": [
            {
                "knowledgePointId": "kp1",
                "name": "Base case",
                "materialId": "m1",
                "blockIds": ["b1"],
                "attempts": 2,
                "correct": 1,
                "accuracy": 0.5,
                "lastAttemptAt": "2026-11-30T10:00:00.000Z",
            }
        ],
        "reading": [
            {
                "blockId": "b1",
                "materialId": "m1",
                "dwellSeconds": 30,
                "lastReadAt": "2026-11-30T09:00:00.000Z",
            }
        ],
        "stats": {"blocksRead": 1},
    }
    payload.update(overrides)
    return payload


QUIZ_OUTPUT = {
    "items": [
        {
            "questionType": "single_choice",
            "stem": "What stops recursion?",
            "options": ["A base case", "A loop"],
            "answer": "A base case",
            "explanation": "Block b1 says so.",
            "difficulty": "medium",
            "knowledgePointId": "kp1",
            "sourceBlockIds": ["b1"],
        }
    ]
}


def make_job(
    job_id: str = "job-1", attempt_no: int = 1, job_type: str = "quiz_generation", **kw: Any
) -> Any:
    job = job_msg.Job(
        job_id=job_id,
        user_id="u1",
        job_type=JOB_TYPE.to_proto(job_type),  # type: ignore[arg-type]
        target_type=TARGET_TYPE.to_proto("material"),  # type: ignore[arg-type]
        target_id="m1",
        status=JOB_STATUS.to_proto("locked"),  # type: ignore[arg-type]
        api_key_mode=API_KEY_MODE.to_proto("platform_key"),  # type: ignore[arg-type]
        model_provider="deepseek",
        model_name="deepseek-chat",
        attempt_no=attempt_no,
        max_retry_count=3,
        timeout_seconds=kw.pop("timeout_seconds", 120),
        locked_by="w",
    )
    job.params.update(
        kw.pop("params", {"count": 1, "difficulty": "medium", "questionTypes": ["single_choice"]})
    )
    return job


# ------------------------------------------------------------ fake gRPC


@dataclass
class Lease:
    held: bool = True
    cancel_requested: bool = False


@dataclass
class FakeBackend:
    """State shared by the fake JobService and CredentialService."""

    queue: list[Any] = field(default_factory=list)
    snapshots: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    leases: dict[tuple[str, int], Lease] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    instance_ids: set[str] = field(default_factory=set)
    status_addresses: set[str] = field(default_factory=set)
    results: list[Any] = field(default_factory=list)
    fails: list[Any] = field(default_factory=list)
    #: every logged model call as a RecordInvocationRequest, however it arrived
    invocations: list[Any] = field(default_factory=list)
    #: the RPC that carried each of ``invocations``
    invocation_routes: list[str] = field(default_factory=list)
    heartbeats: int = 0
    base_url: str = "http://127.0.0.1:9"
    api_key: str = "sk-secretsecret1234"
    #: method name → number of UNAVAILABLE answers still to give
    unavailable: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: method name → an event the call waits for after it is logged
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    #: ClaimJobs with ``with_snapshots`` answers the snapshots (as job_service does);
    #: off, an answer with no room for them (the worker reads each with GetSnapshot)
    answer_snapshots: bool = True
    #: FailJob requests refused as job_service would refuse them
    refused_fails: list[Any] = field(default_factory=list)
    #: seconds ClaimJobs waits after claiming (and starting) its jobs before answering
    claim_answer_delay: float = 0.0
    #: (jobType, version) → template source GetPromptVersion answers (else NOT_FOUND)
    prompt_templates: dict[tuple[str, str], str] = field(default_factory=dict)

    def add_job(self, job: Any, payload: dict[str, Any] | None = None, version: str = "v1") -> None:
        self.queue.append(job)
        self.snapshots[job.job_id] = (
            payload or snapshot_payload(JOB_TYPE.to_str(job.job_type)),
            version,
        )
        self.leases[(job.job_id, job.attempt_no)] = Lease()

    def log_calls(self, route: str, request: Any) -> None:
        """Log the ``ModelCall`` list an accepted SubmitResult/FailJob carried, as job_service does."""
        for call in request.invocations:
            self.invocations.append(self._as_record(request, call))
            self.invocation_routes.append(route)

    @staticmethod
    def _as_record(request: Any, call: Any) -> Any:
        out = rr.RecordInvocationRequest(
            job_id=request.job_id,
            attempt_no=request.attempt_no,
            model_provider=call.model_provider,
            model_name=call.model_name,
            api_key_mode=call.api_key_mode,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=call.completion_tokens,
            cache_hit_tokens=call.cache_hit_tokens,
            latency_ms=call.latency_ms,
            outcome=call.outcome,
        )
        for name in ("credential_id", "error_code", "provider_request_id"):
            if call.HasField(name):
                setattr(out, name, getattr(call, name))
        return out

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def wait_for(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        async def loop() -> None:
            while not predicate():
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.05)

        await asyncio.wait_for(loop(), within)

    async def enter(self, name: str, request: Any, context: Any) -> None:
        self.calls.append((name, request))
        iid = metadata.get(context, metadata.RUNTIME_INSTANCE_ID)
        if iid:
            self.instance_ids.add(iid)
        self.changed.set()
        if name in self.hold:
            await self.hold[name].wait()
        if self.unavailable.get(name, 0) > 0:
            self.unavailable[name] -= 1
            await abort(context, AppError(ErrorCode.UNAVAILABLE, "restarting"))

    async def require_lease(self, job_id: str, attempt_no: int, context: Any) -> None:
        lease = self.leases.get((job_id, attempt_no))
        if lease is None or not lease.held:
            await abort(context, AppError(ErrorCode.LOCK_NOT_HELD, "lease not held"))


class FakeJobService(SessionRpcs, job_grpc.JobServiceServicer):  # type: ignore[misc]
    """The runtime calls, unary and over ``RuntimeSession`` (job_service's own session
    servicer, running these methods)."""

    def __init__(self, backend: FakeBackend) -> None:
        self.b = backend

    async def ClaimJobs(self, request: Any, context: Any) -> Any:
        await self.b.enter("ClaimJobs", request, context)
        if request.status_address:
            self.b.status_addresses.add(request.status_address)
        if not self.b.queue and request.wait_ms:
            await asyncio.sleep(min(request.wait_ms / 1000, 0.05))
        jobs = self.b.queue[: request.limit]
        del self.b.queue[: request.limit]
        out = rr.ClaimJobsResponse(jobs=jobs)
        if request.with_snapshots:
            for job in out.jobs:  # started by the claim, as job_service does
                job.status = JOB_STATUS.to_proto("running")
                job.started_at.CopyFrom(to_timestamp(utcnow()))
                if self.b.answer_snapshots:
                    out.snapshots[job.job_id].CopyFrom(self._snapshot(job.job_id))
        if self.b.claim_answer_delay:  # claimed and started; the answer is slow to leave
            await asyncio.sleep(self.b.claim_answer_delay)
        return out

    def _snapshot(self, job_id: str) -> Any:
        payload, version = self.b.snapshots[job_id]
        resp = rr.GetSnapshotResponse(
            snapshot_id="s-" + job_id,
            schema_version=version,
            target_type=TARGET_TYPE.to_proto("material"),  # type: ignore[arg-type]
            target_id="m1",
        )
        resp.payload.update(payload)
        return resp

    async def StartJob(self, request: Any, context: Any) -> Any:
        await self.b.enter("StartJob", request, context)
        await self.b.require_lease(request.job_id, request.attempt_no, context)
        return rr.StartJobResponse(
            status=JOB_STATUS.to_proto("running"),  # type: ignore[arg-type]
            started_at=to_timestamp(utcnow()),
        )

    async def HeartbeatLeases(self, request: Any, context: Any) -> Any:
        await self.b.enter("HeartbeatLeases", request, context)
        self.b.heartbeats += 1
        out = []
        for ref in request.leases:
            lease = self.b.leases.get((ref.job_id, ref.attempt_no), Lease(held=False))
            out.append(
                job_msg.LeaseState(
                    job_id=ref.job_id,
                    attempt_no=ref.attempt_no,
                    held=lease.held,
                    cancel_requested=lease.cancel_requested,
                )
            )
        return rr.HeartbeatLeasesResponse(leases=out)

    async def GetSnapshot(self, request: Any, context: Any) -> Any:
        await self.b.enter("GetSnapshot", request, context)
        await self.b.require_lease(request.job_id, request.attempt_no, context)
        return self._snapshot(request.job_id)

    async def SubmitResult(self, request: Any, context: Any) -> Any:
        await self.b.enter("SubmitResult", request, context)
        await self.b.require_lease(request.job_id, request.attempt_no, context)
        self.b.results.append(request)
        self.b.log_calls("SubmitResult", request)
        out = rr.SubmitResultResponse(
            job_id=request.job_id,
            status=JOB_STATUS.to_proto("succeeded"),  # type: ignore[arg-type]
            result_id="r1",
            output_hash="h",
        )
        if request.HasField("claim_next"):  # claimed and started, as ClaimJobs with snapshots
            n = request.claim_next.limit
            out.claimed_jobs.extend(self.b.queue[:n])
            del self.b.queue[:n]
            for job in out.claimed_jobs:
                job.status = JOB_STATUS.to_proto("running")
                job.started_at.CopyFrom(to_timestamp(utcnow()))
                out.snapshots[job.job_id].CopyFrom(self._snapshot(job.job_id))
        return out

    async def FailJob(self, request: Any, context: Any) -> Any:
        await self.b.enter("FailJob", request, context)
        await self.b.require_lease(request.job_id, request.attempt_no, context)
        if request.HasField("retry_after_seconds") and not (
            0 <= request.retry_after_seconds <= 86400  # job_service's bound
        ):
            self.b.refused_fails.append(request)
            await abort(
                context,
                AppError(ErrorCode.INVALID_ARGUMENT, "retryAfterSeconds must be 0..86400"),
            )
        self.b.fails.append(request)
        self.b.log_calls("FailJob", request)
        return rr.FailJobResponse(job_id=request.job_id, status=JOB_STATUS.to_proto("failed"))  # type: ignore[arg-type]

    async def GetPromptVersion(self, request: Any, context: Any) -> Any:
        await self.b.enter("GetPromptVersion", request, context)
        source = self.b.prompt_templates.get((JOB_TYPE.to_str(request.job_type), request.version))
        if source is None:
            await abort(context, AppError(ErrorCode.NOT_FOUND, "no such prompt version"))
        return rr.GetPromptVersionResponse(
            version=job_msg.PromptVersion(version=request.version, template=source)
        )

    async def RecordInvocation(self, request: Any, context: Any) -> Any:
        await self.b.enter("RecordInvocation", request, context)
        self.b.invocations.append(request)
        self.b.invocation_routes.append("RecordInvocation")
        return rr.RecordInvocationResponse(id=f"inv{len(self.b.invocations)}")


class FakeCredentialService(cred_grpc.CredentialServiceServicer):  # type: ignore[misc]
    def __init__(self, backend: FakeBackend) -> None:
        self.b = backend

    async def ResolveCredential(self, request: Any, context: Any) -> Any:
        await self.b.enter("ResolveCredential", request, context)
        await self.b.require_lease(request.job_id, request.attempt_no, context)
        return cred_rr.ResolveCredentialResponse(
            api_key_mode=API_KEY_MODE.to_proto("platform_key"),  # type: ignore[arg-type]
            credential_id="",
            api_key=self.b.api_key,
            model_provider="deepseek",
            model_name="deepseek-chat",
            base_url=self.b.base_url,
        )


@pytest.fixture
async def backend() -> AsyncIterator[tuple[FakeBackend, int, int]]:
    """A fake JobService and CredentialService on ephemeral ports: (state, job port, cred port)."""
    b = FakeBackend()
    jobs = GrpcServer(
        token=TOKEN,
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.job.v1.JobService"],
        register=lambda s: job_grpc.add_JobServiceServicer_to_server(FakeJobService(b), s),
    )
    creds = GrpcServer(
        token=TOKEN,
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.credential.v1.CredentialService"],
        register=lambda s: cred_grpc.add_CredentialServiceServicer_to_server(
            FakeCredentialService(b), s
        ),
    )
    await jobs.start()
    await creds.start()
    yield b, jobs.port, creds.port
    await jobs.stop(0)
    await creds.stop(0)


def worker_settings(job_port: int, cred_port: int, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "JOB_SERVICE_ADDR": f"127.0.0.1:{job_port}",
        "CREDENTIAL_SERVICE_ADDR": f"127.0.0.1:{cred_port}",
        "RUNTIME_WORKER_LISTEN": "127.0.0.1:0",
        "RUNTIME_INSTANCE_ID": "worker-test-1",
        "WORKER_METRICS_PORT": 0,
        "HEARTBEAT_INTERVAL_SECONDS": 0.1,
        "LOCK_LEASE_SECONDS": 1.0,
        "POLL_INTERVAL_MS": 20,
        "LONG_POLL_WAIT_MS": 50,
        "SHUTDOWN_GRACE_SECONDS": 0.3,
        "RPC_TIMEOUT_SECONDS": 2.0,
        "RPC_RETRY_SECONDS": 2.0,
        "WORKER_CONCURRENCY": 4,
    }
    values.update(overrides)
    return WorkerSettings(**values)


class ScriptedProvider:
    """A model provider whose every call runs ``behaviour`` (default: valid quiz JSON)."""

    name = "deepseek"

    def __init__(
        self, behaviour: Callable[[ModelRequest], Awaitable[ModelResponse]] | None = None
    ) -> None:
        self.behaviour = behaviour
        self.requests: list[ModelRequest] = []
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        self.started.set()
        try:
            if self.behaviour is not None:
                return await self.behaviour(request)
            return ModelResponse(
                content=json.dumps(QUIZ_OUTPUT),
                finish_reason="stop",
                usage=Usage(100, 20, 64),
                provider_request_id="req-1",
                latency_ms=5,
            )
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def block_forever(_request: ModelRequest) -> ModelResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


__all__ = [
    "QUIZ_OUTPUT",
    "TOKEN",
    "FakeBackend",
    "RawHttpServer",
    "ScriptedProvider",
    "block_forever",
    "envelope",
    "make_job",
    "snapshot_payload",
    "worker_settings",
    "write_response",
]
