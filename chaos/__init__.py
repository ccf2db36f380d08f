"""Fault harness: the real processes on MariaDB under load, one fault at a time, then an SQL audit.

Run ``python -m chaos [--fault NAME] [--jobs N] [--profile short|long|soak]``
(``make chaos``). See :mod:`chaos.scenarios` for the faults,
:mod:`chaos.audit` for what is checked, :mod:`chaos.system` for the short
leases and timeouts the services run with.
"""

from airuntime_common.spawning import disable_grpc_fork_handlers

# before gRPC is imported: the harness starts child processes (airuntime_common.spawning)
disable_grpc_fork_handlers()
