"""OpenTelemetry tracing, set up once per process when OTLP export is configured (reference §9.5).

Each service's start-up calls :func:`setup` with its name. With
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set it
installs the SDK: a ``TracerProvider`` whose resource is built by the SDK from
``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` (``service.name`` is the
service's name unless one of those names it), whose sampler is the SDK's
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based,
always on), and a ``BatchSpanProcessor`` (``OTEL_BSP_*``) in front of an OTLP
exporter over gRPC or HTTP as ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL`` say (``grpc``, the default, or ``http/protobuf``);
the exporter reads its own ``OTEL_EXPORTER_OTLP_*`` variables (headers,
timeout, compression, certificates). ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off.

Unset, :func:`setup` returns None and installs nothing: no tracer provider, no
interceptor on any server or channel, no middleware, no HTTP client hook, and the
OpenTelemetry packages are not even imported. The hot path then pays one
``is None`` test where a span would be made.

What the instrumentations may record is narrowed here once, for every
service: gRPC spans never hold metadata (``x-internal-api-key``) nor message
bodies; HTTP header capture (``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*``)
always redacts :data:`ALWAYS_REDACTED_HEADERS`; health checks, reflection and
the gateway's probes make no spans.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airuntime_common.settings import InvalidSetting

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: The gRPC metadata key / HTTP header of W3C Trace Context.
TRACEPARENT = "traceparent"
#: Length of a version-00 ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``).
TRACEPARENT_LENGTH = 55
#: The services' names, the default ``service.name`` of each (reference §9.5).
SERVICE_NAMES = ("api_gateway", "job_service", "credential_service", "runtime_worker")
#: Headers whose values are replaced by ``[REDACTED]`` whenever header capture is
#: switched on, added to ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS``.
ALWAYS_REDACTED_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-internal-api-key",
    "x-api-key",
    "api-key",
)
#: Gateway paths that make no span unless ``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` (or
#: ``OTEL_PYTHON_EXCLUDED_URLS``) says otherwise: probes and scrapes, every few seconds.
DEFAULT_EXCLUDED_URLS = "/healthz$,/readyz$,/metrics$"
#: gRPC services that make no span (probes, ``grpcurl list``), plus any named in
#: ``OTEL_PYTHON_GRPC_EXCLUDED_SERVICES``.
UNTRACED_GRPC_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")
#: Streams whose calls are traced one by one (:meth:`Tracing.call_span`), not as a stream:
#: a worker's ``RuntimeSession`` lives as long as the worker.
CALL_TRACED_STREAMS = ("/zhixi.airuntime.job.v1.JobService/RuntimeSession",)
#: gRPC codes that mark a server span as an error (OpenTelemetry's semantic
#: conventions: the server's fault, not the caller's).
SERVER_ERROR_CODES = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
PROTOCOLS = ("grpc", "http/protobuf")

_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_SANITIZE_VAR = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"

_lock = threading.Lock()
_GRPC_CODE_NAMES: dict[int, str] = {}
_services: dict[str, Tracing] = {}
_process: Tracing | None = None
#: True once any service of this process has tracing (read on hot paths).
_active = False


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for trace export.

    Args:
        environ: the variables to read (default ``os.environ``).

    Returns:
        True when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
        is set and neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``.

    Raises:
        InvalidSetting: ``OTEL_TRACES_EXPORTER`` names an exporter other than ``otlp``.
    """
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()]
    if exporters == ["none"]:
        return False
    if any(e != "otlp" for e in exporters):
        raise InvalidSetting(
            "refusing to start: OTEL_TRACES_EXPORTER must be otlp or none (reference §9.5)"
        )
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def protocol(environ: Mapping[str, str] | None = None) -> str:
    """The OTLP transport: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``, else ``grpc``.

    Raises:
        InvalidSetting: a value other than ``grpc`` or ``http/protobuf``.
    """
    env = os.environ if environ is None else environ
    value = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "grpc"
    )
    if value not in PROTOCOLS:
        raise InvalidSetting(
            "refusing to start: OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf"
        )
    return value


def _exporter(proto: str) -> Any:
    """The OTLP span exporter for ``proto``; it reads its own ``OTEL_EXPORTER_OTLP_*``."""
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    return GrpcExporter()


