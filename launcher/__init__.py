"""Local launcher: every service as a child process, one command (``python -m launcher``).

Importable for tests and the demo::

    from launcher import Launcher

    async with Launcher(env, dev=True, workers=2) as launcher:
        ... launcher.gateway_url ...
"""

from launcher.core import ChildExit, Launcher, LauncherError
from launcher.plan import LaunchPlan, PlanError, ServiceSpec, build_plan, isolated_env

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
