"""The snapshot's reading and quiz figures on MariaDB come from the running totals,
read by primary key: one row per block or knowledge point in scope, however long
the user's event history. Skipped without TEST_MYSQL_URL.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from airuntime_common.db import make_sessionmaker
from job_service.learning import snapshots
from job_service.store.engine import make_job_engine
from tests.unit.job_service.conftest import create_schema

pytestmark = pytest.mark.mysql

SEED = [
    "INSERT INTO materials VALUES ('m1', 'u1', 't', 'h', 2, UTC_TIMESTAMP(6))",
    "INSERT INTO material_blocks (block_id, material_id, user_id, ordinal, kind, text, char_count)"
    " SELECT CONCAT('b', seq), 'm1', 'u1', seq, 'paragraph', 'text', 4 FROM seq_0_to_1",
    "INSERT INTO knowledge_points VALUES ('k1', 'u1', 'm1', 'kp', UTC_TIMESTAMP(6))",
    "INSERT INTO knowledge_point_blocks VALUES ('k1', 'b0', 0)",
    "INSERT INTO learning_block_stats VALUES ('u1', 'm1', 'b0', 35.5, UTC_TIMESTAMP(6))",
    "INSERT INTO learning_kp_stats VALUES ('u1', 'k1', 9, 4, UTC_TIMESTAMP(6))",
    "INSERT INTO learning_block_stats SELECT CONCAT('u', seq), 'm1', 'b0', 1, UTC_TIMESTAMP(6)"
    " FROM seq_2_to_3000",
    "INSERT INTO learning_kp_stats SELECT CONCAT('u', seq), 'k1', 1, 1, UTC_TIMESTAMP(6)"
    " FROM seq_2_to_3000",
    "ANALYZE TABLE learning_block_stats, learning_kp_stats",
]


async def test_the_snapshot_reads_the_totals_by_primary_key(mysql_url: str) -> None:
    await create_schema(mysql_url)
    engine = make_job_engine(mysql_url)
    try:
        async with engine.begin() as conn:
            for sql in SEED:
                await conn.execute(text(sql))
        sent: list[tuple[str, Any]] = []

        def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
            if "learning_events" in statement or "_stats" in statement:
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
        assert (
            payload["stats"]["quizAttempts"] == 9 and payload["stats"]["totalDwellSeconds"] == 35.5
        )
        assert len(sent) == 2 and not [s for s, _ in sent if "learning_events" in s], sent
        plans = []
        async with engine.connect() as conn:
            for sql, params in sent:
                plan = (await conn.exec_driver_sql("EXPLAIN " + sql, params)).mappings().all()
                plans.append(plan)
        for plan in plans:
            assert plan[0]["key"] == "PRIMARY", plan
            assert len(plan) == 1 and int(plan[0]["rows"]) <= 2, plan
    finally:
        await engine.dispose()
