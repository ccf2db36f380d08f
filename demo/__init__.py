"""The end-to-end demo (``python -m demo``): one study document through all five AI jobs."""

from airuntime_common.spawning import disable_grpc_fork_handlers

# before gRPC is imported: the harness starts child processes (airuntime_common.spawning)
disable_grpc_fork_handlers()
