"""Ids are compared exactly on MariaDB, as on SQLite (migration 0006, ``binary_collation``).

The server's default ``utf8mb4_general_ci`` folds case, accents and trailing spaces:
user ``VIC`` read ``vic``'s materials, instance ``INST-A`` passed ``inst-a``'s fencing,
``Idempotency-Key: Key-1`` replayed ``key-1``'s job, and events ``E1`` / ``e1`` (or
any two emoji) were one event. Skipped without TEST_MYSQL_URL.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airuntime_common.errors import AppError
from job_service import learning
from job_service.lifecycle import Lease
from job_service.services.domain import JobDomain
from tests.unit.job_service.conftest import new_job

pytestmark = pytest.mark.mysql

CAPS = ["learning_state_analysis"]


async def test_another_users_look_alike_id_sees_nothing(domain: JobDomain) -> None:
    async with domain.sessions() as s, s.begin():
        material = await learning.create_material(s, "vic", "T", "A sentence long enough here.")
    for other in ("VIC", "vic ", "víc"):
        async with domain.sessions() as s:
            with pytest.raises(AppError) as err:
                await learning.get_material(s, other, material.material_id)
        assert err.value.code == "NOT_FOUND"
    job = await new_job(domain, user_id="vic")
    with pytest.raises(AppError) as err:
        await domain.get(job.job_id, user_id="VIC")
    assert err.value.code == "JOB_NOT_FOUND"


async def test_fencing_compares_the_instance_exactly(domain: JobDomain) -> None:
    job = await new_job(domain)
    await domain.claim("inst-a", CAPS, 1, 0)
    for impostor in ("INST-A", "inst-a "):
        with pytest.raises(AppError) as err:
            await domain.heartbeat(Lease(job.job_id, impostor, 1))
        assert err.value.code == "LOCK_NOT_HELD"
    await domain.heartbeat(Lease(job.job_id, "inst-a", 1))


async def test_idempotency_keys_differing_in_case_are_two_jobs(domain: JobDomain) -> None:
    first = await new_job(domain, idempotency_key="Key-1")
    second = await new_job(domain, idempotency_key="key-1")
    assert first.job_id != second.job_id


async def test_event_ids_differing_in_case_space_or_emoji_are_distinct(domain: JobDomain) -> None:
    async with domain.sessions() as s, s.begin():
        material = await learning.create_material(s, "u1", "T", "A sentence long enough here.")
    block = material.blocks[0].block_id
    ids = ["e1", "E1", "e1 ", "😀", "😁"]
    events = [{"eventId": i, "type": "reading", "blockId": block, "dwellSeconds": 1} for i in ids]
    async with domain.sessions() as s, s.begin():
        accepted, duplicates = await learning.record_learning_events(s, "u1", events)
    assert (accepted, duplicates) == (5, 0)


async def test_every_text_column_is_binary_and_no_pad(domain: JobDomain) -> None:
    async with domain.sessions() as s:
        rows = (
            await s.execute(
                text(
                    "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
                    " WHERE TABLE_SCHEMA = DATABASE() AND DATA_TYPE IN ('char', 'varchar', 'text')"
                )
            )
        ).all()
    assert rows
    assert {r[2] for r in rows} <= {"utf8mb4_nopad_bin", "ascii_bin"}, rows


FOREIGN_KEYS = (
    "SELECT r.TABLE_NAME, r.CONSTRAINT_NAME, r.REFERENCED_TABLE_NAME, r.UPDATE_RULE,"
    " r.DELETE_RULE, k.COLUMN_NAME, k.REFERENCED_COLUMN_NAME"
    " FROM information_schema.REFERENTIAL_CONSTRAINTS r"
    " JOIN information_schema.KEY_COLUMN_USAGE k ON k.CONSTRAINT_SCHEMA = r.CONSTRAINT_SCHEMA"
    " AND k.TABLE_NAME = r.TABLE_NAME AND k.CONSTRAINT_NAME = r.CONSTRAINT_NAME"
    " WHERE r.CONSTRAINT_SCHEMA = DATABASE() ORDER BY 1, 2, 6"
)
COLLATIONS = (
    "SELECT DISTINCT COLLATION_NAME FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = DATABASE() AND DATA_TYPE IN ('char', 'varchar', 'text')"
)


def test_migrations_convert_a_case_folding_schema_keeping_rows_and_keys(mysql_url: str) -> None:
    """A database made by 0001-0005 on the server's default collation: 0006 converts
    every text column, keeps the rows and makes the foreign keys again as they were;
    credential_service's 0002 does the same to its table."""
    import asyncio

    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from credential_service import migrate as credential_migrate
    from job_service.migrate import alembic_config

    cfg = alembic_config(mysql_url)
    command.upgrade(cfg, "0005")
    engine = create_engine(make_url(mysql_url).set(drivername="mysql+pymysql"))
    try:
        with engine.begin() as conn:
            fks_before = conn.execute(text(FOREIGN_KEYS)).all()
            assert {r[0] for r in conn.execute(text(COLLATIONS))} == {"utf8mb4_general_ci"}
            conn.execute(
                text(
                    "INSERT INTO ai_authorizations (user_id, granted, changed_at)"
                    " VALUES ('vic', 0, NOW())"
                )
            )
        command.upgrade(cfg, "head")
        with engine.begin() as conn:
            assert conn.execute(text(FOREIGN_KEYS)).all() == fks_before
            assert fks_before  # the learning tables' keys
            assert {r[0] for r in conn.execute(text(COLLATIONS))} == {"utf8mb4_nopad_bin"}
            conn.execute(
                text(
                    "INSERT INTO ai_authorizations (user_id, granted, changed_at)"
                    " VALUES ('VIC', 1, NOW())"
                )
            )
            rows = conn.execute(
                text("SELECT user_id, granted FROM ai_authorizations ORDER BY user_id")
            ).all()
        assert [tuple(r) for r in rows] == [("VIC", 1), ("vic", 0)]
        command.upgrade(cfg, "head")  # nothing left to convert: a no-op
        with engine.connect() as conn:
            default = conn.execute(
                text(
                    "SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA"
                    " WHERE SCHEMA_NAME = DATABASE()"
                )
            ).scalar()
        assert default == "utf8mb4_nopad_bin"  # for the tables later migrations make

        with engine.begin() as conn:
            conn.execute(text("DROP TABLE alembic_version"))
            for (table,) in conn.execute(text("SHOW TABLES")).all():
                conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
                conn.execute(text(f"DROP TABLE `{table}`"))
        asyncio.run(credential_migrate.upgrade(mysql_url))
        with engine.begin() as conn:
            got = {r[0] for r in conn.execute(text(COLLATIONS))}
        assert got == {"utf8mb4_nopad_bin", "ascii_bin"}
    finally:
        engine.dispose()
