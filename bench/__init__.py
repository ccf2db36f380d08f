"""Benchmarks of the scheduling path against MariaDB (``python -m bench``).

Scenarios (see :mod:`bench.scenarios`): ``throughput``, ``peer`` (the same backlog
through procrastinate on PostgreSQL, :mod:`bench.peer`), ``floor``, ``pickup``,
``poll_scale``, ``idle``, ``gateway``, ``worker500``, ``waiting`` (:mod:`bench.waiting`). Every run creates a fresh
database (dropped afterwards), writes ``bench-results/<timestamp>.json`` and
prints a table; every figure carries its unit and the run's parameters.
"""

from airuntime_common.spawning import disable_grpc_fork_handlers

# before gRPC is imported: the harness starts child processes (airuntime_common.spawning)
disable_grpc_fork_handlers()
