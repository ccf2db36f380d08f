"""The snapshot's event aggregates on MariaDB read covering indexes only.

Every create builds a snapshot that sums the user's reading time per block and
quiz results per knowledge point; those reads grow with the user's history, so
they must at least come from an index holding every column they need, one event
type at a time. Skipped without TEST_MYSQL_URL.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from airuntime_common.db import make_sessionmaker
from job_service.db import make_job_engine
from job_service.domain import snapshots
from tests.unit.job_service.conftest import create_schema

pytestmark = pytest.mark.mysql

SEED = [
    "INSERT INTO materials VALUES ('m1', 'u1', 't', 'h', 2, UTC_TIMESTAMP(6))",
    "INSERT INTO material_blocks (block_id, material_id, user_id, ordinal, kind, text, char_count)"
    " SELECT CONCAT('b', seq), 'm1', 'u1', seq, 'paragraph', 'text', 4 FROM seq_0_to_1",
    "INSERT INTO knowledge_points VALUES ('k1', 'u1', 'm1', 'kp', UTC_TIMESTAMP(6))",
    "INSERT INTO knowledge_point_blocks VALUES ('k1', 'b0', 0)",
    "INSERT INTO learning_events (user_id, event_id, type, material_id, block_id,"
    " knowledge_point_id, dwell_seconds, correct, occurred_at, created_at)"
    " SELECT 'u1', CONCAT('e', seq), IF(seq % 2, 'quiz_attempt', 'reading'), 'm1',"
    " IF(seq % 2, NULL, CONCAT('b', seq % 2)), IF(seq % 2, 'k1', NULL),"
    " IF(seq % 2, NULL, 3.5), IF(seq % 2, seq % 3 = 0, NULL), UTC_TIMESTAMP(6),"
    " UTC_TIMESTAMP(6) FROM seq_1_to_2000",
    "ANALYZE TABLE learning_events",
]


async def test_the_event_aggregates_read_their_covering_index(mysql_url: str) -> None:
    await create_schema(mysql_url)
    engine = make_job_engine(mysql_url)
    try:
        async with engine.begin() as conn:
            for sql in SEED:
                await conn.execute(text(sql))
        sent: list[tuple[str, Any]] = []

        def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
            if "FROM learning_events" in statement:
                sent.append((statement, parameters))

        event.listen(engine.sync_engine, "before_cursor_execute", seen)
        async with make_sessionmaker(engine)() as session:
            payload = await snapshots.build_payload(
                session,
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="u1",
                params={},
            )
        event.remove(engine.sync_engine, "before_cursor_execute", seen)
        assert payload  # the aggregates ran
        assert len(sent) == 2, [s for s, _ in sent]
        plans = {}
        async with engine.connect() as conn:
            for sql, params in sent:
                plan = (await conn.exec_driver_sql("EXPLAIN " + sql, params)).mappings().all()
                plans[plan[0]["key"]] = plan
        assert set(plans) == {"ix_learning_events_reading", "ix_learning_events_quiz"}, plans
        for plan in plans.values():
            assert len(plan) == 1 and "Using index" in (plan[0]["Extra"] or ""), plan
            assert "Using index condition" not in plan[0]["Extra"], plan  # no row lookups
    finally:
        await engine.dispose()
