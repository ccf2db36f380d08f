"""The ``waiting`` bench scenario (reference §9.1): a tiny real run and its table rows."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.harness import mysql_base_url
from bench.report import table
from bench.scenarios import SCENARIOS, Params


def test_the_table_shows_delivery_and_the_streams_cost() -> None:
    ms = {"p50_ms": 60.0, "p99_ms": 300.0}
    load = {"latency": {"p50_ms": 5.0, "p99_ms": 9.0}, "gateway_cpu_ms_per_request": 2.0}
    doc = {
        "results": {
            "waiting": {
                "commits": 10,
                "delivery": ms,
                "streams": 1000,
                "users": 200,
                "create_without_streams": load,
                "create_with_streams": load,
                "gateway_rss_mb": {"before_streams": 80.0, "streams_open_after_load": 140.0},
            }
        }
    }
    text = table(doc)
    assert "commit → event p50/p99" in text and "p99≤250 MISSED" in text
    assert "80.0/140.0" in text


@pytest.mark.e2e
def test_waiting_tiny_run(mysql_url: str) -> None:
    # mysql_url proves MariaDB is configured; the scenario makes its own database.
    assert os.environ.get("TEST_MYSQL_URL")
    p = Params(
        base_url=mysql_base_url(),
        wait_changes=5,
        wait_streams=20,
        gateway_requests=20,
        gateway_concurrency=4,
    )
    out = asyncio.run(SCENARIOS["waiting"](p))
    assert out["commits"] == 10 and out["delivered"] == 10
    assert out["delivery"]["p99_ms"] < 1000
    assert out["stream_statuses"] == {"200": 20}
    assert out["create_with_streams"]["status_counts"] == {"201": 20}
    assert out["gateway_rss_mb"]["streams_open"] > 0
