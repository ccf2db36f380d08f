"""Shared building blocks: error transport over gRPC, canonical hashes, redaction."""

from __future__ import annotations

import io
import logging
import sys

import grpc
import pytest

from airuntime_common import canonical, errors, logs
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error, to_status


def test_retryability_follows_spec_4() -> None:
    retryable = {c for c in ErrorCode if errors.is_retryable(c)}
    assert retryable == {
        "MODEL_TIMEOUT", "MODEL_RATE_LIMIT", "NETWORK_ERROR", "TEMPORARY_PROVIDER_ERROR",
        "JOB_TIMEOUT", "LEASE_EXPIRED", "WORKER_SHUTDOWN",
    }  # fmt: skip
    assert not errors.is_retryable("SOMETHING_ELSE")
    assert not errors.is_retryable(None)


@pytest.mark.parametrize(
    ("code", "http", "grpc_code"),
    [
        ("LOCK_NOT_HELD", 409, grpc.StatusCode.FAILED_PRECONDITION),
        ("JOB_ALREADY_LOCKED", 409, grpc.StatusCode.ABORTED),
        ("RESULT_ALREADY_EXISTS", 409, grpc.StatusCode.ALREADY_EXISTS),
        ("INVALID_SCHEMA", 422, grpc.StatusCode.INVALID_ARGUMENT),
        ("PLATFORM_CIRCUIT_OPEN", 503, grpc.StatusCode.UNAVAILABLE),
        ("QUOTA_EXCEEDED", 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("PAYLOAD_TOO_LARGE", 413, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_transport_table(code: str, http: int, grpc_code: grpc.StatusCode) -> None:
    assert errors.http_status(code) == http
    assert errors.grpc_status(code) == grpc_code


class _FakeCall(grpc.RpcError):
    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return self._status.trailing_metadata


def test_error_round_trips_through_rich_status() -> None:
    err = AppError("LOCK_NOT_HELD", "lease lost", {"jobId": "j1", "attemptNo": 2})
    back = from_rpc_error(_FakeCall(to_status(err)))
    assert (back.code, back.message, back.details) == (err.code, err.message, err.details)


def test_canonical_hash_ignores_key_order_and_integral_floats() -> None:
    a = {"items": [{"b": 1, "a": "中文"}]}
    b = {"items": [{"a": "中文", "b": 1.0}]}
    assert canonical.content_hash(a) == canonical.content_hash(b)
    assert canonical.canonical_json(a) == '{"items":[{"a":"中文","b":1}]}'.encode()


def test_redaction_scrubs_keys_from_messages_args_and_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = logging.LogRecord(
        "t", logging.ERROR, __file__, 1, "key %s", ("sk-canary1234567",), None
    )
    try:
        raise ValueError("bad key sk-canary1234567")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    record.fields = {"apiKey": "sk-canary1234567", "nested": {"x": "Bearer abc.def"}}
    logs.RedactionFilter().filter(record)
    text = logs.JsonFormatter("t").format(record)
    assert "canary" not in text
    assert "[REDACTED]" in text


def test_the_drivers_server_warnings_stay_out_of_the_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """asyncmy logs an INSERT IGNORE's expected duplicate (with the row's key) at
    WARNING; the services log none of it, as on aiomysql, but still its errors."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logs.setup_logging("t", "INFO")
        driver = logging.getLogger("asyncmy")
        driver.warning("Duplicate entry 'user-1-abc' for key 'uq_ai_snapshots_user_hash'")
        driver.error("a driver error")
        logging.getLogger("job_service.x").warning("an own warning")
        err = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("asyncmy").setLevel(logging.NOTSET)
    assert "Duplicate entry" not in err
    assert "a driver error" in err and "an own warning" in err


def test_logging_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service set up while stderr was a stream closed since (a test's capture) logs to
    the stderr of now, not "--- Logging error --- I/O operation on closed file"."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    first, now = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr(sys, "stderr", first)
        logs.setup_logging("t", "INFO")
        first.close()
        monkeypatch.setattr(sys, "stderr", now)
        logging.getLogger("job_service.x").warning("after the swap")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert "after the swap" in now.getvalue()
    assert "Logging error" not in now.getvalue()
