"""The metrics the services define, and the metric names and labels a PromQL query reads.

:func:`defined_metrics` asks the code, not a list: it imports the services' metric
modules and reads the registries each process serves (job_service and
credential_service serve the default registry, a worker the one
:func:`runtime_worker.metrics.serve` builds, the gateway its ``GatewayMetrics``),
then expands each family into the series names Prometheus stores
(``x_total``, ``x_bucket``, …).

:data:`AWAITED` are the metrics the alert rules and the dashboard read that
job_service does not export yet; ``tests/deploy/test_prometheus_rules.py`` holds a
test, skipped until then, that they exist with these types and labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import promql_parser
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase


@dataclass(frozen=True)
class Series:
    """One stored series name: the family it belongs to, the family's type, its labels."""

    family: str
    type: str
    labels: frozenset[str]


@dataclass(frozen=True)
class Awaited:
    """A metric job_service is asked to export (see the module docstring)."""

    type: str
    labels: frozenset[str]
    meaning: str


#: Metrics asked of job_service: name → type, labels, meaning.
AWAITED: dict[str, Awaited] = {
    "airt_jobs_oldest_pending_age_seconds": Awaited(
        "gauge",
        frozenset({"job_type"}),
        "Seconds (database clock) since availableAt of the oldest pending job of that type "
        "that is pollable now (availableAt <= now); 0 when there is none. Refreshed with "
        "the other gauges every METRICS_REFRESH_SECONDS; every replica reports the same "
        "value; one series per job type, always present.",
    ),
    "airt_platform_spend_usd": Awaited(
        "gauge",
        frozenset(),
        "Today's (UTC, database clock) platform-key spend in USD: the running total of "
        "ai_runtime_platform_spend that create admission compares with the budget.",
    ),
    "airt_platform_budget_usd": Awaited(
        "gauge",
        frozenset(),
        "PLATFORM_DAILY_BUDGET_USD as configured (USD per UTC day); 0 refuses every "
        "platform-key job.",
    ),
    "airt_runtime_workers_live": Awaited(
        "gauge",
        frozenset(),
        "Runtime instances the worker registry counts alive (seen within "
        "worker_alive_seconds: the rule GetRuntimeHealth's SERVING uses).",
    ),
    "airt_model_cost_usd": Awaited(
        "counter",
        frozenset({"model_provider", "model_name", "api_key_mode"}),
        "USD cost of logged model calls (MODEL_PRICES, as written to the invocation log), "
        "counted once the transaction logging them commits; exported as "
        "airt_model_cost_usd_total.",
    ),
}

#: Labels asked of job_service on metrics it already exports: the breaker per provider
#: (reference §9.4; a breaker with one provider may keep exporting no ``provider`` label).
AWAITED_LABELS: dict[str, frozenset[str]] = {
    "airt_platform_breaker_state": frozenset({"provider"}),
}

#: Series Prometheus itself writes (no service defines them).
PROMETHEUS_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds"})

