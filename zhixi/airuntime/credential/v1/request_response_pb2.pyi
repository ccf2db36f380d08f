from zhixi.airuntime.common.v1 import message_pb2 as _message_pb2
from zhixi.airuntime.credential.v1 import message_pb2 as _message_pb2_1
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutCredentialRequest(_message.Message):
    __slots__ = ("user_id", "provider", "api_key", "base_url")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    provider: str
    api_key: str
    base_url: str
    def __init__(self, user_id: _Optional[str] = ..., provider: _Optional[str] = ..., api_key: _Optional[str] = ..., base_url: _Optional[str] = ...) -> None: ...

class PutCredentialResponse(_message.Message):
    __slots__ = ("credential",)
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    credential: _message_pb2_1.Credential
    def __init__(self, credential: _Optional[_Union[_message_pb2_1.Credential, _Mapping]] = ...) -> None: ...

class GetCredentialRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetCredentialResponse(_message.Message):
    __slots__ = ("credential",)
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    credential: _message_pb2_1.Credential
    def __init__(self, credential: _Optional[_Union[_message_pb2_1.Credential, _Mapping]] = ...) -> None: ...

class DeleteCredentialRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class DeleteCredentialResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EraseUserCredentialsRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class EraseUserCredentialsResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class ResolveCredentialRequest(_message.Message):
    __slots__ = ("job_id", "attempt_no")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_no: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_no: _Optional[int] = ...) -> None: ...

class ResolveCredentialResponse(_message.Message):
    __slots__ = ("api_key_mode", "credential_id", "api_key", "model_provider", "model_name", "base_url", "user_base_url")
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    USER_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    api_key_mode: _message_pb2.ApiKeyMode
    credential_id: str
    api_key: str
    model_provider: str
    model_name: str
    base_url: str
    user_base_url: bool
    def __init__(self, api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ..., credential_id: _Optional[str] = ..., api_key: _Optional[str] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., base_url: _Optional[str] = ..., user_base_url: _Optional[bool] = ...) -> None: ...

class MarkCredentialInvalidRequest(_message.Message):
    __slots__ = ("credential_id", "reason")
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    credential_id: str
    reason: str
    def __init__(self, credential_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class MarkCredentialInvalidResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RotateKeysRequest(_message.Message):
    __slots__ = ("batch_size",)
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    def __init__(self, batch_size: _Optional[int] = ...) -> None: ...

class RotateKeysResponse(_message.Message):
    __slots__ = ("rotated", "remaining")
    ROTATED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    rotated: int
    remaining: int
    def __init__(self, rotated: _Optional[int] = ..., remaining: _Optional[int] = ...) -> None: ...

class CheckCredentialRequest(_message.Message):
    __slots__ = ("user_id", "api_key_mode")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    API_KEY_MODE_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    api_key_mode: _message_pb2.ApiKeyMode
    def __init__(self, user_id: _Optional[str] = ..., api_key_mode: _Optional[_Union[_message_pb2.ApiKeyMode, str]] = ...) -> None: ...

class CheckCredentialResponse(_message.Message):
    __slots__ = ("usable", "credential_id", "reason", "providers")
    USABLE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    usable: bool
    credential_id: str
    reason: str
    providers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, usable: _Optional[bool] = ..., credential_id: _Optional[str] = ..., reason: _Optional[str] = ..., providers: _Optional[_Iterable[str]] = ...) -> None: ...
