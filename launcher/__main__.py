"""``python -m launcher [--only a,b] [--dev] [--workers N] [--env-file F] [--var-dir DIR]``.

Runs the services in the foreground until Ctrl-C / SIGTERM (exit 0; a second
Ctrl-C kills at once) or until a child dies unexpectedly (the rest are
stopped; exit 1). Exit 2 on a bad option.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
from pathlib import Path

from launcher.core import Launcher, LauncherError
from launcher.devsecrets import read_env_file
from launcher.plan import SERVICE_ORDER, PlanError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the launcher."""
    parser = argparse.ArgumentParser(
        prog="python -m launcher",
        description="Start AI Runtime's services locally, in dependency order, in the foreground.",
    )
    parser.add_argument(
        "--only",
        help=f"comma list of services to start (of {', '.join(SERVICE_ORDER)}; "
        "aliases: job, credential, worker, gateway)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="use the local DeepSeek stand-in even when DEEPSEEK_API_KEY is set",
    )
    parser.add_argument("--workers", type=int, default=1, help="number of runtime workers (1)")
    parser.add_argument(
        "--job-services",
        type=int,
        default=1,
        help="job_service replicas (1); above 1 needs DATABASE_URL on MySQL/MariaDB",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        help="KEY=VALUE file; the process environment wins over it",
    )
    parser.add_argument(
        "--var-dir",
        default=os.environ.get("AIRUNTIME_VAR_DIR", "var"),
        help="SQLite files and dev secrets (default ./var)",
    )
    return parser.parse_args(argv)


def load_environment(env_file: Path | None) -> dict[str, str]:
    """``os.environ`` over the env file's values (the shell wins).

    Raises:
        PlanError: the env file does not exist.
    """
    env: dict[str, str] = {}
    if env_file is not None:
        if not env_file.is_file():
            raise PlanError(f"env file {env_file} not found")
        env.update(read_env_file(env_file))
    env.update(os.environ)
    return env


def _install_signals(launcher: Launcher, stop: asyncio.Event) -> None:
    """The first SIGINT or SIGTERM stops the services in order; a second kills them."""
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            launcher.say("stopping (Ctrl-C again to kill at once)")
            stop.set()
        else:
            launcher.kill()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


def _announce(launcher: Launcher) -> None:
    """Where the dev secrets and the var dir are, and which model the workers call."""
    plan = launcher.plan
    if plan.generated:
        launcher.say(f"generated {', '.join(plan.generated)} into {plan.secrets_file} (mode 0600)")
    elif plan.secrets_file.exists():
        launcher.say(f"dev secrets from {plan.secrets_file}")
    if plan.standin_urls:
        model = "local stand-ins: " + ", ".join(f"{n} at {u}" for n, u in plan.standin_urls.items())
    elif plan.standin_url:
        model = f"local DeepSeek stand-in at {plan.standin_url}"
    elif plan.env.get("MODEL_PROVIDERS"):
        model = "MODEL_PROVIDERS"
    else:
        model = f"DeepSeek at {plan.env.get('DEEPSEEK_BASE_URL', 'https://api.deepseek.com')}"
    launcher.say(f"var dir {plan.var_dir}; model: {model}")


def _print_ready(launcher: Launcher, args: argparse.Namespace) -> None:
    """The services' addresses, and how to mint a token for them."""
    var_opt = "" if args.var_dir == "var" else f" --var-dir {shlex.quote(str(args.var_dir))}"
    print("\nAI Runtime is up:\n" + launcher.describe(), flush=True)
    hints = []
    if any(s.kind == "api_gateway" for s in launcher.plan.services):
        hints.append(f"  public API   {launcher.gateway_url}")
    hints += [
        f"  a user token {sys.executable} -m launcher.token{var_opt} --sub u1 --role user",
        f"  admin token  {sys.executable} -m launcher.token{var_opt} --sub ops --role admin",
        "  Ctrl-C stops everything.",
    ]
    print("\n" + "\n".join(hints) + "\n", flush=True)


async def _start_or_stop(launcher: Launcher, stopped: asyncio.Task[bool]) -> int | None:
    """Start every service unless a signal comes first; None once all are ready,
    else the exit status (0: stopped by a signal, 1: the start failed)."""
    start = asyncio.create_task(launcher.start())
    await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not start.done():
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError, LauncherError):
            await start
        await launcher.stop()
        launcher.say("stopped before every service was ready")
        return 0
    if start.exception() is not None:
        stopped.cancel()
        launcher.say(f"start failed: {start.exception()}")
        return 1
    return None


async def run(args: argparse.Namespace) -> int:
    """Start, serve until a signal or a child's death, stop. Returns the exit status."""
    try:
        env = load_environment(args.env_file)
        launcher = Launcher(
            env,
            only=args.only,
            workers=args.workers,
            job_services=args.job_services,
            dev=args.dev,
            var_dir=args.var_dir,
        )
    except PlanError as exc:
        print(f"launcher: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    _install_signals(launcher, stop)
    _announce(launcher)
    stopped = asyncio.create_task(stop.wait())
    status = await _start_or_stop(launcher, stopped)
    if status is not None:
        return status
    _print_ready(launcher, args)
    failed = asyncio.create_task(launcher.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    if failed.done() and not stopped.done():
        stopped.cancel()
        failure = failed.result()
        launcher.say(f"{failure.name} died (exit status {failure.returncode}); stopping the rest")
        await launcher.stop()
        return 1
    failed.cancel()
    await launcher.stop()
    launcher.say("all services stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m launcher``."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
