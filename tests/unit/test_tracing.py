"""``airuntime_common.tracing`` (reference §9.5): the standard variables decide, spans
really leave over OTLP/gRPC and OTLP/HTTP, and with export unset nothing loads.

The export tests run a service's set-up in a child process (a real
``TracerProvider`` with the batch processor, flushed at exit) against an OTLP
receiver served by the test on a free port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.trace import SpanKind

from airuntime_common import tracing
from airuntime_common.grpc_server import GrpcServer, insecure_or_tls_channel
from airuntime_common.settings import InvalidSetting
from tests.tracing_support import Capture, capture, new_traceparent
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

__all__ = ["capture"]

REPO = Path(__file__).resolve().parents[2]
OTEL_VARS = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
]

# ----------------------------------------------------------------- variables


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_export_is_on_only_when_an_otlp_endpoint_is_set(env: dict[str, str], on: bool) -> None:
    assert tracing.configured(env) is on


def test_an_exporter_we_cannot_honour_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidSetting, match="OTEL_TRACES_EXPORTER"):
        tracing.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(InvalidSetting, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            "grpc",
        ),
    ],
)
def test_protocol_follows_the_standard_variables(env: dict[str, str], expected: str) -> None:
    assert tracing.protocol(env) == expected


@pytest.mark.parametrize(
    ("value", "normalized"),
    [
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        (
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        ),
        # a later version is read by its first four fields
        (
            "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-adds",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
        ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent_is_validated_to_its_55_character_form(
    value: str | bytes | None, normalized: str | None
) -> None:
    assert tracing.parse_traceparent(value) == normalized
    if normalized is not None:
        assert len(normalized) == tracing.TRACEPARENT_LENGTH


class _Md:
    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value


class _Context:
    def __init__(self, *items: tuple[str, str]) -> None:
        self._items = [_Md(k, v) for k, v in items]

    def invocation_metadata(self) -> list[_Md]:
        return self._items


def test_a_job_stores_its_callers_traceparent_when_this_process_traces_nothing() -> None:
    tracing.reset()
    tp, _, _ = new_traceparent()
    assert tracing.job_trace_parent(_Context(("x-request-id", "r"), ("traceparent", tp))) == tp
    assert tracing.job_trace_parent(_Context(("traceparent", "garbage"))) is None
    assert tracing.job_trace_parent(_Context()) is None
    assert tracing.job_trace_parent(None) is None


def test_a_job_stores_the_current_server_span_when_this_process_traces(capture: Capture) -> None:
    traced = capture.setup("job_service")
    tp, trace_id, _ = new_traceparent()
    parent = traced.parent_context(tp)
    with traced.tracer("test").start_as_current_span("CreateJob", context=parent) as span:
        stored = tracing.job_trace_parent(_Context(("traceparent", tp)))
    assert stored == f"00-{trace_id:032x}-{span.get_span_context().span_id:016x}-01"


def test_setup_is_once_per_service_and_the_first_is_the_processs(capture: Capture) -> None:
    first = capture.setup("job_service")
    assert tracing.setup("job_service") is first
    second = capture.setup("credential_service")
    assert second is not first and tracing.current() is first
    assert first.provider.resource.attributes["service.name"] == "job_service"
    assert second.provider.resource.attributes["service.name"] == "credential_service"


# ------------------------------------------------- gRPC server and channel


class _Status(wgrpc.WorkerStatusServiceServicer):  # type: ignore[misc]
    async def GetStatus(self, request: Any, context: Any) -> Any:
        return wrr.GetStatusResponse(instance_id="w1")


async def test_a_traced_server_and_channel_make_one_client_and_one_server_span(
    capture: Capture,
) -> None:
    traced = capture.setup("runtime_worker")
    server = GrpcServer(
        token="t" * 32,
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.worker.v1.WorkerStatusService"],
        register=lambda s: wgrpc.add_WorkerStatusServiceServicer_to_server(_Status(), s),
    )
    await server.start()
    channel = insecure_or_tls_channel(f"127.0.0.1:{server.port}")
    try:
        stub = wgrpc.WorkerStatusServiceStub(channel)
        with traced.tracer("test").start_as_current_span("caller") as caller:
            await stub.GetStatus(
                wrr.GetStatusRequest(), metadata=(("x-internal-api-key", "t" * 32),)
            )
    finally:
        await channel.close()
        await server.stop(0)
    name = "/zhixi.airuntime.worker.v1.WorkerStatusService/GetStatus"
    await capture.ended(name, count=2)
    (client,) = [s for s in capture.named(name) if s.kind is SpanKind.CLIENT]
    (served,) = [s for s in capture.named(name) if s.kind is SpanKind.SERVER]
    assert client.parent is not None and client.parent.span_id == caller.get_span_context().span_id
    assert served.parent is not None and client.context is not None
    assert served.parent.span_id == client.context.span_id
    assert (served.attributes or {})["rpc.grpc.status_code"] == 0


# ------------------------------------------------------------ real export

CHILD = """
import json, sys
from airuntime_common import tracing
t = tracing.setup(sys.argv[1])
span = t.tracer("probe").start_span("probe")
span.end()
print(json.dumps({
    "resource": dict(t.provider.resource.attributes),
    "sampler": t.provider.sampler.get_description(),
}))
"""


def run_child(service: str, env: dict[str, str]) -> dict[str, Any]:
    """Run :data:`CHILD` for ``service`` with only ``env`` among the OTel variables."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update(env)
    full["PYTHONPATH"] = str(REPO)
    full["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), service],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


class _Receiver(BaseHTTPRequestHandler):
    got: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def http_collector() -> Iterator[tuple[str, list[tuple[str, dict[str, str], bytes]]]]:
    got: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []
    handler = type("Receiver", (_Receiver,), {"got": got})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.got: list[tuple[Any, dict[str, str]]] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.got.append((request, dict(context.invocation_metadata())))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[str, _TraceService]]:
    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", service
    server.stop(None)


