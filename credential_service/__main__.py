"""``python -m credential_service [serve|migrate|rotate-keys]`` (default: serve).

* ``serve``: refuse to start without ``RUNTIME_SERVICE_TOKEN`` or with missing/malformed
  ``CREDENTIAL_ENCRYPTION_KEYS``; run migrations; serve gRPC on ``CREDENTIAL_SERVICE_LISTEN``.
* ``migrate``: upgrade ``CREDENTIAL_DATABASE_URL`` to the latest schema.
* ``rotate-keys [--batch-size N]``: re-encrypt every row to the current master key.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from airuntime_common import aio
from airuntime_common.db import opening_database
from airuntime_common.logs import setup_logging
from airuntime_common.settings import MissingSetting, load

T = TypeVar("T")


async def _opened(work: Coroutine[Any, Any, T]) -> T:
    """``work`` with a database that cannot be opened reported in one line
    (:func:`airuntime_common.db.opening_database`), not a traceback."""
    async with opening_database("credential_service", "CREDENTIAL_DATABASE_URL"):
        return await work


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m credential_service")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="run the gRPC server (default)")
    sub.add_parser("migrate", help="upgrade the database schema to head")
    rot = sub.add_parser("rotate-keys", help="re-encrypt every row to the current master key")
    rot.add_argument("--batch-size", type=int, default=0, help="rows per batch (default 100)")
    args = parser.parse_args(argv)

    from credential_service.settings import CredentialSettings

    settings = load(CredentialSettings, "credential_service")
    setup_logging("credential_service", settings.LOG_LEVEL)
    try:
        if args.command == "migrate":
            from credential_service import migrate

            asyncio.run(_opened(migrate.upgrade(settings.CREDENTIAL_DATABASE_URL)))
            print("credential_service database is at the latest revision")
            return 0
        if args.command == "rotate-keys":
            from credential_service import rotate

            size = args.batch_size or settings.ROTATE_BATCH_SIZE
            return asyncio.run(_opened(rotate.run(settings, size, print)))
        from credential_service.app import run_forever

        settings.validate_for_serve()
        aio.settle_heap()
        aio.run(run_forever(settings), loop=settings.EVENT_LOOP)
        return 0
    except MissingSetting as exc:
        print(f"credential_service: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
