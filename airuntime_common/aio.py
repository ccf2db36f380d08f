"""The event loop a service's process runs on.

Every long-running process (job_service, credential_service, runtime_worker, the
gateway through uvicorn, the model stand-in) runs its main coroutine on the loop
that ``EVENT_LOOP`` names:

* ``uvloop`` (default): libuv's loop, where uvloop is installed (Linux and macOS;
  it is a dependency there). Its transports and timers cost less CPU per socket
  event than the standard library's, which matters on a path that is a chain of
  short gRPC and MySQL round trips (see docs/capacity.md).
* ``asyncio``: the standard library's selector loop, e.g. to rule the loop out
  while chasing a bug.

Where ``uvloop`` is asked for but not installed (Windows), the standard loop runs.

A service's entry point calls :func:`settle_heap` before :func:`run`: it takes what
imports left on the heap out of the cyclic collector's sight and makes its young
collections rarer.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar, cast, get_args

T = TypeVar("T")

#: Values ``EVENT_LOOP`` accepts.
EventLoopName = Literal["uvloop", "asyncio"]
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoopName)
DEFAULT_EVENT_LOOP: EventLoopName = "uvloop"

#: The cyclic collector's thresholds while a service runs (CPython's default is
#: ``(700, 10, 10)``): a young collection every 10,000 net container allocations
#: rather than every 700. A job's path allocates a few thousand short-lived
#: containers (protobuf, SQL parameters, dicts), nearly all freed by reference
#: counting, so the default collects several times per job for nothing.
GC_THRESHOLDS: tuple[int, int, int] = (10_000, 20, 20)


def uvloop_available() -> bool:
    """Whether the uvloop package can be imported here."""
    return importlib.util.find_spec("uvloop") is not None


def resolve_event_loop(name: str | None = None) -> EventLoopName:
    """The loop a process will run: ``name``, else ``EVENT_LOOP``, else ``uvloop``.

    ``uvloop`` resolves to ``asyncio`` where uvloop is not installed.

    Raises:
        ValueError: ``name`` (or ``EVENT_LOOP``) is not one of :data:`EVENT_LOOPS`.
    """
    chosen = name if name is not None else os.environ.get("EVENT_LOOP", DEFAULT_EVENT_LOOP)
    chosen = chosen.strip().lower()
    if chosen not in EVENT_LOOPS:
        raise ValueError(f"EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, not {chosen!r}")
    if chosen == "uvloop" and not uvloop_available():
        return "asyncio"
    return cast(EventLoopName, chosen)


def settle_heap() -> None:
    """Freeze what start-up allocated and set :data:`GC_THRESHOLDS`, once per process
    (a service's ``__main__``, before :func:`run`; not a library call, since frozen
    objects are never collected as cycles).

    Imports leave tens of thousands of long-lived objects (about 95,000 in
    job_service: SQLAlchemy metadata, protobuf descriptors, pydantic models) that
    every full collection would traverse again. :func:`gc.freeze` moves them to the
    permanent generation, which the collector skips; reference counting still
    frees them.
    Cyclic garbage made later is collected as before, only less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(main: Coroutine[Any, Any, T], *, loop: str | None = None) -> T:
    """Run ``main`` to completion on a new event loop and close it, as :func:`asyncio.run`.

    Args:
        main: the process's main coroutine.
        loop: ``"uvloop"`` or ``"asyncio"``; default :func:`resolve_event_loop`'s choice.

    Returns:
        What ``main`` returns.

    Raises:
        ValueError: an unknown loop name (``main`` is closed, never started).
    """
    try:
        chosen = resolve_event_loop(loop)
    except ValueError:
        main.close()
        raise
    factory = None
    if chosen == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
