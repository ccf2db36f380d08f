"""The launcher: runs every service as a child process, in dependency order.

Each child is ``python -m <package>`` in its own session (so a terminal's
Ctrl-C reaches only the launcher, which then stops the children in reverse
order) and, on Linux, with a parent-death signal so no child outlives a
killed launcher. A child is "ready" when its gRPC health (overall service
``""``) is SERVING, or its HTTP probe answers; the next tier starts only
then. Output lines are prefixed with the child's name (or written to
``<log_dir>/<name>.log``); the last lines of each child are kept for error
reports. A child that exits while the system is up is a failure:
:meth:`Launcher.wait` returns it and the caller stops the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launcher.plan import LaunchPlan, ServiceSpec, build_plan, port_in_use

#: Seconds a child gets after SIGTERM before SIGKILL (``LAUNCHER_STOP_GRACE_SECONDS``).
#: Longer than a worker's default ``SHUTDOWN_GRACE_SECONDS`` (20) so it can drain.
DEFAULT_STOP_GRACE_SECONDS = 30.0
#: Services that may run as several processes: one of them dying while another
#: still runs does not stop the launcher (see :meth:`Launcher.wait`).
REPLICATED_KINDS = frozenset({"job_service", "runtime_worker"})
#: Seconds one service may take to become ready (``LAUNCHER_STARTUP_TIMEOUT_SECONDS``).
DEFAULT_STARTUP_TIMEOUT_SECONDS = 90.0
PROBE_INTERVAL_SECONDS = 0.2
TAIL_LINES = 200
_COLORS = ("36", "33", "35", "32", "34", "96", "93", "95", "92", "94")
_PR_SET_PDEATHSIG = 1


class LauncherError(RuntimeError):
    """A service failed to start or become ready; the message names it and its last lines."""


@dataclass(frozen=True)
class ChildExit:
    """A child that exited while it should have been running.

    Attributes:
        name: the service's display name.
        returncode: its exit status (negative: killed by that signal).
        tail: its last output lines.
    """

    name: str
    returncode: int
    tail: tuple[str, ...]


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


_PRCTL = _load_prctl()


def _child_setup() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Child:
    def __init__(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.pump: asyncio.Task[None] | None = None
        self.watch: asyncio.Task[None] | None = None
        self.log: IO[str] | None = None
        self.started_at = 0.0
        #: Set while the launcher itself stops this child (not a failure).
        self.expected_exit = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def tail_text(self, lines: int = 30) -> str:
        return "\n".join(list(self.tail)[-lines:])


class Launcher:
    """Starts and stops the whole system (or the ``only`` part of it).

    Usage::

        system = Launcher(env, workers=2, dev=True)
        await system.start()            # returns when every service is ready
        ... system.gateway_url ...      # e.g. "http://127.0.0.1:3000"
        await system.stop()             # reverse order, SIGTERM then SIGKILL

    or ``async with Launcher(...) as system:``.

    Args:
        env: base environment (default ``os.environ``); see :func:`launcher.plan.build_plan`.
        only: start only these services (names or aliases).
        workers: number of runtime workers.
        job_services: number of job_service replicas (see :func:`launcher.plan.build_plan`).
        dev: force the local model stand-in.
        var_dir: SQLite files, dev secrets and logs (default ``./var``).
        log_dir: write each child's output to ``<log_dir>/<name>.log`` instead of echoing it.
        echo: echo prefixed child output to ``out`` (default: True unless ``log_dir`` is set).
        out: where prefixed output and launcher messages go (default ``sys.stdout``).
        startup_timeout: seconds each service may take to become ready.
        stop_grace: seconds between SIGTERM and SIGKILL.
        plan: a ready-made plan (tests); overrides the arguments above.
        cwd: the children's working directory (default: the current one).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        only: Iterable[str] | str | None = None,
        workers: int = 1,
        job_services: int = 1,
        dev: bool = False,
        var_dir: str | os.PathLike[str] = "var",
        log_dir: str | os.PathLike[str] | None = None,
        echo: bool | None = None,
        out: IO[str] | None = None,
        startup_timeout: float | None = None,
        stop_grace: float | None = None,
        plan: LaunchPlan | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        base = dict(os.environ if env is None else env)
        self.plan = plan or build_plan(
            base, var_dir=var_dir, dev=dev, workers=workers, job_services=job_services, only=only
        )
        self._out = out or sys.stdout
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._echo = echo if echo is not None else self._log_dir is None
        self._cwd = str(cwd) if cwd is not None else None
        self._startup_timeout = startup_timeout or float(
            base.get("LAUNCHER_STARTUP_TIMEOUT_SECONDS") or DEFAULT_STARTUP_TIMEOUT_SECONDS
        )
        self._stop_grace = (
            stop_grace
            if stop_grace is not None
            else float(base.get("LAUNCHER_STOP_GRACE_SECONDS") or DEFAULT_STOP_GRACE_SECONDS)
        )
        self._children = [_Child(spec) for spec in self.plan.services]
        width = max([len(c.spec.name) for c in self._children] + [len("launcher")])
        self._width = width
        self._use_color = "NO_COLOR" not in base and _isatty(self._out)
        self._colors = {
            c.spec.name: _COLORS[i % len(_COLORS)] for i, c in enumerate(self._children)
        }
        self._stopping = False
        self._stop_lock = asyncio.Lock()
        self._failed: asyncio.Event | None = None
        self._failure: ChildExit | None = None
        self._fatal: ChildExit | None = None

    # -- public -----------------------------------------------------------

    @property
    def gateway_url(self) -> str:
        """Base URL of the public REST API, e.g. ``http://127.0.0.1:3000``."""
        return self.plan.gateway_url

    @property
    def standin_url(self) -> str | None:
        """Base URL of the model stand-in (``/_standin/faults`` etc.), or None."""
        return self.plan.standin_url

    @property
    def env(self) -> dict[str, str]:
        """The environment shared by the children (includes the secrets)."""
        return self.plan.env

    @property
    def failure(self) -> ChildExit | None:
        """The first child that exited unexpectedly, if any."""
        return self._failure

    def log_path(self, name: str) -> Path | None:
        """Where a child's output is written, when ``log_dir`` is set."""
        return self._log_dir / f"{name}.log" if self._log_dir is not None else None

    def tail(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` output lines of a child.

        Raises:
            KeyError: no such service.
        """
        return self._child(name).tail_text(lines)

    def pids(self) -> dict[str, int]:
        """Process ids of the running children, by name."""
        return {c.spec.name: c.proc.pid for c in self._children if c.proc is not None and c.running}

    async def start(self) -> None:
        """Start every service tier by tier, waiting for each to be ready.

        Raises:
            LauncherError: a child exited or was not ready within the startup
                timeout; everything started so far has been stopped again.
        """
        self._stopping = False
        self._failure = None
        self._fatal = None
        self._failed = asyncio.Event()
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
        busy = [
            f"{c.spec.name} ({c.spec.bind[0]}:{c.spec.bind[1]})"
            for c in self._children
            if c.spec.bind is not None and c.spec.bind[1] and port_in_use(*c.spec.bind)
        ]
        if busy:
            raise LauncherError(
                f"already in use: {', '.join(busy)} (another instance running?); stop it or"
                " choose other ports (JOB_SERVICE_LISTEN, CREDENTIAL_SERVICE_LISTEN,"
                " RUNTIME_WORKER_LISTEN, GATEWAY_PORT, STANDIN_PORT)"
            )
        try:
            for tier in self._tiers():
                for child in tier:
                    await self._spawn(child)
                await self._wait_tier(tier)
        except BaseException:
            await asyncio.shield(self.stop())
            raise

    async def wait(self) -> ChildExit:
        """Block until a child exits unexpectedly and leaves its service without a
        running process; returns which one.

        A job_service replica or a runtime worker that dies while another of its kind
        still runs is reported (and kept in :attr:`failure`) but does not end the
        wait: the clients skip a dead replica, and a dead worker's leases expire and
        its jobs are retried by the others (reference §2.3).
        """
        if self._failed is None:
            raise RuntimeError("launcher not started")
        await self._failed.wait()
        assert self._fatal is not None
        return self._fatal

    async def stop(self) -> None:
        """Stop the children in reverse start order.

        Each tier gets SIGTERM, then SIGKILL after the grace period. Safe to
        call twice and after a failed start.
        """
        async with self._stop_lock:
            self._stopping = True
            for tier in reversed(self._tiers()):
                await asyncio.gather(*(self._terminate(c) for c in tier))
            for child in self._children:
                await self._finish_tasks(child)

    async def stop_service(self, name: str, sig: signal.Signals = signal.SIGTERM) -> int:
        """Stop one child on purpose (not reported as a failure); returns its exit status.

        ``sig=signal.SIGKILL`` simulates a hard crash (cases L5/L6); any
        other signal is followed by SIGKILL after the grace period.

        Raises:
            KeyError: no such service.
        """
        child = self._child(name)
        if child.proc is None:
            raise KeyError(name)
        child.expected_exit = True
        if child.proc.returncode is None:
            if sig == signal.SIGKILL:
                _signal_group(child.proc.pid, signal.SIGKILL)
                await child.proc.wait()
            else:
                await self._terminate(child, sig)
        await self._finish_tasks(child)
        return int(child.proc.returncode or 0)

    async def restart_service(self, name: str) -> None:
        """Stop one child (if running) and start it again, waiting until it is ready.

        Raises:
            KeyError: no such service.
            LauncherError: it did not become ready again.
        """
        child = self._child(name)
        if child.running:
            await self.stop_service(name)
        else:
            await self._finish_tasks(child)
        child.expected_exit = False
        await self._spawn(child)
        await self._wait_ready(child)

    def kill(self) -> None:
        """SIGKILL every running child at once (a second Ctrl-C)."""
        self._stopping = True
        for child in self._children:
            if child.running and child.proc is not None:
                _signal_group(child.proc.pid, signal.SIGKILL)

    def describe(self) -> str:
        """A table of the services and where each listens."""
        rows = [("service", "pid", "listens")]
        for child in self._children:
            pid = str(child.proc.pid) if child.proc is not None else "-"
            rows.append((child.spec.name, pid, child.spec.listen))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"  {a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
        lines.insert(1, f"  {'-' * w0}  {'-' * w1}  {'-' * 40}")
        return "\n".join(lines)

    async def __aenter__(self) -> Launcher:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def say(self, message: str) -> None:
        """Write a launcher message, prefixed like the children's lines."""
        self._emit("launcher", message, "1")

    # -- internals --------------------------------------------------------

    async def _wait_tier(self, tier: list[_Child]) -> None:
        """Wait until every child of a tier is ready; the first failure cancels the rest."""
        tasks = [asyncio.create_task(self._wait_ready(c)) for c in tier]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    def _child(self, name: str) -> _Child:
        for child in self._children:
            if child.spec.name == name:
                return child
        raise KeyError(name)

    async def _finish_tasks(self, child: _Child) -> None:
        """Let a stopped child's output pump drain, then drop its tasks and log file."""
        for task in (child.pump, child.watch):
            if task is not None and not task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(task), 2.0)
                task.cancel()
        if child.log is not None:
            child.log.close()
            child.log = None

    def _tiers(self) -> list[list[_Child]]:
        tiers: list[list[_Child]] = []
        for tier_no in sorted({c.spec.tier for c in self._children}):
            tiers.append([c for c in self._children if c.spec.tier == tier_no])
        return tiers

    def _emit(self, name: str, line: str, color: str | None = None) -> None:
        color = self._colors.get(name, "") if color is None else color
        if not self._use_color:
            color = ""
        label = f"{name:<{self._width}}"
        prefix = f"\x1b[{color}m{label} |\x1b[0m " if color else f"{label} | "
        with contextlib.suppress(ValueError, OSError):
            self._out.write(prefix + line + "\n")
            self._out.flush()

    async def _spawn(self, child: _Child) -> None:
        spec = child.spec
        if spec.bind is not None and spec.bind[1] and port_in_use(*spec.bind):
            host, port = spec.bind
            raise LauncherError(
                f"{spec.name}: {host}:{port} is already in use (another instance running?);"
                " stop it or choose another port (reference §7 *_LISTEN / GATEWAY_PORT variables)"
            )
        if self._log_dir is not None:
            child.log = (self._log_dir / f"{spec.name}.log").open("a", encoding="utf-8")
        child.started_at = time.monotonic()
        kwargs: dict[str, Any] = {}
        if _PRCTL is not None:
            kwargs["preexec_fn"] = _child_setup
        try:
            child.proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                env=dict(spec.env),
                cwd=self._cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                limit=1 << 20,
                **kwargs,
            )
        except OSError as exc:
            raise LauncherError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}") from exc
        child.pump = asyncio.create_task(self._pump(child), name=f"pump-{spec.name}")
        child.watch = asyncio.create_task(self._watch(child), name=f"watch-{spec.name}")

    async def _pump(self, child: _Child) -> None:
        assert child.proc is not None and child.proc.stdout is not None
        stream = child.proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raw = await stream.read(1 << 20)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            child.tail.append(line)
            if child.log is not None:
                child.log.write(line + "\n")
                child.log.flush()
            if self._echo:
                self._emit(child.spec.name, line)

    async def _watch(self, child: _Child) -> None:
        assert child.proc is not None
        code = await child.proc.wait()
        if child.pump is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(child.pump), 2.0)
        if self._stopping or child.expected_exit:
            return
        exit_ = ChildExit(child.spec.name, code, tuple(child.tail))
        if self._failure is None:
            self._failure = exit_
        others = [
            c.spec.name
            for c in self._children
            if c is not child and c.spec.kind == child.spec.kind and c.running
        ]
        if child.spec.kind in REPLICATED_KINDS and others:
            self.say(
                f"{child.spec.name} exited unexpectedly (exit status {code});"
                f" {', '.join(others)} still running"
            )
            return
        self.say(f"{child.spec.name} exited unexpectedly (exit status {code})")
        if self._fatal is None:
            self._fatal = exit_
        if self._failed is not None:
            self._failed.set()

    async def _wait_ready(self, child: _Child) -> None:
        spec = child.spec
        deadline = time.monotonic() + self._startup_timeout
        channel: grpc.aio.Channel | None = None
        client: httpx.AsyncClient | None = None
        try:
            if spec.probe == "grpc":
                channel = _probe_channel(spec.target, spec.env.get("GRPC_TLS_CA_FILE"))
            else:
                client = httpx.AsyncClient(timeout=1.0, trust_env=False)
            while True:
                if child.proc is None or child.proc.returncode is not None:
                    code = child.proc.returncode if child.proc is not None else None
                    await asyncio.sleep(0.1)  # let the pump drain the last lines
                    raise LauncherError(
                        f"{spec.name} exited with status {code} before it was ready; last output:\n"
                        + child.tail_text()
                    )
                if channel is not None and await _grpc_serving(channel):
                    break
                if client is not None and await _http_ready(client, spec):
                    break
                if time.monotonic() > deadline:
                    raise LauncherError(
                        f"{spec.name} not ready at {spec.target} after {self._startup_timeout:.0f} s;"
                        " last output:\n" + child.tail_text()
                    )
                await asyncio.sleep(PROBE_INTERVAL_SECONDS)
        finally:
            if channel is not None:
                await channel.close()
            if client is not None:
                await client.aclose()
        self.say(f"{spec.name} ready in {time.monotonic() - child.started_at:.1f} s: {spec.listen}")

    async def _terminate(self, child: _Child, sig: signal.Signals = signal.SIGTERM) -> None:
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), self._stop_grace)
        except TimeoutError:
            self.say(
                f"{child.spec.name} still running {self._stop_grace:.0f} s after {sig.name}; SIGKILL"
            )
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the child's process group (it leads its own session), else the child."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _probe_channel(target: str, ca_file: str | None) -> grpc.aio.Channel:
    options = [("grpc.enable_http_proxy", 0)]
    if ca_file:
        creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
        return grpc.aio.secure_channel(target, creds, options=options)
    return grpc.aio.insecure_channel(target, options=options)


async def _grpc_serving(channel: grpc.aio.Channel) -> bool:
    """True when the overall health status (service ``""``) is SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def _http_ready(client: httpx.AsyncClient, spec: ServiceSpec) -> bool:
    """Gateway: ``/healthz`` answers 2xx. Stand-in: any answer below 500."""
    try:
        reply = await client.get(spec.target)
    except httpx.HTTPError:
        return False
    if spec.kind == "api_gateway":
        return 200 <= reply.status_code < 300
    return reply.status_code < 500
