"""The peer's worker process: ``python -m bench.peer_worker --concurrency N``.

Opens a procrastinate ``App`` on the database ``BENCH_PEER_DATABASE_URL`` names
(libpq URL; :data:`bench.peer.URL_VAR`), whose pool holds N connections (all opened
before anything is timed, so no slot waits for one), prints ``ready`` and waits for
one line on stdin; then runs one procrastinate worker with ``concurrency`` N on every
queue until SIGTERM or SIGINT, which procrastinate handles as a graceful stop. The
event loop is our services' (``EVENT_LOOP``, uvloop by default), so the two sides
differ in their design, not in their loop. Started by :func:`bench.peer.drain`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from airuntime_common.aio import run
from bench.peer import URL_VAR, make_app


async def serve(url: str, concurrency: int) -> None:
    """Open the pool, say ``ready``, wait for stdin, run the worker until it is stopped."""
    app = make_app(url, pool_size=concurrency)
    async with app.open_async():
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await app.run_worker_async(concurrency=concurrency, wait=True)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see module doc)."""
    p = argparse.ArgumentParser(prog="python -m bench.peer_worker")
    p.add_argument("--concurrency", type=int, required=True, help="jobs run at once")
    a = p.parse_args(argv)
    run(serve(os.environ[URL_VAR], a.concurrency))


if __name__ == "__main__":
    main()
