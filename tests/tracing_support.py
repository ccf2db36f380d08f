"""Helpers for the tracing tests: in-memory span capture and a leak scan over spans.

:func:`capture` sets a service's tracing up with an ``InMemorySpanExporter`` before
the service starts (its own ``tracing.setup`` call then returns that one), and
:func:`airuntime_common.tracing.reset` forgets it afterwards, so no other test's
servers or channels are traced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from airuntime_common import tracing


class Capture:
    """One in-memory exporter shared by every service a test sets up."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()

    def setup(self, service: str) -> tracing.Tracing:
        """Tracing for ``service`` exporting (synchronously) into this capture."""
        result = tracing.setup(service, span_processor=SimpleSpanProcessor(self.exporter))
        assert result is not None
        return result

    def spans(self) -> list[ReadableSpan]:
        """Every span ended so far, in the order they ended."""
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        """The ended spans called ``name``."""
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        """The one ended span called ``name``."""
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names()}"
        return found[0]

    async def ended(self, name: str, count: int = 1, within: float = 5.0) -> list[ReadableSpan]:
        """Wait until ``count`` spans called ``name`` have ended (a server span ends
        after its answer is sent, so a client can see the answer first)."""
        async with asyncio.timeout(within):
            while len(self.named(name)) < count:  # noqa: ASYNC110 (the SDK ends spans; no event to wait on)
                await asyncio.sleep(0.01)
        return self.named(name)

    def names(self) -> list[str]:
        """Names of the ended spans."""
        return [s.name for s in self.spans()]


@pytest.fixture
def capture() -> Iterator[Capture]:
    """An in-memory span capture; every service's tracing is forgotten afterwards."""
    tracing.reset()
    try:
        yield Capture()
    finally:
        tracing.reset()


def service_of(span: ReadableSpan) -> str:
    """The ``service.name`` of the process (service) that made ``span``."""
    return str(span.resource.attributes.get("service.name"))


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str | bytes):
        yield value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    elif isinstance(value, Iterable):
        for item in value:
            yield from _texts(item)
    elif value is not None:
        yield str(value)


def span_texts(span: ReadableSpan) -> Iterator[tuple[str, str]]:
    """Every text a span carries: ``(where, text)`` for its name, each attribute's key
    and value, each event's name and attributes, its status, its links and resource."""
    yield "name", span.name
    for key, value in (span.attributes or {}).items():
        yield "attribute key", key
        for text in _texts(value):
            yield f"attribute {key}", text
    for event in span.events:
        yield "event", event.name
        for key, value in (event.attributes or {}).items():
            for text in _texts(value):
                yield f"event {event.name} {key}", text
    if span.status.description:
        yield "status", span.status.description
    for link in span.links:
        for key, value in (link.attributes or {}).items():
            for text in _texts(value):
                yield f"link {key}", text
    for key, value in span.resource.attributes.items():
        for text in _texts(value):
            yield f"resource {key}", text


def windows(secret: str, size: int = 9) -> set[str]:
    """Every ``size``-character piece of ``secret`` (a leak of more than 8 characters)."""
    if len(secret) <= size:
        return {secret}
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def leaks(spans: Iterable[ReadableSpan], secrets: Iterable[str]) -> list[str]:
    """Where any 9-character piece of any of ``secrets`` appears in ``spans``."""
    pieces = {w for s in secrets for w in windows(s)}
    found = []
    for span in spans:
        for where, text in span_texts(span):
            if any(piece in text for piece in pieces):
                found.append(f"{span.name}: {where}: {text[:120]!r}")
    return found


def new_traceparent(trace_id: int = 0x0AF7651916CD43DD8448EB211C80319C) -> tuple[str, int, int]:
    """A sampled version-00 ``traceparent``, with its trace and span ids."""
    span_id = 0xB7AD6B7169203331
    return f"00-{trace_id:032x}-{span_id:016x}-01", trace_id, span_id
