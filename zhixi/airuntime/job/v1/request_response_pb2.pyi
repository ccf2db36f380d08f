import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from zhixi.airuntime.common.v1 import message_pb2 as _message_pb2
from zhixi.airuntime.job.v1 import message_pb2 as _message_pb2_1
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_KIND_UNSPECIFIED: _ClassVar[ResultKind]
    RESULT_KIND_ANALYSES: _ClassVar[ResultKind]
    RESULT_KIND_WEAK_POINTS: _ClassVar[ResultKind]
    RESULT_KIND_RECOMMENDATIONS: _ClassVar[ResultKind]
    RESULT_KIND_QUESTIONS: _ClassVar[ResultKind]
    RESULT_KIND_FLASHCARDS: _ClassVar[ResultKind]
RESULT_KIND_UNSPECIFIED: ResultKind
RESULT_KIND_ANALYSES: ResultKind
RESULT_KIND_WEAK_POINTS: ResultKind
RESULT_KIND_RECOMMENDATIONS: ResultKind
RESULT_KIND_QUESTIONS: ResultKind
RESULT_KIND_FLASHCARDS: ResultKind

class CreateJobRequest(_message.Message):
    __slots__ = ("user_id", "job_type", "target_type", "target_id", "params", "api_key_mode", "idempotency_key", "priority", "max_retry_count", "timeout_seconds", "plan", "actor")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    job_type: _message_pb2.JobType
    target_type: _message_pb2.TargetType
    target_id: str
    params: _struct_pb2.Struct
    api_key_mode: _message_pb2.ApiKeyMode
    idempotency_key: str
    priority: int
    max_retry_count: int
    timeout_seconds: int
    plan: str
    actor: str
    def __init__(self, user_id: _Optional[str] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., target_type: _Optional[_Union[_message_pb2.TargetType, str]] = ..., target_id: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., idempotency_key: _Optional[str] = ..., priority: _Optional[int] = ..., max_retry_count: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., plan: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("job", "replayed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: _message_pb2_1.Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[_message_pb2_1.Job, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class CreateJobBatchRequest(_message.Message):
    __slots__ = ("user_id", "job_type", "targets", "targets_of", "params", "api_key_mode", "min_success_ratio", "idempotency_key", "priority", "max_retry_count", "timeout_seconds", "plan", "actor")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_OF_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    MIN_SUCCESS_RATIO_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    job_type: _message_pb2.JobType
    targets: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.BatchTarget]
    targets_of: _message_pb2_1.TargetsOf
    params: _struct_pb2.Struct
    api_key_mode: _message_pb2.ApiKeyMode
    min_success_ratio: float
    idempotency_key: str
    priority: int
    max_retry_count: int
    timeout_seconds: int
    plan: str
    actor: str
    def __init__(self, user_id: _Optional[str] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., targets: _Optional[_Iterable[_Union[_message_pb2_1.BatchTarget, _Mapping]]] = ..., targets_of: _Optional[_Union[_message_pb2_1.TargetsOf, _Mapping]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., min_success_ratio: _Optional[float] = ..., idempotency_key: _Optional[str] = ..., priority: _Optional[int] = ..., max_retry_count: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., plan: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class CreateJobBatchResponse(_message.Message):
    __slots__ = ("job", "replayed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: _message_pb2_1.Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[_message_pb2_1.Job, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "user_id", "include_history")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_HISTORY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user_id: str
    include_history: bool
    def __init__(self, job_id: _Optional[str] = ..., user_id: _Optional[str] = ..., include_history: _Optional[bool] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job", "events", "invocations", "attempts", "snapshot")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    job: _message_pb2_1.Job
    events: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.JobEvent]
    invocations: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Invocation]
    attempts: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.JobAttempt]
    snapshot: _message_pb2_1.SnapshotSummary
    def __init__(self, job: _Optional[_Union[_message_pb2_1.Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_message_pb2_1.JobEvent, _Mapping]]] = ..., invocations: _Optional[_Iterable[_Union[_message_pb2_1.Invocation, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[_message_pb2_1.JobAttempt, _Mapping]]] = ..., snapshot: _Optional[_Union[_message_pb2_1.SnapshotSummary, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("user_id", "status", "job_type", "page_size", "page_token", "created_from", "created_to", "include_counts", "job_ids", "parent_job_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FROM_FIELD_NUMBER: _ClassVar[int]
    CREATED_TO_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    status: _message_pb2.JobStatus
    job_type: _message_pb2.JobType
    page_size: int
    page_token: str
    created_from: _timestamp_pb2.Timestamp
    created_to: _timestamp_pb2.Timestamp
    include_counts: bool
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    parent_job_id: str
    def __init__(self, user_id: _Optional[str] = ..., status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., created_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_counts: _Optional[bool] = ..., job_ids: _Optional[_Iterable[str]] = ..., parent_job_id: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token", "counts")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Job]
    next_page_token: str
    counts: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.JobStateCount]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_message_pb2_1.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., counts: _Optional[_Iterable[_Union[_message_pb2_1.JobStateCount, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "user_id", "actor")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user_id: str
    actor: str
    def __init__(self, job_id: _Optional[str] = ..., user_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _message_pb2_1.Job
    def __init__(self, job: _Optional[_Union[_message_pb2_1.Job, _Mapping]] = ...) -> None: ...

class RerunJobRequest(_message.Message):
    __slots__ = ("job_id", "rebuild_snapshot", "actor", "user_id", "idempotency_key", "plan")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REBUILD_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rebuild_snapshot: bool
    actor: str
    user_id: str
    idempotency_key: str
    plan: str
    def __init__(self, job_id: _Optional[str] = ..., rebuild_snapshot: _Optional[bool] = ..., actor: _Optional[str] = ..., user_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., plan: _Optional[str] = ...) -> None: ...

class RerunJobResponse(_message.Message):
    __slots__ = ("job", "replayed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: _message_pb2_1.Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[_message_pb2_1.Job, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class GetJobResultRequest(_message.Message):
    __slots__ = ("job_id", "user_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user_id: str
    def __init__(self, job_id: _Optional[str] = ..., user_id: _Optional[str] = ...) -> None: ...

class GetJobResultResponse(_message.Message):
    __slots__ = ("job_id", "job_type", "output_schema_version", "items")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_type: _message_pb2.JobType
    output_schema_version: str
    items: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, job_id: _Optional[str] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., output_schema_version: _Optional[str] = ..., items: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ...) -> None: ...

class ListResultItemsRequest(_message.Message):
    __slots__ = ("user_id", "kind", "page_size", "page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    kind: ResultKind
    page_size: int
    page_token: str
    def __init__(self, user_id: _Optional[str] = ..., kind: _Optional[_Union[ResultKind, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListResultItemsResponse(_message.Message):
    __slots__ = ("items", "next_page_token")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    next_page_token: str
    def __init__(self, items: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetAiAuthorizationRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetAiAuthorizationResponse(_message.Message):
    __slots__ = ("granted", "changed_at")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    changed_at: _timestamp_pb2.Timestamp
    def __init__(self, granted: _Optional[bool] = ..., changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetAiAuthorizationRequest(_message.Message):
    __slots__ = ("user_id", "granted")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    granted: bool
    def __init__(self, user_id: _Optional[str] = ..., granted: _Optional[bool] = ...) -> None: ...

class SetAiAuthorizationResponse(_message.Message):
    __slots__ = ("granted", "changed_at", "cancelled", "cancel_requested")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    changed_at: _timestamp_pb2.Timestamp
    cancelled: int
    cancel_requested: int
    def __init__(self, granted: _Optional[bool] = ..., changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancelled: _Optional[int] = ..., cancel_requested: _Optional[int] = ...) -> None: ...

class CreateMaterialRequest(_message.Message):
    __slots__ = ("user_id", "title", "content")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    title: str
    content: str
    def __init__(self, user_id: _Optional[str] = ..., title: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class CreateMaterialResponse(_message.Message):
    __slots__ = ("material",)
    MATERIAL_FIELD_NUMBER: _ClassVar[int]
    material: _message_pb2_1.Material
    def __init__(self, material: _Optional[_Union[_message_pb2_1.Material, _Mapping]] = ...) -> None: ...

class GetMaterialRequest(_message.Message):
    __slots__ = ("user_id", "material_id", "blocks_page_size", "blocks_page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    material_id: str
    blocks_page_size: int
    blocks_page_token: str
    def __init__(self, user_id: _Optional[str] = ..., material_id: _Optional[str] = ..., blocks_page_size: _Optional[int] = ..., blocks_page_token: _Optional[str] = ...) -> None: ...

class GetMaterialResponse(_message.Message):
    __slots__ = ("material", "next_blocks_page_token")
    MATERIAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_BLOCKS_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    material: _message_pb2_1.Material
    next_blocks_page_token: str
    def __init__(self, material: _Optional[_Union[_message_pb2_1.Material, _Mapping]] = ..., next_blocks_page_token: _Optional[str] = ...) -> None: ...

class ListMaterialsRequest(_message.Message):
    __slots__ = ("user_id", "page_size", "page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    page_size: int
    page_token: str
    def __init__(self, user_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListMaterialsResponse(_message.Message):
    __slots__ = ("materials", "next_page_token")
    MATERIALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    materials: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Material]
    next_page_token: str
    def __init__(self, materials: _Optional[_Iterable[_Union[_message_pb2_1.Material, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteMaterialRequest(_message.Message):
    __slots__ = ("user_id", "material_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    material_id: str
    def __init__(self, user_id: _Optional[str] = ..., material_id: _Optional[str] = ...) -> None: ...

class DeleteMaterialResponse(_message.Message):
    __slots__ = ("cancelled", "cancel_requested")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    cancel_requested: int
    def __init__(self, cancelled: _Optional[int] = ..., cancel_requested: _Optional[int] = ...) -> None: ...

class ListKnowledgePointsRequest(_message.Message):
    __slots__ = ("user_id", "material_id", "page_size", "page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    material_id: str
    page_size: int
    page_token: str
    def __init__(self, user_id: _Optional[str] = ..., material_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListKnowledgePointsResponse(_message.Message):
    __slots__ = ("knowledge_points", "next_page_token")
    KNOWLEDGE_POINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    knowledge_points: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.KnowledgePoint]
    next_page_token: str
    def __init__(self, knowledge_points: _Optional[_Iterable[_Union[_message_pb2_1.KnowledgePoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteKnowledgePointRequest(_message.Message):
    __slots__ = ("user_id", "knowledge_point_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_POINT_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    knowledge_point_id: str
    def __init__(self, user_id: _Optional[str] = ..., knowledge_point_id: _Optional[str] = ...) -> None: ...

class DeleteKnowledgePointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteResultItemRequest(_message.Message):
    __slots__ = ("user_id", "kind", "item_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    kind: ResultKind
    item_id: str
    def __init__(self, user_id: _Optional[str] = ..., kind: _Optional[_Union[ResultKind, str]] = ..., item_id: _Optional[str] = ...) -> None: ...

class DeleteResultItemResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EraseUserRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class EraseUserResponse(_message.Message):
    __slots__ = ("cancelled", "cancel_requested", "jobs_removed")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    JOBS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    cancel_requested: int
    jobs_removed: int
    def __init__(self, cancelled: _Optional[int] = ..., cancel_requested: _Optional[int] = ..., jobs_removed: _Optional[int] = ...) -> None: ...

class CreateKnowledgePointRequest(_message.Message):
    __slots__ = ("user_id", "material_id", "name", "block_ids")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    material_id: str
    name: str
    block_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user_id: _Optional[str] = ..., material_id: _Optional[str] = ..., name: _Optional[str] = ..., block_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateKnowledgePointResponse(_message.Message):
    __slots__ = ("knowledge_point",)
    KNOWLEDGE_POINT_FIELD_NUMBER: _ClassVar[int]
    knowledge_point: _message_pb2_1.KnowledgePoint
    def __init__(self, knowledge_point: _Optional[_Union[_message_pb2_1.KnowledgePoint, _Mapping]] = ...) -> None: ...

class RecordLearningEventsRequest(_message.Message):
    __slots__ = ("user_id", "events")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    events: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.LearningEvent]
    def __init__(self, user_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_message_pb2_1.LearningEvent, _Mapping]]] = ...) -> None: ...

class RecordLearningEventsResponse(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class GetCostsRequest(_message.Message):
    __slots__ = ("from_date", "to_date", "group_by")
    FROM_DATE_FIELD_NUMBER: _ClassVar[int]
    TO_DATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    from_date: str
    to_date: str
    group_by: str
    def __init__(self, from_date: _Optional[str] = ..., to_date: _Optional[str] = ..., group_by: _Optional[str] = ...) -> None: ...

class GetCostsResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.CostRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[_message_pb2_1.CostRow, _Mapping]]] = ...) -> None: ...

class GetCircuitBreakerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCircuitBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _message_pb2_1.CircuitBreaker
    def __init__(self, breaker: _Optional[_Union[_message_pb2_1.CircuitBreaker, _Mapping]] = ...) -> None: ...

class ResetCircuitBreakerRequest(_message.Message):
    __slots__ = ("provider",)
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    provider: str
    def __init__(self, provider: _Optional[str] = ...) -> None: ...

class ResetCircuitBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _message_pb2_1.CircuitBreaker
    def __init__(self, breaker: _Optional[_Union[_message_pb2_1.CircuitBreaker, _Mapping]] = ...) -> None: ...

class ListProvidersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProvidersResponse(_message.Message):
    __slots__ = ("providers",)
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.ProviderState]
    def __init__(self, providers: _Optional[_Iterable[_Union[_message_pb2_1.ProviderState, _Mapping]]] = ...) -> None: ...

class GetJobThroughputRequest(_message.Message):
    __slots__ = ("hours",)
    HOURS_FIELD_NUMBER: _ClassVar[int]
    hours: int
    def __init__(self, hours: _Optional[int] = ...) -> None: ...

class GetJobThroughputResponse(_message.Message):
    __slots__ = ("from_time", "to_time", "minutes", "succeeded", "failed", "cancelled", "failure_rate")
    FROM_TIME_FIELD_NUMBER: _ClassVar[int]
    TO_TIME_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    from_time: _timestamp_pb2.Timestamp
    to_time: _timestamp_pb2.Timestamp
    minutes: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.ThroughputMinute]
    succeeded: int
    failed: int
    cancelled: int
    failure_rate: float
    def __init__(self, from_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., to_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., minutes: _Optional[_Iterable[_Union[_message_pb2_1.ThroughputMinute, _Mapping]]] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ..., failure_rate: _Optional[float] = ...) -> None: ...

class PollJobsRequest(_message.Message):
    __slots__ = ("capabilities", "limit", "wait_ms", "status_address")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedScalarFieldContainer[_message_pb2.JobType]
    limit: int
    wait_ms: int
    status_address: str
    def __init__(self, capabilities: _Optional[_Iterable[_Union[_message_pb2.JobType, str]]] = ..., limit: _Optional[int] = ..., wait_ms: _Optional[int] = ..., status_address: _Optional[str] = ...) -> None: ...

class PollJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_message_pb2_1.Job, _Mapping]]] = ...) -> None: ...

class ClaimJobsRequest(_message.Message):
    __slots__ = ("capabilities", "limit", "wait_ms", "status_address", "with_snapshots")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WITH_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedScalarFieldContainer[_message_pb2.JobType]
    limit: int
    wait_ms: int
    status_address: str
    with_snapshots: bool
    def __init__(self, capabilities: _Optional[_Iterable[_Union[_message_pb2.JobType, str]]] = ..., limit: _Optional[int] = ..., wait_ms: _Optional[int] = ..., status_address: _Optional[str] = ..., with_snapshots: _Optional[bool] = ...) -> None: ...

class ClaimJobsResponse(_message.Message):
    __slots__ = ("jobs", "snapshots")
    class SnapshotsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GetSnapshotResponse
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GetSnapshotResponse, _Mapping]] = ...) -> None: ...
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Job]
    snapshots: _containers.MessageMap[str, GetSnapshotResponse]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_message_pb2_1.Job, _Mapping]]] = ..., snapshots: _Optional[_Mapping[str, GetSnapshotResponse]] = ...) -> None: ...

class LockJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class LockJobResponse(_message.Message):
    __slots__ = ("job_id", "status", "locked_by", "lock_until", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    LOCK_UNTIL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: _message_pb2.JobStatus
    locked_by: str
    lock_until: _timestamp_pb2.Timestamp
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., locked_by: _Optional[str] = ..., lock_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class StartJobRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class StartJobResponse(_message.Message):
    __slots__ = ("status", "started_at")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    status: _message_pb2.JobStatus
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lock_until", "cancel_requested")
    LOCK_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    lock_until: _timestamp_pb2.Timestamp
    cancel_requested: bool
    def __init__(self, lock_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ...) -> None: ...

class HeartbeatLeasesRequest(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.LeaseRef]
    def __init__(self, leases: _Optional[_Iterable[_Union[_message_pb2_1.LeaseRef, _Mapping]]] = ...) -> None: ...

class HeartbeatLeasesResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.LeaseState]
    def __init__(self, leases: _Optional[_Iterable[_Union[_message_pb2_1.LeaseState, _Mapping]]] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id", "schema_version", "target_type", "target_id", "payload", "content_hash")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    schema_version: str
    target_type: _message_pb2.TargetType
    target_id: str
    payload: _struct_pb2.Struct
    content_hash: str
    def __init__(self, snapshot_id: _Optional[str] = ..., schema_version: _Optional[str] = ..., target_type: _Optional[_Union[_message_pb2.TargetType, str]] = ..., target_id: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., content_hash: _Optional[str] = ...) -> None: ...

class SubmitResultRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no", "prompt_version", "output_schema_version", "output", "invocations", "claim_next")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NEXT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    prompt_version: str
    output_schema_version: str
    output: _struct_pb2.Struct
    invocations: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.ModelCall]
    claim_next: ClaimNext
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., prompt_version: _Optional[str] = ..., output_schema_version: _Optional[str] = ..., output: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., invocations: _Optional[_Iterable[_Union[_message_pb2_1.ModelCall, _Mapping]]] = ..., claim_next: _Optional[_Union[ClaimNext, _Mapping]] = ...) -> None: ...

class ClaimNext(_message.Message):
    __slots__ = ("capabilities", "limit", "status_address")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STATUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedScalarFieldContainer[_message_pb2.JobType]
    limit: int
    status_address: str
    def __init__(self, capabilities: _Optional[_Iterable[_Union[_message_pb2.JobType, str]]] = ..., limit: _Optional[int] = ..., status_address: _Optional[str] = ...) -> None: ...

class SubmitResultResponse(_message.Message):
    __slots__ = ("job_id", "status", "result_id", "output_hash", "replayed", "claimed_jobs", "snapshots")
    class SnapshotsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GetSnapshotResponse
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GetSnapshotResponse, _Mapping]] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_HASH_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_JOBS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: _message_pb2.JobStatus
    result_id: str
    output_hash: str
    replayed: bool
    claimed_jobs: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.Job]
    snapshots: _containers.MessageMap[str, GetSnapshotResponse]
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., result_id: _Optional[str] = ..., output_hash: _Optional[str] = ..., replayed: _Optional[bool] = ..., claimed_jobs: _Optional[_Iterable[_Union[_message_pb2_1.Job, _Mapping]]] = ..., snapshots: _Optional[_Mapping[str, GetSnapshotResponse]] = ...) -> None: ...

class FailJobRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no", "error_code", "error_message", "retry_after_seconds", "invocations")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    error_code: str
    error_message: str
    retry_after_seconds: float
    invocations: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.ModelCall]
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ..., invocations: _Optional[_Iterable[_Union[_message_pb2_1.ModelCall, _Mapping]]] = ...) -> None: ...

class FailJobResponse(_message.Message):
    __slots__ = ("job_id", "status", "retry_count")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: _message_pb2.JobStatus
    retry_count: int
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., retry_count: _Optional[int] = ...) -> None: ...

class RecordInvocationRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no", "model_provider", "model_name", "api_key_mode", "credential_id", "prompt_tokens", "completion_tokens", "cache_hit_tokens", "latency_ms", "outcome", "error_code", "provider_request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    model_provider: str
    model_name: str
    api_key_mode: _message_pb2.ApiKeyMode
    credential_id: str
    prompt_tokens: int
    completion_tokens: int
    cache_hit_tokens: int
    latency_ms: int
    outcome: str
    error_code: str
    provider_request_id: str
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cache_hit_tokens: _Optional[int] = ..., latency_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., error_code: _Optional[str] = ..., provider_request_id: _Optional[str] = ...) -> None: ...

class RecordInvocationResponse(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetRuntimeHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRuntimeHealthResponse(_message.Message):
    __slots__ = ("status", "workers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    status: str
    workers: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.RuntimeWorker]
    def __init__(self, status: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[_message_pb2_1.RuntimeWorker, _Mapping]]] = ...) -> None: ...

class VerifyLeaseRequest(_message.Message):
    __slots__ = ("job_id", "runtime_instance_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    runtime_instance_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., runtime_instance_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class VerifyLeaseResponse(_message.Message):
    __slots__ = ("user_id", "api_key_mode", "credential_id", "model_provider", "model_name")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    api_key_mode: _message_pb2.ApiKeyMode
    credential_id: str
    model_provider: str
    model_name: str
    def __init__(self, user_id: _Optional[str] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ...) -> None: ...

class VerifyLeasesRequest(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[VerifyLeaseRequest]
    def __init__(self, leases: _Optional[_Iterable[_Union[VerifyLeaseRequest, _Mapping]]] = ...) -> None: ...

class LeaseVerdict(_message.Message):
    __slots__ = ("held", "error_code", "error_message", "error_details_json")
    HELD_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    held: VerifyLeaseResponse
    error_code: str
    error_message: str
    error_details_json: str
    def __init__(self, held: _Optional[_Union[VerifyLeaseResponse, _Mapping]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., error_details_json: _Optional[str] = ...) -> None: ...

class VerifyLeasesResponse(_message.Message):
    __slots__ = ("verdicts",)
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[LeaseVerdict]
    def __init__(self, verdicts: _Optional[_Iterable[_Union[LeaseVerdict, _Mapping]]] = ...) -> None: ...

class RuntimeSessionRequest(_message.Message):
    __slots__ = ("id", "request_id", "traceparent", "claim_jobs", "start_job", "heartbeat_leases", "get_snapshot", "submit_result", "fail_job", "record_invocation", "cancel", "batch")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_JOBS_FIELD_NUMBER: _ClassVar[int]
    START_JOB_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_LEASES_FIELD_NUMBER: _ClassVar[int]
    GET_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_RESULT_FIELD_NUMBER: _ClassVar[int]
    FAIL_JOB_FIELD_NUMBER: _ClassVar[int]
    RECORD_INVOCATION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_id: str
    traceparent: str
    claim_jobs: ClaimJobsRequest
    start_job: StartJobRequest
    heartbeat_leases: HeartbeatLeasesRequest
    get_snapshot: GetSnapshotRequest
    submit_result: SubmitResultRequest
    fail_job: FailJobRequest
    record_invocation: RecordInvocationRequest
    cancel: int
    batch: RuntimeSessionBatch
    def __init__(self, id: _Optional[int] = ..., request_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., claim_jobs: _Optional[_Union[ClaimJobsRequest, _Mapping]] = ..., start_job: _Optional[_Union[StartJobRequest, _Mapping]] = ..., heartbeat_leases: _Optional[_Union[HeartbeatLeasesRequest, _Mapping]] = ..., get_snapshot: _Optional[_Union[GetSnapshotRequest, _Mapping]] = ..., submit_result: _Optional[_Union[SubmitResultRequest, _Mapping]] = ..., fail_job: _Optional[_Union[FailJobRequest, _Mapping]] = ..., record_invocation: _Optional[_Union[RecordInvocationRequest, _Mapping]] = ..., cancel: _Optional[int] = ..., batch: _Optional[_Union[RuntimeSessionBatch, _Mapping]] = ...) -> None: ...

class RuntimeSessionBatch(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[RuntimeSessionRequest]
    def __init__(self, calls: _Optional[_Iterable[_Union[RuntimeSessionRequest, _Mapping]]] = ...) -> None: ...

class RuntimeSessionError(_message.Message):
    __slots__ = ("grpc_code", "message", "status")
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    grpc_code: int
    message: str
    status: bytes
    def __init__(self, grpc_code: _Optional[int] = ..., message: _Optional[str] = ..., status: _Optional[bytes] = ...) -> None: ...

class RuntimeSessionResponse(_message.Message):
    __slots__ = ("id", "error", "claim_jobs", "start_job", "heartbeat_leases", "get_snapshot", "submit_result", "fail_job", "record_invocation", "batch")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CLAIM_JOBS_FIELD_NUMBER: _ClassVar[int]
    START_JOB_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_LEASES_FIELD_NUMBER: _ClassVar[int]
    GET_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_RESULT_FIELD_NUMBER: _ClassVar[int]
    FAIL_JOB_FIELD_NUMBER: _ClassVar[int]
    RECORD_INVOCATION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: RuntimeSessionError
    claim_jobs: ClaimJobsResponse
    start_job: StartJobResponse
    heartbeat_leases: HeartbeatLeasesResponse
    get_snapshot: GetSnapshotResponse
    submit_result: SubmitResultResponse
    fail_job: FailJobResponse
    record_invocation: RecordInvocationResponse
    batch: RuntimeSessionAnswers
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[RuntimeSessionError, _Mapping]] = ..., claim_jobs: _Optional[_Union[ClaimJobsResponse, _Mapping]] = ..., start_job: _Optional[_Union[StartJobResponse, _Mapping]] = ..., heartbeat_leases: _Optional[_Union[HeartbeatLeasesResponse, _Mapping]] = ..., get_snapshot: _Optional[_Union[GetSnapshotResponse, _Mapping]] = ..., submit_result: _Optional[_Union[SubmitResultResponse, _Mapping]] = ..., fail_job: _Optional[_Union[FailJobResponse, _Mapping]] = ..., record_invocation: _Optional[_Union[RecordInvocationResponse, _Mapping]] = ..., batch: _Optional[_Union[RuntimeSessionAnswers, _Mapping]] = ...) -> None: ...

class RuntimeSessionAnswers(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[RuntimeSessionResponse]
    def __init__(self, answers: _Optional[_Iterable[_Union[RuntimeSessionResponse, _Mapping]]] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchJobsResponse(_message.Message):
    __slots__ = ("changes", "head_seq")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.JobChange]
    head_seq: int
    def __init__(self, changes: _Optional[_Iterable[_Union[_message_pb2_1.JobChange, _Mapping]]] = ..., head_seq: _Optional[int] = ...) -> None: ...

class ListJobChangesRequest(_message.Message):
    __slots__ = ("user_id", "after_seq", "limit")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    after_seq: int
    limit: int
    def __init__(self, user_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListJobChangesResponse(_message.Message):
    __slots__ = ("changes", "head_seq", "more")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.JobChange]
    head_seq: int
    more: bool
    def __init__(self, changes: _Optional[_Iterable[_Union[_message_pb2_1.JobChange, _Mapping]]] = ..., head_seq: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class PutPromptVersionRequest(_message.Message):
    __slots__ = ("job_type", "version", "template", "description", "actor")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    job_type: _message_pb2.JobType
    version: str
    template: str
    description: str
    actor: str
    def __init__(self, job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., version: _Optional[str] = ..., template: _Optional[str] = ..., description: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class PutPromptVersionResponse(_message.Message):
    __slots__ = ("version", "created")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    version: _message_pb2_1.PromptVersion
    created: bool
    def __init__(self, version: _Optional[_Union[_message_pb2_1.PromptVersion, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetPromptVersionRequest(_message.Message):
    __slots__ = ("job_type", "version")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_type: _message_pb2.JobType
    version: str
    def __init__(self, job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., version: _Optional[str] = ...) -> None: ...

class GetPromptVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: _message_pb2_1.PromptVersion
    def __init__(self, version: _Optional[_Union[_message_pb2_1.PromptVersion, _Mapping]] = ...) -> None: ...

class GetPromptsRequest(_message.Message):
    __slots__ = ("job_type", "hours")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    HOURS_FIELD_NUMBER: _ClassVar[int]
    job_type: _message_pb2.JobType
    hours: int
    def __init__(self, job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., hours: _Optional[int] = ...) -> None: ...

class GetPromptsResponse(_message.Message):
    __slots__ = ("versions", "routing", "stats")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.PromptVersion]
    routing: _message_pb2_1.PromptRouting
    stats: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.PromptVersionStats]
    def __init__(self, versions: _Optional[_Iterable[_Union[_message_pb2_1.PromptVersion, _Mapping]]] = ..., routing: _Optional[_Union[_message_pb2_1.PromptRouting, _Mapping]] = ..., stats: _Optional[_Iterable[_Union[_message_pb2_1.PromptVersionStats, _Mapping]]] = ...) -> None: ...

class PutPromptRoutingRequest(_message.Message):
    __slots__ = ("job_type", "variants", "max_invalid_schema_increase", "min_attempts", "actor")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    MAX_INVALID_SCHEMA_INCREASE_FIELD_NUMBER: _ClassVar[int]
    MIN_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    job_type: _message_pb2.JobType
    variants: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.PromptVariant]
    max_invalid_schema_increase: float
    min_attempts: int
    actor: str
    def __init__(self, job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., variants: _Optional[_Iterable[_Union[_message_pb2_1.PromptVariant, _Mapping]]] = ..., max_invalid_schema_increase: _Optional[float] = ..., min_attempts: _Optional[int] = ..., actor: _Optional[str] = ...) -> None: ...

class PutPromptRoutingResponse(_message.Message):
    __slots__ = ("routing",)
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    routing: _message_pb2_1.PromptRouting
    def __init__(self, routing: _Optional[_Union[_message_pb2_1.PromptRouting, _Mapping]] = ...) -> None: ...

class SetResultFeedbackRequest(_message.Message):
    __slots__ = ("user_id", "kind", "item_id", "rating")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    RATING_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    kind: ResultKind
    item_id: str
    rating: int
    def __init__(self, user_id: _Optional[str] = ..., kind: _Optional[_Union[ResultKind, str]] = ..., item_id: _Optional[str] = ..., rating: _Optional[int] = ...) -> None: ...

class SetResultFeedbackResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
