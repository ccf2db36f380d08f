"""Fixtures for the DeepSeek stand-in tests: a running stand-in, a hand-built
snapshot (payload v1) with English and Chinese blocks, and request builders
following the prompt protocol."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from model_standin import StandIn, run_standin

USER_ID = "usr_alice"


def make_snapshot() -> dict[str, Any]:
    """A snapshot payload v1 with two materials (English, Chinese)."""
    blocks = [
        {
            "blockId": "blk_en_1",
            "materialId": "mat_en",
            "ordinal": 0,
            "text": "# How photosynthesis works\nPhotosynthesis is the process by which plants, "
            "algae and some bacteria turn light energy into chemical energy. "
            "It takes place mainly in the chloroplasts of leaf cells.",
        },
        {
            "blockId": "blk_en_2",
            "materialId": "mat_en",
            "ordinal": 1,
            "text": "## The light reactions\nThe light reactions happen in the thylakoid membranes. "
            "Chlorophyll absorbs red and blue light and passes the energy to reaction centres. "
            "Water molecules are split, releasing oxygen as a by-product.",
        },
        {
            "blockId": "blk_en_3",
            "materialId": "mat_en",
            "ordinal": 2,
            "text": "## The Calvin cycle\n- The Calvin cycle runs in the stroma.\n"
            "- The enzyme rubisco fixes carbon dioxide onto ribulose bisphosphate.\n"
            "- ATP and NADPH from the light reactions power the cycle.",
        },
        {
            "blockId": "blk_zh_1",
            "materialId": "mat_zh",
            "ordinal": 0,
            "text": "# 光合作用简介\n光合作用是绿色植物利用光能把二氧化碳和水合成有机物的过程。"
            "这个过程主要发生在叶绿体中！叶绿素能够吸收红光和蓝光。",
        },
        {
            "blockId": "blk_zh_2",
            "materialId": "mat_zh",
            "ordinal": 1,
            "text": "光反应在类囊体膜上进行，产生氧气、ATP和NADPH。暗反应在叶绿体基质中进行，"
            "也叫卡尔文循环？它利用光反应的产物固定二氧化碳。",
        },
    ]
    return {
        "jobType": "quiz_generation",
        "targetType": "user",
        "targetId": USER_ID,
        "userId": USER_ID,
        "params": {},
        "materials": [
            {
                "materialId": "mat_en",
                "title": "Photosynthesis",
                "blockCount": 3,
                "readBlockCount": 3,
                "progress": 1.0,
            },
            {
                "materialId": "mat_zh",
                "title": "光合作用简介",
                "blockCount": 2,
                "readBlockCount": 0,
                "progress": 0.0,
            },
        ],
        "blocks": blocks,
        "knowledgePoints": [
            {
                "knowledgePointId": "kp_light",
                "name": "Light reactions",
                "materialId": "mat_en",
                "blockIds": ["blk_en_2"],
                "attempts": 10,
                "correct": 9,
                "accuracy": 0.9,
                "lastAttemptAt": "2026-11-29T10:00:00.000Z",
            },
            {
                "knowledgePointId": "kp_calvin",
                "name": "Calvin cycle",
                "materialId": "mat_en",
                "blockIds": ["blk_en_3", "blk_missing"],
                "attempts": 5,
                "correct": 1,
                "accuracy": 0.2,
                "lastAttemptAt": "2026-11-29T11:00:00.000Z",
            },
            {
                "knowledgePointId": "kp_zh",
                "name": "叶绿体",
                "materialId": "mat_zh",
                "blockIds": ["blk_zh_1", "blk_zh_2"],
                "attempts": 0,
                "correct": 0,
                "accuracy": None,
                "lastAttemptAt": None,
            },
        ],
        "reading": [
            {
                "blockId": "blk_en_1",
                "materialId": "mat_en",
                "dwellSeconds": 120,
                "lastReadAt": "2026-11-29T09:00:00.000Z",
            },
            {
                "blockId": "blk_en_2",
                "materialId": "mat_en",
                "dwellSeconds": 300,
                "lastReadAt": "2026-11-29T09:05:00.000Z",
            },
        ],
        "stats": {"materials": 2, "blocksRead": 2},
    }


def chinese_snapshot() -> dict[str, Any]:
    """Only the Chinese material and its knowledge point."""
    snap = make_snapshot()
    snap["materials"] = [m for m in snap["materials"] if m["materialId"] == "mat_zh"]
    snap["blocks"] = [b for b in snap["blocks"] if b["materialId"] == "mat_zh"]
    snap["knowledgePoints"] = [k for k in snap["knowledgePoints"] if k["materialId"] == "mat_zh"]
    snap["reading"] = []
    return snap


def empty_snapshot() -> dict[str, Any]:
    """A user with no materials or learning data."""
    return {
        "jobType": "learning_state_analysis",
        "targetType": "user",
        "targetId": USER_ID,
        "userId": USER_ID,
        "params": {},
        "materials": [],
        "blocks": [],
        "knowledgePoints": [],
        "reading": [],
        "stats": {},
    }


def snapshot_ids(snapshot: dict[str, Any]) -> dict[str, set[str]]:
    """The ids an answer may cite."""
    return {
        "block": {b["blockId"] for b in snapshot["blocks"]},
        "kp": {k["knowledgePointId"] for k in snapshot["knowledgePoints"]},
        "material": {m["materialId"] for m in snapshot["materials"]},
        "user": {snapshot["userId"]},
    }


def chat_body(
    task: str,
    snapshot: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat request following the prompt protocol."""
    snap = make_snapshot() if snapshot is None else snapshot
    return {
        "model": "deepseek-chat",
        "messages": [
            {
                "role": "system",
                "content": f"TASK: {task}\nYou are a tutor. Reply with a json object.",
            },
            {
                "role": "user",
                "content": "The learner's data snapshot (JSON):\n<snapshot>\n"
                + json.dumps(snap, ensure_ascii=False)
                + "\n</snapshot>\nThe job parameters (JSON):\n<params>\n"
                + json.dumps(params or {})
                + "\n</params>\nReply with the json object only.",
            },
        ],
        "response_format": {"type": "json_object"},
        "max_tokens": 4096,
        "temperature": 0.2,
        **extra,
    }


AUTH = {"Authorization": "Bearer sk-test-key-1234"}


@pytest.fixture
async def standin() -> AsyncIterator[StandIn]:
    async with run_standin(port=0) as server:
        yield server


@pytest.fixture
async def client(standin: StandIn) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=standin.base_url, headers=AUTH, timeout=10) as c:
        yield c
