"""Optional Prometheus metrics (``WORKER_METRICS_PORT``, 0 = off).

Exposes the worker's live numbers through a custom collector, so nothing is
double-booked: ``airt_worker_in_flight``, ``airt_worker_draining`` and
``airt_worker_attempts_total{outcome}`` (same keys as GetStatus counters).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from runtime_worker.worker import Worker


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
    start_http_server(port, registry=registry)
    return registry
