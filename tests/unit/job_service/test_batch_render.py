"""A batch statement's text from its kept rendering equals SQLAlchemy's own expansion.

:mod:`job_service.store.batch` expands each statement shape once per set of
IN-list lengths and fills in later calls' values itself; these tests hold the
text to what SQLAlchemy's per-call expansion gives, for the hot path's shapes
and for values the driver must escape. No database: MariaDB runs these
statements in ``tests/integration/job_service/test_batches_on_mariadb.py``.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Integer, String, bindparam, insert, literal_column, select, tuple_, update
from sqlalchemy.dialects.mysql import aiomysql

from job_service.lifecycle import LOCKED, RUNNING
from job_service.store import mysql_batch as batch
from job_service.store import scheduling, statements
from job_service.store.clock import DbClock
from job_service.store.statements import results
from job_service.store.tables import invocations, jobs
from job_service.store.transitions import events_from_rows

DIALECT = aiomysql.dialect()
CLOCK = DbClock("mysql")


def _claim_read_stmt(status: str) -> Any:
    """A claim's read of the rows it moved."""
    return scheduling.claimed_rows.get(CLOCK, status)


def _claim_events_stmt(status: str) -> Any:
    """A claim's event rows, read from the rows it moved."""
    return events_from_rows(
        CLOCK, from_status=LOCKED, to_status=status, at="started_at", params={"e_actor": "a"}
    ).build()


def escape(value: Any) -> str:
    """The driver's escaping, as ``aiomysql.Connection.escape`` does it for utf8mb4."""
    return str(pymysql.converters.escape_item(value, "utf8mb4"))


def both(stmt: Any, params: dict[str, Any]) -> tuple[str, str]:
    compiled = batch._compile(DIALECT, stmt, list(params))
    return (
        batch._render(compiled, params, escape),
        batch._render_expanded(compiled, params, escape),
    )


def ids(n: int, prefix: str = "j") -> list[str]:
    return [f"{prefix}{i:031x}" for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 4, 50])
def test_claim_statements_render_as_sqlalchemy_expands_them(n: int) -> None:
    params = {"ids": ids(n), "instance_id": "worker-1", "e_actor": "runtime:worker-1"}
    for stmt in (_claim_read_stmt(RUNNING), _claim_events_stmt(RUNNING)):
        kept, expanded = both(stmt, params)
        assert kept == expanded


def test_a_kept_rendering_takes_each_calls_own_values() -> None:
    stmt = _claim_read_stmt(RUNNING)
    compiled = batch._compile(DIALECT, stmt, ["ids", "instance_id"])
    first = {"ids": ids(3, "a"), "instance_id": "w-1"}
    second = {"ids": ids(3, "b"), "instance_id": "w-2"}
    batch._render(compiled, first, escape)
    assert list(compiled.renderings) == [(3,)]
    text = batch._render(compiled, second, escape)
    assert text == batch._render_expanded(compiled, second, escape)
    assert "'w-2'" in text and "'w-1'" not in text
    assert all(f"'{i}'" in text for i in second["ids"])
    assert not any(f"'{i}'" in text for i in first["ids"])


def test_rows_with_json_times_decimals_and_nulls_render_alike() -> None:
    result_row = {
        "result_id": "r1",
        "idempotency_key": "j1:1:abc",
        "job_id": "j1",
        "attempt_no": 1,
        "output_hash": "abc",
        "prompt_version": None,
        "output_schema_version": "v1",
        "output": {"summary": 'it\'s \\ "quoted" — 中文', "items": [1, 2.5, None, True]},
    }
    call_row = {
        "id": "c1",
        "job_id": "j1",
        "job_type": "quiz_generation",
        "attempt_no": 2,
        "model_provider": "deepseek",
        "model_name": "deepseek-chat",
        "api_key_mode": "platform_key",
        "credential_id": None,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "cache_hit_tokens": 0,
        "latency_ms": 31,
        "outcome": "ok",
        "error_code": None,
        "provider_request_id": "req-1",
        "cost_usd": Decimal("0.000123"),
    }
    succeed = (
        update(jobs)
        .where(jobs.c.job_id == bindparam("u_job_id", type_=String()), jobs.c.status == RUNNING)
        .values(
            status="succeeded",
            finished_at=bindparam("u_finished_at"),
            lock_until=None,
            error_message=bindparam("u_message", type_=String()),
        )
    )
    cases: list[tuple[Any, dict[str, Any]]] = [
        (insert(results), result_row),
        (insert(invocations), call_row),
        (
            succeed,
            {
                "u_job_id": "j1",
                "u_finished_at": datetime(2026, 12, 1, 4, 5, 6, 789),
                "u_message": "line\nbreak; DROP TABLE x; --",
            },
        ),
    ]
    for stmt, params in cases:
        kept, expanded = both(stmt, params)
        assert kept == expanded


