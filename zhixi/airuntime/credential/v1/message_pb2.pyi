import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CredentialStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CREDENTIAL_STATUS_UNSPECIFIED: _ClassVar[CredentialStatus]
    CREDENTIAL_STATUS_VALID: _ClassVar[CredentialStatus]
    CREDENTIAL_STATUS_INVALID: _ClassVar[CredentialStatus]
CREDENTIAL_STATUS_UNSPECIFIED: CredentialStatus
CREDENTIAL_STATUS_VALID: CredentialStatus
CREDENTIAL_STATUS_INVALID: CredentialStatus

class Credential(_message.Message):
    __slots__ = ("credential_id", "user_id", "provider", "masked_key", "status", "created_at", "key_id", "base_url")
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MASKED_KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    credential_id: str
    user_id: str
    provider: str
    masked_key: str
    status: CredentialStatus
    created_at: _timestamp_pb2.Timestamp
    key_id: str
    base_url: str
    def __init__(self, credential_id: _Optional[str] = ..., user_id: _Optional[str] = ..., provider: _Optional[str] = ..., masked_key: _Optional[str] = ..., status: _Optional[_Union[CredentialStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., key_id: _Optional[str] = ..., base_url: _Optional[str] = ...) -> None: ...
