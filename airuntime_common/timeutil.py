"""Time helpers: UTC everywhere, RFC 3339 with milliseconds on the wire (reference §3)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp


def utcnow() -> datetime:
    """Current UTC time, timezone-aware. Never used for lease arithmetic (reference §1)."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Treat a naive datetime (as the database returns it) as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def rfc3339(value: datetime | None) -> str | None:
    """``2026-11-30T15:07:35.123Z`` (UTC, milliseconds), or None."""
    if value is None:
        return None
    return (
        as_utc(value).strftime("%Y-%m-%dT%H:%M:%S.") + f"{as_utc(value).microsecond // 1000:03d}Z"
    )


_EPOCH = datetime(1970, 1, 1)


def set_timestamp(field: Timestamp, value: datetime) -> None:
    """Write ``value`` into the Timestamp ``field`` in place (a naive datetime is UTC).

    The same seconds and nanoseconds as ``Timestamp.FromDatetime``, in plain
    arithmetic: about a sixth of its time, which adds up over a job's nine
    timestamps on every poll and claim answer.
    """
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    delta = value - _EPOCH
    field.seconds = delta.days * 86400 + delta.seconds
    field.nanos = delta.microseconds * 1000


def to_timestamp(value: datetime | None) -> Timestamp | None:
    """datetime → protobuf Timestamp (None stays None, so the field stays unset)."""
    if value is None:
        return None
    ts = Timestamp()
    set_timestamp(ts, value)
    return ts


def from_timestamp(ts: Timestamp, present: bool = True) -> datetime | None:
    """protobuf Timestamp → aware UTC datetime; None when the field is unset."""
    if not present:
        return None
    return ts.ToDatetime(tzinfo=UTC)