def _resource(service_name: str) -> Any:
    """The SDK's resource from the environment, ``service.name`` defaulting to ours."""
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource

    if OTELResourceDetector().detect().attributes.get(SERVICE_NAME):
        return Resource.create()  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name it
    return Resource.create({SERVICE_NAME: service_name})


def _redact_headers_always() -> list[str]:
    """Add :data:`ALWAYS_REDACTED_HEADERS` to the standard sanitize list (in the
    environment, which the HTTP instrumentations read) and return the whole list."""
    current = [h.strip() for h in os.environ.get(_SANITIZE_VAR, "").split(",") if h.strip()]
    merged = current + [h for h in ALWAYS_REDACTED_HEADERS if h not in current]
    os.environ[_SANITIZE_VAR] = ",".join(merged)
    return merged


def setup(service_name: str, *, span_processor: SpanProcessor | None = None) -> Tracing | None:
    """Set up tracing for ``service_name`` in this process, once; later calls return the same.

    Args:
        service_name: one of :data:`SERVICE_NAMES`; the default ``service.name``.
        span_processor: export through this processor instead of OTLP, whatever the
            environment says (tests: ``SimpleSpanProcessor(InMemorySpanExporter())``);
            the process-wide OpenTelemetry tracer provider is then left alone.

    Returns:
        The service's :class:`Tracing`, or None when tracing is off (nothing installed).

    Raises:
        InvalidSetting: an unsupported ``OTEL_EXPORTER_OTLP_PROTOCOL`` or
            ``OTEL_TRACES_EXPORTER`` (a misconfigured export must not pass silently).
    """
    global _process, _active
    with _lock:
        existing = _services.get(service_name)
        if existing is not None:
            return existing
        if span_processor is None and not configured():
            return None
        proto = protocol() if span_processor is None else "test"
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        sanitized = _redact_headers_always()
        if not _GRPC_CODE_NAMES:
            _GRPC_CODE_NAMES.update(_grpc_code_names())
        provider = TracerProvider(resource=_resource(service_name))
        if span_processor is None:
            provider.add_span_processor(BatchSpanProcessor(_exporter(proto)))
            if _process is None:
                trace.set_tracer_provider(provider)
        else:
            provider.add_span_processor(span_processor)
        tracing = Tracing(service_name, provider, sanitized)
        _services[service_name] = tracing
        if _process is None:
            _process = tracing
        _active = True
    if span_processor is None:
        log.info(
            "tracing on: OTLP export",
            extra={"fields": {"service": service_name, "protocol": proto}},
        )
    return tracing


def current() -> Tracing | None:
    """The tracing of this process (the first service set up), or None when off.

    Servers and channels made without an explicit ``tracing`` use it: in a
    deployment each process runs one service.
    """
    return _process


def reset() -> None:
    """Forget every service's tracing, flushing and shutting down their providers (tests).

    The process-wide OpenTelemetry provider, once set, stays (the API allows one).
    """
    global _process, _active
    with _lock:
        services = list(_services.values())
        _services.clear()
        _process = None
        _active = False
    for tracing in services:
        tracing.provider.shutdown()


