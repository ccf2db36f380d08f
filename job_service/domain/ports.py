"""Seams to the rest of the system: learning data/results and the credential service.

:class:`LearningPort` is what the core needs from the learning-data module
(``job_service.domain.snapshots`` / ``job_service.domain.results``);
:class:`CredentialChecker` is the credential service as the core sees it.
Both are small protocols so tests can substitute fakes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.logs import log_context
from job_service.db import DbExec

log = logging.getLogger(__name__)


class SnapshotView(Protocol):
    """What :meth:`LearningPort.load_snapshot` returns."""

    @property
    def snapshot_id(self) -> str: ...
    @property
    def schema_version(self) -> str: ...
    @property
    def target_type(self) -> str: ...
    @property
    def target_id(self) -> str: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def content_hash(self) -> str: ...


@dataclass(frozen=True)
class SnapshotRead:
    """How to get one snapshot inside a statement batch (``ModuleLearningPort.snapshot_read``).

    Attributes:
        view: the cached view; None when it must be read.
        key, build, params: the ``SELECT`` (a :mod:`sqlcache` shape and its values).
        exists: a registered (:func:`sqlcache.stable`) condition, bound by the same
            ``params``: the snapshot's row exists.
        from_row: the view of the ``SELECT``'s one row.
        not_found: the error when it returns no row.
    """

    view: SnapshotView | None
    key: Hashable
    build: Callable[[], Any]
    params: dict[str, Any]
    exists: Any
    from_row: Callable[[Sequence[Any]], SnapshotView]
    not_found: Callable[[], Exception]


class LearningPort(Protocol):
    """Snapshots, generation plans and business rows (SPEC §5), in the caller's transaction."""

    async def build_snapshot(
        self,
        session: AsyncSession,
        *,
        user_id: str,
        job_type: str,
        target_type: str,
        target_id: str,
        params: dict[str, Any],
    ) -> str:
        """Build and store an immutable snapshot; NOT_FOUND when the target is not the user's."""
        ...

    async def load_snapshot(self, session: DbExec, snapshot_id: str) -> SnapshotView:
        """Read a stored snapshot."""
        ...

    async def create_generation_plan(
        self,
        session: AsyncSession,
        *,
        job_id: str,
        user_id: str,
        job_type: str,
        target_type: str,
        target_id: str,
        params: dict[str, Any],
    ) -> None:
        """Write the generation plan row of a quiz/flashcard job (no-op otherwise)."""
        ...

    async def accept_result(
        self,
        session: DbExec,
        *,
        job_id: str,
        user_id: str,
        job_type: str,
        snapshot_id: str,
        output_schema_version: str,
        output: dict[str, Any],
    ) -> Any:
        """Validate and write business rows; AppError(INVALID_SCHEMA) when invalid."""
        ...


class ModuleLearningPort:
    """The real :class:`LearningPort`: delegates to the learning-data modules.

    Imported lazily so the core still loads while those modules evolve.

    Attributes:
        validates_before_write: True: :func:`results.accept_result` checks the
            whole output (schema, ownership) before its first write, so an
            ``INVALID_SCHEMA`` leaves nothing to roll back and the job service
            needs no savepoint around it. A port without this attribute gets one.
    """

    validates_before_write = True

    async def build_snapshot(self, session: AsyncSession, **kw: Any) -> str:
        from job_service.domain import snapshots

        return await snapshots.build_snapshot(session, **kw)

    async def load_snapshot(self, session: DbExec, snapshot_id: str) -> SnapshotView:
        from job_service.domain import snapshots

        return await snapshots.load_snapshot(session, snapshot_id)

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        """A snapshot as a batch can read it: the cached view, or the statement.

        For callers sending several statements in one round trip
        (:mod:`job_service.domain.batch`); :meth:`load_snapshot` is the same read
        one statement at a time. A port without this method is read that way.
        """
        from job_service.domain import snapshots

        cached = snapshots.SNAPSHOT_CACHE.get(snapshot_id)
        return SnapshotRead(
            view=cached,
            key=snapshots.SNAPSHOT_READ_KEY,
            build=snapshots.snapshot_read_stmt,
            params={"s_id": snapshot_id},
            exists=snapshots.snapshot_exists(),
            from_row=snapshots.snapshot_from_row,
            not_found=lambda: snapshots.snapshot_not_found(snapshot_id),
        )

    async def create_generation_plan(self, session: AsyncSession, **kw: Any) -> None:
        from job_service.domain import results

        await results.create_generation_plan(session, **kw)

    async def accept_result(self, session: DbExec, **kw: Any) -> Any:
        from job_service.domain import results

        return await results.accept_result(session, **kw)

    async def prepare_result(self, session: DbExec, **kw: Any) -> Any:
        """:meth:`accept_result` up to its writes: a ``results.PreparedResult``, whose
        ``statements()`` a result's batch sends with its own (or None, then its
        ``write(session)``). A port without this method is called with
        :meth:`accept_result`."""
        from job_service.domain import results

        return await results.prepare_result(session, **kw)


