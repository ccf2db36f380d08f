import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from zhixi.airuntime.common.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LearningEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEARNING_EVENT_TYPE_UNSPECIFIED: _ClassVar[LearningEventType]
    LEARNING_EVENT_TYPE_READING: _ClassVar[LearningEventType]
    LEARNING_EVENT_TYPE_QUIZ_ATTEMPT: _ClassVar[LearningEventType]

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_STATE_UNSPECIFIED: _ClassVar[BreakerState]
    BREAKER_STATE_CLOSED: _ClassVar[BreakerState]
    BREAKER_STATE_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_HALF_OPEN: _ClassVar[BreakerState]
LEARNING_EVENT_TYPE_UNSPECIFIED: LearningEventType
LEARNING_EVENT_TYPE_READING: LearningEventType
LEARNING_EVENT_TYPE_QUIZ_ATTEMPT: LearningEventType
BREAKER_STATE_UNSPECIFIED: BreakerState
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState

class Job(_message.Message):
    __slots__ = ("job_id", "user_id", "job_type", "target_type", "target_id", "snapshot_id", "status", "priority", "params", "api_key_mode", "credential_id", "model_provider", "model_name", "prompt_version", "output_schema_version", "attempt_no", "retry_count", "max_retry_count", "timeout_seconds", "locked_by", "lock_until", "available_at", "cancel_requested", "error_code", "error_message", "retried_from_job_id", "created_at", "updated_at", "started_at", "finished_at", "locked_at", "cancelled_at", "expired_at", "trace_parent", "version", "provider_model_name", "provider_base_url", "parent_job_id", "batch")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    LOCK_UNTIL_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_AT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRIED_FROM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LOCKED_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_AT_FIELD_NUMBER: _ClassVar[int]
    TRACE_PARENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    PARENT_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user_id: str
    job_type: _message_pb2.JobType
    target_type: _message_pb2.TargetType
    target_id: str
    snapshot_id: str
    status: _message_pb2.JobStatus
    priority: int
    params: _struct_pb2.Struct
    api_key_mode: _message_pb2.ApiKeyMode
    credential_id: str
    model_provider: str
    model_name: str
    prompt_version: str
    output_schema_version: str
    attempt_no: int
    retry_count: int
    max_retry_count: int
    timeout_seconds: int
    locked_by: str
    lock_until: _timestamp_pb2.Timestamp
    available_at: _timestamp_pb2.Timestamp
    cancel_requested: bool
    error_code: str
    error_message: str
    retried_from_job_id: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    locked_at: _timestamp_pb2.Timestamp
    cancelled_at: _timestamp_pb2.Timestamp
    expired_at: _timestamp_pb2.Timestamp
    trace_parent: str
    version: int
    provider_model_name: str
    provider_base_url: str
    parent_job_id: str
    batch: JobBatch
    def __init__(self, job_id: _Optional[str] = ..., user_id: _Optional[str] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., target_type: _Optional[_Union[_message_pb2.TargetType, str]] = ..., target_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., priority: _Optional[int] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., prompt_version: _Optional[str] = ..., output_schema_version: _Optional[str] = ..., attempt_no: _Optional[int] = ..., retry_count: _Optional[int] = ..., max_retry_count: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., locked_by: _Optional[str] = ..., lock_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., available_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., retried_from_job_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., locked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancelled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., trace_parent: _Optional[str] = ..., version: _Optional[int] = ..., provider_model_name: _Optional[str] = ..., provider_base_url: _Optional[str] = ..., parent_job_id: _Optional[str] = ..., batch: _Optional[_Union[JobBatch, _Mapping]] = ...) -> None: ...

class JobBatch(_message.Message):
    __slots__ = ("total", "pending", "running", "succeeded", "failed", "cancelled", "min_success_ratio")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    MIN_SUCCESS_RATIO_FIELD_NUMBER: _ClassVar[int]
    total: int
    pending: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    min_success_ratio: float
    def __init__(self, total: _Optional[int] = ..., pending: _Optional[int] = ..., running: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ..., min_success_ratio: _Optional[float] = ...) -> None: ...

