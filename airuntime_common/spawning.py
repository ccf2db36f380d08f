"""Starting child processes from a process that uses gRPC.

grpcio's core registers ``pthread_atfork`` handlers. Since grpcio 1.81 the child's
handler restarts the event engine's poller thread in the forked child, which then
polls an epoll descriptor the child is closing on its way to ``exec``: a child
dies (SIGSEGV, or abort after ``epoll_wait error: Bad file descriptor``) before
it runs at all: 2 to 19 of 200 spawns while calls are in flight on this
machine (grpc/grpc#43055, open). A process that starts children (the launcher,
the bench and chaos harnesses, the demo, the test suite) uses no gRPC in a forked
child, so it turns gRPC's fork handling off: ``GRPC_ENABLE_FORK_SUPPORT=false``,
read once when gRPC's core starts, i.e. before ``grpc`` is first imported.

This module imports nothing from gRPC, on purpose.
"""

from __future__ import annotations

import os

#: The grpcio core setting that switches its fork handlers on or off.
FORK_SUPPORT_VAR = "GRPC_ENABLE_FORK_SUPPORT"


def disable_grpc_fork_handlers() -> None:
    """Turn gRPC's fork handlers off for this process (and its children), unless the
    environment already decided (an operator's ``GRPC_ENABLE_FORK_SUPPORT`` wins).

    Call it before anything imports ``grpc`` (a package's ``__init__``): gRPC's core
    reads the setting once, when it starts.
    """
    os.environ.setdefault(FORK_SUPPORT_VAR, "false")
