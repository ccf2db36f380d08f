"""Property test: whatever the snapshot holds, the answer builder never
crashes and never cites an id the snapshot does not have."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airuntime_common.errors import AppError
from airuntime_common.outputs import validate_output
from model_standin.answers import Prompt, build_answer

from .test_standin_answers import TASKS, cited_ids

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=64)
texts = st.one_of(
    st.text(max_size=300),
    st.sampled_from(
        [
            "# Heading\nThe mitochondrion is the powerhouse of the cell. It makes ATP!",
            "光合作用是植物利用光能的过程。叶绿体含有叶绿素！",
            "- item one is long enough\n- item two is also long enough.",
            "",
        ]
    ),
)
numbers = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 50), st.floats(-1, 2), st.text(max_size=3)
)


@st.composite
def snapshots(draw: Any) -> dict[str, Any]:
    material_ids = draw(st.lists(ids, max_size=3, unique=True))
    blocks = [
        {
            "blockId": bid,
            "materialId": draw(st.sampled_from(material_ids)) if material_ids else None,
            "ordinal": draw(numbers),
            "text": draw(texts),
        }
        for bid in draw(st.lists(ids, max_size=6, unique=True))
    ]
    block_ids = [b["blockId"] for b in blocks]
    kps = [
        {
            "knowledgePointId": kid,
            "name": draw(st.text(max_size=500)),
            "blockIds": draw(st.lists(st.one_of(st.sampled_from(block_ids), ids), max_size=4))
            if block_ids
            else draw(st.lists(ids, max_size=2)),
            "attempts": draw(numbers),
            "correct": draw(numbers),
            "accuracy": draw(numbers),
        }
        for kid in draw(st.lists(ids, max_size=4, unique=True))
    ]
    return {
        "userId": draw(st.one_of(st.none(), ids)),
        "targetType": draw(st.sampled_from(["user", "material", "knowledge_point", None])),
        "targetId": draw(st.one_of(st.none(), ids)),
        "materials": [
            {
                "materialId": m,
                "title": draw(st.text(max_size=200)),
                "blockCount": draw(numbers),
                "readBlockCount": draw(numbers),
                "progress": draw(numbers),
            }
            for m in material_ids
        ],
        "blocks": blocks,
        "knowledgePoints": kps,
        "reading": [
            {"blockId": b, "dwellSeconds": draw(numbers)}
            for b in draw(st.lists(st.one_of(st.sampled_from(block_ids), ids), max_size=3))
        ]
        if block_ids
        else [],
        "stats": draw(st.one_of(st.none(), st.just({}))),
    }


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=snapshots(),
    task=st.sampled_from(TASKS),
    params=st.fixed_dictionaries(
        {},
        optional={
            "count": numbers,
            "difficulty": st.sampled_from(["easy", "hard", "weird"]),
            "questionTypes": st.lists(
                st.sampled_from(
                    ["single_choice", "multiple_choice", "true_false", "short_answer", "x"]
                )
            ),
        },
    ),
)
def test_any_snapshot_gives_a_safe_answer(
    snapshot: dict[str, Any], task: str, params: dict[str, Any]
) -> None:
    output = build_answer(Prompt(task=task, snapshot=snapshot, params=params))
    try:
        validate_output(task, "v1", output)
    except AppError:
        # only the generation types may fail, and only by having nothing to say
        assert task in ("quiz_generation", "flashcard_generation") and output["items"] == []
        return
    allowed = {
        "block": {b["blockId"] for b in snapshot["blocks"]},
        "kp": {k["knowledgePointId"] for k in snapshot["knowledgePoints"]},
        "material": {m["materialId"] for m in snapshot["materials"]},
        "user": {snapshot["userId"]} if snapshot["userId"] else set(),
    }
    for kind, cited in cited_ids(task, output).items():
        assert cited <= allowed[kind], (kind, cited - allowed[kind])
