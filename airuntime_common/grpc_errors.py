"""Carrying reference §4 errors over gRPC as rich status (google.rpc.Status).

Servers abort with the code's gRPC status and a ``google.rpc.ErrorInfo``
whose ``reason`` is the reference §4 code and whose metadata holds the details as
JSON; clients turn an ``AioRpcError`` back into the same :class:`AppError`.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from airuntime_common.errors import AppError, ErrorCode, grpc_status
from airuntime_common.tracing import note_error

ERROR_DOMAIN = "airuntime.zhixi"
_DETAILS_KEY = "details"

_FALLBACK_CODES: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED: ErrorCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND: ErrorCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE: ErrorCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.PAYLOAD_TOO_LARGE,
}


#: Longest string kept in an error's details or message: a status travels in
#: the trailers, which a peer refuses past its header-list limit (8 KiB by
#: default), turning a clean refusal into ``INTERNAL``. Echoed input (a 5 MB
#: "id") is cut to this many characters.
MAX_ECHO_CHARS = 256
MAX_MESSAGE_CHARS = 1024
MAX_ECHO_ITEMS = 20


def _bounded(value: Any) -> Any:
    """``value`` with long strings cut and long lists/dicts shortened (for trailers)."""
    if isinstance(value, str):
        if len(value) <= MAX_ECHO_CHARS:
            return value
        return f"{value[:MAX_ECHO_CHARS]}…({len(value)} chars)"
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ECHO_ITEMS]
        return {_bounded(str(k)): _bounded(v) for k, v in items}
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value[:MAX_ECHO_ITEMS]]
    return value


def to_status(err: AppError) -> grpc.Status:
    """Build the rich gRPC status for ``err`` (code per reference §4, ErrorInfo.reason = code).

    Strings in the details are cut to :data:`MAX_ECHO_CHARS` and the message to
    :data:`MAX_MESSAGE_CHARS`, so a refusal that echoes a huge input still fits
    in the trailers.
    """
    info = error_details_pb2.ErrorInfo(
        reason=err.code,
        domain=ERROR_DOMAIN,
        metadata={_DETAILS_KEY: json.dumps(_bounded(err.details or {}), default=str)},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    message = err.message
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "…"
    status = status_pb2.Status(
        code=grpc_status(err.code).value[0], message=message, details=[detail]
    )
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext[Any, Any], err: AppError) -> NoReturn:
    """Abort the current RPC with ``err`` as rich status. Never returns.

    With tracing on, the call's server span gets ``error.type`` = the reference §4 code
    (never the message, which may echo input).
    """
    note_error(err.code)
    await context.abort_with_status(to_status(err))
    raise AssertionError("unreachable")  # abort_with_status always raises


def from_rpc_error(exc: grpc.aio.AioRpcError | grpc.RpcError) -> AppError:
    """Turn a failed call back into the :class:`AppError` the server raised.

    A status without ErrorInfo (a transport failure, a foreign server) maps
    by its gRPC code: UNAVAILABLE/DEADLINE_EXCEEDED → ``UNAVAILABLE``, others
    to the nearest reference §4 code, else ``INTERNAL``.
    """
    status = rpc_status.from_call(exc)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                raw = info.metadata.get(_DETAILS_KEY)
                details = json.loads(raw) if raw else None
                return AppError(info.reason, status.message, details or None)
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    text = exc.details() if hasattr(exc, "details") else str(exc)
    return AppError(_FALLBACK_CODES.get(code, ErrorCode.INTERNAL), text or str(code))
