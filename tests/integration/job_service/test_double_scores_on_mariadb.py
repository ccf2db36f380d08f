"""Scores and dwell seconds keep double precision on MariaDB, as on SQLite (migration 0007).

They were ``FLOAT`` (single precision): a model's ``masteryLevel`` 0.123456789 was
read back as 0.123457, no longer the value its ``outputHash`` covers. Skipped
without TEST_MYSQL_URL.
"""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from job_service.migrate import alembic_config

pytestmark = pytest.mark.mysql

TYPES = (
    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME IN"
    " ('mastery_level', 'severity', 'dwell_seconds') ORDER BY TABLE_NAME"
)
INSERT = (
    "INSERT INTO ai_learning_analyses (id, summary, mastery_level, strengths, risks,"
    " evidence, user_id, job_id, ordinal, content_hash, created_at)"
    " VALUES (:id, 's', :level, '[]', '[]', '[]', 'u1', 'j1', 0, :id, NOW())"
)
READ = "SELECT mastery_level FROM ai_learning_analyses WHERE id = :id"


def _widened(conn: Connection) -> set[str]:
    """The types of 0007's columns (learning_block_stats' was a DOUBLE from the start)."""
    return {r[2] for r in conn.execute(text(TYPES)) if r[0] != "learning_block_stats"}


def test_0007_widens_the_float_columns_keeping_their_values(mysql_url: str) -> None:
    cfg = alembic_config(mysql_url)
    command.upgrade(cfg, "0006")
    engine = create_engine(make_url(mysql_url).set(drivername="mysql+pymysql"))
    try:
        with engine.begin() as conn:
            assert _widened(conn) == {"float"}
            conn.execute(text(INSERT), {"id": "before", "level": 0.123456789})
            single = conn.execute(text(READ), {"id": "before"}).scalar_one()
        assert single == pytest.approx(0.123457)  # what single precision did to it
        command.upgrade(cfg, "head")
        with engine.begin() as conn:
            assert conn.execute(text(TYPES)).all() == [
                ("ai_learning_analyses", "mastery_level", "double"),
                ("ai_weak_point_candidates", "severity", "double"),
                ("learning_block_stats", "dwell_seconds", "double"),
                ("learning_events", "dwell_seconds", "double"),
            ]
            # the row keeps its single-precision value (no longer cut to 6 digits)
            kept = conn.execute(text(READ), {"id": "before"}).scalar_one()
            assert kept == pytest.approx(0.123456789, rel=1e-7) and kept != 0.123456789
            conn.execute(text(INSERT), {"id": "after", "level": 0.123456789})
            assert conn.execute(text(READ), {"id": "after"}).scalar_one() == 0.123456789
        command.downgrade(cfg, "0006")
        with engine.begin() as conn:
            assert _widened(conn) == {"float"}
    finally:
        engine.dispose()
