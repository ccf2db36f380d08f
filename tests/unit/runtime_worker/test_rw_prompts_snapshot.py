"""Prompt templates (protocol, examples valid, truncation rule) and snapshot validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airuntime_common.enums import JOB_TYPES
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.outputs import validate_output
from runtime_worker.prompts import (
    MAX_SNAPSHOT_CHARS,
    reask_messages,
    render_prompt,
    truncate_snapshot,
)
from runtime_worker.snapshot import normalize_numbers, validate_snapshot
from tests.unit.runtime_worker.rw_helpers import snapshot_payload


def snap(job_type: str = "quiz_generation", **overrides: Any) -> Any:
    return validate_snapshot(
        snapshot_payload(job_type, **overrides), schema_version="v1", job_type=job_type
    )


def between(text: str, start: str, end: str) -> Any:
    return json.loads(text.split(start, 1)[1].split(end, 1)[0])


@pytest.mark.parametrize("job_type", JOB_TYPES)
def test_prompt_protocol_and_valid_example(job_type: str) -> None:
    prompt = render_prompt(job_type, snap(job_type), {"count": 2})
    assert prompt.prompt_version == f"{job_type}.v1"
    system, user = (m["content"] for m in prompt.messages)
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert system.splitlines()[0] == f"TASK: {job_type}"
    assert "json" in system
    example = json.loads(system.split("Example output:", 1)[1].strip().splitlines()[0])
    validate_output(job_type, "v1", example)  # the example itself follows the schema
    assert between(user, "<snapshot>", "</snapshot>")["userId"] == "u1"
    assert between(user, "<params>", "</params>") == {"count": 2}
    assert prompt.max_tokens > 0
    assert prompt.dropped == {}


def test_truncation_drops_blocks_from_the_end_first() -> None:
    blocks = [
        {"blockId": f"b{i}", "materialId": "m1", "ordinal": i, "text": "x" * 1000}
        for i in range(100)
    ]
    s = snap(blocks=blocks)
    prompt = render_prompt("quiz_generation", s, {"count": 1})
    user = prompt.messages[1]["content"]
    kept = between(user, "<snapshot>", "</snapshot>")
    assert len(json.dumps(kept, ensure_ascii=False, separators=(",", ":"))) <= MAX_SNAPSHOT_CHARS
    ids = [b["blockId"] for b in kept["blocks"]]
    assert ids == [f"b{i}" for i in range(len(ids))]  # a prefix: dropped from the end
    assert 0 < len(ids) < 100
    assert prompt.dropped == {"blocks": 100 - len(ids)}
    assert "left out from the end" in user
    assert kept["reading"] and kept["knowledgePoints"]  # untouched while blocks sufficed


def test_truncation_then_reading_and_too_large_fails() -> None:
    data = snapshot_payload()
    data["reading"] = [{"blockId": f"b{i}", "dwellSeconds": 1} for i in range(50)]
    limit = len(json.dumps(data, separators=(",", ":"))) // 2
    out, dropped = truncate_snapshot(data, max_chars=limit)
    assert dropped["blocks"] == 2 and dropped["reading"] > 0
    assert len(json.dumps(out, separators=(",", ":"))) <= limit
    assert out["blocks"] == [] and data["blocks"]  # the input is not modified
    with pytest.raises(AppError) as info:
        truncate_snapshot({**data, "stats": {"huge": "y" * 5000}}, max_chars=1000)
    assert info.value.code == ErrorCode.INVALID_SNAPSHOT


def test_reask_never_contains_previous_answer() -> None:
    prompt = render_prompt("flashcard_generation", snap("flashcard_generation"), {"count": 1})
    messages = reask_messages(prompt, "it was cut off at the token limit")
    assert messages[: len(prompt.messages)] == prompt.messages
    assert messages[-1]["role"] == "user"
    assert all(m["role"] != "assistant" for m in messages)


@pytest.mark.parametrize(
    ("mutate", "version"),
    [
        (lambda d: d.pop("userId"), "v1"),
        (lambda d: d.update(jobType="weak_point_analysis"), "v1"),
        (lambda d: d.update(targetType="galaxy"), "v1"),
        (lambda d: d.update(blocks=[{"blockId": "b1"}]), "v1"),
        (lambda d: d.update(blocks="nope"), "v1"),
        (lambda d: None, "v2"),
    ],
)
def test_invalid_snapshot(mutate: Any, version: str) -> None:
    data = snapshot_payload()
    mutate(data)
    with pytest.raises(AppError) as info:
        validate_snapshot(data, schema_version=version, job_type="quiz_generation")
    assert info.value.code == ErrorCode.INVALID_SNAPSHOT


def test_snapshot_of_another_user_refused() -> None:
    with pytest.raises(AppError) as info:
        validate_snapshot(
            snapshot_payload(), schema_version="v1", job_type="quiz_generation", user_id="u2"
        )
    assert info.value.code == ErrorCode.INVALID_SNAPSHOT


def test_snapshot_ignores_unknown_keys_and_null_accuracy() -> None:
    data = snapshot_payload(future={"x": 1})
    data["knowledgePoints"][0].update(attempts=0, correct=0, accuracy=None, lastAttemptAt=None)
    s = validate_snapshot(data, schema_version="v1", job_type="quiz_generation")
    assert s.knowledgePoints[0].accuracy is None


def test_normalize_numbers() -> None:
    assert normalize_numbers({"a": 5.0, "b": [1.5, 2.0], "c": True}) == {
        "a": 5,
        "b": [1.5, 2],
        "c": True,
    }
