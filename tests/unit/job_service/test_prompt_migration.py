"""Migration 0012 (the prompt registry) makes what the models say, on SQLite and MariaDB,
and goes down and up again; the jobs not yet ended get the version they were going to run."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

MINE = (
    "ai_prompt_versions",
    "ai_prompt_routings",
    "ai_result_feedback",
    "ix_invocations_type_created",
    "ix_result_feedback_type_updated",
    "'prompt_version'",
)


def _sync_engine(db_url: str) -> Any:
    sync = make_url(db_url)
    dialect = sync.drivername.split("+")[0]
    return create_engine(sync.set(drivername="mysql+pymysql" if dialect == "mysql" else dialect))


def test_migration_0012_matches_the_models(db_url: str) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from job_service.migrate import alembic_config
    from job_service.store.base import Base

    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0011")
    engine = _sync_engine(db_url)
    try:
        with engine.begin() as conn:
            for job_id, status, version in (
                ("j-live", "pending", None),
                ("j-done", "failed", None),
                ("j-set", "running", "learning_state_analysis.v7"),
            ):
                conn.execute(
                    text(
                        "INSERT INTO ai_runtime_jobs (job_id, user_id, job_type, target_type,"
                        " target_id, status, priority, params, api_key_mode, model_provider,"
                        " model_name, prompt_version, attempt_no, retry_count, max_retry_count,"
                        " timeout_seconds, available_at, cancel_requested, created_at,"
                        " updated_at, version) VALUES (:j, 'u', 'learning_state_analysis',"
                        " 'user', 'u', :s, 0, '{}', 'platform_key', 'deepseek', 'deepseek-chat',"
                        " :v, 0, 0, 3, 120, '2026-01-01 00:00:00', 0, '2026-01-01 00:00:00',"
                        " '2026-01-01 00:00:00', 0)"
                    ),
                    {"j": job_id, "s": status, "v": version},
                )  # fmt: skip
        command.upgrade(cfg, "head")
        command.downgrade(cfg, "0011")
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            versions = dict(
                conn.execute(text("SELECT job_id, prompt_version FROM ai_runtime_jobs")).all()
            )
    finally:
        engine.dispose()
    mine = [d for d in diffs if any(name in repr(d) for name in MINE)]
    if db_url.startswith("sqlite"):  # SQLite keeps the declared 64 (it enforces no length)
        mine = [d for d in mine if "length=64)" not in repr(d)]
    assert mine == []
    assert versions == {
        "j-live": "learning_state_analysis.v1",
        "j-done": None,
        "j-set": "learning_state_analysis.v7",
    }


@pytest.mark.mysql
def test_a_long_prompt_version_fits_the_columns_on_mariadb(mysql_url: str) -> None:
    from alembic import command

    from job_service.migrate import alembic_config

    command.upgrade(alembic_config(mysql_url), "head")
    engine = _sync_engine(mysql_url)
    try:
        with engine.connect() as conn:
            widths = dict(
                conn.execute(
                    text(
                        "SELECT TABLE_NAME, CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS"
                        " WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'prompt_version'"
                    )
                ).all()
            )
    finally:
        engine.dispose()
    assert widths == {
        "ai_runtime_jobs": 128,
        "ai_results": 128,
        "ai_runtime_invocation_logs": 128,
        "ai_result_feedback": 128,
    }
