"""Seams to the rest of the system: learning data/results and the credential service.

:class:`LearningPort` is what the core needs from the learning-data room
(:mod:`job_service.learning`); :class:`CredentialChecker` is the credential
service as the core sees it. Both are small protocols so tests can substitute
fakes; every method is required (the core never probes for optional ones).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
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
from job_service.store.cache import Sql
from job_service.store.clock import DbClock
from job_service.store.engine import DbExec

log = logging.getLogger(__name__)


class SnapshotView(Protocol):
    """A snapshot as :meth:`LearningPort.snapshot_read` finds it and
    :meth:`~job_service.services.core.Core.load_snapshot` returns it."""

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
    """How to get one snapshot inside a transaction (:meth:`LearningPort.snapshot_read`).

    Attributes:
        view: the cached view; None when it must be read.
        sql: the ``SELECT`` of its one row (for a batch).
        exists: a registered (:func:`job_service.store.cache.stable`) condition,
            bound by ``sql``'s values: the snapshot's row exists.
        from_row: the view of ``sql``'s one row.
        not_found: the error when ``sql`` returns no row.
    """

    view: SnapshotView | None
    sql: Sql
    exists: Any
    from_row: Callable[[Sequence[Any]], SnapshotView]
    not_found: Callable[[], Exception]


@dataclass(frozen=True)
class SnapshotsRead:
    """How to get several snapshots inside a transaction (:meth:`LearningPort.snapshots_read`).

    Attributes:
        views: the cached views, by snapshot id.
        sql: one ``SELECT`` of the rows of the others (for a batch); None when every
            one is cached.
        from_row: the view of one of ``sql``'s rows.
    """

    views: Mapping[str, SnapshotView]
    sql: Sql | None
    from_row: Callable[[Sequence[Any]], SnapshotView]


class PreparedResult(Protocol):
    """A validated output's business writes, not yet run (:meth:`LearningPort.prepare_result`)."""

    def statements(self, clock: DbClock) -> list[Sql]:
        """The writes (business rows, the generation plan's outcome), for the result's batch."""
        ...


class MaterialScopeView(Protocol):
    """What deleting a material reaches (:meth:`LearningPort.material_scope`)."""

    @property
    def snapshot_ids(self) -> frozenset[str]:
        """The user's snapshots built from the material."""
        ...

    @property
    def targets(self) -> list[tuple[str, str]]:
        """``(targetType, targetId)`` of jobs on the material or its knowledge points."""
        ...


class LearnerDataPort(Protocol):
    """Deleting and erasing the learner's data (reference §9.2), in the caller's transaction."""

    async def material_scope(
        self, session: AsyncSession, user_id: str, material_id: str
    ) -> MaterialScopeView:
        """What deleting the user's material reaches; reads only.

        Raises:
            AppError: ``NOT_FOUND`` when the material is unknown or another user's.
        """
        ...

    async def delete_material(
        self, session: AsyncSession, scope: MaterialScopeView, job_ids: Sequence[str]
    ) -> None:
        """Delete the material and everything built from it (and ``job_ids``' results)."""
        ...

    async def erase_user(self, session: AsyncSession, user_id: str, job_ids: Sequence[str]) -> None:
        """Delete every learning row of the user (and ``job_ids``' results)."""
        ...


class LearningPort(LearnerDataPort, Protocol):
    """Snapshots, generation plans and business rows (reference §5), in the caller's transaction.

    The real port is :class:`job_service.learning.port.LearningModulePort`;
    core tests substitute a fake.
    """

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

    async def build_snapshots(
        self,
        session: AsyncSession,
        *,
        user_id: str,
        job_type: str,
        targets: Sequence[tuple[str, str]],
        params: dict[str, Any],
    ) -> list[str]:
        """:meth:`build_snapshot` of each ``(targetType, targetId)`` of ``targets``, in
        order, with set reads and writes; NOT_FOUND for the first that is not the user's."""
        ...

    async def targets_of(
        self,
        session: AsyncSession,
        user_id: str,
        target_type: str,
        material_id: str | None,
        limit: int,
    ) -> list[str]:
        """The ids of the user's materials (``material``) or knowledge points
        (``knowledge_point``, of ``material_id`` when given), oldest first, at most
        ``limit`` (reference §10.3 ``targetsOf``); reads only.

        Raises:
            AppError: ``NOT_FOUND`` when ``material_id`` is not the user's;
                ``INVALID_ARGUMENT`` for another target type.
        """
        ...

    def snapshot_read(self, snapshot_id: str) -> SnapshotRead:
        """A snapshot as a transaction reads it: the cached view, or its statement."""
        ...

    def snapshots_read(self, snapshot_ids: Sequence[str]) -> SnapshotsRead:
        """Several snapshots as a transaction reads them: the cached views, and one
        statement for the rest."""
        ...

    def generation_plan(
        self,
        clock: DbClock,
        *,
        job_id: str,
        user_id: str,
        job_type: str,
        target_type: str,
        target_id: str,
        params: dict[str, Any],
    ) -> Sql | None:
        """The INSERT of a new job's generation plan row, or None when its type keeps none."""
        ...

    async def prepare_result(
        self,
        db: DbExec,
        *,
        job_id: str,
        user_id: str,
        job_type: str,
        snapshot_id: str,
        output_schema_version: str,
        output: dict[str, Any],
    ) -> PreparedResult:
        """Validate an output (schema, ownership; reads only) and build its writes.

        Raises:
            AppError: ``INVALID_SCHEMA`` (nothing written), ``INVALID_SNAPSHOT``.
        """
        ...

    async def snapshot_stored(self, db: DbExec, snapshot_id: str) -> bool:
        """Whether the snapshot's row still exists: a cancel-requested job whose
        snapshot is gone had its data deleted (reference §9.2)."""
        ...


class CredentialChecker(Protocol):
    """The credential service as seen from job create and fail (reference §6)."""

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
        #: The providers with a platform key, as the last platform-key check said
        #: (None before the first): where platform-key attempts may run (reference §9.4).
        self.platform_providers: frozenset[str] | None = None

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
        if api_key_mode == "platform_key" and resp.providers:
            self.platform_providers = frozenset(resp.providers)
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
