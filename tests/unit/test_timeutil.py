"""Timestamps on the wire: the in-place conversion agrees with protobuf's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from airuntime_common.timeutil import from_timestamp, set_timestamp, to_timestamp

OFFSETS = st.integers(min_value=-23 * 60, max_value=23 * 60).map(
    lambda m: timezone(timedelta(minutes=m))
)
MOMENTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.none() | OFFSETS
)


def _reference(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    return ts


@settings(deadline=None)
@given(MOMENTS)
def test_set_timestamp_matches_from_datetime(value: datetime) -> None:
    field = Timestamp(seconds=123, nanos=456)  # overwritten, not merged
    set_timestamp(field, value)
    assert (field.seconds, field.nanos) == (_reference(value).seconds, _reference(value).nanos)
    assert 0 <= field.nanos < 1_000_000_000


@settings(deadline=None)
@given(MOMENTS)
def test_round_trip_keeps_the_instant(value: datetime) -> None:
    ts = to_timestamp(value)
    assert ts is not None
    back = from_timestamp(ts)
    assert back == (value if value.tzinfo else value.replace(tzinfo=UTC))


def test_known_values() -> None:
    assert to_timestamp(None) is None
    ts = to_timestamp(datetime(1970, 1, 1, 0, 0, 1, 500))
    assert ts is not None and (ts.seconds, ts.nanos) == (1, 500_000)
    ts = to_timestamp(datetime(1969, 12, 31, 23, 59, 59, 250_000))  # before the epoch
    assert ts is not None and (ts.seconds, ts.nanos) == (-1, 250_000_000)
    aware = datetime(2026, 12, 2, 8, 0, tzinfo=timezone(timedelta(hours=8)))
    ts = to_timestamp(aware)
    assert ts is not None and ts.ToDatetime(tzinfo=UTC) == datetime(2026, 12, 2, tzinfo=UTC)
