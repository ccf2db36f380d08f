"""What every JobService RPC shares: the error mapping and the checks of request fields.

:func:`rpc` wraps each RPC: an :class:`AppError` becomes a rich gRPC status
(:func:`airuntime_common.grpc_errors.abort`), a database that cannot be
reached ``UNAVAILABLE``, anything else unexpected ``INTERNAL`` (logged), never
a bare traceback. Runtime calls read the caller's instance id from
``x-runtime-instance-id`` (missing → INVALID_ARGUMENT).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from sqlalchemy.exc import DBAPIError, OperationalError

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.settings import DAY
from job_service.services.inputs import ModelCallInput

log = logging.getLogger("job_service.rpc")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type hints)


def rpc(
    fn: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    """Map :class:`AppError` to a rich status, a database that cannot be reached to
    ``UNAVAILABLE`` (retryable: nothing was committed, or the call is idempotent),
    and anything else unexpected to INTERNAL."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await fn(self, request, context)
        except AppError as err:
            await abort(context, err)
        except grpc.aio.AbortError:
            raise
        except DBAPIError as exc:
            if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                log.exception("unexpected database error in %s", fn.__name__)
                await abort(context, AppError(ErrorCode.INTERNAL, "internal error", None))
            log.warning(
                "database unavailable in %s: %s",
                fn.__name__,
                type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__,
            )
            await abort(
                context, AppError(ErrorCode.UNAVAILABLE, "the job database is unavailable", None)
            )
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            await abort(context, AppError(ErrorCode.INTERNAL, "internal error", None))
        raise AssertionError("unreachable")  # pragma: no cover

    return wrapper


def instance_of(context: Ctx) -> str:
    """The caller's runtime instance id (``x-runtime-instance-id``, ≤ 128 characters).

    Raises:
        AppError: INVALID_ARGUMENT when it is missing or too long.
    """
    value = metadata.get(context, metadata.RUNTIME_INSTANCE_ID)
    if not value:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "x-runtime-instance-id metadata is required",
            {"field": "x-runtime-instance-id"},
        )
    if len(value) > 128:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "x-runtime-instance-id is too long",
            {"field": "x-runtime-instance-id"},
        )
    return value


def job_id_of(value: str) -> str:
    """A request's job id (any non-empty string: ids are opaque, reference §3).

    Raises:
        AppError: INVALID_ARGUMENT when empty.
    """
    if not value:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "jobId is required", {"field": "jobId"})
    return value


def attempt_of(value: int) -> int:
    """A request's ``attemptNo`` (≥ 1).

    Raises:
        AppError: INVALID_ARGUMENT otherwise.
    """
    if value < 1:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "attemptNo must be ≥ 1", {"field": "attemptNo"})
    return value


#: Bounds of runtime request fields; the REST shim's body models hold the same
#: ones, so both transports refuse the same requests (and no value overflows its column).
MAX_CAPABILITIES = 10
MAX_STATUS_ADDRESS = 255
#: ``<jobType>.<version>``: a 32-character type, a dot, a 64-character version (reference §10.4)
MAX_PROMPT_VERSION = 128
MAX_OUTPUT_SCHEMA_VERSION = 16
MAX_ERROR_CODE = 64
MAX_ERROR_MESSAGE = 4000
MAX_RETRY_AFTER_SECONDS = float(DAY)
MAX_MODEL_PROVIDER = 32
MAX_MODEL_NAME = 64
MAX_CREDENTIAL_ID = 64
MAX_PROVIDER_REQUEST_ID = 128
#: Token counts and latencies stay within the integers JSON handles exactly.
MAX_COUNTER = 2**53


def capabilities_of(values: Any) -> list[str]:
    """A request's capabilities as job type names, each once, in first-seen order.

    Raises:
        AppError: INVALID_ARGUMENT for more than :data:`MAX_CAPABILITIES` or an unknown type.
    """
    if len(values) > MAX_CAPABILITIES:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"at most {MAX_CAPABILITIES} capabilities",
            {"field": "capabilities"},
        )
    # a repeated capability is the same capability: kept once, in first-seen order
    return list(dict.fromkeys(JOB_TYPE.to_str(v) for v in values))


def text_field(value: str, field: str, max_len: int, *, required: bool = False) -> str:
    """A string request field within its bounds (``INVALID_ARGUMENT`` naming it otherwise)."""
    if required and not value.strip():
        raise AppError(ErrorCode.INVALID_ARGUMENT, f"{field} is required", {"field": field})
    if len(value) > max_len:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field} is longer than {max_len} characters",
            {"field": field},
        )
    return value


def counter_field(value: int, field: str) -> int:
    """A token count or latency within 0..2^53 (``INVALID_ARGUMENT`` naming it otherwise)."""
    if not 0 <= value <= MAX_COUNTER:
        raise AppError(ErrorCode.INVALID_ARGUMENT, f"{field} must be 0..2^53", {"field": field})
    return value


#: Model calls one SubmitResult/FailJob may carry (a worker makes at most two per attempt).
MAX_CALLS_PER_REPORT = 20


def model_call_of(c: Any, at: str = "") -> ModelCallInput:
    """One reported model call (a ``ModelCall`` or a ``RecordInvocationRequest``: the same
    field names), its fields checked; ``at`` prefixes the field named in an error.

    Raises:
        AppError: INVALID_ARGUMENT naming ``<at><field>``.
    """
    for field, value, max_len in (
        ("credentialId", c.credential_id, MAX_CREDENTIAL_ID),
        ("errorCode", c.error_code, MAX_ERROR_CODE),
        ("providerRequestId", c.provider_request_id, MAX_PROVIDER_REQUEST_ID),
    ):
        text_field(value, at + field, max_len)
    call = ModelCallInput(
        model_provider=text_field(
            c.model_provider, at + "modelProvider", MAX_MODEL_PROVIDER, required=True
        ),
        model_name=text_field(c.model_name, at + "modelName", MAX_MODEL_NAME, required=True),
        api_key_mode=API_KEY_MODE.optional(c.api_key_mode),
        credential_id=c.credential_id if c.HasField("credential_id") else None,
        prompt_tokens=counter_field(c.prompt_tokens, at + "promptTokens"),
        completion_tokens=counter_field(c.completion_tokens, at + "completionTokens"),
        cache_hit_tokens=counter_field(c.cache_hit_tokens, at + "cacheHitTokens"),
        latency_ms=counter_field(c.latency_ms, at + "latencyMs"),
        outcome=c.outcome,
        error_code=c.error_code if c.HasField("error_code") else None,
        provider_request_id=c.provider_request_id if c.HasField("provider_request_id") else None,
    )
    try:
        call.check()
    except AppError as err:
        field = (err.details or {}).get("field", "")
        raise AppError(err.code, err.message, {"field": at + str(field)}) from None
    return call


def calls_of(reported: Any) -> list[ModelCallInput]:
    """The ``invocations`` of a SubmitResult/FailJob, checked like RecordInvocation's fields.

    Raises:
        AppError: INVALID_ARGUMENT naming ``invocations[i].<field>``.
    """
    if len(reported) > MAX_CALLS_PER_REPORT:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"at most {MAX_CALLS_PER_REPORT} invocations",
            {"field": "invocations"},
        )
    return [model_call_of(c, f"invocations[{i}].") for i, c in enumerate(reported)]
