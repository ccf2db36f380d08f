"""The stand-in's answers: DeepSeek's envelope, schema-valid output citing only
snapshot ids, prompt-protocol errors, authentication, usage accounting."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from airuntime_common.errors import AppError
from airuntime_common.outputs import validate_output
from model_standin import StandIn
from model_standin.answers import is_cjk, parse_prompt, split_sentences

from .conftest import (
    USER_ID,
    chat_body,
    chinese_snapshot,
    empty_snapshot,
    make_snapshot,
    snapshot_ids,
)

TASKS = [
    "learning_state_analysis",
    "weak_point_analysis",
    "next_action_planning",
    "quiz_generation",
    "flashcard_generation",
]


def cited_ids(task: str, output: dict[str, Any]) -> dict[str, set[str]]:
    """Every id an output cites, by kind."""
    cited: dict[str, set[str]] = {"block": set(), "kp": set(), "material": set(), "user": set()}
    if task == "learning_state_analysis":
        for ev in output["evidence"]:
            if ev.get("blockId"):
                cited["block"].add(ev["blockId"])
            if ev.get("knowledgePointId"):
                cited["kp"].add(ev["knowledgePointId"])
        return cited
    for item in output["items"]:
        cited["block"].update(item.get("sourceBlockIds", []))
        cited["block"].update(item.get("evidenceBlockIds", []))
        if item.get("knowledgePointId"):
            cited["kp"].add(item["knowledgePointId"])
        if "targetType" in item:
            kind = {"knowledge_point": "kp", "material": "material", "user": "user"}[
                item["targetType"]
            ]
            cited[kind].add(item["targetId"])
    return cited


async def ask(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    r = await client.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    envelope = r.json()
    return envelope, json.loads(envelope["choices"][0]["message"]["content"])


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("snap", [make_snapshot, chinese_snapshot], ids=["mixed", "chinese"])
async def test_answer_is_schema_valid_and_cites_only_snapshot_ids(
    client: httpx.AsyncClient, task: str, snap: Any
) -> None:
    snapshot = snap()
    params = {"count": 6, "difficulty": "hard", "questionTypes": ["single_choice", "true_false"]}
    _, output = await ask(client, chat_body(task, snapshot, params))
    validate_output(task, "v1", output)
    allowed = snapshot_ids(snapshot)
    cited = cited_ids(task, output)
    for kind, ids in cited.items():
        assert ids <= allowed[kind], (kind, ids - allowed[kind])
    assert "blk_missing" not in cited["block"]  # a KP's link to a block outside the snapshot
    assert sum(len(v) for v in cited.values()) > 0


@pytest.mark.parametrize("task", TASKS)
async def test_envelope_matches_deepseek(client: httpx.AsyncClient, task: str) -> None:
    envelope, _ = await ask(client, chat_body(task))
    assert set(envelope) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    }
    assert envelope["object"] == "chat.completion"
    assert envelope["model"] == "deepseek-chat"
    assert envelope["system_fingerprint"] == "fp_standin"
    choice = envelope["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert choice["message"]["role"] == "assistant"
    usage = envelope["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (
        usage["prompt_cache_hit_tokens"] + usage["prompt_cache_miss_tokens"]
        == usage["prompt_tokens"]
    )


async def test_answers_are_deterministic_and_follow_v1_path(client: httpx.AsyncClient) -> None:
    body = chat_body("quiz_generation", params={"count": 4})
    _, first = await ask(client, body)
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == first


async def test_repeated_system_prompt_is_a_cache_hit(client: httpx.AsyncClient) -> None:
    env1, _ = await ask(client, chat_body("weak_point_analysis"))
    env2, _ = await ask(client, chat_body("weak_point_analysis", chinese_snapshot()))
    assert env1["usage"]["prompt_cache_hit_tokens"] == 0
    assert env2["usage"]["prompt_cache_hit_tokens"] > 0
    assert env2["usage"]["prompt_cache_miss_tokens"] > 0


async def test_quiz_count_types_difficulty_and_answers(client: httpx.AsyncClient) -> None:
    types = ["single_choice", "multiple_choice", "true_false", "short_answer"]
    params = {"count": 8, "difficulty": "easy", "questionTypes": types}
    _, output = await ask(client, chat_body("quiz_generation", params=params))
    items = output["items"]
    assert len(items) == 8
    assert len({q["stem"] for q in items}) == 8
    assert {q["questionType"] for q in items} == set(types)
    assert all(q["difficulty"] == "easy" for q in items)
    texts = " ".join(b["text"] for b in make_snapshot()["blocks"])
    for q in items:
        if q["questionType"] == "single_choice":
            assert q["answer"] in q["options"] and len(q["options"]) == 4
            assert "____" in q["stem"]
        elif q["questionType"] == "multiple_choice":
            assert isinstance(q["answer"], list) and set(q["answer"]) <= set(q["options"])
            assert all(a in texts for a in q["answer"])  # true options are real sentences
        elif q["questionType"] == "true_false":
            assert q["options"] == ["true", "false"] and q["answer"] in q["options"]
        else:
            assert q["options"] == [] and q["answer"] in texts
        # the explanation quotes the cited block
        block = next(b for b in make_snapshot()["blocks"] if b["blockId"] == q["sourceBlockIds"][0])
        assert any(q["explanation"].endswith(s) for s in split_sentences(block["text"]))


async def test_quiz_defaults_to_five_single_choice_medium(client: httpx.AsyncClient) -> None:
    _, output = await ask(client, chat_body("quiz_generation", params={}))
    assert len(output["items"]) == 5
    assert {q["questionType"] for q in output["items"]} == {"single_choice"}
    assert {q["difficulty"] for q in output["items"]} == {"medium"}


async def test_flashcards_from_chinese_blocks(client: httpx.AsyncClient) -> None:
    snapshot = chinese_snapshot()
    _, output = await ask(client, chat_body("flashcard_generation", snapshot, {"count": 5}))
    items = output["items"]
    assert len(items) == 5
    assert len({c["front"] for c in items}) == 5
    texts = {b["blockId"]: b["text"] for b in snapshot["blocks"]}
    for card in items:
        assert card["back"] in texts[card["sourceBlockIds"][0]]
        assert card["back"][-1] in "。！？；"  # split on CJK sentence ends
        assert card["knowledgePointId"] == "kp_zh"
    assert items[0]["front"] == "什么是光合作用？"


async def test_quiz_on_knowledge_point_target_uses_its_blocks(client: httpx.AsyncClient) -> None:
    snapshot = make_snapshot()
    snapshot["targetType"] = "knowledge_point"
    snapshot["targetId"] = "kp_calvin"
    _, output = await ask(client, chat_body("quiz_generation", snapshot, {"count": 2}))
    assert {b for q in output["items"] for b in q["sourceBlockIds"]} == {"blk_en_3"}


async def test_analyses_reflect_the_data(client: httpx.AsyncClient) -> None:
    _, analysis = await ask(client, chat_body("learning_state_analysis"))
    assert 0 < analysis["masteryLevel"] < 1
    assert any("Light reactions" in s for s in analysis["strengths"])
    assert any("Calvin cycle" in r for r in analysis["risks"])
    _, weak = await ask(client, chat_body("weak_point_analysis"))
    assert [w["knowledgePointId"] for w in weak["items"]] == ["kp_calvin", "kp_zh"]
    assert weak["items"][0]["severity"] == pytest.approx(0.8)
    assert weak["items"][0]["evidenceBlockIds"] == ["blk_en_3"]
    _, plan = await ask(client, chat_body("next_action_planning"))
    actions = [(i["actionType"], i["targetId"]) for i in plan["items"]]
    assert ("review", "kp_calvin") in actions and ("read", "mat_zh") in actions
    assert [i["priority"] for i in plan["items"]] == list(range(len(plan["items"])))


async def test_chinese_material_gets_chinese_prose(client: httpx.AsyncClient) -> None:
    _, analysis = await ask(client, chat_body("learning_state_analysis", chinese_snapshot()))
    assert is_cjk(analysis["summary"])


@pytest.mark.parametrize(
    "task", ["learning_state_analysis", "weak_point_analysis", "next_action_planning"]
)
async def test_empty_snapshot_still_valid_for_analyses(
    client: httpx.AsyncClient, task: str
) -> None:
    _, output = await ask(client, chat_body(task, empty_snapshot()))
    validate_output(task, "v1", output)
    if task == "next_action_planning":
        assert output["items"][0]["targetType"] == "user"
        assert output["items"][0]["targetId"] == USER_ID


async def test_generation_without_text_is_rejected_by_the_schema(client: httpx.AsyncClient) -> None:
    _, output = await ask(client, chat_body("quiz_generation", empty_snapshot()))
    with pytest.raises(AppError):
        validate_output("quiz_generation", "v1", output)


async def test_unknown_task_is_400_with_deepseek_error_body(client: httpx.AsyncClient) -> None:
    r = await client.post("/chat/completions", json=chat_body("poetry_generation"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "poetry_generation" in err["message"]


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        (
            lambda b: b["messages"].__setitem__(0, {"role": "system", "content": "no task line"}),
            400,
        ),
        (lambda b: b["messages"][1].__setitem__("content", "no snapshot here"), 400),
        (lambda b: b.__setitem__("model", "gpt-4o"), 400),
        (lambda b: b.pop("model"), 422),
        (lambda b: b.__setitem__("messages", []), 422),
    ],
)
async def test_malformed_requests(client: httpx.AsyncClient, mutate: Any, status: int) -> None:
    body = chat_body("quiz_generation")
    mutate(body)
    r = await client.post("/chat/completions", json=body)
    assert r.status_code == status
    assert "error" in r.json()


async def test_body_that_is_not_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/chat/completions", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400


async def test_invalid_key_gets_deepseek_401(standin: StandIn) -> None:
    async with httpx.AsyncClient(base_url=standin.base_url) as c:
        r = await c.post(
            "/chat/completions",
            json=chat_body("quiz_generation"),
            headers={"Authorization": "Bearer sk-invalid-0000abcd"},
        )
        assert r.status_code == 401
        assert r.json() == {
            "error": {
                "message": "Authentication Fails, Your api key: ****abcd is invalid",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_request_error",
            }
        }
        r = await c.post("/chat/completions", json=chat_body("quiz_generation"))
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    assert standin.stats()["byOutcome"]["auth_error"] == 2


async def test_request_log_masks_the_key_and_keeps_messages(
    standin: StandIn, client: httpx.AsyncClient
) -> None:
    await ask(client, chat_body("flashcard_generation"))
    (entry,) = standin.requests()
    assert entry["keyMask"] == "****1234"
    assert entry["task"] == "flashcard_generation" and entry["outcome"] == "ok"
    assert "sk-test-key-1234" not in json.dumps(entry)
    assert entry["messages"][0]["content"].startswith("TASK: flashcard_generation")


async def test_small_max_tokens_truncates_like_deepseek(client: httpx.AsyncClient) -> None:
    r = await client.post("/chat/completions", json=chat_body("quiz_generation", max_tokens=20))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])
    assert r.json()["usage"]["completion_tokens"] <= 20


async def test_streaming_answer_is_server_sent_events(client: httpx.AsyncClient) -> None:
    r = await client.post("/chat/completions", json=chat_body("flashcard_generation", stream=True))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    validate_output("flashcard_generation", "v1", json.loads(content))
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "usage" in chunks[-1]


async def test_models_endpoint(client: httpx.AsyncClient) -> None:
    r = await client.get("/models")
    assert "deepseek-chat" in {m["id"] for m in r.json()["data"]}


def test_sentence_split_handles_markdown_and_cjk() -> None:
    text = "# Title\nFirst sentence is here. Second one is here!\n- A list item that is long.\n光合作用很重要。叶绿体吸收光能！对吗？"
    assert split_sentences(text) == [
        "First sentence is here.",
        "Second one is here!",
        "A list item that is long.",
        "光合作用很重要。",
        "叶绿体吸收光能！",
    ]  # "对吗？" is too short to be a sentence


def test_parse_prompt_accepts_a_wrapped_snapshot() -> None:
    body = chat_body("weak_point_analysis", {"payload": make_snapshot(), "schemaVersion": "v1"})
    prompt = parse_prompt(body["messages"])
    assert prompt.task == "weak_point_analysis"
    assert prompt.snapshot["userId"] == USER_ID
    assert re.fullmatch(r"[a-z_]+", prompt.task)
