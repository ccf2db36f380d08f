"""``python -m job_service`` (migrate, then serve) and ``python -m job_service migrate``."""

from __future__ import annotations

import asyncio
import sys

from airuntime_common import aio
from airuntime_common.db import opening_database
from airuntime_common.grpc_server import install_stop_signals
from airuntime_common.logs import setup_logging
from airuntime_common.settings import load
from job_service.migrate import upgrade_head_async
from job_service.settings import JobServiceSettings


async def _serve(settings: JobServiceSettings) -> None:
    from job_service.app import serve

    stop = asyncio.Event()
    install_stop_signals(stop)
    async with opening_database("job_service", "DATABASE_URL"):
        app = await serve(settings)
    await stop.wait()
    await app.stop(grace=5.0)


async def _migrate(settings: JobServiceSettings) -> None:
    async with opening_database("job_service", "DATABASE_URL"):
        await upgrade_head_async(settings.DATABASE_URL)


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` without the program name (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else argv
    settings = load(JobServiceSettings, "job_service")
    setup_logging("job_service", settings.LOG_LEVEL)
    command = argv[0] if argv else "serve"
    if command == "migrate":
        asyncio.run(_migrate(settings))
        return 0
    if command == "serve":
        aio.settle_heap()
        aio.run(_serve(settings), loop=settings.EVENT_LOOP)
        return 0
    print(f"usage: python -m job_service [serve|migrate], not {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
