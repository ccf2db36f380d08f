"""``python -m api_gateway``: serve the gateway with uvicorn on GATEWAY_HOST:GATEWAY_PORT."""

from __future__ import annotations

import uvicorn

from airuntime_common.aio import resolve_event_loop
from airuntime_common.logs import setup_logging
from airuntime_common.settings import load
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings


def main() -> None:
    """Read settings from the environment, refuse to start without secrets, serve."""
    settings = load(GatewaySettings, "api_gateway")
    settings.check()
    setup_logging("api_gateway", settings.LOG_LEVEL)
    uvicorn.run(
        create_app(settings),
        host=settings.GATEWAY_HOST,
        port=settings.GATEWAY_PORT,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        loop=resolve_event_loop(settings.EVENT_LOOP),
    )


if __name__ == "__main__":
    main()
