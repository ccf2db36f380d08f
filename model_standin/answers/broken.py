"""Answers made wrong on purpose, for the stand-in's scripted faults: valid JSON
that misses a required field of the task's schema (:func:`schema_violation`), or
a schema-valid answer citing an id absent from the snapshot (:func:`foreign_ids`).
"""

from __future__ import annotations

import json
from typing import Any


def schema_violation(task: str, answer: dict[str, Any]) -> dict[str, Any]:
    """Valid JSON that misses a required field of the task's v1 schema."""
    out: dict[str, Any] = json.loads(json.dumps(answer))
    if task == "learning_state_analysis":
        out.pop("summary", None)
        return out
    items = out.get("items") or []
    if items:
        required = {
            "weak_point_analysis": "knowledgePointId",
            "next_action_planning": "targetId",
            "quiz_generation": "stem",
            "flashcard_generation": "back",
        }.get(task, next(iter(items[0]), ""))
        items[0].pop(required, None)
        return out
    return {"results": []}


def foreign_ids(task: str, answer: dict[str, Any], foreign: str) -> dict[str, Any]:
    """A schema-valid answer that cites an id absent from the snapshot.

    Args:
        task: the job type.
        answer: the honest answer.
        foreign: the id to cite.
    """
    out: dict[str, Any] = json.loads(json.dumps(answer))
    if task == "learning_state_analysis":
        out["evidence"] = [{"blockId": foreign, "note": "see this block"}, *out["evidence"]][:50]
    elif task == "weak_point_analysis":
        if out["items"]:
            out["items"][0]["evidenceBlockIds"] = [foreign, *out["items"][0]["evidenceBlockIds"]][
                :50
            ]
        else:
            out["items"] = [
                {
                    "knowledgePointId": foreign,
                    "reason": "Low accuracy.",
                    "severity": 0.9,
                    "evidenceBlockIds": [foreign],
                }
            ]
    elif task == "next_action_planning":
        out["items"].insert(
            0,
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": foreign,
                "reason": "Read this material.",
                "priority": 0,
            },
        )
        out["items"] = out["items"][:50]
    else:
        if out["items"]:
            out["items"][0]["sourceBlockIds"] = [foreign]
        else:
            item: dict[str, Any] = {
                "front": "What is this?",
                "back": "Something.",
                "sourceBlockIds": [foreign],
            }
            if task == "quiz_generation":
                item = {
                    "questionType": "short_answer",
                    "stem": "What is this?",
                    "options": [],
                    "answer": "Something.",
                    "explanation": "Made up.",
                    "difficulty": "medium",
                    "sourceBlockIds": [foreign],
                }
            out["items"] = [item]
    return out
