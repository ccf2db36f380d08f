"""Every fault kind of the stand-in, observed on the wire (httpx and raw sockets),
plus the scripted-fault queue, the admin endpoints, random faults and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.outputs import validate_output
from model_standin import StandIn, run_standin

from .conftest import AUTH, chat_body, make_snapshot, snapshot_ids

TASKS = [
    "learning_state_analysis",
    "weak_point_analysis",
    "next_action_planning",
    "quiz_generation",
    "flashcard_generation",
]
REPO = Path(__file__).resolve().parents[3]


def raw_request(body: dict[str, Any], *, keep_alive: bool = True) -> bytes:
    data = json.dumps(body).encode()
    head = (
        "POST /chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-raw-0001\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + data


async def read_until_eof(reader: asyncio.StreamReader, limit: float = 3.0) -> bytes:
    out = b""
    async with asyncio.timeout(limit):
        while chunk := await reader.read(65536):
            out += chunk
    return out


async def eventually(predicate: Any, limit: float = 2.0) -> None:
    """Poll ``predicate`` until true (the stand-in exposes no event to wait on)."""
    async with asyncio.timeout(limit):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def content_of(r: httpx.Response) -> tuple[str, str]:
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


# ---------------------------------------------------------------- status faults


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid request body format."),
        (402, "Insufficient Balance"),
        (422, "Invalid Parameters"),
        (500, "Server Error"),
        (503, "Server Overloaded"),
    ],
)
async def test_status_fault_has_deepseek_error_body(
    standin: StandIn, client: httpx.AsyncClient, status: int, message: str
) -> None:
    standin.add_faults([{"kind": "status", "status": status}])
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert r.status_code == status
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["param"] is None
    assert "retry-after" not in r.headers
    assert standin.stats()["byOutcome"] == {f"status_{status}": 1}
    # the fault is consumed: the next request is answered
    assert (
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    ).status_code == 200


async def test_429_carries_retry_after(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults(
        [
            {"kind": "status", "status": 429, "retryAfter": 7},
            {"kind": "status", "status": 429},
            {"kind": "status", "status": 429, "retryAfter": "Wed, 21 Oct 2026 07:28:00 GMT"},
        ]
    )
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["message"] == "Rate Limit Reached"
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert r.headers["retry-after"] == "1"
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert r.headers["retry-after"] == "Wed, 21 Oct 2026 07:28:00 GMT"


# ---------------------------------------------------------------- content faults


async def test_delay_fault_then_normal_answer(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "delay", "ms": 300}])
    t0 = time.monotonic()
    r = await client.post("/chat/completions", json=chat_body("flashcard_generation"))
    assert time.monotonic() - t0 >= 0.3
    validate_output("flashcard_generation", "v1", json.loads(content_of(r)[0]))
    assert standin.stats()["byOutcome"] == {"delay": 1}


async def test_empty_content(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "empty_content"}])
    r = await client.post("/chat/completions", json=chat_body("weak_point_analysis"))
    content, finish = content_of(r)
    assert r.status_code == 200 and finish == "stop"
    assert content and content.strip() == "" and set(content) == {" "}


async def test_truncated(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "truncated"}])
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    content, finish = content_of(r)
    assert finish == "length"
    assert content.startswith('{"items": [')
    with pytest.raises(ValueError):
        json.loads(content)


async def test_out_of_capacity_cuts_the_answer(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "out_of_capacity", "fraction": 0.5}])
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    content, finish = content_of(r)
    assert r.status_code == 200 and finish == "insufficient_system_resource"
    assert content.startswith('{"items": [')
    with pytest.raises(ValueError):
        json.loads(content)
    assert standin.stats()["byOutcome"] == {"out_of_capacity": 1}


async def test_invalid_json(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "invalid_json"}])
    r = await client.post("/chat/completions", json=chat_body("learning_state_analysis"))
    content, finish = content_of(r)
    assert finish == "stop"
    with pytest.raises(ValueError):
        json.loads(content)


@pytest.mark.parametrize("task", TASKS)
async def test_schema_violation(standin: StandIn, client: httpx.AsyncClient, task: str) -> None:
    standin.add_faults([{"kind": "schema_violation"}])
    r = await client.post("/chat/completions", json=chat_body(task))
    output = json.loads(content_of(r)[0])  # valid JSON …
    with pytest.raises(AppError) as info:  # … that misses a required field
        validate_output(task, "v1", output)
    assert info.value.code == ErrorCode.INVALID_SCHEMA


@pytest.mark.parametrize("task", TASKS)
async def test_foreign_ids(standin: StandIn, client: httpx.AsyncClient, task: str) -> None:
    standin.add_faults([{"kind": "foreign_ids", "foreignId": "blk_elsewhere"}])
    r = await client.post("/chat/completions", json=chat_body(task))
    content = content_of(r)[0]
    validate_output(task, "v1", json.loads(content))  # schema-valid …
    assert "blk_elsewhere" in content  # … but cites an id the snapshot does not have
    allowed = set().union(*snapshot_ids(make_snapshot()).values())
    assert "blk_elsewhere" not in allowed


async def test_content_fault_is_verbatim(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "content", "content": "```json\n{}\n```"}])
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert content_of(r) == ("```json\n{}\n```", "stop")


# ---------------------------------------------------------------- wire faults


async def test_keepalive_forever_defeats_read_timeouts(standin: StandIn) -> None:
    standin.add_faults([{"kind": "keepalive_forever", "intervalMs": 20}])
    received = b""
    timeout = httpx.Timeout(5.0, read=0.5)  # a per-read timeout never fires: blank lines reset it
    async with httpx.AsyncClient(base_url=standin.base_url, headers=AUTH, timeout=timeout) as c:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            async with (
                asyncio.timeout(1.2),
                c.stream("POST", "/chat/completions", json=chat_body("quiz_generation")) as r,
            ):
                assert r.status_code == 200
                async for chunk in r.aiter_raw():
                    received += chunk
        assert time.monotonic() - t0 >= 1.2
    assert received.count(b"\n") >= 5
    assert received.strip() == b""
    assert standin.stats()["byOutcome"] == {"keepalive_forever": 1}
    # the server notices the client left and ends the connection
    await eventually(lambda: standin.stats()["openConnections"] == 0)


async def test_huge_body_is_a_whole_envelope_when_read_to_the_end(
    standin: StandIn, client: httpx.AsyncClient
) -> None:
    standin.add_faults([{"kind": "huge_body", "totalBytes": 300_000}])
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert r.status_code == 200 and r.headers["transfer-encoding"] == "chunked"
    content, finish = content_of(r)
    assert (len(content), set(content), finish) == (300_000, {"a"}, "stop")
    entry = standin.requests()[-1]
    assert entry["outcome"] == "huge_body" and entry["clientClosed"] is False
    assert entry["bytesSent"] == len(r.content)


async def test_huge_body_stops_when_the_client_leaves(standin: StandIn) -> None:
    """500 MB are streamed as the client reads: a client that leaves after 1 MiB
    gets no more, and the stand-in never held more than a chunk of it."""
    standin.add_faults([{"kind": "huge_body"}])
    body = chat_body("quiz_generation")
    async with (
        httpx.AsyncClient(base_url=standin.base_url, headers=AUTH) as c,
        c.stream("POST", "/chat/completions", json=body) as r,
    ):
        got = 0
        async for chunk in r.aiter_raw():
            got += len(chunk)
            if got > 1024 * 1024:
                break
    entry = standin.requests()[-1]
    await eventually(lambda: entry["clientClosed"] is True, limit=5)
    assert entry["bytesSent"] < 64 * 1024 * 1024
    await eventually(lambda: standin.stats()["openConnections"] == 0)


async def test_keepalive_forever_on_the_wire(standin: StandIn) -> None:
    standin.add_faults([{"kind": "keepalive_forever", "intervalMs": 20}])
    reader, writer = await asyncio.open_connection("127.0.0.1", standin.port)
    writer.write(raw_request(chat_body("quiz_generation")))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert await reader.readexactly(len(b"1\r\n\n\r\n") * 3) == b"1\r\n\n\r\n" * 3
    writer.close()
    await writer.wait_closed()


async def test_close_mid_body(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "close_mid_body", "count": 2, "fraction": 0.3}])
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    reader, writer = await asyncio.open_connection("127.0.0.1", standin.port)
    writer.write(raw_request(chat_body("quiz_generation")))
    data = await read_until_eof(reader)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[
            1
        ]
    )
    assert 0 < len(body) < length  # announced the whole body, sent part, closed


async def test_blank_then_close(standin: StandIn, client: httpx.AsyncClient) -> None:
    standin.add_faults([{"kind": "blank_then_close", "count": 2, "lines": 3, "intervalMs": 10}])
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    reader, writer = await asyncio.open_connection("127.0.0.1", standin.port)
    writer.write(raw_request(chat_body("quiz_generation")))
    data = await read_until_eof(reader)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body == b"1\r\n\n\r\n" * 3  # blank lines, no terminating chunk, then EOF


async def test_hang_never_answers(standin: StandIn) -> None:
    standin.add_faults([{"kind": "hang"}])
    async with httpx.AsyncClient(base_url=standin.base_url, headers=AUTH, timeout=10) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/chat/completions", json=chat_body("quiz_generation"), timeout=0.3)
        assert standin.stats()["byOutcome"] == {"hang": 1}
        # other requests are still served
        r = await c.post("/chat/completions", json=chat_body("quiz_generation"))
        assert r.status_code == 200


async def test_stop_ends_hung_connections_quickly() -> None:
    async with run_standin(port=0, faults=[{"kind": "hang"}, {"kind": "keepalive_forever"}]) as s:
        reader1, writer1 = await asyncio.open_connection("127.0.0.1", s.port)
        writer1.write(raw_request(chat_body("quiz_generation")))
        reader2, writer2 = await asyncio.open_connection("127.0.0.1", s.port)
        writer2.write(raw_request(chat_body("quiz_generation")))
        await eventually(lambda: s.stats()["requests"] == 2)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 3.0  # hung connections do not block the stop
    assert await read_until_eof(reader1) == b""
    assert (await read_until_eof(reader2)).startswith(b"HTTP/1.1 200")
    for w in (writer1, writer2):
        w.close()


# ---------------------------------------------------------------- the queue


async def test_faults_are_consumed_in_order_with_match_and_count(
    standin: StandIn, client: httpx.AsyncClient
) -> None:
    standin.add_faults(
        [
            {"kind": "status", "status": 503, "match": "quiz_generation"},
            {"kind": "status", "status": 500, "count": 2},
        ]
    )

    async def status(task: str) -> int:
        return (await client.post("/chat/completions", json=chat_body(task))).status_code

    assert await status("flashcard_generation") == 500  # the quiz-only fault is skipped
    assert await status("quiz_generation") == 503
    assert await status("flashcard_generation") == 500
    assert await status("quiz_generation") == 200
    stats = standin.stats()
    assert stats["requests"] == 4
    assert stats["byOutcome"] == {"status_500": 2, "status_503": 1, "ok": 1}
    assert stats["byTask"] == {"quiz_generation": 2, "flashcard_generation": 2}
    assert stats["pendingFaults"] == 0


async def test_admin_endpoints(standin: StandIn, client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/_standin/faults",
        json=[{"kind": "truncated", "match": "quiz_generation"}, {"kind": "status", "status": 402}],
    )
    assert r.json() == {"added": 2, "queued": 2}
    pending = (await client.get("/_standin/faults")).json()["faults"]
    assert [f["kind"] for f in pending] == ["truncated", "status"]
    assert pending[0]["remaining"] == 1
    r = await client.post("/chat/completions", json=chat_body("quiz_generation"))
    assert content_of(r)[1] == "length"
    stats = (await client.get("/_standin/stats")).json()
    assert stats["byOutcome"] == {"truncated": 1} and stats["pendingFaults"] == 1
    assert (await client.get("/_standin/requests")).json()["requests"][0]["outcome"] == "truncated"
    assert (await client.post("/_standin/reset")).json() == {"reset": True}
    stats = (await client.get("/_standin/stats")).json()
    assert stats["requests"] == 0 and stats["pendingFaults"] == 0
    assert (
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    ).status_code == 200
    # object form: fault rate and delay at run time
    r = await client.post("/_standin/faults", json={"faults": [], "faultRate": 1.0})
    assert r.status_code == 200
    assert (
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    ).status_code == 500
    await client.post("/_standin/reset")
    assert (
        await client.post("/chat/completions", json=chat_body("quiz_generation"))
    ).status_code == 200
    assert (await client.get("/_standin/health")).json() == {"status": "ok"}


@pytest.mark.parametrize(
    "bad",
    [
        [{"kind": "explode"}],
        [{"kind": "status", "status": 700}],
        [{"kind": "status", "count": 0}],
        [{"kind": "status", "surprise": 1}],
        {"faults": [], "faultRate": 2},
        "not json",
    ],
)
async def test_admin_rejects_bad_faults(client: httpx.AsyncClient, bad: Any) -> None:
    content = bad.encode() if isinstance(bad, str) else json.dumps(bad).encode()
    r = await client.post("/_standin/faults", content=content)
    assert r.status_code == 400
    assert "error" in r.json()


async def test_random_fault_rate_and_delay() -> None:
    async with (
        run_standin(port=0, fault_rate=1.0, delay_ms=150) as s,
        httpx.AsyncClient(base_url=s.base_url, headers=AUTH) as c,
    ):
        t0 = time.monotonic()
        r = await c.post("/chat/completions", json=chat_body("quiz_generation"))
        assert time.monotonic() - t0 >= 0.15
        assert r.status_code == 500 and r.json()["error"]["message"] == "Server Error"
        assert s.stats()["byOutcome"] == {"random_500": 1}

    async def sequence() -> list[int]:
        async with (
            run_standin(port=0, fault_rate=0.5, seed=7) as s,
            httpx.AsyncClient(base_url=s.base_url, headers=AUTH) as c,
        ):
            body = chat_body("flashcard_generation")
            return [(await c.post("/chat/completions", json=body)).status_code for _ in range(12)]

    first = await sequence()
    assert first == await sequence()  # seeded: reproducible
    assert set(first) == {200, 500}


async def test_keep_alive_and_chunked_request_body(standin: StandIn) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", standin.port)
    body = json.dumps(chat_body("weak_point_analysis")).encode()
    chunked = (
        b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (body[:100], body[100:]))
        + b"0\r\n\r\n"
    )
    writer.write(
        b"POST /chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a-0001\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    )
    writer.write(raw_request(chat_body("weak_point_analysis"), keep_alive=False))
    data = await read_until_eof(reader)
    writer.close()
    assert data.count(b"HTTP/1.1 200 OK") == 2  # two answers on one connection


async def test_cli_runs_with_scripted_faults() -> None:
    env = {**os.environ, "STANDIN_FAULTS": json.dumps([{"kind": "status", "status": 503}])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "model_standin", "--port", "0",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            line = await proc.stdout.readline()
        base_url = json.loads(line)["baseUrl"]
        async with httpx.AsyncClient(base_url=base_url, headers=AUTH) as c:
            assert (
                await c.post("/chat/completions", json=chat_body("quiz_generation"))
            ).status_code == 503
            assert (
                await c.post("/chat/completions", json=chat_body("quiz_generation"))
            ).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            rc = await proc.wait()
    assert rc == 0
