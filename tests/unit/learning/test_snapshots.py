"""Snapshot payload v1 per job type and target type; the block budget rule (reference §5)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from airuntime_common.canonical import content_hash
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.jobtypes import ANALYSIS_SNAPSHOT, GENERATION_SNAPSHOT
from job_service import learning
from job_service.learning import plans, snapshots
from job_service.learning.payload import BlockMeta, select_blocks, spread_order
from job_service.learning.tables import AiSnapshot

from .conftest import Tx

PAYLOAD_KEYS = {
    "jobType",
    "targetType",
    "targetId",
    "userId",
    "params",
    "materials",
    "blocks",
    "knowledgePoints",
    "reading",
    "stats",
}


async def _setup(tx: Tx, material: learning.MaterialView) -> dict[str, Any]:
    """Two knowledge points (one weak), reading on two blocks, quiz attempts."""
    blocks = material.blocks
    inputs = await tx(
        learning.create_knowledge_point,
        "u1",
        material.material_id,
        "Inputs",
        [blocks[3].block_id, blocks[1].block_id],
    )
    summary = await tx(
        learning.create_knowledge_point, "u1", material.material_id, "Summary", [blocks[9].block_id]
    )
    t = datetime(2026, 11, 2, 8, 30, 0, 123000, tzinfo=UTC)
    events = [
        {
            "eventId": "r1",
            "type": "reading",
            "blockId": blocks[0].block_id,
            "dwellSeconds": 10,
            "occurredAt": t,
        },
        {
            "eventId": "r2",
            "type": "reading",
            "blockId": blocks[1].block_id,
            "dwellSeconds": 20,
            "occurredAt": t,
        },
        {
            "eventId": "r3",
            "type": "reading",
            "blockId": blocks[1].block_id,
            "dwellSeconds": 20.5,
            "occurredAt": t.replace(hour=9),
        },
    ]
    for i, ok in enumerate([True, False, False]):
        events.append(
            {
                "eventId": f"q{i}",
                "type": "quiz_attempt",
                "knowledgePointId": inputs.knowledge_point_id,
                "correct": ok,
                "occurredAt": t.replace(minute=i),
            }
        )
    for i in range(2):
        events.append(
            {
                "eventId": f"s{i}",
                "type": "quiz_attempt",
                "knowledgePointId": summary.knowledge_point_id,
                "correct": True,
                "occurredAt": t.replace(hour=10),
            }
        )
    assert await tx(learning.record_learning_events, "u1", events) == (len(events), 0)
    return {"inputs": inputs, "summary": summary}


async def _payload(tx: Tx, **kw: Any) -> dict[str, Any]:
    async def run(s: AsyncSession) -> dict[str, Any]:
        sid = await snapshots.build_snapshot(s, **kw)
        view = await snapshots.load_snapshot(s, sid)
        assert view.content_hash == content_hash(view.payload)
        assert view.schema_version == "v1"
        assert (view.target_type, view.target_id) == (kw["target_type"], kw["target_id"])
        return {"id": sid, **view.payload}

    payload: dict[str, Any] = await tx(run)
    return payload


async def test_analysis_snapshot_of_a_user(tx: Tx, photosynthesis: learning.MaterialView) -> None:
    kps = await _setup(tx, photosynthesis)
    p = await _payload(
        tx,
        user_id="u1",
        job_type="learning_state_analysis",
        target_type="user",
        target_id="u1",
        params={},
    )
    assert set(p) - {"id"} == PAYLOAD_KEYS
    assert (p["jobType"], p["targetType"], p["targetId"], p["userId"]) == (
        "learning_state_analysis",
        "user",
        "u1",
        "u1",
    )
    assert p["materials"] == [
        {
            "materialId": photosynthesis.material_id,
            "title": "Photosynthesis",
            "blockCount": 10,
            "readBlockCount": 2,
            "progress": 0.2,
        }
    ]
    inputs, summary = kps["inputs"], kps["summary"]
    # weakest first; accuracy rounded; lastAttemptAt RFC 3339 with ms
    assert p["knowledgePoints"] == [
        {
            "knowledgePointId": inputs.knowledge_point_id,
            "name": "Inputs",
            "materialId": photosynthesis.material_id,
            "blockIds": [photosynthesis.blocks[3].block_id, photosynthesis.blocks[1].block_id],
            "attempts": 3,
            "correct": 1,
            "accuracy": 0.3333,
            "lastAttemptAt": "2026-11-02T08:02:00.123Z",
        },
        {
            "knowledgePointId": summary.knowledge_point_id,
            "name": "Summary",
            "materialId": photosynthesis.material_id,
            "blockIds": [photosynthesis.blocks[9].block_id],
            "attempts": 2,
            "correct": 2,
            "accuracy": 1.0,
            "lastAttemptAt": "2026-11-02T10:30:00.123Z",
        },
    ]
    # reading aggregated per block, most recent first
    assert p["reading"] == [
        {
            "blockId": photosynthesis.blocks[1].block_id,
            "materialId": photosynthesis.material_id,
            "dwellSeconds": 40.5,
            "lastReadAt": "2026-11-02T09:30:00.123Z",
        },
        {
            "blockId": photosynthesis.blocks[0].block_id,
            "materialId": photosynthesis.material_id,
            "dwellSeconds": 10.0,
            "lastReadAt": "2026-11-02T08:30:00.123Z",
        },
    ]
    # the whole (small) material fits the analysis sample, in ordinal order
    assert [b["ordinal"] for b in p["blocks"]] == list(range(10))
    assert p["blocks"][0] == {
        "blockId": photosynthesis.blocks[0].block_id,
        "materialId": photosynthesis.material_id,
        "ordinal": 0,
        "text": "Photosynthesis",
    }
    stats = p["stats"]
    assert stats["quizAttempts"] == 5 and stats["quizCorrect"] == 3 and stats["accuracy"] == 0.6
    assert stats["weakestKnowledgePointIds"] == [
        inputs.knowledge_point_id,
        summary.knowledge_point_id,
    ]
    assert stats["lastActivityAt"] == "2026-11-02T10:30:00.123Z"
    assert stats["totalDwellSeconds"] == 50.5
    assert stats["materialCount"] == 1 and stats["knowledgePointCount"] == 2
    assert stats["omittedBlockCount"] == 0


async def test_accuracy_is_null_without_attempts_and_other_users_data_is_absent(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    kp = await tx(
        learning.create_knowledge_point,
        "u1",
        photosynthesis.material_id,
        "New",
        [photosynthesis.blocks[2].block_id],
    )
    theirs = await tx(learning.create_material, "u2", "Theirs", "Secret text.")
    p = await _payload(
        tx,
        user_id="u1",
        job_type="weak_point_analysis",
        target_type="user",
        target_id="u1",
        params={},
    )
    assert p["knowledgePoints"][0]["knowledgePointId"] == kp.knowledge_point_id
    assert p["knowledgePoints"][0]["attempts"] == 0
    assert p["knowledgePoints"][0]["accuracy"] is None
    assert p["knowledgePoints"][0]["lastAttemptAt"] is None
    assert p["stats"]["accuracy"] is None and p["stats"]["lastActivityAt"] is None
    assert theirs.material_id not in {m["materialId"] for m in p["materials"]}
    assert "Secret text." not in {b["text"] for b in p["blocks"]}
    assert p["reading"] == []


async def test_quiz_snapshot_of_a_material_carries_params_and_its_blocks(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    await _setup(tx, photosynthesis)
    other = await tx(learning.create_material, "u1", "Other", "Unrelated text.")
    params = {"count": 3, "difficulty": "hard", "questionTypes": ["true_false"]}
    p = await _payload(
        tx,
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id=photosynthesis.material_id,
        params=params,
    )
    assert p["params"] == params
    assert [m["materialId"] for m in p["materials"]] == [photosynthesis.material_id]
    assert [b["blockId"] for b in p["blocks"]] == [b.block_id for b in photosynthesis.blocks]
    assert other.material_id not in {b["materialId"] for b in p["blocks"]}
    assert p["stats"]["blockBudgetChars"] == GENERATION_SNAPSHOT.chars


async def test_flashcard_snapshot_of_a_knowledge_point_has_only_its_blocks(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    kps = await _setup(tx, photosynthesis)
    inputs = kps["inputs"]
    p = await _payload(
        tx,
        user_id="u1",
        job_type="flashcard_generation",
        target_type="knowledge_point",
        target_id=inputs.knowledge_point_id,
        params={"count": 4},
    )
    # the knowledge point's blocks, in ordinal order (not link order)
    assert [b["ordinal"] for b in p["blocks"]] == [1, 3]
    assert [k["knowledgePointId"] for k in p["knowledgePoints"]] == [inputs.knowledge_point_id]
    assert [m["materialId"] for m in p["materials"]] == [photosynthesis.material_id]


@pytest.mark.parametrize(
    ("target_type", "target", "code"),
    [
        ("user", "u2", ErrorCode.NOT_FOUND),
        ("user", "", ErrorCode.NOT_FOUND),
        ("material", "THEIR_MATERIAL", ErrorCode.NOT_FOUND),
        ("material", "nope", ErrorCode.NOT_FOUND),
        ("knowledge_point", "THEIR_KP", ErrorCode.NOT_FOUND),
        ("knowledge_point", "OWN_MATERIAL", ErrorCode.NOT_FOUND),
        ("course", "u1", ErrorCode.INVALID_ARGUMENT),
    ],
)
async def test_target_must_exist_and_be_the_users(
    tx: Tx, photosynthesis: learning.MaterialView, target_type: str, target: str, code: str
) -> None:
    theirs = await tx(learning.create_material, "u2", "Theirs", "Their text.")
    their_kp = await tx(
        learning.create_knowledge_point, "u2", theirs.material_id, "k", [theirs.blocks[0].block_id]
    )
    target_id = {
        "THEIR_MATERIAL": theirs.material_id,
        "THEIR_KP": their_kp.knowledge_point_id,
        "OWN_MATERIAL": photosynthesis.material_id,
    }.get(target, target)
    with pytest.raises(AppError) as exc:
        await tx(
            snapshots.build_snapshot,
            user_id="u1",
            job_type="quiz_generation",
            target_type=target_type,
            target_id=target_id,
            params={},
        )
    assert exc.value.code == code


@pytest.mark.mysql
async def test_identical_snapshots_are_stored_once_and_reused(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    kw = dict(
        user_id="u1",
        job_type="learning_state_analysis",
        target_type="material",
        target_id=photosynthesis.material_id,
        params={},
    )
    first = await tx(snapshots.build_snapshot, **kw)
    assert await tx(snapshots.build_snapshot, **kw) == first
    # new learning data → a new snapshot
    await tx(
        learning.record_learning_events,
        "u1",
        [{"eventId": "x", "type": "reading", "blockId": photosynthesis.blocks[4].block_id}],
    )
    second = await tx(snapshots.build_snapshot, **kw)
    assert second != first

    async def count(s: AsyncSession) -> int:
        return int((await s.execute(select(func.count()).select_from(AiSnapshot))).scalar_one())

    assert await tx(count) == 2
    with pytest.raises(AppError) as exc:
        await tx(snapshots.load_snapshot, "missing")
    assert exc.value.code == ErrorCode.NOT_FOUND


def _big_document(n: int = 80) -> str:
    filler = "This sentence pads the paragraph so that it is long enough to matter. " * 12
    return "\n\n".join(f"Paragraph {i}. {filler}".strip() for i in range(n))


async def test_budget_rule_on_a_large_material(tx: Tx) -> None:
    material = await tx(learning.create_material, "u1", "Big", _big_document())
    blocks = material.blocks
    assert len(blocks) == 80
    total = sum(len(b.text) for b in blocks)
    assert total > 2 * GENERATION_SNAPSHOT.chars
    weak = await tx(
        learning.create_knowledge_point,
        "u1",
        material.material_id,
        "weak",
        [blocks[51].block_id, blocks[50].block_id],
    )
    strong = await tx(
        learning.create_knowledge_point, "u1", material.material_id, "strong", [blocks[77].block_id]
    )
    events = [
        {
            "eventId": f"w{i}",
            "type": "quiz_attempt",
            "knowledgePointId": weak.knowledge_point_id,
            "correct": False,
        }
        for i in range(2)
    ] + [
        {
            "eventId": "s",
            "type": "quiz_attempt",
            "knowledgePointId": strong.knowledge_point_id,
            "correct": True,
        }
    ]
    await tx(learning.record_learning_events, "u1", events)
    kw = dict(
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id=material.material_id,
        params={"count": 5},
    )
    p = await _payload(tx, **kw)
    chosen = [b["ordinal"] for b in p["blocks"]]
    assert sum(len(b["text"]) for b in p["blocks"]) <= GENERATION_SNAPSHOT.chars
    assert chosen == sorted(chosen)  # ordinal order kept
    assert {50, 51, 77} <= set(chosen)  # knowledge-point blocks first
    assert 0 in chosen  # then the even spread starts at the beginning…
    rest = [o for o in chosen if o not in (50, 51, 77)]
    gaps = [b - a for a, b in itertools.pairwise(rest)]
    # …and covers the whole document: no gap over twice the ideal stride (80 / 25 ≈ 3),
    # plus the two prioritised blocks removed from the spread
    assert max(gaps) <= 8
    assert max(rest) >= 70
    assert p["stats"]["includedBlockCount"] == len(chosen)
    assert p["stats"]["omittedBlockCount"] == 80 - len(chosen)
    # deterministic: the same data gives the same selection (and the same snapshot)
    again = await _payload(tx, **kw)
    assert again == p
    # a knowledge point offers only blocks that are in the payload
    wide = await tx(
        learning.create_knowledge_point,
        "u1",
        material.material_id,
        "wide",
        [b.block_id for b in blocks[:30]],
    )
    # analysis types get a smaller sample
    a = await _payload(tx, **{**kw, "job_type": "next_action_planning", "params": {}})
    assert sum(len(b["text"]) for b in a["blocks"]) <= ANALYSIS_SNAPSHOT.chars
    assert {50, 51} <= {b["ordinal"] for b in a["blocks"]}
    included = {b["blockId"] for b in a["blocks"]}
    [wide_entry] = [
        k for k in a["knowledgePoints"] if k["knowledgePointId"] == wide.knowledge_point_id
    ]
    assert 0 < len(wide_entry["blockIds"]) < 30
    assert all(set(k["blockIds"]) <= included for k in a["knowledgePoints"])


def test_spread_order_visits_ends_then_halves() -> None:
    assert spread_order(10) == [0, 8, 4, 2, 6, 1, 3, 5, 7, 9]
    assert spread_order(1) == [0]
    assert spread_order(0) == []
    assert sorted(spread_order(37)) == list(range(37))


def _meta(sizes: list[int]) -> list[BlockMeta]:
    return [BlockMeta(f"b{i}", "m", i, size) for i, size in enumerate(sizes)]


def test_select_blocks_rules() -> None:
    blocks = _meta([100] * 10)
    assert select_blocks(blocks, priority=[], budget_chars=1000, max_blocks=10) == blocks
    # priority first, then the spread; a block that does not fit is skipped, smaller ones still taken
    got = select_blocks(blocks, priority=["b7"], budget_chars=300, max_blocks=10)
    assert [b.block_id for b in got] == ["b0", "b7", "b9"]  # rest = b0..b6,b8,b9: 0 then 8
    uneven = _meta([500, 100, 100, 100, 100])
    got = select_blocks(uneven, priority=[], budget_chars=300, max_blocks=10)
    # spread order 0,4,2,1,3: b0 is too big and skipped, the spread continues
    assert [b.block_id for b in got] == ["b1", "b2", "b4"]
    got = select_blocks(blocks, priority=["b5", "b6", "b7"], budget_chars=10_000, max_blocks=2)
    assert [b.block_id for b in got] == ["b5", "b6"]


async def test_generation_plans(tx: Tx) -> None:
    await tx(
        plans.create_generation_plan,
        job_id="j1",
        user_id="u1",
        job_type="quiz_generation",
        target_type="user",
        target_id="u1",
        params={"count": 7, "difficulty": "easy", "questionTypes": ["true_false", "short_answer"]},
    )
    await tx(
        plans.create_generation_plan,
        job_id="j2",
        user_id="u1",
        job_type="flashcard_generation",
        target_type="user",
        target_id="u1",
        params={},
    )
    await tx(
        plans.create_generation_plan,
        job_id="j3",
        user_id="u1",
        job_type="weak_point_analysis",
        target_type="user",
        target_id="u1",
        params={},
    )
    quiz = await tx(plans.get_generation_plan, "j1")
    assert quiz is not None
    assert (quiz["requestedCount"], quiz["difficulty"], quiz["questionTypes"]) == (
        7,
        "easy",
        ["true_false", "short_answer"],
    )
    assert quiz["generated"] is None and quiz["written"] is None
    cards = await tx(plans.get_generation_plan, "j2")
    assert cards is not None and cards["requestedCount"] == 5 and "difficulty" not in cards
    assert await tx(plans.get_generation_plan, "j3") is None


async def test_a_user_without_any_data_gets_an_empty_snapshot(tx: Tx) -> None:
    p = await _payload(
        tx,
        user_id="new-user",
        job_type="next_action_planning",
        target_type="user",
        target_id="new-user",
        params={},
    )
    assert (p["materials"], p["blocks"], p["knowledgePoints"], p["reading"]) == ([], [], [], [])
    assert p["stats"]["materialCount"] == 0 and p["stats"]["accuracy"] is None