def _resource_and_spans(request: Any) -> tuple[dict[str, str], list[str]]:
    (rs,) = request.resource_spans
    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
    names = [s.name for ss in rs.scope_spans for s in ss.spans]
    return resource, names


def test_spans_leave_over_otlp_http_with_the_standard_variables(
    http_collector: tuple[str, list[tuple[str, dict[str, str], bytes]]],
) -> None:
    endpoint, got = http_collector
    summary = run_child(
        "job_service",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=staging",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "1.0",
        },
    )
    assert summary["resource"]["service.name"] == "job_service"
    assert summary["sampler"].startswith("ParentBased{root:TraceIdRatioBased{1.0}")
    (path, headers, body) = got[0]
    assert path == "/v1/traces" and headers["x-tenant"] == "acme"
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    resource, names = _resource_and_spans(request)
    assert resource["service.name"] == "job_service"
    assert resource["deployment.environment.name"] == "staging"
    assert names == ["probe"]


def test_spans_leave_over_otlp_grpc_and_otel_service_name_wins(
    grpc_collector: tuple[str, _TraceService],
) -> None:
    endpoint, service = grpc_collector
    summary = run_child(
        "runtime_worker",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme",
            "OTEL_SERVICE_NAME": "worker-eu-1",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,service.namespace=airt",
        },
    )
    assert (
        summary["sampler"]
        == "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
    )
    (request, md) = service.got[0]
    assert md["x-tenant"] == "acme"
    resource, names = _resource_and_spans(request)
    assert resource["service.name"] == "worker-eu-1"
    assert resource["service.namespace"] == "airt"
    assert names == ["probe"]


def test_service_name_in_resource_attributes_beats_the_default(
    http_collector: tuple[str, list[tuple[str, dict[str, str], bytes]]],
) -> None:
    endpoint, _ = http_collector
    summary = run_child(
        "credential_service",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=vault",
        },
    )
    assert summary["resource"]["service.name"] == "vault"


OFF_CHILD = """
import sys
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings
from airuntime_common.grpc_server import GrpcServer, insecure_or_tls_channel
from runtime_worker.app import WorkerApp
from runtime_worker.settings import WorkerSettings

token = "t" * 32
create_app(GatewaySettings(RUNTIME_SERVICE_TOKEN=token, JWT_SECRET="s" * 32))
GrpcServer(token=token, address="127.0.0.1:0", service_names=[], register=lambda s: None)
WorkerApp(WorkerSettings(RUNTIME_SERVICE_TOKEN=token, WORKER_METRICS_PORT=0))
loaded = sorted(
    m for m in sys.modules
    if m.startswith(("opentelemetry.sdk", "opentelemetry.instrumentation", "opentelemetry.exporter"))
)
print(",".join(loaded) or "nothing")
"""


def test_with_export_unset_no_sdk_exporter_or_instrumentation_is_loaded() -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full["PYTHONPATH"] = str(REPO)
    full["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OFF_CHILD)],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "nothing"
    assert not [v for v in OTEL_VARS if v in full]
