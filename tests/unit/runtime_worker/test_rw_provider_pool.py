"""The provider holds as many live connections as the worker has slots, in one pool, and
the stand-in accepts that many at once (bench: the 500-slot worker)."""

from __future__ import annotations

import asyncio

from model_standin.server import run_standin
from runtime_worker.app import WorkerApp
from runtime_worker.providers.deepseek import DeepSeekProvider
from runtime_worker.settings import WorkerSettings
from tests.unit.runtime_worker.test_rw_provider_deepseek import make_request

CALLS = 150  # more than aiohttp's default pool of 100, and more than the stand-in's old backlog


async def test_every_slot_calls_at_once_and_connections_are_kept() -> None:
    async with run_standin(port=0, delay_ms=1500) as standin:
        provider = DeepSeekProvider(max_connections=CALLS)
        try:
            for _ in range(2):
                calls = [
                    asyncio.create_task(provider.complete(make_request(standin.base_url)))
                    for _ in range(CALLS)
                ]
                # every call connects and then waits on the 1.5 s answer
                in_flight = 0
                for _ in range(120):
                    in_flight = standin.stats()["openConnections"]
                    if in_flight >= CALLS:
                        break
                    await asyncio.sleep(0.01)
                # the answers (400: the prompt is not a job's) are not the point here
                await asyncio.gather(*calls, return_exceptions=True)
                assert in_flight == CALLS
                # all kept alive: the second round opens no new connection
                assert standin.stats()["openConnections"] == CALLS
            assert standin.stats()["requests"] == 2 * CALLS
        finally:
            await provider.aclose()


async def test_the_worker_sizes_its_pool_to_its_concurrency() -> None:
    app = WorkerApp(WorkerSettings(WORKER_CONCURRENCY=321, RUNTIME_SERVICE_TOKEN="t"))
    try:
        assert isinstance(app.provider, DeepSeekProvider)
        assert app.provider.max_connections == 321
    finally:
        await app.client.close()
        await app.provider.aclose()