#: Labels a scrape adds to every series (the target's).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "app", "container", "service"})

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
}


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, frozenset[str]]]:
    """``{family: (type, label names)}`` of everything ``registry`` serves."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in registry.collect():
        labels = {name for s in family.samples for name in s.labels} - {"le", "quantile"}
        out[family.name] = (family.type, frozenset(labels))
    # A labelled metric with no child yet has no samples: read its label names.
    for collector in list(registry._collector_to_names):  # private, stable for years
        if isinstance(collector, MetricWrapperBase):
            kind = out[collector._name][0] if collector._name in out else str(collector._type)
            out[collector._name] = (kind, frozenset(collector._labelnames))
    return out


def _registries() -> Iterator[CollectorRegistry]:
    import prometheus_client

    import credential_service.app  # noqa: F401  (registers its metrics and the gRPC ones)
    import job_service.app  # noqa: F401
    import runtime_worker.metrics as worker_metrics
    from api_gateway.middleware import GatewayMetrics

    yield prometheus_client.REGISTRY
    yield GatewayMetrics().registry
    # The registry a worker serves, built by the worker's own code (without the server;
    # serve() registers the module's collectors in a fresh registry on each call).
    worker = SimpleNamespace(runs={}, draining=False, counters={"succeeded": 1})
    with mock.patch.object(worker_metrics, "start_http_server"):
        registry = worker_metrics.serve(0, cast(Any, worker))
    yield registry


def defined_metrics() -> dict[str, Series]:
    """Every series name the services export, mapped to its family, type and labels."""
    out: dict[str, Series] = {}
    for registry in _registries():
        for family, (kind, labels) in _families(registry).items():
            for suffix in _SUFFIXES[kind]:
                extra = {"le"} if suffix == "_bucket" else set()
                out[family + suffix] = Series(family, kind, labels | extra)
    return out


def awaited_series() -> dict[str, Series]:
    """The series of :data:`AWAITED`, as :func:`defined_metrics` would list them."""
    out = {}
    for family, spec in AWAITED.items():
        for suffix in _SUFFIXES[spec.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            out[family + suffix] = Series(family, spec.type, spec.labels | extra)
    return out


#: Grafana's interval variables, replaced by a duration before parsing.
_GRAFANA_INTERVALS = re.compile(
    r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}"
)


def parse(expr: str) -> promql_parser.Expr:
    """Parse PromQL, after replacing Grafana's ``$__rate_interval``-style variables.

    Raises:
        ValueError: not PromQL.
    """
    return promql_parser.parse(_GRAFANA_INTERVALS.sub("5m", expr))


@dataclass(frozen=True)
class Selector:
    """A vector selector of a query: metric name and the label names it matches on."""

    name: str
    matchers: frozenset[str]
    in_rate: bool


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of ``expr``, each with whether a ``rate``-like function reads it.

    Raises:
        ValueError: not PromQL, or a selector without a metric name.
    """
    found: list[Selector] = []

    def visit(node: Any, in_rate: bool) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name: m.value for m in node.matchers.matchers}
            name = node.name or labels.get("__name__")
            if not name:
                raise ValueError(f"selector without a metric name in {expr!r}")
            found.append(Selector(name, frozenset(labels) - {"__name__"}, in_rate))
            return
        if isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector, in_rate)
            return
        if isinstance(node, promql_parser.Call):
            rate_like = node.func.name in _RATE_FUNCTIONS
            for arg in node.args:
                visit(arg, in_rate or rate_like)
            return
        for child in _children(node):
            visit(child, in_rate)

    visit(parse(expr), False)
    return found


_RATE_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})


def _children(node: Any) -> list[Any]:
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr):
        return [node.expr]
    if isinstance(node, promql_parser.SubqueryExpr):
        return [node.expr]
    return []


def quantiles_keep_le(expr: str) -> list[str]:
    """Problems of the ``histogram_quantile`` calls of ``expr``: an aggregation inside
    one that drops ``le`` makes it answer NaN."""
    problems: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.Call):
            if node.func.name == "histogram_quantile":
                inner = node.args[1]
                if isinstance(inner, promql_parser.AggregateExpr):
                    mod = inner.modifier
                    if mod is None:
                        keeps = False
                    elif mod.type == promql_parser.AggModifierType.By:
                        keeps = "le" in mod.labels
                    else:
                        keeps = "le" not in mod.labels
                    if not keeps:
                        problems.append(
                            f"histogram_quantile over an aggregation without le: {expr}"
                        )
            for arg in node.args:
                visit(arg)
            return
        for child in _children(node):
            visit(child)

    visit(parse(expr))
    return problems


def check_queries(
    exprs: dict[str, str], known: dict[str, Series], *, queries: bool = True
) -> list[str]:
    """What is wrong with ``{where: expr}`` against the series in ``known``: an unknown
    metric, a matcher on a label the metric does not have and, for ``queries`` (not
    bare series names), ``rate`` over a gauge, a counter read without ``rate`` or
    ``increase``, ``histogram_quantile`` without ``le``.

    Raises:
        ValueError: an expression is not PromQL.
    """
    problems = []
    for where, expr in exprs.items():
        if queries:
            problems += [f"{where}: {p}" for p in quantiles_keep_le(expr)]
        for sel in selectors(expr):
            if sel.name in PROMETHEUS_SERIES:
                continue
            series = known.get(sel.name)
            if series is None:
                problems.append(f"{where}: {sel.name} is not a metric the services define")
                continue
            allowed = series.labels | TARGET_LABELS | AWAITED_LABELS.get(series.family, frozenset())
            for label in sorted(sel.matchers - allowed):
                problems.append(f"{where}: {sel.name} has no label {label!r}")
            counter_like = series.type in ("counter", "histogram", "summary") and (
                sel.name != series.family or series.type == "counter"
            )
            if not queries:
                continue
            if sel.in_rate and not counter_like:
                problems.append(f"{where}: rate/increase over {sel.name}, a {series.type}")
            if not sel.in_rate and series.type == "counter":
                problems.append(f"{where}: {sel.name} is a counter read without rate/increase")
    return problems
