"""The Prometheus alert rules (``deploy/prometheus/alerts.yml``, reference §9.5): a plain rule
file that ``promtool check rules`` accepts, whose unit tests (``alerts.test.yml``,
``promtool test rules``) show each alert firing when it should and silent when it
should not, and whose expressions read metrics the services define (or that
job_service is asked for: ``promql.AWAITED``).

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it). Without
it these tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import promql

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail("promtool is missing: .ci/run installs it (apt-get install prometheus)")
    pytest.skip("promtool not installed (apt-get install prometheus); CI fails here instead")


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert list(doc) == ["groups"]
    return [rule for group in doc["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def rule_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return tests


def run(promtool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rule_file(promtool: str) -> None:
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_rule_unit_tests_pass(promtool: str) -> None:
    proc = run(promtool, "test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_silent(
    rules: list[dict[str, Any]], rule_tests: list[dict[str, Any]]
) -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for group in rule_tests:
        for case in group["alert_rule_test"]:
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {r["alert"] for r in rules}
    assert names - fired == set(), "alerts no test shows firing"
    assert names - silent == set(), "alerts no test shows silent"


@pytest.mark.parametrize("mutation", ["vector(1) < 0", "vector(1)"])
def test_the_unit_tests_catch_an_alert_that_never_or_always_fires(
    promtool: str, rules: list[dict[str, Any]], tmp_path: Path, mutation: str
) -> None:
    """Replacing every expression by one that never (always) fires fails a test of
    every alert: none passes its unit tests whatever its expression."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = mutation
    (tmp_path / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    proc = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    failed = set(re.findall(r"alertname: (\w+),", proc.stdout + proc.stderr))
    assert {r["alert"] for r in rules} - failed == set()


def test_every_rule_has_a_duration_a_severity_and_annotations(
    rules: list[dict[str, Any]],
) -> None:
    names = [r["alert"] for r in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert re.fullmatch(r"AiRuntime[A-Z]\w+", rule["alert"])
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"]) > 40, rule["alert"]


def test_the_alerts_spec_9_5_asks_for_are_there(rules: list[dict[str, Any]]) -> None:
    """Breaker open, failure rate, no live workers, lease expiries, queue age, budget."""
    reads = {
        r["alert"]: {s.name for s in promql.selectors(r["expr"])} for r in rules if "alert" in r
    }
    for metric in (
        "airt_platform_breaker_state",
        "airt_jobs_finished_total",
        "airt_runtime_workers_live",
        "airt_reaper_expired_total",
        "airt_jobs_oldest_pending_age_seconds",
        "airt_platform_spend_usd",
    ):
        assert any(metric in names for names in reads.values()), metric


def test_rules_and_their_test_series_read_metrics_the_services_define(
    rules: list[dict[str, Any]],
    rule_tests: list[dict[str, Any]],
    known_metrics: dict[str, promql.Series],
) -> None:
    known = known_metrics
    assert promql.check_queries({r["alert"]: r["expr"] for r in rules}, known) == []
    series = {
        f"test {i} series {j}": s["series"]
        for i, group in enumerate(rule_tests)
        for j, s in enumerate(group["input_series"])
    }
    assert promql.check_queries(series, known, queries=False) == []


@pytest.mark.parametrize("family", sorted(promql.AWAITED))
def test_job_service_exports_the_metrics_the_rules_await(family: str) -> None:
    spec = promql.AWAITED[family]
    defined = {s.family: s for s in promql.defined_metrics().values()}
    assert family in defined
    assert (defined[family].type, defined[family].labels) == (spec.type, spec.labels)


def test_job_service_labels_the_breaker_by_provider() -> None:
    defined = promql.defined_metrics()
    for family, labels in promql.AWAITED_LABELS.items():
        assert labels <= defined[family].labels