def test_shapes_whose_text_depends_on_values_are_expanded_per_call() -> None:
    literal = select(jobs.c.job_id).limit(bindparam("n", type_=Integer(), literal_execute=True))
    compiled = batch._compile(DIALECT, literal, ["n"])
    assert compiled.expanding is None
    assert batch._render(compiled, {"n": 7}, escape).rstrip().endswith("7")
    assert compiled.renderings == {}

    pairs = select(jobs.c.job_id).where(
        tuple_(jobs.c.job_id, jobs.c.attempt_no).in_(bindparam("pairs", expanding=True))
    )
    params = {"pairs": [("j1", 1), ("j2", 2)]}
    compiled = batch._compile(DIALECT, pairs, ["pairs"])
    kept, expanded = both(pairs, params)
    assert kept == expanded
    assert compiled.renderings == {}


def test_renderings_kept_per_shape_are_bounded() -> None:
    stmt = select(jobs.c.job_id).where(jobs.c.job_id.in_(bindparam("ids", expanding=True)))
    compiled = batch._compile(DIALECT, stmt, ["ids"])
    for n in range(batch.MAX_RENDERINGS + 5):
        batch._render(compiled, {"ids": ids(n)}, escape)
    assert len(compiled.renderings) == batch.MAX_RENDERINGS
    beyond = {"ids": ids(batch.MAX_RENDERINGS + 3)}
    assert batch._render(compiled, beyond, escape) == batch._render_expanded(
        compiled, beyond, escape
    )


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.text(max_size=12), max_size=8),
    instance=st.text(max_size=20),
    constant=st.sampled_from(["pending", "it's", "a\\b"]),
)
def test_any_values_render_as_sqlalchemy_expands_them(
    values: list[str], instance: str, constant: str
) -> None:
    stmt = select(jobs.c.job_id, literal_column("1").label("one")).where(
        jobs.c.job_id.in_(bindparam("ids", expanding=True)),
        jobs.c.locked_by == bindparam("instance_id", type_=String()),
        jobs.c.status == constant,
    )
    params = {"ids": values, "instance_id": instance}
    compiled = batch._compile(DIALECT, stmt, list(params))
    # twice: the first call keeps the rendering, the second uses it
    for _ in range(2):
        assert batch._render(compiled, params, escape) == batch._render_expanded(
            compiled, params, escape
        )


def test_an_in_list_built_into_the_shape_is_kept_with_its_values() -> None:
    stmt = (
        update(jobs)
        .where(
            jobs.c.job_id == bindparam("u_job_id", type_=String()),
            jobs.c.status.in_(["locked", "running"]),
            jobs.c.job_type.in_(bindparam("types", expanding=True)),
        )
        .values(lock_until=None)
    )
    compiled = batch._compile(DIALECT, stmt, ["u_job_id", "types"])
    assert compiled.expanding == ("types",)
    for types in (["quiz_generation"], ["a", "b"], ["c"]):
        params = {"u_job_id": "j1", "types": types}
        kept = batch._render(compiled, params, escape)
        assert kept == batch._render_expanded(compiled, params, escape)
        assert "'locked', 'running'" in kept
    assert set(compiled.renderings) == {(1,), (2,)}


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=6),
    st.datetimes(),
    st.text(),
)


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_both_mysql_drivers_escape_a_value_alike(value: Any) -> None:
    """A batch escapes values with its connection's driver (asyncmy or aiomysql);
    both spell every bound value the same (utf8mb4, backslash escapes on)."""
    import asyncmy.converters

    assert asyncmy.converters.escape_item(value, "utf8mb4") == escape(value)


@pytest.mark.parametrize(
    ("text", "mergeable"),
    [
        ("INSERT INTO t (a, b, c) VALUES (%s, %s, UTC_TIMESTAMP(6))", True),
        ("INSERT IGNORE INTO t (a) VALUES (%s)", True),
        ("INSERT INTO t (a) VALUES (%s) ON DUPLICATE KEY UPDATE a = VALUES(a)", False),
        ("INSERT INTO t (a) VALUES (%s), (%s)", False),
        ("INSERT INTO t (a) VALUES (%s, ')')", False),
        ("INSERT INTO t (a) SELECT a FROM u WHERE ROW_COUNT() = 1", False),
        ("UPDATE t SET a = %s", False),
    ],
)
def test_only_a_plain_single_row_insert_can_take_other_rows(text: str, mergeable: bool) -> None:
    assert (batch._values_at(text) > 0) is mergeable


def test_merged_inserts_render_as_one_statement_with_each_rows_values() -> None:
    stmt = statements.insert_result.get(CLOCK)
    rows = [
        {
            "result_id": f"r{i}",
            "idempotency_key": f"j{i}:1:h",
            "job_id": f"j{i}",
            "attempt_no": 1,
            "output_hash": "h",
            "prompt_version": None,
            "output_schema_version": "v1",
            "output": {"summary": f"it's row {i}"},
        }
        for i in range(3)
    ]
    compiled = batch._compile(DIALECT, stmt, list(rows[0]))
    assert batch._merging(compiled, rows[0])
    one = batch._render(compiled, rows[0], escape)
    text = batch._render_rows(compiled, rows, escape)
    head, _, first = one.partition(" VALUES ")
    assert text.startswith(head + " VALUES " + first + ", (")
    assert text.count("UTC_TIMESTAMP(6)") == 3
    for i in range(3):
        assert f"'r{i}'" in text and "it\\'s row " + str(i) in text
