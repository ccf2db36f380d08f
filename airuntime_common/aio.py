"""The event loop every service process runs on.

Each service (job_service, credential_service, runtime_worker, the gateway's
uvicorn, the DeepSeek stand-in) runs one asyncio event loop. By default that
loop is uvloop's (libuv) where the package is installed: on the full job path
it cuts the CPU spent per job by about a sixth (socket writes, callbacks and
timers are in C; ``python -m bench``, README "Benchmarks"). ``EVENT_LOOP``
chooses explicitly:

* ``auto`` (default): uvloop when importable, else asyncio's own loop;
* ``uvloop``: uvloop, and refuse to start without it;
* ``asyncio``: asyncio's own selector loop (e.g. to rule the loop out while
  debugging).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

#: The environment variable that picks the loop.
EVENT_LOOP_ENV = "EVENT_LOOP"
LoopName = Literal["uvloop", "asyncio"]


class EventLoopSettingError(ValueError):
    """``EVENT_LOOP`` holds an unknown value, or asks for uvloop where it is not installed."""


def loop_name(environ: dict[str, str] | None = None) -> LoopName:
    """The loop ``EVENT_LOOP`` selects in ``environ`` (default: ``os.environ``).

    Raises:
        EventLoopSettingError: an unknown value, or ``uvloop`` without the package.
    """
    env = os.environ if environ is None else environ
    choice = env.get(EVENT_LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "uvloop", "asyncio"):
        raise EventLoopSettingError(
            f"{EVENT_LOOP_ENV} must be auto, uvloop or asyncio, not {choice!r}"
        )
    if choice == "asyncio":
        return "asyncio"
    if importlib.util.find_spec("uvloop") is None:
        if choice == "uvloop":
            raise EventLoopSettingError(f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed")
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on the loop :func:`loop_name` selects; its result.

    Like :func:`asyncio.run` (a new loop, closed afterwards).

    Raises:
        SystemExit: ``EVENT_LOOP`` is invalid (see :func:`loop_name`); the message
            names the setting and ``main`` is closed unrun.
    """
    try:
        name = loop_name()
    except EventLoopSettingError as exc:
        main.close()
        raise SystemExit(f"configuration error: {exc}") from None
    if name == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
