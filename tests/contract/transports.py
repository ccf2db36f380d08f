"""One runtime contract, two transports: gRPC stubs and the REST shim (reference §3).

:class:`RuntimeTransport` is what the contract suite talks to. Every answer is
transport-neutral: a dict in the REST camelCase shape of reference §3's table
(times RFC 3339 UTC with milliseconds, enums as the contract's strings, absent
values ``None``). Every refusal is raised as :class:`ContractError` carrying
the reference §4 code and the transport's own status (an HTTP status for REST, a
``grpc.StatusCode`` for gRPC); :func:`expected_status` gives the status reference §4
requires for a code on each transport, from the contract's table (not from the
product's mapping), so the suite checks the mapping too.

The gRPC answers are converted here from the protobuf descriptors, not with
the gateway's converter, so a disagreement between the two transports shows
up as a failing test instead of being shared.

* :class:`GrpcTransport` calls ``JobService`` / ``CredentialService`` with
  ``x-internal-api-key`` and ``x-runtime-instance-id`` metadata.
* :class:`RestTransport` calls the real api_gateway app (in-process, through
  ``httpx.ASGITransport``) with the shim headers. It also checks the REST-only
  envelope of each answer (201 for logs, 204 + headers for a heartbeat,
  ``Cache-Control: no-store`` on resolve) and keeps the last response in
  :attr:`RestTransport.last` for REST-only assertions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Protocol
from urllib.parse import quote

import grpc
import httpx
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.timeutil import rfc3339
from job_service.rpc.session import SESSION_CALLS
from runtime_worker.session import RuntimeSession
from tests.spec_fields import JOB_KEYS
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

#: reference §4: code → (HTTP status, gRPC status) of the refusals the runtime contract uses.
SPEC_STATUS: dict[str, tuple[int, grpc.StatusCode]] = {
    "INVALID_SCHEMA": (422, grpc.StatusCode.INVALID_ARGUMENT),
    "INVALID_CREDENTIAL": (422, grpc.StatusCode.FAILED_PRECONDITION),
    "JOB_NOT_FOUND": (404, grpc.StatusCode.NOT_FOUND),
    "JOB_ALREADY_LOCKED": (409, grpc.StatusCode.ABORTED),
    "INVALID_JOB_STATE": (409, grpc.StatusCode.FAILED_PRECONDITION),
    "LOCK_NOT_HELD": (409, grpc.StatusCode.FAILED_PRECONDITION),
    "RESULT_ALREADY_EXISTS": (409, grpc.StatusCode.ALREADY_EXISTS),
    "INVALID_ARGUMENT": (400, grpc.StatusCode.INVALID_ARGUMENT),
    "UNAUTHENTICATED": (401, grpc.StatusCode.UNAUTHENTICATED),
    "PERMISSION_DENIED": (403, grpc.StatusCode.PERMISSION_DENIED),
    "NOT_FOUND": (404, grpc.StatusCode.NOT_FOUND),
    "PAYLOAD_TOO_LARGE": (413, grpc.StatusCode.INVALID_ARGUMENT),
    "NO_PROVIDER_CAPACITY": (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
}

_ENUMS = {
    "zhixi.airuntime.common.v1.JobType": JOB_TYPE,
    "zhixi.airuntime.common.v1.JobStatus": JOB_STATUS,
    "zhixi.airuntime.common.v1.TargetType": TARGET_TYPE,
    "zhixi.airuntime.common.v1.ApiKeyMode": API_KEY_MODE,
}

#: A job type number no server knows (the wire form of an unknown capability).
UNKNOWN_JOB_TYPE = 99


@dataclass
class ContractError(Exception):
    """A refusal, whatever the transport.

    Attributes:
        code: the reference §4 code (``ErrorInfo.reason`` / the body's ``code``).
        status: HTTP status (REST) or ``grpc.StatusCode`` (gRPC).
        message: the human message.
        details: the error's details object.
    """

    code: str
    status: int | grpc.StatusCode
    message: str = ""
    details: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.message}"


class RuntimeTransport(Protocol):
    """The runtime operations of reference §3, bound to one runtime instance id.

    Every method returns the REST camelCase answer as a dict and raises
    :class:`ContractError` on a refusal.
    """

    name: str
    instance: str

    def expected_status(self, code: str) -> int | grpc.StatusCode:
        """The status reference §4 requires for ``code`` on this transport."""
        ...

    async def poll(
        self, capabilities: list[str], limit: int | None = None, wait_ms: int | None = None
    ) -> dict[str, Any]:
        """``{"jobs": [Job…]}``: pending jobs, not locked."""
        ...

    async def claim(
        self,
        capabilities: list[str],
        limit: int | None = None,
        wait_ms: int | None = None,
        *,
        with_snapshots: bool = False,
    ) -> dict[str, Any]:
        """``{"jobs": [Job…]}``: each locked to this instance; with ``with_snapshots``
        each is started too, and ``"snapshots"`` maps job id → snapshot."""
        ...

    async def lock(self, job_id: str) -> dict[str, Any]:
        """``{"jobId","status","lockedBy","lockUntil","attemptNo"}``."""
        ...

    async def start(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        """``{"status","startedAt"}``."""
        ...

    async def heartbeat(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        """``{"lockUntil","cancelRequested"}`` (REST: 204 + ``X-Lock-Until`` / ``X-Cancel-Requested``)."""
        ...

    async def heartbeat_leases(self, leases: list[tuple[str, int]]) -> dict[str, Any]:
        """``{"leases":[{"jobId","attemptNo","held","lockUntil","cancelRequested"}…]}``."""
        ...

    async def snapshot(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        """``{"snapshotId","schemaVersion","targetType","targetId","payload","contentHash"}``."""
        ...

    async def resolve(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        """``{"apiKeyMode","credentialId","apiKey","modelProvider","modelName","baseUrl",
        "userBaseUrl"}``."""
        ...

    async def result(
        self,
        job_id: str,
        attempt_no: int,
        output: dict[str, Any],
        *,
        prompt_version: str = "learning_state_analysis.v1",
        output_schema_version: str = "v1",
    ) -> dict[str, Any]:
        """``{"jobId","status","resultId","outputHash","replayed"}``."""
        ...

    async def fail(
        self,
        job_id: str,
        attempt_no: int,
        error_code: str,
        error_message: str = "",
        retry_after_seconds: float | None = None,
    ) -> dict[str, Any]:
        """``{"jobId","status","retryCount"}``."""
        ...

    async def invocation_log(self, **fields: Any) -> dict[str, Any]:
        """``{"id"}`` (REST: 201); ``fields`` are the camelCase body keys."""
        ...

    async def health(self) -> dict[str, Any]:
        """``{"status":"SERVING"|"NOT_SERVING","workers":[…]}``."""
        ...


# ---------------------------------------------------------------- protobuf → JSON


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _scalar(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _ENUMS[field.enum_type.full_name].to_str_or_none(value)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return rfc3339(value.ToDatetime(tzinfo=UTC))
        if name == "google.protobuf.Struct":
            return _plain(json_format.MessageToDict(value))
        return to_json(value)
    return value


def field_json(message: Message, name: str) -> Any:
    """One field of ``message`` as JSON: unset optional/message fields are ``None``."""
    field = message.DESCRIPTOR.fields_by_name[name]
    value = getattr(message, name)
    if field.is_repeated:
        return [_scalar(field, v) for v in value]
    if field.has_presence and not message.HasField(name):
        return None
    return _scalar(field, value)


def to_json(message: Message) -> dict[str, Any]:
    """Every field of ``message`` under its JSON (camelCase) name."""
    return {f.json_name: field_json(message, f.name) for f in message.DESCRIPTOR.fields}


def job_json(job: msg.Job) -> dict[str, Any]:
    """A ``Job`` message as the ``Job`` JSON: exactly the reference §3 keys."""
    full = to_json(job)
    missing = [k for k in JOB_KEYS if k not in full]
    assert not missing, f"Job proto lacks {missing}"
    return {k: full[k] for k in JOB_KEYS}


def _job_type_number(value: str) -> int:
    if value in JOB_TYPE_NAMES:
        return int(JOB_TYPE.to_proto(value))
    return UNKNOWN_JOB_TYPE


JOB_TYPE_NAMES = frozenset(
    {
        "learning_state_analysis",
        "weak_point_analysis",
        "next_action_planning",
        "quiz_generation",
        "flashcard_generation",
    }
)


# ---------------------------------------------------------------- gRPC


class GrpcTransport:
    """The runtime contract over ``JobService`` / ``CredentialService`` stubs.

    Args:
        job_channel: channel to job_service.
        credential_channel: channel to credential_service.
        token: the service token (``x-internal-api-key``).
        instance: this runtime instance id (``x-runtime-instance-id``).
    """

    name = "grpc"

    def __init__(
        self,
        job_channel: grpc.aio.Channel,
        credential_channel: grpc.aio.Channel,
        token: str,
        instance: str,
    ) -> None:
        self.job = job_grpc.JobServiceStub(job_channel)
        self.credential = cred_grpc.CredentialServiceStub(credential_channel)
        self.instance = instance
        self.md = metadata.outgoing(token, instance)

    def expected_status(self, code: str) -> grpc.StatusCode:
        return SPEC_STATUS[code][1]

    async def _call(self, method: Any, request: Any, deadline: float = 30.0) -> Any:
        try:
            return await method(request, metadata=self.md, timeout=deadline)
        except grpc.aio.AioRpcError as exc:
            err = from_rpc_error(exc)
            raise ContractError(err.code, exc.code(), err.message, err.details) from None

    def _poll_request(
        self, cls: Any, capabilities: list[str], limit: int | None, wait_ms: int | None
    ) -> Any:
        return cls(
            capabilities=[_job_type_number(c) for c in capabilities],
            limit=0 if limit is None else limit,
            wait_ms=0 if wait_ms is None else wait_ms,
        )

    async def poll(
        self, capabilities: list[str], limit: int | None = None, wait_ms: int | None = None
    ) -> dict[str, Any]:
        req = self._poll_request(rr.PollJobsRequest, capabilities, limit, wait_ms)
        resp = await self._call(self.job.PollJobs, req)
        return {"jobs": [job_json(j) for j in resp.jobs]}

    async def claim(
        self,
        capabilities: list[str],
        limit: int | None = None,
        wait_ms: int | None = None,
        *,
        with_snapshots: bool = False,
    ) -> dict[str, Any]:
        req = self._poll_request(rr.ClaimJobsRequest, capabilities, limit, wait_ms)
        req.with_snapshots = with_snapshots
        resp = await self._call(self.job.ClaimJobs, req)
        out: dict[str, Any] = {"jobs": [job_json(j) for j in resp.jobs]}
        if with_snapshots:
            out["snapshots"] = {k: to_json(v) for k, v in resp.snapshots.items()}
        return out

    async def lock(self, job_id: str) -> dict[str, Any]:
        resp = await self._call(self.job.LockJob, rr.LockJobRequest(job_id=job_id))
        return to_json(resp)

    async def start(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self._call(
            self.job.StartJob, rr.StartJobRequest(job_id=job_id, attempt_no=attempt_no)
        )
        return to_json(resp)

    async def heartbeat(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self._call(
            self.job.Heartbeat, rr.HeartbeatRequest(job_id=job_id, attempt_no=attempt_no)
        )
        return to_json(resp)

    async def heartbeat_leases(self, leases: list[tuple[str, int]]) -> dict[str, Any]:
        req = rr.HeartbeatLeasesRequest(
            leases=[msg.LeaseRef(job_id=j, attempt_no=a) for j, a in leases]
        )
        return to_json(await self._call(self.job.HeartbeatLeases, req))

    async def snapshot(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self._call(
            self.job.GetSnapshot, rr.GetSnapshotRequest(job_id=job_id, attempt_no=attempt_no)
        )
        return to_json(resp)

    async def resolve(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self._call(
            self.credential.ResolveCredential,
            cred_rr.ResolveCredentialRequest(job_id=job_id, attempt_no=attempt_no),
        )
        out = to_json(resp)
        # a plain proto3 string: "" is the wire form of "no credential"
        out["credentialId"] = out["credentialId"] or None
        return out

    async def result(
        self,
        job_id: str,
        attempt_no: int,
        output: dict[str, Any],
        *,
        prompt_version: str = "learning_state_analysis.v1",
        output_schema_version: str = "v1",
    ) -> dict[str, Any]:
        struct = struct_pb2.Struct()
        struct.update(output)
        resp = await self._call(
            self.job.SubmitResult,
            rr.SubmitResultRequest(
                job_id=job_id,
                attempt_no=attempt_no,
                prompt_version=prompt_version,
                output_schema_version=output_schema_version,
                output=struct,
            ),
        )
        out = to_json(resp)
        # claimedJobs/snapshots are deprecated and always empty
        assert not resp.claimed_jobs and not resp.snapshots
        del out["claimedJobs"], out["snapshots"]
        return out

    async def fail(
        self,
        job_id: str,
        attempt_no: int,
        error_code: str,
        error_message: str = "",
        retry_after_seconds: float | None = None,
    ) -> dict[str, Any]:
        req = rr.FailJobRequest(
            job_id=job_id,
            attempt_no=attempt_no,
            error_code=error_code,
            error_message=error_message,
        )
        if retry_after_seconds is not None:
            req.retry_after_seconds = retry_after_seconds
        return to_json(await self._call(self.job.FailJob, req))

    async def invocation_log(self, **fields: Any) -> dict[str, Any]:
        names = {f.json_name: f.name for f in rr.RecordInvocationRequest.DESCRIPTOR.fields}
        kwargs: dict[str, Any] = {}
        for key, value in fields.items():
            if value is None:
                continue
            if key == "apiKeyMode":
                value = API_KEY_MODE.to_proto(value)
            kwargs[names[key]] = value
        resp = await self._call(self.job.RecordInvocation, rr.RecordInvocationRequest(**kwargs))
        return to_json(resp)

    async def health(self) -> dict[str, Any]:
        resp = await self._call(self.job.GetRuntimeHealth, rr.GetRuntimeHealthRequest())
        keys = ("instanceId", "capabilities", "inFlight", "lastSeenAt", "status")
        return {
            "status": resp.status,
            "workers": [{k: to_json(w)[k] for k in keys} for w in resp.workers],
        }


class _SessionStub:
    """The JobService stub with the runtime calls a ``RuntimeSession`` carries sent over it."""

    def __init__(self, stub: job_grpc.JobServiceStub, session: RuntimeSession) -> None:
        self._stub = stub
        self._session = session

    def __getattr__(self, name: str) -> Any:
        unary = getattr(self._stub, name)
        field = SESSION_FIELDS.get(name)
        return unary if field is None else self._session.method(field)


#: JobService method → its call's name on a RuntimeSession.
SESSION_FIELDS = {method: field for field, method in SESSION_CALLS.items()}


class SessionTransport(GrpcTransport):
    """The runtime contract with claim, start, heartbeats, snapshot, result, fail and
    invocation logs over one ``RuntimeSession`` stream (the worker's way); the
    rest (poll, lock, the single heartbeat, resolve, health) unary as over ``grpc``."""

    name = "session"

    def __init__(
        self,
        job_channel: grpc.aio.Channel,
        credential_channel: grpc.aio.Channel,
        token: str,
        instance: str,
    ) -> None:
        super().__init__(job_channel, credential_channel, token, instance)
        self.session = RuntimeSession(self.job, self.md)
        self.job = _SessionStub(self.job, self.session)  # type: ignore[assignment]


# ---------------------------------------------------------------- REST


class RestTransport:
    """The runtime contract over the gateway's ``/internal/runtime`` shim.

    Args:
        client: an httpx client whose base URL is the gateway.
        token: the service token (``x-internal-api-key``).
        instance: this runtime instance id (``X-Runtime-Instance-Id``).
    """

    name = "rest"
    prefix = "/internal/runtime"

    def __init__(self, client: httpx.AsyncClient, token: str, instance: str) -> None:
        self.client = client
        self.instance = instance
        self.headers = {"x-internal-api-key": token, "X-Runtime-Instance-Id": instance}
        self.last: httpx.Response | None = None

    def expected_status(self, code: str) -> int:
        return SPEC_STATUS[code][0]

    async def request(
        self, method: str, path: str, *, ok: int = 200, deadline: float = 30.0, **kw: Any
    ) -> httpx.Response:
        """One shim call; a non-``ok`` answer is raised as :class:`ContractError`."""
        resp = await self.client.request(
            method, self.prefix + path, headers=self.headers, timeout=deadline, **kw
        )
        self.last = resp
        if resp.status_code != ok:
            try:
                body = resp.json()
            except ValueError:
                body = {}
            assert set(body) == {"code", "message", "details"}, (resp.status_code, resp.text)
            raise ContractError(
                body["code"], resp.status_code, body["message"], body["details"] or {}
            )
        return resp

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        resp = await self.request(method, path, **kw)
        body: dict[str, Any] = resp.json()
        return body

    @staticmethod
    def _poll_body(
        capabilities: list[str], limit: int | None, wait_ms: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"capabilities": capabilities}
        if limit is not None:
            body["limit"] = limit
        if wait_ms is not None:
            body["waitMs"] = wait_ms
        return body

    async def poll(
        self, capabilities: list[str], limit: int | None = None, wait_ms: int | None = None
    ) -> dict[str, Any]:
        return await self._json(
            "POST", "/jobs/poll", json=self._poll_body(capabilities, limit, wait_ms)
        )

    async def claim(
        self,
        capabilities: list[str],
        limit: int | None = None,
        wait_ms: int | None = None,
        *,
        with_snapshots: bool = False,
    ) -> dict[str, Any]:
        body = self._poll_body(capabilities, limit, wait_ms)
        if with_snapshots:
            body["withSnapshots"] = True
        return await self._json("POST", "/jobs/claim", json=body)

    async def lock(self, job_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/jobs/{quote(job_id, safe='')}/lock", json={})

    async def start(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        return await self._json(
            "POST", f"/jobs/{quote(job_id, safe='')}/start", json={"attemptNo": attempt_no}
        )

    async def heartbeat(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self.request(
            "POST",
            f"/jobs/{quote(job_id, safe='')}/heartbeat",
            ok=204,
            json={"attemptNo": attempt_no},
        )
        assert resp.content == b"", "a 204 heartbeat has no body"
        cancel = resp.headers.get("X-Cancel-Requested")
        assert cancel in ("true", "false"), f"X-Cancel-Requested: {cancel!r}"
        return {"lockUntil": resp.headers.get("X-Lock-Until"), "cancelRequested": cancel == "true"}

    async def heartbeat_leases(self, leases: list[tuple[str, int]]) -> dict[str, Any]:
        body = {"leases": [{"jobId": j, "attemptNo": a} for j, a in leases]}
        return await self._json("POST", "/leases/heartbeat", json=body)

    async def snapshot(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        return await self._json(
            "GET", f"/jobs/{quote(job_id, safe='')}/snapshot", params={"attemptNo": attempt_no}
        )

    async def resolve(self, job_id: str, attempt_no: int) -> dict[str, Any]:
        resp = await self.request(
            "POST", "/model-credentials/resolve", json={"jobId": job_id, "attemptNo": attempt_no}
        )
        assert resp.headers.get("Cache-Control") == "no-store", resp.headers
        body: dict[str, Any] = resp.json()
        return body

    async def result(
        self,
        job_id: str,
        attempt_no: int,
        output: dict[str, Any],
        *,
        prompt_version: str = "learning_state_analysis.v1",
        output_schema_version: str = "v1",
    ) -> dict[str, Any]:
        body = {
            "attemptNo": attempt_no,
            "promptVersion": prompt_version,
            "outputSchemaVersion": output_schema_version,
            "output": output,
        }
        return await self._json("POST", f"/jobs/{quote(job_id, safe='')}/result", json=body)

    async def fail(
        self,
        job_id: str,
        attempt_no: int,
        error_code: str,
        error_message: str = "",
        retry_after_seconds: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "attemptNo": attempt_no,
            "errorCode": error_code,
            "errorMessage": error_message,
        }
        if retry_after_seconds is not None:
            body["retryAfterSeconds"] = retry_after_seconds
        return await self._json("POST", f"/jobs/{quote(job_id, safe='')}/fail", json=body)

    async def invocation_log(self, **fields: Any) -> dict[str, Any]:
        return await self._json("POST", "/invocation-logs", ok=201, json=fields)

    async def health(self) -> dict[str, Any]:
        return await self._json("GET", "/health")


__all__ = [
    "JOB_KEYS",
    "SPEC_STATUS",
    "ContractError",
    "GrpcTransport",
    "RestTransport",
    "RuntimeTransport",
    "field_json",
    "job_json",
    "to_json",
]
