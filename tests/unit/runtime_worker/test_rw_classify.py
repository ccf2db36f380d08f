"""The classification table, one test per row (codes, retryability, breaker effect)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from airuntime_common.errors import BREAKER_FAILURE_CODES, ErrorCode, is_retryable
from runtime_worker.providers.classify import (
    REASKABLE,
    TABLE,
    Fault,
    code_for,
    fault_for_finish_reason,
    fault_for_status,
    parse_retry_after,
)

#: fault → (code, retryable, counts toward the platform breaker)
EXPECTED = {
    Fault.TIMEOUT: (ErrorCode.MODEL_TIMEOUT, True, True),
    Fault.JOB_DEADLINE: (ErrorCode.JOB_TIMEOUT, True, False),
    Fault.HTTP_408: (ErrorCode.MODEL_TIMEOUT, True, True),
    Fault.CONNECT_ERROR: (ErrorCode.NETWORK_ERROR, True, True),
    Fault.READ_ERROR: (ErrorCode.NETWORK_ERROR, True, True),
    Fault.HTTP_429: (ErrorCode.MODEL_RATE_LIMIT, True, True),
    Fault.HTTP_500: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.HTTP_502: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.HTTP_503: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.HTTP_504: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.HTTP_OTHER_5XX: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.BAD_ENVELOPE: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.OUT_OF_CAPACITY: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.BODY_TOO_LARGE: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.HTTP_401: (ErrorCode.INVALID_CREDENTIAL, False, True),
    Fault.HTTP_403: (ErrorCode.INVALID_CREDENTIAL, False, True),
    Fault.HTTP_402: (ErrorCode.INSUFFICIENT_BALANCE, False, True),
    Fault.HTTP_400: (ErrorCode.MODEL_BAD_REQUEST, False, False),
    Fault.HTTP_422: (ErrorCode.MODEL_BAD_REQUEST, False, False),
    Fault.HTTP_OTHER_4XX: (ErrorCode.MODEL_BAD_REQUEST, False, False),
    Fault.REDIRECT: (ErrorCode.TEMPORARY_PROVIDER_ERROR, True, True),
    Fault.EGRESS_REFUSED: (ErrorCode.EGRESS_BLOCKED, False, False),
    Fault.BLANK_CONTENT: (ErrorCode.INVALID_SCHEMA, False, False),
    Fault.TRUNCATED: (ErrorCode.INVALID_SCHEMA, False, False),
    Fault.SCHEMA_MISMATCH: (ErrorCode.INVALID_SCHEMA, False, False),
}


def test_every_fault_has_a_row() -> None:
    assert set(TABLE) == set(Fault) == set(EXPECTED)


@pytest.mark.parametrize("fault", list(Fault))
def test_row(fault: Fault) -> None:
    code, retryable, breaker = EXPECTED[fault]
    assert code_for(fault) == code
    assert is_retryable(code) is retryable
    assert (code in BREAKER_FAILURE_CODES) is breaker


@pytest.mark.parametrize(
    ("status", "fault"),
    [
        (200, None),
        (204, None),
        (408, Fault.HTTP_408),
        (429, Fault.HTTP_429),
        (500, Fault.HTTP_500),
        (502, Fault.HTTP_502),
        (503, Fault.HTTP_503),
        (504, Fault.HTTP_504),
        (507, Fault.HTTP_OTHER_5XX),
        (401, Fault.HTTP_401),
        (403, Fault.HTTP_403),
        (402, Fault.HTTP_402),
        (400, Fault.HTTP_400),
        (422, Fault.HTTP_422),
        (404, Fault.HTTP_OTHER_4XX),
        (302, Fault.REDIRECT),
        (307, Fault.REDIRECT),
        (301, Fault.REDIRECT),
    ],
)
def test_status_to_fault(status: int, fault: Fault | None) -> None:
    assert fault_for_status(status) is fault


@pytest.mark.parametrize(
    ("finish_reason", "fault"),
    [
        ("insufficient_system_resource", Fault.OUT_OF_CAPACITY),
        ("stop", None),
        ("length", None),
        (None, None),
    ],
)
def test_finish_reason_to_fault(finish_reason: str | None, fault: Fault | None) -> None:
    assert fault_for_finish_reason(finish_reason) is fault


def test_only_content_faults_are_reaskable() -> None:
    assert {code_for(f) for f in REASKABLE} == {ErrorCode.INVALID_SCHEMA}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 2.5 ", 2.5),
        ("-3", 0.0),
        ("Mon, 30 Nov 2026 12:00:10 GMT", 10.0),
        ("garbage", None),
        (None, None),
        ("", None),
    ],
)
def test_retry_after(value: str | None, seconds: float | None) -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(value, now) == seconds
