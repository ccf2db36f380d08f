import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from zhixi.airuntime.common.v1 import message_pb2 as _message_pb2
from zhixi.airuntime.worker.v1 import message_pb2 as _message_pb2_1
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("instance_id", "version", "capabilities", "in_flight", "counters", "draining", "concurrency", "started_at")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    version: str
    capabilities: _containers.RepeatedScalarFieldContainer[_message_pb2.JobType]
    in_flight: _containers.RepeatedCompositeFieldContainer[_message_pb2_1.InFlightJob]
    counters: _containers.ScalarMap[str, int]
    draining: bool
    concurrency: int
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, instance_id: _Optional[str] = ..., version: _Optional[str] = ..., capabilities: _Optional[_Iterable[_Union[_message_pb2.JobType, str]]] = ..., in_flight: _Optional[_Iterable[_Union[_message_pb2_1.InFlightJob, _Mapping]]] = ..., counters: _Optional[_Mapping[str, int]] = ..., draining: _Optional[bool] = ..., concurrency: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("grace_seconds",)
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    grace_seconds: float
    def __init__(self, grace_seconds: _Optional[float] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("in_flight",)
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    def __init__(self, in_flight: _Optional[int] = ...) -> None: ...