class BatchTarget(_message.Message):
    __slots__ = ("target_type", "target_id")
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_type: _message_pb2.TargetType
    target_id: str
    def __init__(self, target_type: _Optional[_Union[_message_pb2.TargetType, str]] = ..., target_id: _Optional[str] = ...) -> None: ...

class TargetsOf(_message.Message):
    __slots__ = ("target_type", "material_id")
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    target_type: _message_pb2.TargetType
    material_id: str
    def __init__(self, target_type: _Optional[_Union[_message_pb2.TargetType, str]] = ..., material_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "from_status", "to_status", "error_code", "actor", "attempt_no", "at", "model_provider")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATUS_FIELD_NUMBER: _ClassVar[int]
    TO_STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_status: _message_pb2.JobStatus
    to_status: _message_pb2.JobStatus
    error_code: str
    actor: str
    attempt_no: int
    at: _timestamp_pb2.Timestamp
    model_provider: str
    def __init__(self, job_id: _Optional[str] = ..., from_status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., to_status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., error_code: _Optional[str] = ..., actor: _Optional[str] = ..., attempt_no: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model_provider: _Optional[str] = ...) -> None: ...

class Invocation(_message.Message):
    __slots__ = ("id", "job_id", "attempt_no", "model_provider", "model_name", "api_key_mode", "credential_id", "prompt_tokens", "completion_tokens", "cache_hit_tokens", "latency_ms", "outcome", "error_code", "provider_request_id", "cost_usd", "created_at", "prompt_version")
    ID_FIELD_NUMBER: _ClassVar[int]
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
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
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
    cost_usd: float
    created_at: _timestamp_pb2.Timestamp
    prompt_version: str
    def __init__(self, id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cache_hit_tokens: _Optional[int] = ..., latency_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., error_code: _Optional[str] = ..., provider_request_id: _Optional[str] = ..., cost_usd: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., prompt_version: _Optional[str] = ...) -> None: ...

