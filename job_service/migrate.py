"""Running job_service's Alembic migrations programmatically (``python -m job_service migrate``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

INI = Path(__file__).with_name("alembic.ini")


def alembic_config(url: str) -> Config:
    """Alembic config for ``url`` (the ini lives inside the package)."""
    cfg = Config(str(INI))
    cfg.attributes["url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade_head(url: str) -> None:
    """``alembic upgrade head`` against ``url`` (blocking; runs its own event loop)."""
    command.upgrade(alembic_config(url), "head")


async def upgrade_head_async(url: str) -> None:
    """:func:`upgrade_head` from async code (in a worker thread)."""
    await asyncio.to_thread(upgrade_head, url)
