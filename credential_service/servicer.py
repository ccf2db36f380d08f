"""gRPC servicer of ``zhixi.airuntime.credential.v1.CredentialService`` (reference §3, §6).

Proto ↔ domain only: every method converts the request, calls
:class:`~credential_service.domain.CredentialStore`, and converts the answer. An
:class:`AppError` becomes a rich status (ErrorInfo.reason = the reference §4 code); a
database that cannot be reached (a lost connection, a refused one, a Galera node
that left its cluster) is ``UNAVAILABLE`` (retryable: reference §9.3, §9.6); any other
exception is logged (redacted) and answered ``INTERNAL`` without its text.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.timeutil import to_timestamp
from credential_service.domain import CredentialStore, CredentialView
from zhixi.airuntime.credential.v1 import message_pb2 as msg
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr
from zhixi.airuntime.credential.v1 import service_pb2_grpc

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)

_STATUS = {"valid": msg.CREDENTIAL_STATUS_VALID, "invalid": msg.CREDENTIAL_STATUS_INVALID}


def _rpc(
    fn: Callable[[Any, Req, Any], Awaitable[Resp]],
) -> Callable[[Any, Req, Any], Awaitable[Resp]]:
    """Map AppError to rich status, an unreachable database to UNAVAILABLE and
    anything else to a text-free INTERNAL."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Any) -> Resp:
        try:
            return await fn(self, request, context)
        except AppError as err:
            await abort(context, err)
        except DBAPIError as exc:
            if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                log.exception("unexpected database error in %s", fn.__name__)
                await abort(context, AppError(ErrorCode.INTERNAL, "internal error"))
            log.warning(
                "database unavailable in %s: %s",
                fn.__name__,
                type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__,
            )
            await abort(
                context,
                AppError(ErrorCode.UNAVAILABLE, "the credential database is unavailable"),
            )
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            await abort(context, AppError(ErrorCode.INTERNAL, "internal error"))

    return wrapper


def credential_to_proto(view: CredentialView) -> msg.Credential:
    """The masked proto view; there is no field that could carry the plaintext."""
    return msg.Credential(
        credential_id=view.credential_id,
        user_id=view.user_id,
        provider=view.provider,
        masked_key=view.masked_key,
        status=_STATUS.get(view.status, msg.CREDENTIAL_STATUS_UNSPECIFIED),
        created_at=to_timestamp(view.created_at),
        key_id=view.key_id,
        base_url=view.base_url or "",
    )


class CredentialServiceServicer(service_pb2_grpc.CredentialServiceServicer):  # type: ignore[misc]
    """Serves CredentialService over a :class:`CredentialStore`.

    Args:
        store: the domain object.
    """

    def __init__(self, store: CredentialStore) -> None:
        self.store = store

    @_rpc
    async def PutCredential(
        self, request: rr.PutCredentialRequest, context: Context
    ) -> rr.PutCredentialResponse:
        """Store or replace a key (with the user's own base URL, if any) → masked view
        with a new credential id."""
        view = await self.store.put(
            request.user_id, request.provider, request.api_key, request.base_url
        )
        return rr.PutCredentialResponse(credential=credential_to_proto(view))

    @_rpc
    async def GetCredential(
        self, request: rr.GetCredentialRequest, context: Context
    ) -> rr.GetCredentialResponse:
        """Masked view; ``NOT_FOUND`` when none."""
        view = await self.store.get(request.user_id)
        return rr.GetCredentialResponse(credential=credential_to_proto(view))

    @_rpc
    async def DeleteCredential(
        self, request: rr.DeleteCredentialRequest, context: Context
    ) -> rr.DeleteCredentialResponse:
        """Delete; ``NOT_FOUND`` when none."""
        await self.store.delete(request.user_id)
        return rr.DeleteCredentialResponse()

    @_rpc
    async def EraseUserCredentials(
        self, request: rr.EraseUserCredentialsRequest, context: Context
    ) -> rr.EraseUserCredentialsResponse:
        """Delete every credential row of the user (reference §9.2 erasure); idempotent."""
        return rr.EraseUserCredentialsResponse(removed=await self.store.erase(request.user_id))

    @_rpc
    async def CheckCredential(
        self, request: rr.CheckCredentialRequest, context: Context
    ) -> rr.CheckCredentialResponse:
        """Whether a job with this key mode may be created; ``INVALID_ARGUMENT`` on an
        unspecified mode."""
        mode = API_KEY_MODE.to_str(request.api_key_mode)
        result = await self.store.check(request.user_id, mode)
        log.info(
            "credential checked",
            extra={
                "fields": {
                    "userId": request.user_id,
                    "apiKeyMode": mode,
                    "usable": result.usable,
                    "credentialId": result.credential_id or None,
                }
            },
        )
        return rr.CheckCredentialResponse(
            usable=result.usable,
            credential_id=result.credential_id,
            reason=result.reason,
            providers=list(result.providers),
        )

    @_rpc
    async def MarkCredentialInvalid(
        self, request: rr.MarkCredentialInvalidRequest, context: Context
    ) -> rr.MarkCredentialInvalidResponse:
        """Mark a key invalid; ``NOT_FOUND`` for an unknown id."""
        await self.store.mark_invalid(request.credential_id, request.reason)
        return rr.MarkCredentialInvalidResponse()

    @_rpc
    async def RotateKeys(
        self, request: rr.RotateKeysRequest, context: Context
    ) -> rr.RotateKeysResponse:
        """One rotation batch → rotated / remaining."""
        result = await self.store.rotate_batch(request.batch_size)
        return rr.RotateKeysResponse(rotated=result.rotated, remaining=result.remaining)

    @_rpc
    async def ResolveCredential(
        self, request: rr.ResolveCredentialRequest, context: Context
    ) -> rr.ResolveCredentialResponse:
        """The key for the lease holder ``(job_id, x-runtime-instance-id, attempt_no)``."""
        resolved = await self.store.resolve(
            request.job_id,
            request.attempt_no,
            metadata.get(context, metadata.RUNTIME_INSTANCE_ID),
            metadata.get(context, metadata.REQUEST_ID),
        )
        return rr.ResolveCredentialResponse(
            api_key_mode=API_KEY_MODE.to_proto(resolved.api_key_mode),  # type: ignore[arg-type]
            credential_id=resolved.credential_id,
            api_key=resolved.api_key,
            model_provider=resolved.model_provider,
            model_name=resolved.model_name,
            base_url=resolved.base_url,
            user_base_url=resolved.user_base_url,
        )
