"""Fixtures of the learning-data tests: a fresh database with the learning tables.

``engine`` runs every test on SQLite; tests marked ``mysql`` also run on
MariaDB when ``TEST_MYSQL_URL`` is set (their own database, dropped afterwards).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

import job_service.learning.tables as lm
from airuntime_common.db import make_sessionmaker
from job_service import learning
from job_service.store.base import Base
from job_service.store.engine import WRITE_TX, make_job_engine

DOCS = Path(__file__).resolve().parents[2] / "fixtures" / "docs"

LEARNING_TABLES: list[Table] = [
    m.__table__  # type: ignore[misc]
    for m in (
        lm.Material,
        lm.MaterialBlock,
        lm.KnowledgePoint,
        lm.KnowledgePointBlock,
        lm.LearningEvent,
        lm.LearningBlockStat,
        lm.LearningKnowledgePointStat,
        lm.AiSnapshot,
        lm.AiResult,
        lm.AiLearningAnalysis,
        lm.AiWeakPointCandidate,
        lm.AiNextActionRecommendation,
        lm.AiQuizQuestion,
        lm.AiFlashcard,
        lm.AiQuestionGenerationPlan,
        lm.AiFlashcardGenerationPlan,
    )
]


async def create_learning_tables(engine: AsyncEngine) -> None:
    """Create only the tables this area owns (the core job tables are not needed)."""
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: Base.metadata.create_all(c, tables=LEARNING_TABLES))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test runs on SQLite; tests marked ``mysql`` also on MariaDB (skipped without it)."""
    if "backend" in metafunc.fixturenames:
        mysql = metafunc.definition.get_closest_marker("mysql") is not None
        metafunc.parametrize("backend", ["sqlite", "mysql"] if mysql else ["sqlite"])


@pytest.fixture
async def engine(
    request: pytest.FixtureRequest, backend: str, sqlite_url: str
) -> AsyncIterator[AsyncEngine]:
    url = sqlite_url if backend == "sqlite" else request.getfixturevalue("mysql_url")
    eng = make_job_engine(url)  # the job database's engine, as job_service builds it
    await create_learning_tables(eng)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return make_sessionmaker(engine)


class Tx:
    """Run one function in its own committed write transaction, begun as the job
    service begins one (``BEGIN IMMEDIATE`` on SQLite, see :data:`WRITE_TX`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        token = WRITE_TX.set(True)
        try:
            async with self.sessions() as session, session.begin():
                return await fn(session, *args, **kwargs)
        finally:
            WRITE_TX.reset(token)


@pytest.fixture
def tx(sessions: async_sessionmaker[AsyncSession]) -> Tx:
    return Tx(sessions)


@pytest.fixture
async def photosynthesis(tx: Tx) -> learning.MaterialView:
    """User u1's material from ``structured.md``."""
    view: learning.MaterialView = await tx(
        learning.create_material, "u1", "Photosynthesis", (DOCS / "structured.md").read_text()
    )
    return view
