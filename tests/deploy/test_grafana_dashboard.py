"""The Grafana dashboard (``deploy/grafana/ai-runtime.json``, reference §9.5) is an importable
dashboard model on a Prometheus data-source variable, and every query it makes reads
metrics and labels the services define (parsed from the PromQL, checked against the
services' own registries: see ``tests/deploy/promql.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import promql

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "ai-runtime.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "table", "state-timeline", "bargauge"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels") or [])
    return out


def queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """``{"panel title / refId": expr}`` of every panel query."""
    return {
        f"{p['title']} / {t['refId']}": t["expr"]
        for p in panels(dashboard)
        for t in p.get("targets") or []
    }


def test_it_is_a_dashboard_model_on_a_prometheus_datasource_variable(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["id"] is None  # import assigns one
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and isinstance(dashboard["panels"], list)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]


def test_every_panel_and_query_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel["type"] in PANEL_TYPES, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_panels_have_unique_ids_and_titles_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    all_panels = panels(dashboard)
    ids = [p["id"] for p in all_panels]
    assert len(set(ids)) == len(ids)
    titles = [p["title"] for p in all_panels if p["type"] != "row"]
    assert len(set(titles)) == len(titles), sorted(t for t in titles if titles.count(t) > 1)
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_query_reads_metrics_and_labels_the_services_define(
    dashboard: dict[str, Any], known_metrics: dict[str, promql.Series]
) -> None:
    assert promql.check_queries(queries(dashboard), known_metrics) == []


def test_template_variables_read_a_defined_label(
    dashboard: dict[str, Any], known_metrics: dict[str, promql.Series]
) -> None:
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
        assert match, var["definition"]
        metric, label = match.groups()
        assert label in known_metrics[metric].labels, var["definition"]
        assert var["query"]["query"] == var["definition"]


def test_the_panels_spec_9_5_asks_for_are_there(dashboard: dict[str, Any]) -> None:
    """Jobs by state and outcome, lease expiries, model calls and latency, cost, the
    breakers, pickup latency, the gateway's request rate by status and latency."""
    read: dict[str, set[str]] = {}
    for where, expr in queries(dashboard).items():
        for sel in promql.selectors(expr):
            read.setdefault(sel.name, set()).add(where.split(" / ")[0])
    for metric in (
        "airt_jobs_queue_depth",
        "airt_jobs_finished_total",
        "airt_reaper_expired_total",
        "airt_model_call_latency_seconds_count",
        "airt_model_call_latency_seconds_bucket",
        "airt_model_cost_usd_total",
        "airt_platform_breaker_state",
        "airt_job_pickup_latency_seconds_bucket",
        "gateway_http_requests_total",
        "gateway_http_request_duration_seconds_bucket",
    ):
        assert metric in read, metric
    by_status = [e for e in queries(dashboard).values() if "gateway_http_requests_total" in e]
    assert any(re.search(r"by \([^)]*\bstatus\b", e) for e in by_status)


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(airt_jobs_finishd_total[5m]))", "not a metric the services define"),
        ('sum(rate(airt_jobs_finished_total{status="failed"}[5m]))', "has no label 'status'"),
        ("rate(airt_jobs_queue_depth[5m])", "a gauge"),
        ("airt_jobs_finished_total > 0", "without rate"),
        (
            "histogram_quantile(0.9, sum(rate(airt_job_pickup_latency_seconds_bucket[5m])))",
            "without le",
        ),
        (
            "histogram_quantile(0.9, sum by (job_type) "
            "(rate(airt_job_pickup_latency_seconds_bucket[5m])))",
            "without le",
        ),
    ],
)
def test_the_query_check_refuses_what_would_draw_nothing(
    expr: str, problem: str, known_metrics: dict[str, promql.Series]
) -> None:
    problems = promql.check_queries({"q": expr}, known_metrics)
    assert len(problems) == 1 and problem in problems[0], problems


def test_the_query_check_accepts_grafana_variables(known_metrics: dict[str, promql.Series]) -> None:
    expr = 'sum by (le) (rate(airt_job_pickup_latency_seconds_bucket{job_type=~"$job_type"}[$__rate_interval]))'
    assert promql.check_queries({"q": f"histogram_quantile(0.5, {expr})"}, known_metrics) == []
