"""Chat completions as DeepSeek writes them: the JSON answer with its usage (and
prompt-cache hits), the same as server-sent events (``"stream": true``), and the
content faults that spoil an answer's content rather than the wire.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from model_standin import answers
from model_standin.answers.picking import estimate_tokens
from model_standin.faults import Fault
from model_standin.wire import chunk, head

#: Fault kinds that change an answer's content (the others break the wire).
CONTENT_FAULTS = frozenset(
    {
        "empty_content",
        "truncated",
        "out_of_capacity",
        "invalid_json",
        "schema_violation",
        "foreign_ids",
        "content",
        "close_mid_body",
    }
)


def fault_content(
    fault: Fault, prompt: answers.Prompt, answer: dict[str, Any], content: str
) -> tuple[str, str]:
    """The content and ``finish_reason`` of an answer spoiled by a content fault."""
    if fault.kind == "empty_content":
        return " " * 8, "stop"
    if fault.kind == "truncated":
        return content[: max(1, int(len(content) * 0.6))], "length"
    if fault.kind == "out_of_capacity":
        return content[: int(len(content) * fault.fraction)], "insufficient_system_resource"
    if fault.kind == "invalid_json":
        return content[:-1] + ",}", "stop"
    if fault.kind == "schema_violation":
        return json.dumps(answers.schema_violation(prompt.task, answer), ensure_ascii=False), "stop"
    if fault.kind == "foreign_ids":
        bad = answers.foreign_ids(prompt.task, answer, fault.foreignId)
        return json.dumps(bad, ensure_ascii=False), "stop"
    if fault.kind == "content":
        return fault.content, "stop"
    return content, "stop"  # close_mid_body: the body itself is cut


def within_max_tokens(content: str, finish: str, max_tokens: int) -> tuple[str, str, int]:
    """Content, ``finish_reason`` and completion tokens once ``max_tokens`` applies: a
    longer honest answer is cut, as a model stops writing (``finish_reason: length``)."""
    tokens = estimate_tokens(content)
    if tokens > max_tokens and finish == "stop":
        keep = max(1, int(len(content) * max_tokens / tokens) - 1)
        content = content[:keep]
        return content, "length", min(max_tokens, estimate_tokens(content))
    return content, finish, tokens


def completion(
    model: str,
    messages: list[Any],
    content: str,
    finish: str,
    completion_tokens: int,
    seen_prefixes: set[str],
) -> dict[str, Any]:
    """A ``chat.completion`` object with DeepSeek's usage fields.

    Args:
        seen_prefixes: system messages seen before: one seen again counts as a
            prompt-cache hit (``prompt_cache_hit_tokens``), a new one is added.
    """
    prompt_tokens = 0
    system = ""
    for m in messages:
        if isinstance(m, dict):
            text = answers.content_text(m.get("content"))
            prompt_tokens += estimate_tokens(text) + 4
            if m.get("role") == "system" and not system:
                system = text
    hit = 0
    if system:
        if system in seen_prefixes:
            hit = min(prompt_tokens, estimate_tokens(system) + 4)
        else:
            seen_prefixes.add(system)
    return {
        "id": str(uuid.uuid4()),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": hit},
            "prompt_cache_hit_tokens": hit,
            "prompt_cache_miss_tokens": prompt_tokens - hit,
        },
        "system_fingerprint": "fp_standin",
    }


def stream_events(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as ``chat.completion.chunk`` events: the role, the content in
    pieces of 64 characters, then the ``finish_reason`` with the usage."""
    content: str = payload["choices"][0]["message"]["content"]
    base = {k: payload[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"

    def event(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    pieces = [content[i : i + 64] for i in range(0, len(content), 64)] or [""]
    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": p}) for p in pieces]
    last = event({"content": ""}, payload["choices"][0]["finish_reason"])
    last["usage"] = payload["usage"]
    events.append(last)
    return events


async def send_stream(writer: asyncio.StreamWriter, payload: dict[str, Any]) -> bool:
    """Send a completion as server-sent events (``stream: true``); the connection goes on."""
    writer.write(
        head(
            200,
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Transfer-Encoding", "chunked"),
                ("Cache-Control", "no-cache"),
                ("Connection", "keep-alive"),
            ],
        )
    )
    for ev in stream_events(payload):
        writer.write(chunk(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()))
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def send_cut(writer: asyncio.StreamWriter, payload: dict[str, Any], fraction: float) -> bool:
    """Send the head of a completion and ``fraction`` of its body, then close
    (``close_mid_body``: at least one byte is missing)."""
    raw = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    answer_head = head(
        200,
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(raw))),
            ("Connection", "keep-alive"),
        ],
    )
    part = raw[: int(len(raw) * fraction)]
    if len(part) >= len(raw):
        part = raw[:-1]
    writer.write(answer_head + part)
    await writer.drain()
    return False
