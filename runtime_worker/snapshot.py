"""Snapshot payload v1 as the worker reads it, validated before any model call.

The shape is fixed by the cross-service contract (job_service builds it):
``{"jobType", "targetType", "targetId", "userId", "params", "materials",
"blocks", "knowledgePoints", "reading", "stats"}``. Unknown keys are ignored
(a newer job_service may add some); missing or mistyped required ones fail the
attempt with ``INVALID_SNAPSHOT`` (non-retryable).
"""

from __future__ import annotations

from typing import Any, Literal

from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode

SNAPSHOT_SCHEMA_VERSION = "v1"


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SnapshotMaterial(_Item):
    """One material the snapshot covers."""

    materialId: str = Field(min_length=1)
    title: str = ""
    blockCount: int = Field(default=0, ge=0)
    readBlockCount: int = Field(default=0, ge=0)
    progress: float | None = None


class SnapshotBlock(_Item):
    """One block of text the model may cite by ``blockId``."""

    blockId: str = Field(min_length=1)
    materialId: str = Field(min_length=1)
    ordinal: int = Field(ge=0)
    text: str


class SnapshotKnowledgePoint(_Item):
    """A knowledge point with the learner's quiz record (``accuracy`` null when no attempts)."""

    knowledgePointId: str = Field(min_length=1)
    name: str
    materialId: str | None = None
    blockIds: list[str] = Field(default_factory=list)
    attempts: int = Field(default=0, ge=0)
    correct: int = Field(default=0, ge=0)
    accuracy: float | None = None
    lastAttemptAt: str | None = None


class SnapshotReading(_Item):
    """Reading activity on one block."""

    blockId: str = Field(min_length=1)
    materialId: str | None = None
    dwellSeconds: float = Field(default=0.0, ge=0)
    lastReadAt: str | None = None


class SnapshotPayload(_Item):
    """Snapshot payload v1."""

    jobType: str

    @field_validator("jobType")
    @classmethod
    def _registered(cls, value: str) -> str:
        if jobtypes.find(value) is None:
            raise ValueError(f"jobType must be one of {', '.join(jobtypes.names())}")
        return value

    targetType: Literal["user", "material", "knowledge_point"]
    targetId: str = Field(min_length=1)
    userId: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    materials: list[SnapshotMaterial] = Field(default_factory=list)
    blocks: list[SnapshotBlock] = Field(default_factory=list)
    knowledgePoints: list[SnapshotKnowledgePoint] = Field(default_factory=list)
    reading: list[SnapshotReading] = Field(default_factory=list)
    stats: dict[str, Any] = Field(default_factory=dict)


def normalize_numbers(value: Any) -> Any:
    """Turn integral floats back into ints (``google.protobuf.Struct`` stores every number
    as a double, so ``5`` arrives as ``5.0``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: normalize_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize_numbers(v) for v in value]
    return value


def struct_to_dict(struct: Struct) -> dict[str, Any]:
    """A protobuf Struct as a plain dict with integral numbers as ints."""
    result = normalize_numbers(MessageToDict(struct))
    assert isinstance(result, dict)
    return result


def validate_snapshot(
    payload: Any, *, schema_version: str, job_type: str, user_id: str | None = None
) -> SnapshotPayload:
    """Check a snapshot before the model sees it.

    Args:
        payload: the snapshot payload (dict).
        schema_version: ``schemaVersion`` the snapshot was stored with; must be ``"v1"``.
        job_type: the job's type; the payload's ``jobType`` must equal it.
        user_id: the job's user; when given, the payload's ``userId`` must equal it.

    Returns:
        The validated payload.

    Raises:
        AppError: ``INVALID_SNAPSHOT`` naming the first problems.
    """
    if schema_version != SNAPSHOT_SCHEMA_VERSION:
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            f"unsupported snapshot schemaVersion {schema_version!r}",
            {"schemaVersion": schema_version},
        )
    try:
        snap = SnapshotPayload.model_validate(payload)
    except ValidationError as exc:
        errors = [
            {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]} for e in exc.errors()[:10]
        ]
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            f"snapshot payload is not v1: {errors[0]['loc']}: {errors[0]['msg']}",
            {"errors": errors},
        ) from None
    if snap.jobType != job_type:
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            f"snapshot is for {snap.jobType}, job is {job_type}",
            {"jobType": snap.jobType},
        )
    if user_id and snap.userId != user_id:
        raise AppError(ErrorCode.INVALID_SNAPSHOT, "snapshot belongs to another user")
    return snap
