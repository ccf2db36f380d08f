"""``python -m demo [--file PATH]`` — the whole flow, end to end, through the public REST API.

Starts every service with the launcher in dev mode (SQLite in a fresh
temporary directory, the local DeepSeek stand-in, free ports) unless
``DEMO_GATEWAY_URL`` / ``--gateway-url`` names a running gateway (the JWT
secret then comes from ``JWT_SECRET`` or ``var/dev-secrets.env``). The
document is ``--file``, else ``DEMO_FILE``, else
``demo/documents/photosynthesis.md``. Exit status 0 only when all five jobs
succeeded and every check passed; 1 otherwise; 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import httpx

from demo.flow import ApiError, Demo, DemoOutcome
from launcher.core import Launcher, LauncherError
from launcher.plan import PlanError, isolated_env
from launcher.token import TokenError, find_jwt_settings, mint_token

DEFAULT_DOCUMENT = Path(__file__).resolve().parent / "documents" / "photosynthesis.md"
MAX_DOCUMENT_BYTES = 1024 * 1024
TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".text")


class DocumentError(ValueError):
    """The document cannot be used (missing, not text, too large, empty)."""


def demo_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The launcher environment of a self-contained demo run.

    :func:`launcher.plan.isolated_env` (own secrets, SQLite, free ports, no
    metrics ports), with the worker polling every 250 ms unless
    ``POLL_INTERVAL_MS`` is set.
    """
    env = isolated_env(base)
    env.setdefault("POLL_INTERVAL_MS", "250")
    return env


