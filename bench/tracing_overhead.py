"""What tracing costs a unary gRPC call through the shared server and channel (reference §9.5).

``python -m bench.tracing_overhead [--calls N] [--rounds R] [--mode off|on]`` serves
``WorkerStatusService.GetStatus`` on a :class:`~airuntime_common.grpc_server.GrpcServer`
(auth interceptor, metrics, health) and calls it ``N`` times a round through
:func:`~airuntime_common.grpc_server.insecure_or_tls_channel`, one call at a time,
printing one JSON line: the median and best wall µs per call over the rounds, and
the median CPU µs per call of the process (client and server both run in it; on a
shared machine the CPU figure is the steadier one).

``off`` imports :mod:`airuntime_common.tracing` and leaves it unconfigured (what a
service runs with ``OTEL_EXPORTER_OTLP_ENDPOINT`` unset); ``on`` sets tracing up
with a batch processor in front of an exporter that drops every span, so the
figure is the instrumentation's own cost. Run ``off`` against a checkout without
the tracing module (``PYTHONPATH=<checkout>``) for the baseline: with tracing off
the two must not differ beyond noise.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import airuntime_common
from airuntime_common import metadata
from airuntime_common.grpc_server import GrpcServer, insecure_or_tls_channel
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

TOKEN = "bench-token-0123456789abcdef"


class _Status(wgrpc.WorkerStatusServiceServicer):  # type: ignore[misc]
    async def GetStatus(self, request: Any, context: Any) -> Any:
        return wrr.GetStatusResponse(instance_id="bench")


def _tracing_on() -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from airuntime_common import tracing

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracing.setup("runtime_worker", span_processor=BatchSpanProcessor(Drop()))


async def measure(calls: int, rounds: int) -> tuple[list[float], list[float]]:
    """(wall µs, CPU µs) per call of each round (after one warm-up round)."""
    server = GrpcServer(
        token=TOKEN,
        address="127.0.0.1:0",
        service_names=["zhixi.airuntime.worker.v1.WorkerStatusService"],
        register=lambda s: wgrpc.add_WorkerStatusServiceServicer_to_server(_Status(), s),
    )
    await server.start()
    channel = insecure_or_tls_channel(f"127.0.0.1:{server.port}")
    stub = wgrpc.WorkerStatusServiceStub(channel)
    md = metadata.outgoing(TOKEN, "bench-worker")
    request = wrr.GetStatusRequest()
    wall: list[float] = []
    cpu: list[float] = []
    try:
        for n in range(rounds + 1):
            began, began_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                await stub.GetStatus(request, metadata=md, timeout=5)
            if n:  # the first round warms up
                wall.append((time.perf_counter() - began) / calls * 1e6)
                cpu.append((time.process_time() - began_cpu) / calls * 1e6)
    finally:
        await channel.close()
        await server.stop(0)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, measure, print one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_overhead")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    parser.add_argument("--mode", choices=("off", "on"), default="off")
    args = parser.parse_args(argv)
    # next to the package imported (an editable install could serve a newer one)
    has_module = (Path(airuntime_common.__file__).parent / "tracing.py").exists()
    if has_module:
        importlib.import_module("airuntime_common.tracing")  # imported, not configured
    if args.mode == "on":
        _tracing_on()
    rounds, cpu = asyncio.run(measure(args.calls, args.rounds))
    print(
        json.dumps(
            {
                "mode": args.mode,
                "tracingModule": has_module,
                "calls": args.calls,
                "rounds": [round(r, 1) for r in rounds],
                "medianUsPerCall": round(statistics.median(rounds), 1),
                "bestUsPerCall": round(min(rounds), 1),
                "medianCpuUsPerCall": round(statistics.median(cpu), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
