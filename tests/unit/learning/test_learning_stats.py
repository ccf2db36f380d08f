"""The running totals event ingestion keeps (``learning_block_stats``,
``learning_kp_stats``) and the snapshot reads: they always equal the aggregates of
the stored events, duplicates and racing batches included; the snapshot no longer
reads the event history.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from sqlalchemy import case, event, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from airuntime_common.db import retry_transient
from job_service import learning
from job_service.learning import snapshots
from job_service.learning.tables import (
    LearningBlockStat,
    LearningEvent,
    LearningKnowledgePointStat,
)

from .conftest import Tx


async def _kps(tx: Tx, material: learning.MaterialView) -> list[str]:
    ids = [b.block_id for b in material.blocks]
    made = [
        await tx(
            learning.create_knowledge_point, "u1", material.material_id, f"kp{i}", ids[i : i + 2]
        )
        for i in range(3)
    ]
    return [k.knowledge_point_id for k in made]


def _events(
    prefix: str, blocks: list[str], kps: list[str], n: int, seed: int
) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        at = f"2026-11-{1 + rnd.randrange(28):02d}T{rnd.randrange(24):02d}:00:00Z"
        if rnd.random() < 0.5:
            out.append(
                {
                    "eventId": f"{prefix}{rnd.randrange(n)}",  # repeats: duplicates
                    "type": "reading",
                    "blockId": rnd.choice(blocks),
                    "dwellSeconds": rnd.choice([0.5, 1.25, 12.5, 30.0]),
                    "occurredAt": at,
                }
            )
        else:
            out.append(
                {
                    "eventId": f"{prefix}{rnd.randrange(n)}",
                    "type": "quiz_attempt",
                    "knowledgePointId": rnd.choice(kps),
                    "correct": rnd.random() < 0.6,
                    "occurredAt": at,
                }
            )
    return out


async def _totals_agree(sessions: async_sessionmaker[AsyncSession]) -> None:
    ev = LearningEvent
    async with sessions() as s:
        reading = {
            (r[0], r[1]): (round(float(r[2]), 6), r[3])
            for r in await s.execute(
                select(
                    ev.material_id,
                    ev.block_id,
                    func.sum(ev.dwell_seconds),
                    func.max(ev.occurred_at),
                )
                .where(ev.user_id == "u1", ev.type == "reading", ev.block_id.is_not(None))
                .group_by(ev.material_id, ev.block_id)
            )
        }
        kept = {
            (r.material_id, r.block_id): (round(r.dwell_seconds, 6), r.last_read_at)
            for r in (await s.execute(select(LearningBlockStat))).scalars()
        }
        quiz = {
            r[0]: (int(r[1]), int(r[2]), r[3])
            for r in await s.execute(
                select(
                    ev.knowledge_point_id,
                    func.count(),
                    func.sum(case((ev.correct.is_(True), 1), else_=0)),
                    func.max(ev.occurred_at),
                )
                .where(ev.user_id == "u1", ev.type == "quiz_attempt")
                .group_by(ev.knowledge_point_id)
            )
        }
        kept_quiz = {
            r.knowledge_point_id: (r.attempts, r.correct, r.last_attempt_at)
            for r in (await s.execute(select(LearningKnowledgePointStat))).scalars()
        }
    assert reading and quiz
    assert kept == reading
    assert kept_quiz == quiz


@pytest.mark.mysql
async def test_totals_equal_the_events_aggregates_over_batches_and_repeats(
    sessions: async_sessionmaker[AsyncSession], tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    kps = await _kps(tx, photosynthesis)
    blocks = [b.block_id for b in photosynthesis.blocks]
    for seed in range(4):
        batch = _events("e", blocks, kps, 120, seed)
        await tx(learning.record_learning_events, "u1", batch)
        await tx(learning.record_learning_events, "u1", batch)  # a repeat adds nothing
    await _totals_agree(sessions)


@pytest.mark.mysql
async def test_racing_batches_of_one_user_lose_no_event(
    sessions: async_sessionmaker[AsyncSession], tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    kps = await _kps(tx, photosynthesis)
    blocks = [b.block_id for b in photosynthesis.blocks][:4]  # few keys: many collisions

    async def send(batch: list[dict[str, Any]]) -> None:
        # a write transaction begun as the servicer's, retried as the servicer retries it
        await retry_transient(lambda: tx(learning.record_learning_events, "u1", batch))

    batches = [_events("r", blocks, kps, 60, seed) for seed in range(12)]
    await asyncio.gather(*(send(b) for b in batches))
    await _totals_agree(sessions)


@pytest.mark.mysql
async def test_the_snapshot_reads_totals_not_events(
    engine: Any,
    sessions: async_sessionmaker[AsyncSession],
    tx: Tx,
    photosynthesis: learning.MaterialView,
) -> None:
    kps = await _kps(tx, photosynthesis)
    blocks = [b.block_id for b in photosynthesis.blocks]
    await tx(learning.record_learning_events, "u1", _events("s", blocks, kps, 200, 7))
    sent: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        async with sessions() as s:
            payload = await snapshots.build_payload(
                s,
                user_id="u1",
                job_type="learning_state_analysis",
                target_type="user",
                target_id="u1",
                params={},
            )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", seen)
    assert payload["reading"] and payload["stats"]["quizAttempts"] > 0
    assert not [q for q in sent if "learning_events" in q]
    assert [q for q in sent if "learning_block_stats" in q]
    assert [q for q in sent if "learning_kp_stats" in q]


def test_the_migration_builds_the_totals_from_stored_events(sqlite_url: str) -> None:
    from datetime import datetime

    from alembic import command
    from sqlalchemy import create_engine, insert
    from sqlalchemy.engine import make_url

    from job_service.migrate import alembic_config

    cfg = alembic_config(sqlite_url)
    command.upgrade(cfg, "0004")
    engine = create_engine(make_url(sqlite_url).set(drivername="sqlite"))
    t1, t2 = datetime(2026, 11, 3, 9), datetime(2026, 11, 4, 9)
    rows = [
        ("a", "reading", "b1", None, 2.5, None, t1),
        ("b", "reading", "b1", None, 4.0, None, t2),
        ("c", "reading", None, None, 9.0, None, t2),  # no block: not a block's reading
        ("d", "quiz_attempt", None, "k1", None, True, t1),
        ("e", "quiz_attempt", None, "k1", None, False, t2),
    ]
    try:
        with engine.begin() as conn:
            for event_id, kind, block, kp, dwell, correct, at in rows:
                conn.execute(
                    insert(LearningEvent.__table__).values(
                        user_id="u1",
                        event_id=event_id,
                        type=kind,
                        material_id="m1",
                        block_id=block,
                        knowledge_point_id=kp,
                        dwell_seconds=dwell,
                        correct=correct,
                        occurred_at=at,
                        created_at=at,
                    )
                )
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            blocks = conn.execute(select(LearningBlockStat.__table__)).all()
            kps = conn.execute(select(LearningKnowledgePointStat.__table__)).all()
        assert [tuple(r) for r in blocks] == [("u1", "m1", "b1", 6.5, t2)]
        assert [tuple(r) for r in kps] == [("u1", "k1", 2, 1, t2)]
    finally:
        engine.dispose()