class ModelCall(_message.Message):
    __slots__ = ("model_provider", "model_name", "api_key_mode", "credential_id", "prompt_tokens", "completion_tokens", "cache_hit_tokens", "latency_ms", "outcome", "error_code", "provider_request_id")
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
    def __init__(self, model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cache_hit_tokens: _Optional[int] = ..., latency_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., error_code: _Optional[str] = ..., provider_request_id: _Optional[str] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("job_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class LeaseState(_message.Message):
    __slots__ = ("job_id", "attempt_no", "held", "lock_until", "cancel_requested")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    LOCK_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    held: bool
    lock_until: _timestamp_pb2.Timestamp
    cancel_requested: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., held: _Optional[bool] = ..., lock_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ...) -> None: ...

class RuntimeWorker(_message.Message):
    __slots__ = ("instance_id", "capabilities", "in_flight", "last_seen_at", "status", "status_address")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    capabilities: _containers.RepeatedScalarFieldContainer[_message_pb2.JobType]
    in_flight: int
    last_seen_at: _timestamp_pb2.Timestamp
    status: str
    status_address: str
    def __init__(self, instance_id: _Optional[str] = ..., capabilities: _Optional[_Iterable[_Union[_message_pb2.JobType, str]]] = ..., in_flight: _Optional[int] = ..., last_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., status: _Optional[str] = ..., status_address: _Optional[str] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("block_id", "ordinal", "text")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    block_id: str
    ordinal: int
    text: str
    def __init__(self, block_id: _Optional[str] = ..., ordinal: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Material(_message.Message):
    __slots__ = ("material_id", "user_id", "title", "blocks", "created_at", "block_count")
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNT_FIELD_NUMBER: _ClassVar[int]
    material_id: str
    user_id: str
    title: str
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    created_at: _timestamp_pb2.Timestamp
    block_count: int
    def __init__(self, material_id: _Optional[str] = ..., user_id: _Optional[str] = ..., title: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., block_count: _Optional[int] = ...) -> None: ...

class KnowledgePoint(_message.Message):
    __slots__ = ("knowledge_point_id", "user_id", "material_id", "name", "block_ids", "created_at")
    KNOWLEDGE_POINT_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    knowledge_point_id: str
    user_id: str
    material_id: str
    name: str
    block_ids: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, knowledge_point_id: _Optional[str] = ..., user_id: _Optional[str] = ..., material_id: _Optional[str] = ..., name: _Optional[str] = ..., block_ids: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LearningEvent(_message.Message):
    __slots__ = ("event_id", "type", "material_id", "block_id", "knowledge_point_id", "dwell_seconds", "correct", "occurred_at")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_POINT_ID_FIELD_NUMBER: _ClassVar[int]
    DWELL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    type: LearningEventType
    material_id: str
    block_id: str
    knowledge_point_id: str
    dwell_seconds: float
    correct: bool
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, event_id: _Optional[str] = ..., type: _Optional[_Union[LearningEventType, str]] = ..., material_id: _Optional[str] = ..., block_id: _Optional[str] = ..., knowledge_point_id: _Optional[str] = ..., dwell_seconds: _Optional[float] = ..., correct: _Optional[bool] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CostRow(_message.Message):
    __slots__ = ("key", "calls", "prompt_tokens", "completion_tokens", "cache_hit_tokens", "cost_usd")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    key: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cache_hit_tokens: int
    cost_usd: float
    def __init__(self, key: _Optional[str] = ..., calls: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cache_hit_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class CircuitBreaker(_message.Message):
    __slots__ = ("state", "consecutive_failures", "opened_at", "half_open_at", "providers")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    HALF_OPEN_AT_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    state: BreakerState
    consecutive_failures: int
    opened_at: _timestamp_pb2.Timestamp
    half_open_at: _timestamp_pb2.Timestamp
    providers: _containers.RepeatedCompositeFieldContainer[ProviderBreaker]
    def __init__(self, state: _Optional[_Union[BreakerState, str]] = ..., consecutive_failures: _Optional[int] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., half_open_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., providers: _Optional[_Iterable[_Union[ProviderBreaker, _Mapping]]] = ...) -> None: ...

class ProviderBreaker(_message.Message):
    __slots__ = ("name", "state", "consecutive_failures", "opened_at", "half_open_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    HALF_OPEN_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: BreakerState
    consecutive_failures: int
    opened_at: _timestamp_pb2.Timestamp
    half_open_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ..., consecutive_failures: _Optional[int] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., half_open_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ProviderState(_message.Message):
    __slots__ = ("name", "requests_per_minute", "tokens_per_minute", "max_concurrent", "requests_last_minute", "tokens_last_minute", "in_flight", "paused_until", "breaker")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    name: str
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent: int
    requests_last_minute: int
    tokens_last_minute: int
    in_flight: int
    paused_until: _timestamp_pb2.Timestamp
    breaker: ProviderBreaker
    def __init__(self, name: _Optional[str] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ..., max_concurrent: _Optional[int] = ..., requests_last_minute: _Optional[int] = ..., tokens_last_minute: _Optional[int] = ..., in_flight: _Optional[int] = ..., paused_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., breaker: _Optional[_Union[ProviderBreaker, _Mapping]] = ...) -> None: ...

class JobStateCount(_message.Message):
    __slots__ = ("status", "count")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    status: _message_pb2.JobStatus
    count: int
    def __init__(self, status: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., count: _Optional[int] = ...) -> None: ...

class JobAttempt(_message.Message):
    __slots__ = ("attempt_no", "runtime_instance_id", "started_at", "ended_at", "outcome", "error_code", "events", "invocations", "latency_ms", "cost_usd")
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    attempt_no: int
    runtime_instance_id: str
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    outcome: _message_pb2.JobStatus
    error_code: str
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    invocations: _containers.RepeatedCompositeFieldContainer[Invocation]
    latency_ms: int
    cost_usd: float
    def __init__(self, attempt_no: _Optional[int] = ..., runtime_instance_id: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[_message_pb2.JobStatus, str]] = ..., error_code: _Optional[str] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., invocations: _Optional[_Iterable[_Union[Invocation, _Mapping]]] = ..., latency_ms: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class SnapshotSummary(_message.Message):
    __slots__ = ("snapshot_id", "schema_version", "target_type", "target_id", "content_hash", "payload_bytes", "material_count", "block_count", "knowledge_point_count", "stats")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNT_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_POINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    schema_version: str
    target_type: str
    target_id: str
    content_hash: str
    payload_bytes: int
    material_count: int
    block_count: int
    knowledge_point_count: int
    stats: _struct_pb2.Struct
    def __init__(self, snapshot_id: _Optional[str] = ..., schema_version: _Optional[str] = ..., target_type: _Optional[str] = ..., target_id: _Optional[str] = ..., content_hash: _Optional[str] = ..., payload_bytes: _Optional[int] = ..., material_count: _Optional[int] = ..., block_count: _Optional[int] = ..., knowledge_point_count: _Optional[int] = ..., stats: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ThroughputMinute(_message.Message):
    __slots__ = ("minute", "succeeded", "failed", "cancelled")
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    minute: _timestamp_pb2.Timestamp
    succeeded: int
    failed: int
    cancelled: int
    def __init__(self, minute: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class JobChange(_message.Message):
    __slots__ = ("seq", "job")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    seq: int
    job: Job
    def __init__(self, seq: _Optional[int] = ..., job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class PromptVersion(_message.Message):
    __slots__ = ("version", "template", "description", "created_at", "builtin")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BUILTIN_FIELD_NUMBER: _ClassVar[int]
    version: str
    template: str
    description: str
    created_at: _timestamp_pb2.Timestamp
    builtin: bool
    def __init__(self, version: _Optional[str] = ..., template: _Optional[str] = ..., description: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., builtin: _Optional[bool] = ...) -> None: ...

class PromptVariant(_message.Message):
    __slots__ = ("version", "weight")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    version: str
    weight: float
    def __init__(self, version: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class PromptGuard(_message.Message):
    __slots__ = ("max_invalid_schema_increase", "min_attempts")
    MAX_INVALID_SCHEMA_INCREASE_FIELD_NUMBER: _ClassVar[int]
    MIN_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    max_invalid_schema_increase: float
    min_attempts: int
    def __init__(self, max_invalid_schema_increase: _Optional[float] = ..., min_attempts: _Optional[int] = ...) -> None: ...

class PromptRouting(_message.Message):
    __slots__ = ("variants", "guard", "rolled_back_at", "rollback_reason", "started_at")
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_AT_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    variants: _containers.RepeatedCompositeFieldContainer[PromptVariant]
    guard: PromptGuard
    rolled_back_at: _timestamp_pb2.Timestamp
    rollback_reason: str
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, variants: _Optional[_Iterable[_Union[PromptVariant, _Mapping]]] = ..., guard: _Optional[_Union[PromptGuard, _Mapping]] = ..., rolled_back_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rollback_reason: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PromptVersionStats(_message.Message):
    __slots__ = ("version", "attempts", "succeeded", "invalid_schema_rate", "mean_prompt_tokens", "mean_completion_tokens", "p50_latency_ms", "p95_latency_ms", "cost_per_succeeded_usd", "feedback_positive", "feedback_negative")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    INVALID_SCHEMA_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    P50_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    P95_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    COST_PER_SUCCEEDED_USD_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_POSITIVE_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    version: str
    attempts: int
    succeeded: int
    invalid_schema_rate: float
    mean_prompt_tokens: float
    mean_completion_tokens: float
    p50_latency_ms: int
    p95_latency_ms: int
    cost_per_succeeded_usd: float
    feedback_positive: int
    feedback_negative: int
    def __init__(self, version: _Optional[str] = ..., attempts: _Optional[int] = ..., succeeded: _Optional[int] = ..., invalid_schema_rate: _Optional[float] = ..., mean_prompt_tokens: _Optional[float] = ..., mean_completion_tokens: _Optional[float] = ..., p50_latency_ms: _Optional[int] = ..., p95_latency_ms: _Optional[int] = ..., cost_per_succeeded_usd: _Optional[float] = ..., feedback_positive: _Optional[int] = ..., feedback_negative: _Optional[int] = ...) -> None: ...