class Tracing:
    """One service's tracing: its provider and the instrumentation made from it.

    Args:
        service_name: the service (``api_gateway``…).
        provider: its SDK tracer provider.
        sanitized_headers: header names redacted whenever header capture is on.
    """

    def __init__(
        self, service_name: str, provider: TracerProvider, sanitized_headers: list[str]
    ) -> None:
        self.service_name = service_name
        self.provider = provider
        self._sanitized = list(sanitized_headers)
        self._grpc_filter = _grpc_filter()

    def tracer(self, name: str) -> Tracer:
        """A tracer of this service (``name``: the instrumenting module)."""
        return self.provider.get_tracer(name)

    def server_interceptors(self) -> list[Any]:
        """The gRPC aio server interceptor (one server span per call, the caller's
        ``traceparent`` as parent; health and reflection excluded)."""
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        interceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]
            tracer_provider=self.provider, filter_=self._grpc_filter
        )
        return [interceptor]

    def client_interceptors(self) -> list[Any]:
        """The gRPC aio client interceptors (one client span per call, ``traceparent``
        sent in the metadata; health and reflection excluded)."""
        from opentelemetry.instrumentation.grpc import aio_client_interceptors

        interceptors = aio_client_interceptors(  # type: ignore[no-untyped-call]
            tracer_provider=self.provider,
            filter_=self._grpc_filter,
            response_hook=_status_without_message,
        )
        return list(interceptors)

    def instrument_fastapi(self, app: Any) -> None:
        """Trace every request of a FastAPI ``app`` (one server span per request, named
        by its route template; no ASGI send/receive spans, probes excluded)."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        excluded = (
            os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS")
            or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
            or DEFAULT_EXCLUDED_URLS
        )
        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.provider,
            excluded_urls=excluded,
            http_capture_headers_sanitize_fields=self._sanitized,
            exclude_spans=["receive", "send"],
        )

    def aiohttp_trace_config(self) -> Any:
        """An ``aiohttp.TraceConfig`` that traces every request of the session made
        with it (one client span: method, URL without credentials, status; bodies
        never, headers only as ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_*``
        ask, always with the redacted ones redacted)."""
        from opentelemetry.instrumentation._semconv import (
            _OpenTelemetrySemanticConventionStability,
            _OpenTelemetryStabilitySignalType,
        )
        from opentelemetry.instrumentation.aiohttp_client import create_trace_config
        from opentelemetry.util.http import (
            OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST,
            OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE,
            get_custom_headers,
        )

        _OpenTelemetrySemanticConventionStability._initialize()  # type: ignore[no-untyped-call]
        mode = _OpenTelemetrySemanticConventionStability._get_opentelemetry_stability_opt_in_mode(
            _OpenTelemetryStabilitySignalType.HTTP
        )
        return create_trace_config(
            tracer_provider=self.provider,
            sem_conv_opt_in_mode=mode,
            captured_request_headers=get_custom_headers(
                OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST
            ),
            captured_response_headers=get_custom_headers(
                OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE
            ),
            sensitive_headers=list(self._sanitized),
        )

    @contextlib.contextmanager
    def call_span(
        self, full_method: str, *, server: bool, trace_parent: str | None = None
    ) -> Iterator[CallSpan]:
        """The span of one call on a call-traced stream (:data:`CALL_TRACED_STREAMS`),
        shaped as the gRPC instrumentation's span of the unary call would be: named
        by the full method (``/zhixi.airuntime.job.v1.JobService/ClaimJobs``), kind
        CLIENT or SERVER, ``rpc.*`` attributes.

        Args:
            full_method: the unary method the call stands for.
            server: a server span (its parent: ``trace_parent``) or a client span (its
                parent: the current span; :attr:`CallSpan.trace_parent` is what to send).
            trace_parent: the caller's ``traceparent`` (server spans).

        Yields:
            The call's span; :meth:`CallSpan.finish` records how it ended.
        """
        from opentelemetry.trace import SpanKind

        service, _, method = full_method.strip("/").partition("/")
        parent = self.parent_context(trace_parent) if server else None
        tracer = self.tracer(__name__)
        with tracer.start_as_current_span(
            full_method,
            context=parent,
            kind=SpanKind.SERVER if server else SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield CallSpan(span)

    def parent_context(self, trace_parent: str | None) -> Context | None:
        """The remote parent a stored ``traceparent`` names, or None (none, or invalid)."""
        normalized = parse_traceparent(trace_parent)
        if normalized is None:
            return None
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        return TraceContextTextMapPropagator().extract({TRACEPARENT: normalized})

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every ended span now; True when all were exported in time."""
        return bool(self.provider.force_flush(timeout_millis))


class CallSpan:
    """One call's span (:meth:`Tracing.call_span`)."""

    def __init__(self, span: Any) -> None:
        self.span = span

    @property
    def trace_parent(self) -> str:
        """This span as a version-00 ``traceparent``, to send with the call."""
        ctx = self.span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def finish(self, code_name: str) -> None:
        """Record the call's gRPC status (``"OK"``, ``"FAILED_PRECONDITION"``…): a failed
        call's status names its code, never the server's message (as
        :func:`_status_without_message`)."""
        from opentelemetry.trace import Status, StatusCode

        if not _GRPC_CODE_NAMES:
            _GRPC_CODE_NAMES.update(_grpc_code_names())
        number = next((n for n, name in _GRPC_CODE_NAMES.items() if name == code_name), None)
        if number is not None:
            self.span.set_attribute("rpc.grpc.status_code", number)
        if code_name != "OK":
            self.span.set_status(Status(StatusCode.ERROR, code_name))