class CredentialChecker(Protocol):
    """The credential service as seen from job create and fail (SPEC §6)."""

    async def check(self, user_id: str, api_key_mode: str) -> str | None:
        """Return the credential id (None for the platform key) if usable.

        Raises:
            AppError: ``INVALID_CREDENTIAL`` when no usable key exists.
        """
        ...

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        """Mark a user's credential invalid after the model refused it."""
        ...


class GrpcCredentialChecker:
    """:class:`CredentialChecker` over gRPC to ``CREDENTIAL_SERVICE_ADDR``.

    Args:
        target: ``host:port`` of credential_service.
        token: the internal service token.
        ca_file: optional CA for TLS.
        timeout: per-call deadline in seconds.
    """

    def __init__(self, target: str, token: str, ca_file: str | None = None, timeout: float = 5.0):
        from zhixi.airuntime.credential.v1 import service_pb2_grpc

        self._channel = insecure_or_tls_channel(target, ca_file)
        self._stub = service_pb2_grpc.CredentialServiceStub(self._channel)
        self._token = token
        self._timeout = timeout

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The service token, plus the request id of the RPC being served (log correlation)."""
        request_id = (log_context.get() or {}).get("requestId")
        return metadata.outgoing(self._token, request_id=request_id)

    async def check(self, user_id: str, api_key_mode: str) -> str | None:
        from zhixi.airuntime.credential.v1 import request_response_pb2 as crr

        try:
            resp = await self._stub.CheckCredential(
                crr.CheckCredentialRequest(
                    user_id=user_id, api_key_mode=cast(Any, API_KEY_MODE.to_proto(api_key_mode))
                ),
                metadata=self._metadata(),
                timeout=self._timeout,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        if not resp.usable:
            raise AppError(
                ErrorCode.INVALID_CREDENTIAL,
                resp.reason or "no usable model credential",
                {"apiKeyMode": api_key_mode},
            )
        return resp.credential_id or None

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        from zhixi.airuntime.credential.v1 import request_response_pb2 as crr

        try:
            await self._stub.MarkCredentialInvalid(
                crr.MarkCredentialInvalidRequest(credential_id=credential_id, reason=reason),
                metadata=self._metadata(),
                timeout=self._timeout,
            )
        except grpc.RpcError as exc:
            log.warning(
                "MarkCredentialInvalid failed",
                extra={"fields": {"credentialId": credential_id, "code": from_rpc_error(exc).code}},
            )

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()


class AllowAllCredentials:
    """A :class:`CredentialChecker` that accepts every job (tests, local runs without keys)."""

    def __init__(self) -> None:
        self.marked: list[tuple[str, str]] = []

    async def check(self, user_id: str, api_key_mode: str) -> str | None:
        return f"cred-{user_id}" if api_key_mode == "user_deepseek_key" else None

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        self.marked.append((credential_id, reason))
