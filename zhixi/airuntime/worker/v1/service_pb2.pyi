from zhixi.airuntime.worker.v1 import request_response_pb2 as _request_response_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
