"""``python -m model_standin`` — run the DeepSeek stand-in.

Options (each also read from the environment):

* ``--host`` (``STANDIN_HOST``, default 127.0.0.1), ``--port`` (``STANDIN_PORT``, 8600);
* ``--providers`` (``STANDIN_PROVIDERS``): ``name=port[:model+model…],…``, one
  stand-in per provider, each on its own port with its own faults, statistics and
  record of the keys and models it saw (``/_standin/seen``); without it, one
  ``deepseek`` stand-in on ``--port``. A provider given models serves exactly
  those (e.g. ``backup=8601:backup-chat``), else DeepSeek's;
* ``--fault-rate`` (``STANDIN_FAULT_RATE``, 0): probability of a random HTTP 500;
* ``--delay-ms`` (``STANDIN_DELAY_MS``, 0): delay before every answer;
* ``--seed`` (``STANDIN_SEED``): seed of the random faults;
* ``--faults`` (``STANDIN_FAULTS``): JSON list of scripted faults queued at start
  (on every provider; change one provider's with its ``/_standin/faults``);
* ``--tls-cert`` / ``--tls-key`` (``STANDIN_TLS_CERT_FILE`` / ``STANDIN_TLS_KEY_FILE``):
  serve HTTPS with this PEM certificate chain and key (e.g. a test CA's), to play a
  provider that is reached over verified TLS.

It prints one line of JSON per provider once listening:
``{"event": "standin_listening", "provider": name, "baseUrl": url}``.

Stops cleanly on SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import ssl
import sys

from pydantic import ValidationError

from airuntime_common import aio
from model_standin.faults import FAULT_LIST, Fault
from model_standin.providers import ProviderSpec
from model_standin.server import StandIn


def _parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m model_standin", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=env.get("STANDIN_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env.get("STANDIN_PORT", "8600")))
    p.add_argument(
        "--providers",
        default=env.get("STANDIN_PROVIDERS", ""),
        help="name=port[:model+model],... one stand-in per provider",
    )
    p.add_argument("--fault-rate", type=float, default=float(env.get("STANDIN_FAULT_RATE", "0")))
    p.add_argument("--delay-ms", type=int, default=int(env.get("STANDIN_DELAY_MS", "0")))
    seed = env.get("STANDIN_SEED")
    p.add_argument("--seed", type=int, default=int(seed) if seed else None)
    p.add_argument("--faults", default=env.get("STANDIN_FAULTS", ""), help="JSON list of faults")
    p.add_argument("--tls-cert", default=env.get("STANDIN_TLS_CERT_FILE", ""))
    p.add_argument("--tls-key", default=env.get("STANDIN_TLS_KEY_FILE", ""))
    p.add_argument("--log-level", default=env.get("LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if not 0.0 <= args.fault_rate <= 1.0:
        p.error("--fault-rate must be within 0..1")
    if args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    try:
        args.specs = ProviderSpec.parse_list(args.providers) or [
            ProviderSpec("deepseek", args.port)
        ]
    except ValueError as exc:
        p.error(f"--providers: {exc}")
    return args


async def _run(args: argparse.Namespace, faults: list[Fault]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    servers = [
        StandIn(
            args.host,
            spec.port,
            fault_rate=args.fault_rate,
            delay_ms=args.delay_ms,
            seed=args.seed,
            faults=faults,
            name=spec.name,
            models=spec.models,
            tls=_tls(args.tls_cert, args.tls_key),
        )
        for spec in args.specs
    ]
    try:
        for server in servers:
            await server.start()
            print(
                json.dumps(
                    {
                        "event": "standin_listening",
                        "provider": server.name,
                        "baseUrl": server.base_url,
                    }
                ),
                flush=True,
            )
        await stop.wait()
    finally:
        for server in servers:
            await server.stop()


def _tls(cert: str, key: str) -> ssl.SSLContext | None:
    """A server TLS context of ``cert`` and ``key`` (PEM files), or None (plain HTTP)."""
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parse(argv)
    try:
        from airuntime_common.logs import setup_logging

        setup_logging("standin", args.log_level)
    except Exception:  # logging setup is best effort for a dev tool
        logging.basicConfig(level=args.log_level)
    try:
        faults = FAULT_LIST.validate_json(args.faults) if args.faults.strip() else []
    except ValidationError as exc:
        print(f"invalid --faults: {exc}", file=sys.stderr)
        return 2
    try:
        loop = aio.resolve_event_loop()
    except ValueError as exc:  # EVENT_LOOP=tokio: one line, as the services say it
        print(f"standin: refusing to start: {exc}", file=sys.stderr)
        return 2
    try:
        aio.run(_run(args, faults), loop=loop)
    except OSError as exc:  # e.g. the port is taken
        ports = ", ".join(str(spec.port) for spec in args.specs)
        print(f"cannot listen on {args.host} port {ports}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
