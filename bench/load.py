"""Gateway load process: ``python -m bench.load --url URL --requests N --concurrency C``.

Sends ``POST /v1/ai/jobs`` (learning_state_analysis for the caller) with
``BENCH_JWT_SECRET``-signed user tokens over C keep-alive connections and
prints one JSON line: requests/s and latency percentiles (ms), status counts.
Run as its own process so the load generator does not share a CPU core's
event loop with anything it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter

import httpx

from bench.harness import summary_ms
from launcher.token import mint_token


async def run(url: str, requests: int, concurrency: int, users: int) -> dict[str, object]:
    """Send the requests; returns the figures (see module doc)."""
    secret = os.environ["BENCH_JWT_SECRET"]
    tokens = [mint_token(secret, sub=f"gw-user-{i}") for i in range(users)]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    it = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def caller() -> None:
            for i in it:
                body = {
                    "jobType": "learning_state_analysis",
                    "targetType": "user",
                    "apiKeyMode": "platform_key",
                }
                headers = {"Authorization": f"Bearer {tokens[i % users]}"}
                t0 = time.perf_counter()
                reply = await client.post("/v1/ai/jobs", json=body, headers=headers)
                latencies.append(time.perf_counter() - t0)
                statuses[reply.status_code] += 1

        # warm the connections
        await asyncio.gather(*(client.get("/healthz") for _ in range(concurrency)))
        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "requests_per_s": round(requests / elapsed, 1),
        "latency": summary_ms(latencies),
        "status_counts": {str(k): v for k, v in sorted(statuses.items())},
    }


def main() -> None:
    """CLI entry point (see module doc)."""
    p = argparse.ArgumentParser(prog="python -m bench.load")
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--users", type=int, default=100)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.url, a.requests, a.concurrency, a.users))))


if __name__ == "__main__":
    main()
