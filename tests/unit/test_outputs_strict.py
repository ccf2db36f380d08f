"""The output models are strict (reference §9.4, case P4), for the worker and job_service
alike: nothing is coerced, and a quiz answer fits its question type and options."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.outputs import validate_output

ANALYSIS: dict[str, Any] = {
    "summary": "Steady progress.",
    "masteryLevel": 0.5,
    "strengths": ["reading"],
    "risks": [],
    "evidence": [{"blockId": "b1", "note": "read twice"}],
}
WEAK: dict[str, Any] = {
    "items": [
        {"knowledgePointId": "kp1", "reason": "1 of 5", "severity": 0.8, "evidenceBlockIds": []}
    ]
}
ACTIONS: dict[str, Any] = {
    "items": [
        {
            "actionType": "review",
            "targetType": "knowledge_point",
            "targetId": "kp1",
            "reason": "low accuracy",
            "priority": 0,
        }
    ]
}


def question(**fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "questionType": "single_choice",
        "stem": "What stops recursion?",
        "options": ["A base case", "A loop", "A stack"],
        "answer": "A base case",
        "explanation": "Block b1 says so.",
        "difficulty": "medium",
        "knowledgePointId": None,
        "sourceBlockIds": ["b1"],
    }
    return {"items": [{**item, **fields}]}


def with_(output: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``output`` with the dotted ``path`` (list indexes as numbers) set."""
    out = copy.deepcopy(output)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return out


def refused(job_type: str, output: Any) -> str:
    with pytest.raises(AppError) as info:
        validate_output(job_type, "v1", output)
    assert info.value.code == ErrorCode.INVALID_SCHEMA
    return info.value.message


LSA = "learning_state_analysis"
QUIZ = "quiz_generation"


@pytest.mark.parametrize(
    ("job_type", "output", "where"),
    [
        (LSA, with_(ANALYSIS, "masteryLevel", "0.5"), "masteryLevel"),
        (LSA, with_(ANALYSIS, "masteryLevel", True), "masteryLevel"),
        (LSA, with_(ANALYSIS, "masteryLevel", None), "masteryLevel"),
        (LSA, with_(ANALYSIS, "summary", 42), "summary"),
        (LSA, with_(ANALYSIS, "strengths", "reading"), "strengths"),
        ("weak_point_analysis", with_(WEAK, "items.0.severity", "0.8"), "severity"),
        ("weak_point_analysis", with_(WEAK, "items.0.knowledgePointId", 7), "knowledgePointId"),
        ("next_action_planning", with_(ACTIONS, "items.0.priority", "3"), "priority"),
        ("next_action_planning", with_(ACTIONS, "items.0.priority", 1.5), "priority"),
        ("next_action_planning", with_(ACTIONS, "items.0.priority", True), "priority"),
        ("next_action_planning", with_(ACTIONS, "items.0.priority", float("inf")), "priority"),
    ],
)
def test_p4_nothing_is_coerced(job_type: str, output: dict[str, Any], where: str) -> None:
    assert where in refused(job_type, output)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"answer": "A while loop"}, "exactly one of its options"),
        ({"answer": ["A base case"]}, "exactly one of its options"),
        ({"answer": "a base case"}, "exactly one of its options"),  # compared exactly
        ({"options": ["A base case"]}, "at least 2 options"),
        ({"options": ["A base case", "A base case"]}, "distinct"),
        ({"questionType": "multiple_choice", "answer": []}, "non-empty list"),
        ({"questionType": "multiple_choice", "answer": "A loop"}, "non-empty list"),
        ({"questionType": "multiple_choice", "answer": ["A loop", "A queue"]}, "each exactly"),
        ({"questionType": "multiple_choice", "answer": ["A loop", "A loop"]}, "distinct"),
        ({"questionType": "true_false", "options": ["True", "False"], "answer": "true"}, "options"),
        ({"questionType": "true_false", "options": ["false", "true"], "answer": "true"}, "options"),
        ({"questionType": "true_false", "options": ["true", "false"], "answer": "yes"}, "answer"),
        ({"questionType": "true_false", "options": ["true", "false"], "answer": True}, "answer"),
        ({"questionType": "true_false", "options": ["正确", "错误"], "answer": "正确"}, "options"),
        ({"questionType": "short_answer", "answer": "A base case"}, "no options"),
        ({"questionType": "short_answer", "options": [], "answer": ["x"]}, "a string"),
        ({"answer": 1}, "answer"),
    ],
)
def test_p4_a_quiz_answer_fits_its_question(fields: dict[str, Any], reason: str) -> None:
    assert reason in refused(QUIZ, question(**fields))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"questionType": "multiple_choice", "answer": ["A loop", "A base case"]},
        {"questionType": "multiple_choice", "answer": ["A base case", "A loop", "A stack"]},
        {"questionType": "true_false", "options": ["true", "false"], "answer": "false"},
        {"questionType": "short_answer", "options": [], "answer": "A base case"},
    ],
)
def test_every_question_type_in_its_shape_is_accepted(fields: dict[str, Any]) -> None:
    validate_output(QUIZ, "v1", question(**fields))


def test_json_numbers_are_numbers_whatever_their_spelling() -> None:
    """An integer is a number; an integral number is an integer (JSON tells them apart
    no more than a protobuf Struct does): the gRPC result path sends ``0`` as ``0.0``."""
    validate_output(LSA, "v1", with_(ANALYSIS, "masteryLevel", 1))
    model = validate_output("next_action_planning", "v1", with_(ACTIONS, "items.0.priority", 2.0))
    assert model.model_dump()["items"][0]["priority"] == 2
    assert type(model.model_dump()["items"][0]["priority"]) is int


@pytest.mark.parametrize(
    ("job_type", "output"),
    [
        (LSA, ANALYSIS),
        ("weak_point_analysis", WEAK),
        ("next_action_planning", ACTIONS),
        (QUIZ, question(questionType="true_false", options=["true", "false"], answer="true")),
        (QUIZ, question(questionType="multiple_choice", answer=["A loop"])),
    ],
)
def test_an_output_is_as_valid_after_a_struct_as_before(
    job_type: str, output: dict[str, Any]
) -> None:
    """What the worker validated, job_service validates the same after the Struct."""
    struct = struct_pb2.Struct()
    struct.update(json.loads(json.dumps(output)))
    validate_output(job_type, "v1", json_format.MessageToDict(struct))
