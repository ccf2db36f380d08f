"""The ``batches`` bench scenario (reference §10.3): its table rows, and a tiny real run."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.harness import mysql_base_url
from bench.report import table
from bench.scenarios import SCENARIOS, Params


def test_the_table_shows_the_create_time_and_the_wrong_counts() -> None:
    doc = {
        "results": {
            "batches": {
                "params": {"children": 200, "batches": 50, "pairs": 10000},
                "create_batch_200": {"p50_ms": 300.0, "p95_ms": 1200.0},
                "two_at_once": {
                    "pairs": 10000,
                    "lanes": 8,
                    "replicas": 2,
                    "count_mismatches": 0,
                    "final_mismatches": 1,
                    "pair_end_ms": {"p50_ms": 9.0, "p99_ms": 30.0},
                },
            }
        }
    }
    text = table(doc)
    assert "create a batch of 200 p50/p95" in text and "p95<1000 MISSED" in text
    assert "counts wrong" in text and "=0 MISSED" in text


@pytest.mark.e2e
def test_batches_tiny_run(mysql_url: str) -> None:
    # mysql_url proves MariaDB is configured; the scenario makes its own database.
    assert os.environ.get("TEST_MYSQL_URL")
    out = asyncio.run(SCENARIOS["batches"](Params(base_url=mysql_base_url(), batch_pairs=120)))
    assert out["params"]["batches"] == 2
    assert out["create_batch_200"]["n"] == 2
    race = out["two_at_once"]
    assert race["pairs"] == 120 and race["results_refused"] == 0
    assert out["counts_always_equal"], race
    # the first batch's 100 pairs, then 20 of the second's
    assert race["parents_by_status"] == {"succeeded": 1, "running": 1}
