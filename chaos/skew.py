"""Run a module with its wall clock skewed: ``python -m chaos.skew SECONDS MODULE [ARGS...]``.

The fallback of the clock-skew fault when libfaketime is not installed:
``time.time``/``time.time_ns`` and ``datetime.datetime.now``/``utcnow`` are
shifted by ``SECONDS`` before the module is imported (the monotonic clock,
which asyncio and timeouts use, is left alone — as a real NTP-less machine
would). reference §1 / case L7: leases must be unaffected, since only the
database clock is used for them.
"""

from __future__ import annotations

import datetime as _dt
import runpy
import sys
import time as _time
from typing import Any


def install(offset_seconds: float) -> None:
    """Shift this process's wall clock by ``offset_seconds`` (both ``time`` and ``datetime``)."""
    real_time = _time.time
    real_time_ns = _time.time_ns
    offset_ns = int(offset_seconds * 1_000_000_000)
    delta = _dt.timedelta(seconds=offset_seconds)

    def time() -> float:
        return real_time() + offset_seconds

    def time_ns() -> int:
        return real_time_ns() + offset_ns

    base = _dt.datetime

    class SkewedDatetime(base):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return base.now(tz) + delta

        @classmethod
        def utcnow(cls) -> Any:
            return base.now(_dt.UTC).replace(tzinfo=None) + delta

        @classmethod
        def today(cls) -> Any:
            return cls.now()

    _time.time = time
    _time.time_ns = time_ns
    _dt.datetime = SkewedDatetime  # type: ignore[misc]


def main(argv: list[str] | None = None) -> None:
    """Entry point: skew the clock, then run ``MODULE`` as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        raise SystemExit("usage: python -m chaos.skew SECONDS MODULE [ARGS...]")
    offset = float(args[0])
    module = args[1]
    install(offset)
    sys.argv = [module, *args[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
