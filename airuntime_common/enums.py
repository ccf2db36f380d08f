"""Mapping between the contract's JSON strings and the protobuf enums.

The contract's strings (``learning_state_analysis``, ``pending``…) are the enum
value names without their prefix, lower-cased: ``JOB_TYPE_QUIZ_GENERATION``
↔ ``quiz_generation``. Request enums are closed (reference §4): an unknown string
raises ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from airuntime_common import jobtypes
from airuntime_common.errors import invalid_argument
from airuntime_common.states import TERMINAL, JobStatus
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import message_pb2 as job_msg_pb2

#: The job types registered when this module was first imported (the built-in
#: five, reference §2.1): for static schemas. Checks at run time ask
#: :mod:`airuntime_common.jobtypes`, which also knows types registered later.
JOB_TYPES: Final = jobtypes.names()
JOB_STATUSES: Final = tuple(JobStatus)
TERMINAL_STATUSES: Final = frozenset(TERMINAL)
TARGET_TYPES: Final = ("user", "material", "knowledge_point")
API_KEY_MODES: Final = ("platform_key", "user_deepseek_key")


class EnumMap:
    """Two-way map between a proto enum and the contract's strings.

    Args:
        enum: the generated enum wrapper, e.g. ``common_pb2.JobType``.
        prefix: the value prefix, e.g. ``"JOB_TYPE_"``.
        field: the JSON field name used in error details.
    """

    def __init__(self, enum: EnumTypeWrapper, prefix: str, field: str) -> None:
        self.enum = enum
        self.field = field
        self._to_proto: dict[str, int] = {}
        self._to_str: dict[int, str] = {}
        for name, number in enum.items():
            if number == 0:
                continue
            text = name.removeprefix(prefix).lower()
            self._to_proto[text] = number
            self._to_str[number] = text

    @property
    def values(self) -> tuple[str, ...]:
        """The contract's strings, in proto order."""
        return tuple(self._to_proto)

    def to_proto(self, value: str) -> int:
        """Contract string → enum number; unknown or empty → ``INVALID_ARGUMENT``."""
        try:
            return self._to_proto[value]
        except (KeyError, TypeError):
            raise invalid_argument(
                f"{self.field} must be one of {', '.join(self._to_proto)}",
                field=self.field,
                value=value,
            ) from None

    def to_str(self, number: int) -> str:
        """Enum number → contract string; UNSPECIFIED or unknown → ``INVALID_ARGUMENT``."""
        try:
            return self._to_str[number]
        except KeyError:
            raise invalid_argument(
                f"{self.field} is required and must be one of {', '.join(self._to_proto)}",
                field=self.field,
                value=number,
            ) from None

    def to_str_or_none(self, number: int) -> str | None:
        """Enum number → contract string, or None for UNSPECIFIED (an absent filter)."""
        return self._to_str.get(number)

    def optional(self, number: int) -> str | None:
        """An optional enum of a request: UNSPECIFIED (0) → None, known → contract string.

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a number the enum does not define
                (enums of requests are closed, reference §4; never read as "absent").
        """
        if number == 0:
            return None
        return self.to_str(number)


class JobTypeMap(EnumMap):
    """:class:`EnumMap` of ``JobType`` read from the job-type registry, so a type
    registered after import maps too (by its :attr:`~jobtypes.JobTypeSpec.wire` number)."""

    def __init__(self) -> None:
        super().__init__(common_pb2.JobType, "JOB_TYPE_", "jobType")

    @property
    def values(self) -> tuple[str, ...]:
        return jobtypes.names()

    def to_proto(self, value: str) -> int:
        spec = jobtypes.find(value) if isinstance(value, str) else None
        if spec is None:
            raise invalid_argument(
                f"{self.field} must be one of {', '.join(jobtypes.names())}",
                field=self.field,
                value=value,
            )
        return spec.wire

    def to_str(self, number: int) -> str:
        spec = jobtypes.by_wire(number)
        if spec is None:
            raise invalid_argument(
                f"{self.field} is required and must be one of {', '.join(jobtypes.names())}",
                field=self.field,
                value=number,
            )
        return spec.name

    def to_str_or_none(self, number: int) -> str | None:
        spec = jobtypes.by_wire(number)
        return spec.name if spec is not None else None


JOB_TYPE = JobTypeMap()
JOB_STATUS = EnumMap(common_pb2.JobStatus, "JOB_STATUS_", "status")
TARGET_TYPE = EnumMap(common_pb2.TargetType, "TARGET_TYPE_", "targetType")
API_KEY_MODE = EnumMap(common_pb2.ApiKeyMode, "API_KEY_MODE_", "apiKeyMode")
LEARNING_EVENT_TYPE = EnumMap(job_msg_pb2.LearningEventType, "LEARNING_EVENT_TYPE_", "type")
BREAKER_STATE = EnumMap(job_msg_pb2.BreakerState, "BREAKER_STATE_", "state")
