"""``python -m runtime_worker``: run one worker process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio

from airuntime_common import aio
from airuntime_common.grpc_server import install_stop_signals
from airuntime_common.logs import setup_logging
from airuntime_common.settings import load
from runtime_worker.app import run
from runtime_worker.settings import WorkerSettings


async def _main(settings: WorkerSettings) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    await run(settings, stop)


def main() -> None:
    """Entry point."""
    settings = load(WorkerSettings, "runtime_worker")
    setup_logging("runtime_worker", settings.LOG_LEVEL)
    settings.check()
    aio.settle_heap()
    aio.run(_main(settings), loop=settings.EVENT_LOOP)


if __name__ == "__main__":
    main()
