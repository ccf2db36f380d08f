"""Structured logging: one JSON object a line, with one redaction filter.

Context (``jobId``, ``attemptNo``, ``runtimeInstanceId``, ``requestId``) is
carried in :data:`log_context` (a ``contextvars`` var) and added to every
record. :class:`RedactionFilter` scrubs secrets by field name and by key
pattern from the message, the arguments and any exception text, so no key
ever reaches a log (reference §6).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import traceback
from typing import Any

log_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "log_context", default=None
)

#: Field names whose values are never logged.
SECRET_FIELDS = frozenset(
    {
        "api_key",
        "apikey",
        "apiKey",
        "authorization",
        "x-internal-api-key",
        "password",
        "secret",
        "token",
    }
)
#: Anything that looks like a model key or bearer token.
SECRET_PATTERN = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6,}|Bearer\s+[A-Za-z0-9_\-\.=]+|eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*)"
)
REDACTED = "[REDACTED]"


def redact_text(text: str) -> str:
    """Replace every key-looking substring of ``text`` with ``[REDACTED]``."""
    return SECRET_PATTERN.sub(REDACTED, text)


def redact(value: Any) -> Any:
    """Recursively redact a JSON-like value by field name and by key pattern."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if str(k) in SECRET_FIELDS else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def bind(**fields: Any) -> contextvars.Token[dict[str, Any] | None]:
    """Add fields to the log context of the current task; returns a reset token."""
    current = dict(log_context.get() or {})
    current.update({k: v for k, v in fields.items() if v is not None})
    return log_context.set(current)


class RedactionFilter(logging.Filter):
    """Scrubs secrets from a record's message, args and exception before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not kill logging
            message = str(record.msg)
        record.msg = redact_text(message)
        record.args = None
        if record.exc_info:
            record.exc_text = redact_text("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            record.fields = redact(extra)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, context and ``fields``."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(log_context.get() or {})
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            out.update(extra)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler writing to ``sys.stderr`` as it is when a record is emitted,
    not as it was when the handler was made (as :data:`logging.lastResort` does).

    A service started in-process while ``sys.stderr`` was a replaced stream (a test
    capture, closed when its test ends) keeps logging to the current stderr instead
    of failing every record with "I/O operation on closed file".
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def setup_logging(service: str, level: str = "INFO") -> None:
    """Route all logging to stderr as JSON lines through the redaction filter."""
    import time

    logging.Formatter.converter = time.gmtime
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter(service))
    handler.addFilter(RedactionFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "aiosqlite", "sqlalchemy.engine", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # asyncmy logs each of the server's warnings at WARNING: the expected ones of
    # INSERT IGNORE (a deduplicated row: "Duplicate entry '<user>-<hash>'", row data
    # in the log) and of DDL. They are outcomes the code handles, as they are on
    # aiomysql, which logs none of them; driver errors still raise.
    logging.getLogger("asyncmy").setLevel(max(logging.ERROR, root.level))
