"""The worker's end of ``RuntimeSession``: its runtime calls over one stream (reference §3).

:class:`RuntimeSession` keeps one bidirectional stream to job_service open and
multiplexes the worker's calls over it: each call is a numbered message, its
answer is matched by number, any number may be in flight at once. A call's
deadline is kept here (a late call is cancelled on the server by a ``cancel``
message); a refusal arrives as the rich status the unary call would have ended
with, raised as the same :class:`grpc.aio.AioRpcError`, so the client's retry
rules and error mapping apply unchanged.

Calls that queue while the stream is busy writing go out together as one
``batch`` message, once job_service's initial metadata says it takes batches
(``x-runtime-session-batch``); the worker asks for batched answers the same way.
Nothing waits to fill a batch: a lone call is written at once, so batching only
saves writes (each a system call and a poller wake-up on both sides) when calls
come faster than the stream sends them, as under load.

When the stream breaks (job_service restarted, the network cut), every call in
flight on it fails ``UNAVAILABLE`` (the retryable calls are then retried, as a
unary call cut the same way would be) and the next call opens a new stream.

With tracing on, each call is a client span shaped as the unary call's would be,
and its ``traceparent`` travels in the call's message, so job_service's span of
the call joins the caller's trace (:meth:`airuntime_common.tracing.Tracing.call_span`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from airuntime_common import metadata as md_keys
from airuntime_common.tracing import Tracing
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

log = logging.getLogger(__name__)

#: The stream's own failures passed to its calls as they are: refusals of the stream
#: itself (a wrong token, an unknown method). Any other failure is the transport's
#: and its calls fail ``UNAVAILABLE``.
STREAM_REFUSALS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)
_CODES = {code.value[0]: code for code in grpc.StatusCode}

Pending = dict[int, "asyncio.Future[rr.RuntimeSessionResponse]"]
#: The most calls one batch message carries.
MAX_CALLS_PER_MESSAGE = 64
#: A call's field in ``RuntimeSessionRequest`` → the unary method it stands for.
CALL_METHODS = {
    field: f"/zhixi.airuntime.job.v1.JobService/{method}"
    for field, method in (
        ("claim_jobs", "ClaimJobs"),
        ("start_job", "StartJob"),
        ("heartbeat_leases", "HeartbeatLeases"),
        ("get_snapshot", "GetSnapshot"),
        ("submit_result", "SubmitResult"),
        ("fail_job", "FailJob"),
        ("record_invocation", "RecordInvocation"),
    )
}


class _Stream:
    """One open stream: its calls in flight and the messages waiting to be written."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: Pending = {}
        self.outbox: list[rr.RuntimeSessionRequest] = []
        self.wake = asyncio.Event()
        #: job_service's initial metadata said it takes batches
        self.batches = False
        self.reader: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None


def _rpc_error(code: grpc.StatusCode, message: str, status: bytes = b"") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status)) if status else None
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing or grpc.aio.Metadata(), message)


