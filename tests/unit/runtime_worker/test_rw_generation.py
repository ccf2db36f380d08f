"""Validation and the single in-attempt re-ask (cases D1, D2), through the real
provider against a scripted HTTP server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from airuntime_common.errors import BREAKER_FAILURE_CODES, ErrorCode, is_retryable
from runtime_worker.generation import Invocation, generate, parse_content
from runtime_worker.prompts import render_prompt
from runtime_worker.providers.base import ModelError
from runtime_worker.providers.classify import Fault
from runtime_worker.providers.deepseek import DeepSeekProvider
from runtime_worker.snapshot import validate_snapshot
from tests.unit.runtime_worker.rw_helpers import (
    QUIZ_OUTPUT,
    RawHttpServer,
    envelope,
    snapshot_payload,
    write_response,
)

VALID = json.dumps(QUIZ_OUTPUT)
TRUNCATED = '{"items": [{"questionType": "single_choice", "stem": "What sto'


async def scripted(raw_http: Any, answers: list[tuple[str | None, str]]) -> RawHttpServer:
    """Answer call i with ``answers[i]`` = (content, finish_reason)."""
    queue = list(answers)

    async def respond(req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        content, finish = queue.pop(0)
        await write_response(w, 200, envelope(content, finish, rid=f"req-{len(queue)}"))

    server: RawHttpServer = await raw_http(respond)
    return server


async def run_generate(
    server: RawHttpServer, *, budget: float = 10.0, allow_reask: bool = True
) -> tuple[dict[str, Any] | ModelError, list[Invocation]]:
    snap = validate_snapshot(snapshot_payload(), schema_version="v1", job_type="quiz_generation")
    prompt = render_prompt("quiz_generation", snap, {"count": 1})
    invocations: list[Invocation] = []
    provider = DeepSeekProvider()
    try:
        result: dict[str, Any] | ModelError = await generate(
            provider,
            job_type="quiz_generation",
            prompt=prompt,
            model="deepseek-chat",
            api_key="sk-abcdefgh12345",
            base_url=server.base_url,
            job_deadline=time.monotonic() + budget,
            max_call_seconds=5.0,
            invocations=invocations,
            allow_reask=allow_reask,
        )
    except ModelError as exc:
        result = exc
    finally:
        await provider.aclose()
    return result, invocations


async def test_valid_answer_one_call(raw_http: Any) -> None:
    server = await scripted(raw_http, [(VALID, "stop")])
    result, invocations = await run_generate(server)
    assert result == QUIZ_OUTPUT
    assert len(server.requests) == 1
    assert [i.outcome for i in invocations] == ["succeeded"]
    assert invocations[0].usage.cache_hit_tokens == 64


async def test_d1_blank_then_reask_succeeds(raw_http: Any) -> None:
    server = await scripted(raw_http, [("   ", "stop"), (VALID, "stop")])
    result, invocations = await run_generate(server)
    assert result == QUIZ_OUTPUT
    assert len(server.requests) == 2
    assert [(i.outcome, i.error_code) for i in invocations] == [
        ("failed", ErrorCode.INVALID_SCHEMA),
        ("succeeded", None),
    ]


async def test_d1_blank_twice_is_invalid_schema_not_an_outage(raw_http: Any) -> None:
    server = await scripted(raw_http, [("   ", "stop"), ("", "stop"), (VALID, "stop")])
    result, invocations = await run_generate(server)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.INVALID_SCHEMA
    assert not is_retryable(result.code)
    assert result.code not in BREAKER_FAILURE_CODES
    assert len(server.requests) == 2  # at most ONE re-ask
    assert len(invocations) == 2


async def test_d2_truncated_never_fed_back(raw_http: Any) -> None:
    server = await scripted(raw_http, [(TRUNCATED, "length"), (TRUNCATED, "length")])
    result, _ = await run_generate(server)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.INVALID_SCHEMA
    assert len(server.requests) == 2
    reask = json.dumps(server.requests[1]["json"]["messages"], ensure_ascii=False)
    assert "What sto" not in reask
    assert "cut off" in reask
    # the re-ask keeps the original prompt protocol
    assert server.requests[1]["json"]["messages"][0]["content"].startswith(
        "TASK: quiz_generation\n"
    )


async def test_schema_mismatch_then_valid(raw_http: Any) -> None:
    server = await scripted(raw_http, [('{"items": [{"stem": "x"}]}', "stop"), (VALID, "stop")])
    result, _ = await run_generate(server)
    assert result == QUIZ_OUTPUT
    reask = server.requests[1]["json"]["messages"][-1]["content"]
    assert "items.0" in reask


async def test_no_reask_when_disabled(raw_http: Any) -> None:
    server = await scripted(raw_http, [("  ", "stop"), (VALID, "stop")])
    result, _ = await run_generate(server, allow_reask=False)
    assert isinstance(result, ModelError)
    assert len(server.requests) == 1


async def test_no_budget_left_is_job_timeout_without_a_call(raw_http: Any) -> None:
    server = await scripted(raw_http, [(VALID, "stop")])
    result, invocations = await run_generate(server, budget=-1)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.JOB_TIMEOUT
    assert server.requests == []
    assert invocations == []


def test_single_code_fence_accepted() -> None:
    fenced = "```json\n" + VALID + "\n```"
    assert parse_content("quiz_generation", fenced, "stop") == QUIZ_OUTPUT
    assert parse_content("quiz_generation", "```\n" + VALID + "```", "stop") == QUIZ_OUTPUT


@pytest.mark.parametrize(
    ("content", "finish", "fault"),
    [
        ("  \n ", "stop", Fault.BLANK_CONTENT),
        (VALID, "length", Fault.TRUNCATED),
        ("not json", "stop", Fault.SCHEMA_MISMATCH),
        ("[1, 2]", "stop", Fault.SCHEMA_MISMATCH),
        ('{"items": []}', "stop", Fault.SCHEMA_MISMATCH),  # quiz needs >= 1 item
        ("```json\n" + VALID + "\n```\n```json\n{}\n```", "stop", Fault.SCHEMA_MISMATCH),
    ],
)
def test_content_faults(content: str, finish: str, fault: Fault) -> None:
    from runtime_worker.generation import ContentFault

    with pytest.raises(ContentFault) as info:
        parse_content("quiz_generation", content, finish)
    assert info.value.fault is fault


def _quiz_with(**fields: Any) -> str:
    return json.dumps({"items": [{**QUIZ_OUTPUT["items"][0], **fields}]})


@pytest.mark.parametrize(
    ("job_type", "content"),
    [
        (
            "learning_state_analysis",
            json.dumps(
                {
                    "summary": "s",
                    "masteryLevel": "0.5",
                    "strengths": [],
                    "risks": [],
                    "evidence": [],
                }
            ),
        ),
        ("quiz_generation", _quiz_with(answer="A while loop")),
        ("quiz_generation", _quiz_with(questionType="true_false", answer=True)),
    ],
)
def test_p4_the_worker_refuses_coerced_or_misfitting_outputs(job_type: str, content: str) -> None:
    from runtime_worker.generation import ContentFault

    with pytest.raises(ContentFault) as info:
        parse_content(job_type, content, "stop")
    assert info.value.fault is Fault.SCHEMA_MISMATCH


async def test_p4_an_answer_outside_its_options_twice_is_invalid_schema(raw_http: Any) -> None:
    """Not among its options: re-asked once with the reason, then INVALID_SCHEMA; never
    submitted (job_service would refuse it the same way)."""
    bad = _quiz_with(answer="A while loop")
    server = await scripted(raw_http, [(bad, "stop"), (bad, "stop")])
    result, invocations = await run_generate(server)
    assert isinstance(result, ModelError)
    assert result.code == ErrorCode.INVALID_SCHEMA
    assert len(server.requests) == 2 and len(invocations) == 2
    reask = server.requests[1]["json"]["messages"][-1]["content"]
    assert "exactly one of its options" in reask
    assert "A while loop" not in reask  # the previous answer is never fed back


def test_more_items_than_the_count_submit_only_the_first_count() -> None:
    """reference §9.4: a result with more items than the job's ``count`` keeps the first
    ``count``; the rest are neither validated nor submitted (21 questions for 20 are
    not a schema violation)."""
    item = QUIZ_OUTPUT["items"][0]
    many = [{**item, "stem": f"Question {n}?"} for n in range(21)]
    many[20]["answer"] = "not an option"  # past the count: never judged
    output = parse_content("quiz_generation", json.dumps({"items": many}), "stop", max_items=20)
    assert [q["stem"] for q in output["items"]] == [f"Question {n}?" for n in range(20)]
    from runtime_worker.generation import ContentFault

    with pytest.raises(ContentFault, match="at most 20"):
        parse_content("quiz_generation", json.dumps({"items": many}), "stop")
    fewer = parse_content("quiz_generation", json.dumps({"items": many[:2]}), "stop", max_items=5)
    assert len(fewer["items"]) == 2
