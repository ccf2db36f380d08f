"""Optional Prometheus metrics (``WORKER_METRICS_PORT``, 0 = off).

Exposes the worker's live numbers through a custom collector, so nothing is
double-booked: ``airt_worker_in_flight``, ``airt_worker_draining`` and
``airt_worker_attempts_total{outcome}`` (same keys as GetStatus counters); plus
the model-call histogram ``airt_model_call_latency_seconds``, the token
counter ``airt_model_tokens_total`` and ``airt_worker_rpc_seconds{rpc,code}``, the
wall time of each internal gRPC call (each try of a retried one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from runtime_worker.worker import Worker


#: Model calls of this process (registered in the registry :func:`serve` creates).
MODEL_LATENCY = Histogram(
    "airt_model_call_latency_seconds",
    "Wall time of one model call, by model, key mode and outcome",
    ["model_name", "api_key_mode", "outcome"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
    registry=None,
)
#: This worker's calls to job_service and credential_service, retries included.
RPC_SECONDS = Histogram(
    "airt_worker_rpc_seconds",
    "Wall time of one internal gRPC call made by the worker, by method and reference §4 code",
    ["rpc", "code"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 25),
    registry=None,
)
MODEL_TOKENS = Counter(
    "airt_model_tokens",
    "Tokens of model calls by model and kind (prompt, completion, cache_hit)",
    ["model_name", "kind"],
    registry=None,
)


def observe_model_call(
    model_name: str,
    api_key_mode: str,
    outcome: str,
    latency_ms: int,
    prompt_tokens: int,
    completion_tokens: int,
    cache_hit_tokens: int,
) -> None:
    """Record one model call (latency in ms, token counts) in the model metrics."""
    MODEL_LATENCY.labels(model_name, api_key_mode, outcome).observe(max(0, latency_ms) / 1000.0)
    for kind, count in (
        ("prompt", prompt_tokens),
        ("completion", completion_tokens),
        ("cache_hit", cache_hit_tokens),
    ):
        MODEL_TOKENS.labels(model_name, kind).inc(max(0, count))


class WorkerCollector(Collector):
    """Reads a :class:`Worker`'s state at scrape time."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        """Yield the gauges and the outcome counter."""
        yield GaugeMetricFamily(
            "airt_worker_in_flight", "Jobs in flight", value=len(self.worker.runs)
        )
        yield GaugeMetricFamily(
            "airt_worker_draining", "1 while draining", value=int(self.worker.draining)
        )
        counter = CounterMetricFamily(
            "airt_worker_attempts", "Ended attempts by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(self.worker.counters.items()):
            counter.add_metric([outcome], count)
        yield counter


def serve(port: int, worker: Worker) -> CollectorRegistry:
    """Serve ``/metrics`` on ``port`` in a background thread.

    Raises:
        OSError: the port is taken.
    """
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    registry.register(MODEL_LATENCY)
    registry.register(MODEL_TOKENS)
    registry.register(RPC_SECONDS)
    start_http_server(port, registry=registry)
    return registry