def _status_without_message(span: Any, _details: Any) -> None:
    """A failed client call's status names its gRPC code, not the server's message.

    The gRPC instrumentation copies the status details into the span; a server's
    message may quote its input (a model output, say), and nothing a body held
    belongs in a span. The reference §4 code is on the server span (``error.type``).
    """
    from opentelemetry.trace import Status, StatusCode

    if not span.is_recording() or span.status.status_code is not StatusCode.ERROR:
        return
    number = (span.attributes or {}).get("rpc.grpc.status_code")
    name = _GRPC_CODE_NAMES.get(number, "ERROR") if isinstance(number, int) else "ERROR"
    span.set_status(Status(StatusCode.ERROR, name))


def _grpc_code_names() -> dict[int, str]:
    import grpc

    return {code.value[0]: code.name for code in grpc.StatusCode}


def _grpc_filter() -> Callable[[Any], bool]:
    """True for the calls to trace: not health, not reflection, not a service named in
    ``OTEL_PYTHON_GRPC_EXCLUDED_SERVICES``."""
    from opentelemetry.instrumentation.grpc import filters

    excluded = [filters.service_prefix(p) for p in UNTRACED_GRPC_PREFIXES]
    excluded += [filters.full_method_name(m) for m in CALL_TRACED_STREAMS]
    names = os.environ.get("OTEL_PYTHON_GRPC_EXCLUDED_SERVICES", "")
    excluded += [filters.service_name(n.strip()) for n in names.split(",") if n.strip()]
    return filters.negate(filters.any_of(*excluded))


def parse_traceparent(value: str | bytes | None) -> str | None:
    """A W3C ``traceparent`` as its version-00 form, or None when it is not a valid one.

    Later versions are read by their first four fields, as W3C Trace Context asks;
    version ``ff`` and all-zero ids are invalid.

    Returns:
        ``00-<trace-id>-<parent-id>-<flags>``, :data:`TRACEPARENT_LENGTH` characters.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    match = _TRACEPARENT_RE.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def job_trace_parent(context: Any = None) -> str | None:
    """The ``traceparent`` to store with a job created by the current gRPC call (reference §9.5).

    With tracing on in this process, it names the current span (the ``CreateJob`` /
    ``RerunJob`` server span), so the attempts hang under it; otherwise the
    caller's own ``traceparent`` metadata (validated), so a job created through a
    traced gateway still joins its trace when job_service itself exports nothing.

    Args:
        context: the ``grpc.aio.ServicerContext`` of the call, or None.

    Returns:
        A version-00 ``traceparent`` (:data:`TRACEPARENT_LENGTH` characters), or None.
    """
    if _active:
        from opentelemetry import trace

        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            return (
                f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}"
                f"-{int(span_context.trace_flags):02x}"
            )
    if context is None:
        return None
    for item in context.invocation_metadata() or ():
        if item.key == TRACEPARENT:
            return parse_traceparent(item.value)
    return None


def note_error(code: str) -> None:
    """Mark the current span with a reference §4 error code (``error.type``); a no-op when off."""
    if not _active:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attribute("error.type", str(code))


def note_rpc_status(code_name: str) -> None:
    """Put a server call's final gRPC status on the current (server) span.

    ``context.abort_with_status`` bypasses the instrumentation's own status
    bookkeeping, so without this every refused call would read ``OK``.

    Args:
        code_name: the ``grpc.StatusCode`` name the call ended with (``"OK"``…).
    """
    import grpc
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    if not span.is_recording():
        return
    code = grpc.StatusCode.__members__.get(code_name)
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code_name in SERVER_ERROR_CODES:
        span.set_status(Status(StatusCode.ERROR, code_name))


__all__ = [
    "ALWAYS_REDACTED_HEADERS",
    "SERVICE_NAMES",
    "TRACEPARENT",
    "TRACEPARENT_LENGTH",
    "Tracing",
    "configured",
    "current",
    "job_trace_parent",
    "note_error",
    "note_rpc_status",
    "parse_traceparent",
    "protocol",
    "reset",
    "setup",
]
