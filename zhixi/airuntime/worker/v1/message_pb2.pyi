import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from zhixi.airuntime.common.v1 import message_pb2 as _message_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InFlightJob(_message.Message):
    __slots__ = ("job_id", "attempt_no", "job_type", "started_at", "age_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    job_type: _message_pb2.JobType
    started_at: _timestamp_pb2.Timestamp
    age_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ..., job_type: _Optional[_Union[_message_pb2.JobType, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., age_seconds: _Optional[float] = ...) -> None: ...
