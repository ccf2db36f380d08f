from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class JobType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_TYPE_UNSPECIFIED: _ClassVar[JobType]
    JOB_TYPE_LEARNING_STATE_ANALYSIS: _ClassVar[JobType]
    JOB_TYPE_WEAK_POINT_ANALYSIS: _ClassVar[JobType]
    JOB_TYPE_NEXT_ACTION_PLANNING: _ClassVar[JobType]
    JOB_TYPE_QUIZ_GENERATION: _ClassVar[JobType]
    JOB_TYPE_FLASHCARD_GENERATION: _ClassVar[JobType]

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_PENDING: _ClassVar[JobStatus]
    JOB_STATUS_LOCKED: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_SUCCEEDED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]
    JOB_STATUS_EXPIRED: _ClassVar[JobStatus]

class TargetType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_TYPE_UNSPECIFIED: _ClassVar[TargetType]
    TARGET_TYPE_USER: _ClassVar[TargetType]
    TARGET_TYPE_MATERIAL: _ClassVar[TargetType]
    TARGET_TYPE_KNOWLEDGE_POINT: _ClassVar[TargetType]

class ApiKeyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    API_KEY_MODE_UNSPECIFIED: _ClassVar[ApiKeyMode]
    API_KEY_MODE_PLATFORM_KEY: _ClassVar[ApiKeyMode]
    API_KEY_MODE_USER_DEEPSEEK_KEY: _ClassVar[ApiKeyMode]
JOB_TYPE_UNSPECIFIED: JobType
JOB_TYPE_LEARNING_STATE_ANALYSIS: JobType
JOB_TYPE_WEAK_POINT_ANALYSIS: JobType
JOB_TYPE_NEXT_ACTION_PLANNING: JobType
JOB_TYPE_QUIZ_GENERATION: JobType
JOB_TYPE_FLASHCARD_GENERATION: JobType
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_PENDING: JobStatus
JOB_STATUS_LOCKED: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_SUCCEEDED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELLED: JobStatus
JOB_STATUS_EXPIRED: JobStatus
TARGET_TYPE_UNSPECIFIED: TargetType
TARGET_TYPE_USER: TargetType
TARGET_TYPE_MATERIAL: TargetType
TARGET_TYPE_KNOWLEDGE_POINT: TargetType
API_KEY_MODE_UNSPECIFIED: ApiKeyMode
API_KEY_MODE_PLATFORM_KEY: ApiKeyMode
API_KEY_MODE_USER_DEEPSEEK_KEY: ApiKeyMode
