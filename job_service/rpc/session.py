"""``RuntimeSession``: a worker's runtime calls over one bidirectional stream (reference §3).

Each request message names one call (``claim_jobs``, ``start_job``,
``heartbeat_leases``, ``get_snapshot``, ``submit_result``, ``fail_job``,
``record_invocation``) and an ``id``; the call runs as its own task through the
very servicer method its unary RPC runs (same checks, same transaction, same
refusals), and its answer, or its refusal as the rich status the unary call would
have ended with, comes back under the same ``id`` in whatever order the calls
finish. A ``cancel`` stops the call it names, as a cancelled unary call stops.
The stream's metadata (token, runtime instance id) holds for every call on it.

Why: a unary call costs a stream's setup, its metadata and the interceptors on
both sides per message; a worker's calls per job (claim, heartbeat, result) are
small, so that overhead was a large part of a job's CPU. The unary RPCs and the
REST shim stay for every other runtime.

A call's duration is observed in ``airt_grpc_server_handling_seconds`` under its own
method's label (``JobService/ClaimJobs``…), as the unary call's would be; with
tracing on, each call is a server span named by its unary method, the caller's
``traceparent`` (the message's) its parent.

Batches: the server's initial metadata says it takes batched calls
(``x-runtime-session-batch: 1``): a ``batch`` message carries calls (and cancels)
that are taken in order as if each came alone. A caller that sends the same key
gets the answers that are ready together as one ``batch`` answer: one message,
one write, instead of one per answer (a group of results committed together
answers at once). Batching changes no call's outcome, only how many messages
carry them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import grpc

from airuntime_common import metadata as md_keys
from airuntime_common import tracing as _tracing
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.grpc_server import RPC_SECONDS
from airuntime_common.logs import bind, log_context
from job_service.rpc.common import Ctx
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

log = logging.getLogger("job_service.rpc")

#: A call's name (its field in the request's ``call`` and the answer's ``answer``) →
#: the servicer method that runs it.
SESSION_CALLS: dict[str, str] = {
    "claim_jobs": "ClaimJobs",
    "start_job": "StartJob",
    "heartbeat_leases": "HeartbeatLeases",
    "get_snapshot": "GetSnapshot",
    "submit_result": "SubmitResult",
    "fail_job": "FailJob",
    "record_invocation": "RecordInvocation",
}
#: Calls one session may have in flight; a worker holds at most its slots' worth of
#: leases plus a claim and a heartbeat, so this only stops a runaway client.
MAX_CALLS_IN_FLIGHT = 1024


#: What the stream's answer queue holds: an answer, the end of the caller's calls
#: (None), or the protocol error that ends the stream.
Answer = rr.RuntimeSessionResponse | AppError | None


#: The most answers one batched answer carries.
MAX_ANSWERS_PER_MESSAGE = 64


def _protocol_error(
    request: rr.RuntimeSessionRequest, kind: str | None, *, in_batch: bool = False
) -> AppError | None:
    """The INVALID_ARGUMENT ending the stream for a message no conforming caller sends:
    no call, a message numbered 0 (proto3's unset), a cancel of call 0, an empty
    batch, a batch within a batch, or a batch holding any of these."""
    if kind == "batch":
        if in_batch:
            return AppError(
                ErrorCode.INVALID_ARGUMENT, "a batch holds calls, not batches", {"field": "batch"}
            )
        if not request.batch.calls:
            return AppError(
                ErrorCode.INVALID_ARGUMENT, "a batch names no call", {"field": "batch.calls"}
            )
        for call in request.batch.calls:
            broken = _protocol_error(call, call.WhichOneof("call"), in_batch=True)
            if broken is not None:
                return broken
        return None
    if kind is None:
        return AppError(
            ErrorCode.INVALID_ARGUMENT, "a session message names no call", {"field": "call"}
        )
    if request.id == 0:
        return AppError(
            ErrorCode.INVALID_ARGUMENT, "a session message needs an id ≥ 1", {"field": "id"}
        )
    if kind == "cancel" and request.cancel == 0:
        return AppError(
            ErrorCode.INVALID_ARGUMENT, "cancel names call 0: ids start at 1", {"field": "cancel"}
        )
    return None


def _one_message(answers: list[rr.RuntimeSessionResponse]) -> rr.RuntimeSessionResponse:
    """One answer as it is, several as one batch."""
    if len(answers) == 1:
        return answers[0]
    return rr.RuntimeSessionResponse(batch=rr.RuntimeSessionAnswers(answers=answers))


def _forget(calls: dict[int, asyncio.Task[None]], call_id: int, _task: object) -> None:
    calls.pop(call_id, None)


class CallRefused(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by :class:`CallContext` where a unary call's context would abort: the
    refusal of one call on the session, not of the stream."""

    def __init__(self, code: grpc.StatusCode, message: str, status: bytes = b"") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def answer(self, call_id: int) -> rr.RuntimeSessionResponse:
        """The call's answer carrying this refusal."""
        return rr.RuntimeSessionResponse(
            id=call_id,
            error=rr.RuntimeSessionError(
                grpc_code=self.code.value[0], message=self.message, status=self.status
            ),
        )


class _Metadatum(NamedTuple):
    """One metadata item, as a servicer context's ``invocation_metadata`` yields them."""

    key: str
    value: str


class CallContext:
    """The servicer context of one call on a session: the stream's metadata and peer
    (with the call's own ``traceparent``, as a unary call's metadata carries it), and
    an ``abort`` that refuses this call only (:class:`CallRefused`)."""

    def __init__(self, stream: Ctx, traceparent: str = "") -> None:
        self._stream = stream
        self._traceparent = traceparent
        self.code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> Any:
        """The stream's metadata (``x-runtime-instance-id``…) and the call's ``traceparent``."""
        md = tuple(self._stream.invocation_metadata() or ())
        if not self._traceparent:
            return md
        return (
            *(item for item in md if item.key != _tracing.TRACEPARENT),
            _Metadatum(_tracing.TRACEPARENT, self._traceparent),
        )

    def peer(self) -> str:
        """The stream's peer."""
        return str(self._stream.peer())

    def time_remaining(self) -> float | None:
        """No per-call deadline on the server: the caller cancels a late call."""
        return None

    async def abort_with_status(self, status: grpc.Status) -> None:
        """Refuse this call with ``status`` (a rich status, as :func:`~airuntime_common.grpc_errors.abort` builds)."""
        self.code = status.code
        details = dict(status.trailing_metadata or ()).get("grpc-status-details-bin", b"")
        raise CallRefused(status.code, status.details or "", bytes(details))

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        """Refuse this call with a plain status."""
        self.code = code
        raise CallRefused(code, details)


class SessionRpcs:
    """``RuntimeSession``: the runtime calls of :class:`~job_service.rpc.runtime.RuntimeRpcs`
    over one stream."""

    async def RuntimeSession(
        self, requests: AsyncIterator[rr.RuntimeSessionRequest], context: Ctx
    ) -> AsyncIterator[rr.RuntimeSessionResponse]:
        """Run every call the stream sends, concurrently; yield each answer as it is ready.

        The stream ends once the caller has half-closed it and every call in flight
        has answered; a caller that goes away cancels every call in flight at once. A
        message no conforming caller sends (no call, id 0) ends it INVALID_ARGUMENT.
        """
        batched = md_keys.get(context, md_keys.SESSION_BATCH) == "1"
        await context.send_initial_metadata(((md_keys.SESSION_BATCH, "1"),))
        answers: asyncio.Queue[Answer] = asyncio.Queue()
        calls: dict[int, asyncio.Task[None]] = {}
        reader = asyncio.create_task(self._read_calls(requests, context, calls, answers))
        reading = True
        try:
            while reading or calls or not answers.empty():
                ready = [await answers.get()]
                while batched and len(ready) < MAX_ANSWERS_PER_MESSAGE and not answers.empty():
                    ready.append(answers.get_nowait())
                out: list[rr.RuntimeSessionResponse] = []
                for answer in ready:
                    if answer is None:
                        reading = False
                    elif isinstance(answer, AppError):
                        if out:
                            yield _one_message(out)
                        await abort(context, answer)
                    else:
                        out.append(answer)
                if out:
                    yield _one_message(out)
        finally:
            reader.cancel()
            for task in list(calls.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read_calls(
        self,
        requests: AsyncIterator[rr.RuntimeSessionRequest],
        context: Ctx,
        calls: dict[int, asyncio.Task[None]],
        answers: asyncio.Queue[Answer],
    ) -> None:
        try:
            async for request in requests:
                kind = request.WhichOneof("call")
                broken = _protocol_error(request, kind)
                if broken is not None:  # nothing of a broken message runs
                    answers.put_nowait(broken)
                    return
                if kind == "batch":
                    for call in request.batch.calls:
                        self._take(call, str(call.WhichOneof("call")), context, calls, answers)
                else:
                    self._take(request, str(kind), context, calls, answers)
        finally:
            answers.put_nowait(None)

    def _take(
        self,
        request: rr.RuntimeSessionRequest,
        kind: str,
        context: Ctx,
        calls: dict[int, asyncio.Task[None]],
        answers: asyncio.Queue[Answer],
    ) -> None:
        """Start one well-formed call (or apply a cancel), as its message's turn comes."""
        if kind == "cancel":
            task = calls.get(request.cancel)
            if task is not None:
                task.cancel()
            return
        refused = None
        if request.id in calls:
            refused = CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT, "a call with this id is in flight"
            )
        elif len(calls) >= MAX_CALLS_IN_FLIGHT:
            refused = CallRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls in flight on this session"
            )
        if refused is not None:
            answers.put_nowait(refused.answer(request.id))
            return
        task = asyncio.create_task(self._run_call(request, kind, context, answers))
        calls[request.id] = task
        task.add_done_callback(functools.partial(_forget, calls, request.id))

    async def _run_call(
        self,
        request: rr.RuntimeSessionRequest,
        kind: str,
        context: Ctx,
        answers: asyncio.Queue[Answer],
    ) -> None:
        method_name = SESSION_CALLS[kind]
        tracing = _tracing.current()
        if tracing is None:
            await self._answer(request, kind, context, answers)
            return
        full = f"/zhixi.airuntime.job.v1.JobService/{method_name}"
        trace_parent = request.traceparent or None
        with tracing.call_span(full, server=True, trace_parent=trace_parent) as span:
            span.finish(await self._answer(request, kind, context, answers))

    async def _answer(
        self,
        request: rr.RuntimeSessionRequest,
        kind: str,
        context: Ctx,
        answers: asyncio.Queue[Answer],
    ) -> str:
        """Run one call through its servicer method and queue its answer; the name of the
        gRPC status it ended with."""
        field, method_name = kind, SESSION_CALLS[kind]
        method: Callable[[Any, Any], Awaitable[Any]] = getattr(self, method_name)
        call_context = CallContext(context, request.traceparent)
        started = time.perf_counter()
        token = bind(requestId=request.request_id or None)
        status = "OK"
        try:
            response = await method(getattr(request, field), call_context)
            answers.put_nowait(rr.RuntimeSessionResponse(id=request.id, **{field: response}))
        except CallRefused as refused:
            status = refused.code.name
            answers.put_nowait(refused.answer(request.id))
        except asyncio.CancelledError:
            status = "CANCELLED"
            raise
        finally:
            RPC_SECONDS.labels(f"JobService/{method_name}", status).observe(
                time.perf_counter() - started
            )
            log_context.reset(token)
        return status