class RuntimeSession:
    """One long-lived ``RuntimeSession`` stream, opened on first use and again after a break.

    Args:
        stub: the JobService stub of the worker's channel.
        metadata: the stream's metadata (token, runtime instance id), sent once.
        tracing: the worker's tracing: one client span per call. None: no spans.
    """

    def __init__(
        self,
        stub: job_grpc.JobServiceStub,
        metadata: Sequence[tuple[str, str]],
        tracing: Tracing | None = None,
    ) -> None:
        self._stub = stub
        self._tracing = tracing
        self._metadata = (*tuple(metadata), (md_keys.SESSION_BATCH, "1"))
        self._ids = itertools.count(1)
        self._stream: _Stream | None = None
        self._open_lock = asyncio.Lock()
        #: streams opened so far (a reopen after a break counts)
        self.opened = 0
        #: messages written, and how many of them were batches (for tests and metrics)
        self.messages_written = 0
        self.batches_written = 0

    async def _current(self) -> _Stream:
        async with self._open_lock:
            if self._stream is None:
                stream = _Stream(self._stub.RuntimeSession(metadata=self._metadata))
                stream.reader = asyncio.create_task(self._read(stream))
                stream.writer = asyncio.create_task(self._write(stream))
                self._stream = stream
                self.opened += 1
            return self._stream

    async def _write(self, stream: _Stream) -> None:
        """Write what the outbox holds, all of it in one message when job_service takes
        batches; a failed write fails the calls it carried ``UNAVAILABLE``."""
        while True:
            await stream.wake.wait()
            stream.wake.clear()
            while stream.outbox:
                take = MAX_CALLS_PER_MESSAGE if stream.batches else 1
                messages, stream.outbox[:take] = stream.outbox[:take], []
                message = (
                    messages[0]
                    if len(messages) == 1
                    else rr.RuntimeSessionRequest(batch=rr.RuntimeSessionBatch(calls=messages))
                )
                try:
                    await stream.call.write(message)
                except (
                    grpc.aio.AioRpcError,
                    grpc.aio.UsageError,
                    asyncio.InvalidStateError,
                ) as exc:
                    broke = _rpc_error(
                        grpc.StatusCode.UNAVAILABLE, f"the runtime session broke: {exc}"
                    )
                    for sent in (*messages, *stream.outbox):
                        future = stream.pending.pop(sent.id, None)
                        if future is not None and not future.done():
                            future.set_exception(broke)
                    stream.outbox.clear()
                    continue
                self.messages_written += 1
                self.batches_written += len(messages) > 1

    async def _read(self, stream: _Stream) -> None:
        error: grpc.aio.AioRpcError
        pending = stream.pending
        try:
            initial = await stream.call.initial_metadata()
            stream.batches = dict(initial or ()).get(md_keys.SESSION_BATCH) == "1"
            async for answer in stream.call:
                batch = (
                    answer.batch.answers if answer.WhichOneof("answer") == "batch" else (answer,)
                )
                for one in batch:
                    future = pending.pop(one.id, None)
                    if future is not None and not future.done():
                        future.set_result(one)
            error = _rpc_error(grpc.StatusCode.UNAVAILABLE, "the runtime session ended")
        except grpc.aio.AioRpcError as exc:
            if exc.code() in STREAM_REFUSALS:
                error = exc
            else:
                error = _rpc_error(
                    grpc.StatusCode.UNAVAILABLE, f"the runtime session broke: {exc.code().name}"
                )
        except asyncio.CancelledError:
            error = _rpc_error(grpc.StatusCode.CANCELLED, "the runtime session was closed")
        finally:
            if self._stream is stream:
                self._stream = None
            if stream.writer is not None:
                stream.writer.cancel()
        if error.code() != grpc.StatusCode.CANCELLED:
            log.warning("runtime session ended: %s", error.details())
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        pending.clear()
        stream.outbox.clear()

    async def call(
        self, field: str, request: Any, *, deadline_s: float | None, request_id: str = ""
    ) -> Any:
        """Send one call (``field`` is its name in ``RuntimeSessionRequest.call``) and wait
        for its answer, at most ``deadline_s`` seconds (None: no limit).

        Returns:
            The unary RPC's response message.

        Raises:
            grpc.aio.AioRpcError: the call's refusal (its rich status), UNAVAILABLE when
                the stream broke, DEADLINE_EXCEEDED after ``deadline_s``.
        """
        if self._tracing is None:
            return await self._send(field, request, deadline_s, request_id, "")
        with self._tracing.call_span(CALL_METHODS[field], server=False) as span:
            try:
                answer = await self._send(field, request, deadline_s, request_id, span.trace_parent)
            except grpc.aio.AioRpcError as exc:
                span.finish(exc.code().name)
                raise
            except asyncio.CancelledError:
                span.finish("CANCELLED")
                raise
            span.finish("OK")
            return answer

    async def _send(
        self,
        field: str,
        request: Any,
        deadline_s: float | None,
        request_id: str,
        traceparent: str,
    ) -> Any:
        stream = await self._current()
        call_id = next(self._ids)
        future: asyncio.Future[rr.RuntimeSessionResponse] = (
            asyncio.get_running_loop().create_future()
        )
        stream.pending[call_id] = future
        stream.outbox.append(
            rr.RuntimeSessionRequest(
                id=call_id, request_id=request_id, traceparent=traceparent, **{field: request}
            )
        )
        stream.wake.set()
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            stream.pending.pop(call_id, None)
            future.cancel()
            self._cancel(stream, call_id)
            if isinstance(exc, TimeoutError):
                raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            raise
        if answer.WhichOneof("answer") == "error":
            err = answer.error
            raise _rpc_error(
                _CODES.get(err.grpc_code, grpc.StatusCode.UNKNOWN), err.message, err.status
            )
        return getattr(answer, field)

    def _cancel(self, stream: _Stream, call_id: int) -> None:
        """Stop a call in flight: drop it if it is still unwritten, else send a cancel."""
        for n, waiting in enumerate(stream.outbox):
            if waiting.id == call_id:
                del stream.outbox[n]
                return
        if self._stream is stream:
            stream.outbox.append(rr.RuntimeSessionRequest(id=next(self._ids), cancel=call_id))
            stream.wake.set()

    async def close(self) -> None:
        """Half-close the stream and stop reading; calls in flight fail CANCELLED."""
        stream = self._stream
        self._stream = None
        if stream is None:
            return
        stream.call.cancel()
        for task in (stream.reader, stream.writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def method(self, field: str) -> Callable[..., Awaitable[Any]]:
        """A callable shaped like the unary stub method of call ``field``
        (``(request, *, metadata, timeout)``) that sends the call on this session."""

        async def call(
            request: Any,
            *,
            metadata: Any = (),
            timeout: float | None = None,  # noqa: ASYNC109 (the unary stub's signature)
        ) -> Any:
            request_id = dict(metadata).get(md_keys.REQUEST_ID, "") or uuid.uuid4().hex
            return await self.call(field, request, deadline_s=timeout, request_id=request_id)

        return call
