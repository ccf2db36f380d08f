"""The real gateway, served by uvicorn on a free port, over real job_service replicas,
and a small reader of ``text/event-stream`` answers (reference §9.1 tests)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import jwt
import uvicorn
from fastapi import FastAPI

from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings
from api_gateway.watch import JobHub
from job_service.lifecycle import Lease
from job_service.store.records import JobRecord
from tests.unit.job_service.conftest import TOKEN, Server, new_job

JWT_SECRET = "waiting-jwt-secret-0123456789abcdef0123456789"
USER = "u1"


def token(sub: str = USER) -> str:
    """A user JWT the gateway accepts."""
    claims = {"sub": sub, "role": "user", "exp": int(time.time()) + 3600}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


@dataclass
class Gateway:
    """The gateway app served on ``url``."""

    app: FastAPI
    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]
    channels: list[grpc.aio.Channel]

    @property
    def hub(self) -> JobHub:
        """The app's job watch (made by the first waiting request)."""
        hub: JobHub = self.app.state.hub
        return hub

    def client(self, sub: str = USER, **kw: Any) -> httpx.AsyncClient:
        """An HTTP client of the gateway with ``sub``'s token."""
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token(sub)}"},
            timeout=httpx.Timeout(30.0),
            trust_env=False,
            **kw,
        )

    async def stop(self) -> None:
        """Stop serving (open streams are cut) and close the channels."""
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self.task, 10)
        for channel in self.channels:
            await channel.close()


async def start_gateway(job_address: str, **settings: Any) -> Gateway:
    """The real gateway app on ``job_address`` (the credential channel goes nowhere:
    these routes never use it), served by uvicorn on 127.0.0.1:<free port>."""
    job_channel = grpc.aio.insecure_channel(job_address)
    cred_channel = grpc.aio.insecure_channel("127.0.0.1:9")
    values: dict[str, Any] = {
        "RUNTIME_SERVICE_TOKEN": TOKEN,
        "JWT_SECRET": JWT_SECRET,
        "WATCH_RECONNECT_SECONDS": 0.1,
    }
    values.update(settings)
    app = create_app(
        GatewaySettings(**values), job_channel=job_channel, credential_channel=cred_channel
    )
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Gateway(app, f"http://127.0.0.1:{port}", server, task, [job_channel, cred_channel])


@dataclass
class SseEvent:
    """One event of a stream (``comments`` are the comment lines before it)."""

    event: str | None = None
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)


class SseReader:
    """Reads a streamed ``httpx`` response in the background; events come one at a time.

    Attributes:
        comments: every comment line seen so far (``: ping``).
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments: list[str] = []
        self._events: asyncio.Queue[SseEvent | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        event = SseEvent()
        try:
            async for line in self.response.aiter_lines():
                if line == "":
                    if event.event or event.data or event.id:
                        self._events.put_nowait(event)
                    event = SseEvent()
                elif line.startswith(":"):
                    self.comments.append(line)
                    event.comments.append(line)
                else:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "data":
                        event.data = f"{event.data}\n{value}" if event.data else value
                    elif name in ("event", "id"):
                        setattr(event, name, value)
        except (httpx.HTTPError, RuntimeError):
            pass
        finally:
            self._events.put_nowait(None)

    async def next(self, within: float = 5.0) -> SseEvent | None:
        """The next event (None when the stream ended), failing after ``within`` s."""
        return await asyncio.wait_for(self._events.get(), within)

    async def close(self) -> None:
        """Stop reading."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[httpx.Response, SseReader]]:
    """A streamed GET of ``path`` (closed on exit: the client disconnects)."""
    async with client.stream("GET", path, headers=headers or {}) as response:
        reader = SseReader(response)
        try:
            yield response, reader
        finally:
            await reader.close()


async def wait_for(pred: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until ``pred()`` (checked every 10 ms), else fail."""
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def locked_job(server: Server, user_id: str = USER) -> tuple[JobRecord, Lease]:
    """A new job of ``user_id`` locked by runtime instance ``w1``."""
    job = await new_job(server.domain, user_id=user_id)
    locked = await server.domain.lock(job.job_id, "w1")
    return locked, Lease(job.job_id, "w1", locked.attempt_no)


async def fail_for_good(server: Server, lease: Lease) -> JobRecord:
    """Fail the attempt with a final code (the job → failed)."""
    return await server.domain.fail(
        lease, error_code="INVALID_SNAPSHOT", error_message="test: final failure"
    )
