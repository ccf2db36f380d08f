"""The stand-in answers the worker's real prompts (runtime_worker.prompts) for
the shipped study documents: schema-valid, within the worker's max_tokens,
citing only snapshot ids."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from airuntime_common.outputs import validate_output

from .conftest import snapshot_ids
from .test_standin_answers import TASKS, cited_ids

prompts = pytest.importorskip("runtime_worker.prompts")
snapshot_mod = pytest.importorskip("runtime_worker.snapshot")

DOCS = Path(__file__).resolve().parents[3] / "demo" / "documents"


def document_snapshot(path: Path, job_type: str) -> dict[str, Any]:
    """A snapshot of one document split into paragraph blocks, one KP per ## section."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", path.read_text("utf-8")) if p.strip()]
    blocks: list[dict[str, Any]] = [
        {"blockId": f"blk_{i:03d}", "materialId": "mat_doc", "ordinal": i, "text": p}
        for i, p in enumerate(paragraphs)
    ]
    kps: list[dict[str, Any]] = []
    for b in blocks:
        if b["text"].startswith("## "):
            kps.append(
                {
                    "knowledgePointId": f"kp_{len(kps):02d}",
                    "name": b["text"][3:].splitlines()[0],
                    "materialId": "mat_doc",
                    "blockIds": [],
                    "attempts": len(kps) % 4,
                    "correct": len(kps) % 2,
                    "accuracy": (len(kps) % 2) / (len(kps) % 4) if len(kps) % 4 else None,
                    "lastAttemptAt": None,
                }
            )
        elif kps:
            kps[-1]["blockIds"].append(b["blockId"])
    read = blocks[: len(blocks) // 3]
    return {
        "jobType": job_type,
        "targetType": "material",
        "targetId": "mat_doc",
        "userId": "usr_demo",
        "params": {},
        "materials": [
            {
                "materialId": "mat_doc",
                "title": path.stem,
                "blockCount": len(blocks),
                "readBlockCount": len(read),
                "progress": round(len(read) / len(blocks), 4),
            }
        ],
        "blocks": blocks,
        "knowledgePoints": kps,
        "reading": [
            {
                "blockId": b["blockId"],
                "materialId": "mat_doc",
                "dwellSeconds": 30,
                "lastReadAt": None,
            }
            for b in read
        ],
        "stats": {},
    }


@pytest.mark.parametrize("doc", ["photosynthesis.md", "binary-search.md", "photosynthesis-zh.md"])
@pytest.mark.parametrize("task", TASKS)
async def test_worker_prompt_for_shipped_document(
    client: httpx.AsyncClient, doc: str, task: str
) -> None:
    raw = document_snapshot(DOCS / doc, task)
    payload = snapshot_mod.SnapshotPayload.model_validate(raw)
    params = {"count": 10, "difficulty": "medium", "questionTypes": ["single_choice", "true_false"]}
    rendered = prompts.render_prompt(task, payload, params)
    r = await client.post(
        "/chat/completions",
        json={
            "model": "deepseek-chat",
            "messages": rendered.messages,
            "max_tokens": rendered.max_tokens,
            "response_format": {"type": "json_object"},
            "stream": False,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    output = json.loads(choice["message"]["content"])
    validate_output(task, "v1", output)
    if task in ("quiz_generation", "flashcard_generation"):
        assert len(output["items"]) == 10
    allowed = snapshot_ids(raw)
    for kind, ids in cited_ids(task, output).items():
        assert ids <= allowed[kind]
