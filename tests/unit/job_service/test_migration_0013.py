"""Migration 0013 (fair order, provider limits): after ``upgrade head`` the new columns,
index and tables are as the models say; down to 0012 and up again works, and a job
waiting for its backoff is parked until its ``availableAt``."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def test_migration_0013_matches_the_models(db_url: str) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from job_service.migrate import alembic_config
    from job_service.store.base import Base

    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0012")
    sync = make_url(db_url)
    dialect = sync.drivername.split("+")[0]
    engine = create_engine(sync.set(drivername="mysql+pymysql" if dialect == "mysql" else dialect))
    try:
        with engine.begin() as conn:  # one job backing off, one available
            for job_id, offset in (("j-later", "+1 hour"), ("j-now", "-1 hour")):
                at = (
                    f"datetime('now', '{offset}')"
                    if dialect == "sqlite"
                    else f"DATE_ADD(UTC_TIMESTAMP(6), INTERVAL {offset.split()[0]} HOUR)"
                )
                conn.execute(
                    text(
                        "INSERT INTO ai_runtime_jobs (job_id, user_id, job_type, target_type,"
                        " target_id, status, priority, params, api_key_mode, model_provider,"
                        " model_name, attempt_no, retry_count, max_retry_count, timeout_seconds,"
                        " available_at, cancel_requested, created_at, updated_at, version)"
                        f" VALUES ('{job_id}', 'u', 'learning_state_analysis', 'user', 'u',"
                        " 'pending', 0, '{}', 'platform_key', 'deepseek', 'deepseek-chat', 0, 0,"
                        f" 3, 120, {at}, 0, {at}, {at}, 0)"
                    )
                )
        command.upgrade(cfg, "head")
        command.downgrade(cfg, "0012")
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            parked = dict(
                conn.execute(
                    text("SELECT job_id, parked_until IS NOT NULL FROM ai_runtime_jobs")
                ).all()
            )
    finally:
        engine.dispose()
    mine = [
        d
        for d in diffs
        if any(
            name in repr(d)
            for name in (
                "vstart",
                "parked_until",
                "ix_jobs_poll",
                "ix_jobs_user_waiting",
                "ai_provider_grants",
                "ai_credential_pauses",
                "paused_until",
                "'grants'",
            )
        )
    ]
    assert mine == []
    assert parked == {"j-later": 1, "j-now": 0}
