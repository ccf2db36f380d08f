"""Local launcher: every service as a child process, one command (``python -m launcher``).

Importable for tests and the demo::

    from launcher import Launcher

    async with Launcher(env, dev=True, workers=2) as system:
        ... system.gateway_url ...
"""

from airuntime_common.spawning import disable_grpc_fork_handlers

# before gRPC is imported: the launcher forks its children (airuntime_common.spawning)
disable_grpc_fork_handlers()

from launcher.core import ChildExit, Launcher, LauncherError  # noqa: E402
from launcher.plan import LaunchPlan, PlanError, ServiceSpec, build_plan, isolated_env  # noqa: E402

__all__ = [
    "ChildExit",
    "LaunchPlan",
    "Launcher",
    "LauncherError",
    "PlanError",
    "ServiceSpec",
    "build_plan",
    "isolated_env",
]