def resolve_document(cli_value: str | None, env: Mapping[str, str]) -> Path:
    """``--file``, else ``DEMO_FILE``, else the shipped photosynthesis document.

    Raises:
        DocumentError: the file is missing, over 1 MiB, not UTF-8 text, or empty.
    """
    raw = cli_value or env.get("DEMO_FILE") or str(DEFAULT_DOCUMENT)
    path = Path(raw).expanduser()
    if not path.is_file():
        raise DocumentError(f"document {path} not found")
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"document {path} is larger than 1 MiB (the API's limit)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DocumentError(f"document {path} is not UTF-8 text") from None
    if not text.strip():
        raise DocumentError(f"document {path} is empty")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the demo."""
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    p.add_argument(
        "--file", help="a .md or .txt study document (default: DEMO_FILE or photosynthesis.md)"
    )
    p.add_argument(
        "--gateway-url",
        default=os.environ.get("DEMO_GATEWAY_URL"),
        help="use a running gateway instead of starting one (DEMO_GATEWAY_URL)",
    )
    p.add_argument(
        "--var-dir",
        default=os.environ.get("AIRUNTIME_VAR_DIR", "var"),
        help="with --gateway-url: the launcher's var dir holding dev-secrets.env (./var)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("DEMO_TIMEOUT_SECONDS", "90")),
        help="seconds to wait for the jobs (90)",
    )
    p.add_argument("--workers", type=int, default=1, help="runtime workers to start (1)")
    p.add_argument("--keep", action="store_true", help="keep the temporary var directory")
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the services up after the demo until Ctrl-C (to explore with curl)",
    )
    return p.parse_args(argv)


def _say(line: str = "") -> None:
    print(line, flush=True)


async def run_flow(
    gateway_url: str,
    secret: str,
    issuer: str | None,
    document: Path,
    wait_seconds: float,
    *,
    local: bool,
) -> DemoOutcome:
    """Mint a user token and run :class:`demo.flow.Demo` against ``gateway_url``."""
    user_id = f"demo-learner-{uuid.uuid4().hex[:8]}"
    token = mint_token(secret, sub=user_id, role="user", ttl_seconds=3600, issuer=issuer)
    _say(f"   user {user_id} (JWT signed with the gateway's JWT_SECRET)")
    async with httpx.AsyncClient(
        base_url=gateway_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30.0,
        trust_env=not local,
    ) as client:
        return await Demo(
            client, user_id=user_id, document=document, timeout=wait_seconds, say=_say
        ).run()


def _verdict(outcome: DemoOutcome) -> None:
    succeeded = sum(1 for j in outcome.jobs if j.status == "succeeded")
    if outcome.ok:
        _say(
            f"\n✓ Demo passed: all {len(outcome.jobs)} jobs succeeded, idempotent replay and"
            " citations verified."
        )
        return
    _say(f"\n✗ Demo FAILED: {succeeded}/{len(outcome.jobs)} jobs succeeded.")
    if not outcome.idempotency_ok:
        _say("  - the idempotent replay did not answer 200 + Idempotent-Replayed with the same job")
    if not outcome.citations_ok:
        _say("  - some results cite ids that are not this user's document or knowledge points")
    for problem in outcome.problems:
        _say(f"  - {problem}")


async def _against_running(args: argparse.Namespace, document: Path) -> int:
    """The flow against a gateway already running (``--gateway-url``)."""
    try:
        secret, issuer = find_jwt_settings(os.environ, var_dir=args.var_dir)
    except TokenError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    _say(f"   gateway {args.gateway_url} (already running)")
    try:
        outcome = await run_flow(
            args.gateway_url, secret, issuer, document, args.timeout, local=False
        )
    except (ApiError, httpx.HTTPError) as exc:
        _say(f"\n✗ Demo FAILED: {exc}")
        return 1
    _verdict(outcome)
    return 0 if outcome.ok else 1


async def _flow_on(launcher: Launcher, args: argparse.Namespace, document: Path) -> bool:
    """The flow against the services ``launcher`` started; whether it passed (the
    services' log tails are shown when it did not)."""
    try:
        outcome = await run_flow(
            launcher.gateway_url,
            launcher.env["JWT_SECRET"],
            launcher.env.get("JWT_ISSUER") or None,
            document,
            args.timeout,
            local=True,
        )
    except (ApiError, httpx.HTTPError) as exc:
        _say(f"\n✗ Demo FAILED: {exc}")
        _print_tails(launcher)
        return False
    if launcher.failure is not None:
        outcome.problems.append(
            f"{launcher.failure.name} exited unexpectedly (status {launcher.failure.returncode})"
        )
    _verdict(outcome)
    if not outcome.ok:
        _print_tails(launcher)
    return outcome.ok


async def _with_own_services(args: argparse.Namespace, document: Path) -> int:
    """Start every service (dev mode, the stand-in model, SQLite in a temporary
    directory), run the flow, stop them (the data is kept unless it passed)."""
    var_dir = Path(tempfile.mkdtemp(prefix="airuntime-demo-"))
    try:
        launcher = Launcher(
            demo_environment(os.environ),
            dev=True,
            workers=args.workers,
            var_dir=var_dir,
            log_dir=var_dir / "logs",
            echo=False,
        )
    except PlanError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    _stop_on_signals(launcher)
    _say(f"   starting the services (dev mode, stand-in model, SQLite in {var_dir}) …")
    started = time.monotonic()
    ok = False
    try:
        try:
            await launcher.start()
        except LauncherError as exc:
            _say(f"\n✗ the services did not start: {exc}")
            return 1
        _say(f"   up in {time.monotonic() - started:.1f} s; gateway {launcher.gateway_url}")
        ok = await _flow_on(launcher, args, document)
        if args.keep_running:
            await _keep_running(launcher)
        return 0 if ok else 1
    finally:
        _say("\nStopping the services …")
        await launcher.stop()
        if ok and not args.keep and not args.keep_running:
            shutil.rmtree(var_dir, ignore_errors=True)
            _say("   stopped; temporary data removed.")
        else:
            _say(f"   stopped; data and logs kept in {var_dir}")


async def main_async(args: argparse.Namespace) -> int:
    """The demo; returns the exit status."""
    try:
        document = resolve_document(args.file, os.environ)
    except DocumentError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    if document.suffix.lower() not in TEXT_SUFFIXES:
        _say(f"note: {document.name} is not .md/.txt; uploading it as plain text")
    _say("AI Runtime demo")
    _say(f"   document {document}")
    if args.gateway_url:
        return await _against_running(args, document)
    return await _with_own_services(args, document)


def summarize_log_line(line: str, limit: int = 300) -> str:
    """One readable line from a service's JSON log line (time, level, message, the
    exception's last line); other lines are cut to ``limit`` characters."""
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "msg" not in record:
        return line if len(line) <= limit else line[:limit] + " …"
    text = f"{record.get('ts', '')} {record.get('level', '')} {record.get('msg', '')}"
    extras = [f"{k}={record[k]}" for k in ("jobId", "attemptNo", "code") if k in record]
    if extras:
        text += f" ({', '.join(map(str, extras))})"
    exc = str(record.get("exc") or "").strip()
    if exc:
        # the exception line itself, not SQLAlchemy's trailing "[SQL: …]" / "(Background …)"
        lines = [ln for ln in exc.splitlines() if ln.strip() and not ln.startswith((" ", "(", "["))]
        text += " | " + (lines[-1] if lines else exc.splitlines()[-1])
    return text if len(text) <= limit else text[:limit] + " …"


def _print_tails(launcher: Launcher) -> None:
    names = [s.name for s in launcher.plan.services if s.kind != "standin"]
    for name in names:
        tail = launcher.tail(name, 8)
        if tail:
            lines = "\n".join(summarize_log_line(line) for line in tail.splitlines())
            _say(f"\n--- last lines of {name} (full log: {launcher.log_path(name)}) ---\n{lines}")


async def _keep_running(launcher: Launcher) -> None:
    user = f"demo-explorer-{uuid.uuid4().hex[:6]}"
    token = mint_token(launcher.env["JWT_SECRET"], sub=user, role="admin", ttl_seconds=8 * 3600)
    _say(
        f"\nServices stay up at {launcher.gateway_url} (console: {launcher.gateway_url}/admin/console)."
    )
    _say(f"An admin token for 8 h:\n{token}\nCtrl-C stops everything.")
    failure = await launcher.wait()  # until Ctrl-C cancels the demo, or a service dies
    _say(f"{failure.name} exited unexpectedly (status {failure.returncode})")


def _stop_on_signals(launcher: Launcher) -> None:
    """Ctrl-C / SIGTERM: cancel the demo (its ``finally`` stops the services in order);
    a second signal kills them at once."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    count = 0

    def on_signal() -> None:
        nonlocal count
        count += 1
        if count == 1 and task is not None:
            _say("\ninterrupted")
            task.cancel()
        else:
            launcher.kill()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m demo``."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")
    args = parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
