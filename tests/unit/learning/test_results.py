"""Server-side result validation, dedupe and business rows (reference §5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from airuntime_common.canonical import content_hash
from airuntime_common.db import retry_transient
from airuntime_common.errors import AppError, ErrorCode
from job_service import learning
from job_service.learning import plans, results, snapshots
from job_service.learning.results import AcceptOutcome
from job_service.learning.tables import business_kinds

from .conftest import Tx


def question(stem: str, block_ids: list[str] | None, kp: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "questionType": "single_choice",
        "stem": stem,
        "options": ["A", "B", "C"],
        "answer": "A",
        "explanation": "Because.",
        "difficulty": "medium",
    }
    if block_ids is not None:
        item["sourceBlockIds"] = block_ids
    if kp is not None:
        item["knowledgePointId"] = kp
    return item


class World:
    """u1's material with a knowledge point and quiz/analysis snapshots; u2's own data."""

    material: learning.MaterialView
    kp: learning.KnowledgePointView
    other_material: learning.MaterialView
    their_material: learning.MaterialView
    their_kp: learning.KnowledgePointView
    quiz_snapshot: str
    kp_snapshot: str

    def block(self, i: int) -> str:
        return self.material.blocks[i].block_id


@pytest.fixture
async def world(tx: Tx, photosynthesis: learning.MaterialView) -> World:
    w = World()
    w.material = photosynthesis
    w.kp = await tx(
        learning.create_knowledge_point,
        "u1",
        photosynthesis.material_id,
        "Inputs",
        [photosynthesis.blocks[3].block_id],
    )
    w.other_material = await tx(learning.create_material, "u1", "Other", "Other own text.")
    w.their_material = await tx(learning.create_material, "u2", "Theirs", "Their text.")
    w.their_kp = await tx(
        learning.create_knowledge_point,
        "u2",
        w.their_material.material_id,
        "k",
        [w.their_material.blocks[0].block_id],
    )
    w.quiz_snapshot = await tx(
        snapshots.build_snapshot,
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id=photosynthesis.material_id,
        params={"count": 3},
    )
    w.kp_snapshot = await tx(
        snapshots.build_snapshot,
        user_id="u1",
        job_type="quiz_generation",
        target_type="knowledge_point",
        target_id=w.kp.knowledge_point_id,
        params={"count": 3},
    )
    return w


async def accept(
    tx: Tx,
    job_id: str,
    job_type: str,
    snapshot_id: str,
    output: Any,
    version: str = "v1",
    user_id: str = "u1",
) -> AcceptOutcome:
    outcome: AcceptOutcome = await tx(
        results.accept_result,
        job_id=job_id,
        user_id=user_id,
        job_type=job_type,
        snapshot_id=snapshot_id,
        output_schema_version=version,
        output=output,
    )
    return outcome


async def rows(tx: Tx, kind: str) -> int:
    model, _ = business_kinds()[kind]

    async def count(s: AsyncSession) -> int:
        return int((await s.execute(select(func.count()).select_from(model))).scalar_one())

    return int(await tx(count))


@pytest.mark.mysql
async def test_quiz_result_writes_rows_and_counts_duplicates(tx: Tx, world: World) -> None:
    await tx(
        plans.create_generation_plan,
        job_id="j1",
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id=world.material.material_id,
        params={"count": 3},
    )
    q1 = question("What do plants absorb?", [world.block(3)], world.kp.knowledge_point_id)
    q2 = question("Where is the Calvin cycle?", [world.block(4), world.block(8)])
    out = {"items": [q1, q2, dict(q1)]}  # the third repeats the first exactly
    assert await accept(tx, "j1", "quiz_generation", world.quiz_snapshot, out) == AcceptOutcome(
        3, 2, 1
    )
    plan = await tx(plans.get_generation_plan, "j1")
    assert plan is not None
    assert (plan["generated"], plan["written"], plan["skippedDuplicates"]) == (3, 2, 1)

    items = await tx(results.result_items, job_id="j1", job_type="quiz_generation")
    assert [i["stem"] for i in items] == [q1["stem"], q2["stem"]]
    assert all(len(i["questionId"]) == 32 for i in items)
    first = items[0]
    assert first["sourceBlockIds"] == [world.block(3)]
    assert first["knowledgePointId"] == world.kp.knowledge_point_id
    assert first["options"] == ["A", "B", "C"] and first["answer"] == "A"
    assert first["jobId"] == "j1" and first["createdAt"].endswith("Z")
    assert items[1]["knowledgePointId"] is None
    assert "userId" not in first and "contentHash" not in first
    # the same question from a later job is skipped (an absent optional field hashes as null)
    again = {"items": [q2, question("A new one?", [world.block(2)])]}
    assert await accept(tx, "j2", "quiz_generation", world.quiz_snapshot, again) == AcceptOutcome(
        2, 1, 1
    )
    assert await rows(tx, "questions") == 3
    # once the result row is stored, j2's result lists both of its items: the duplicate
    # as the user's existing row (written by j1)
    await tx(
        results.insert_result_row,
        job_id="j2",
        attempt_no=1,
        output_hash=content_hash(again),
        prompt_version="quiz_generation.v1",
        output_schema_version="v1",
        output=again,
    )
    j2_items = await tx(results.result_items, job_id="j2", job_type="quiz_generation", user_id="u1")
    assert [(i["stem"], i["jobId"]) for i in j2_items] == [
        (q2["stem"], "j1"),
        ("A new one?", "j2"),
    ]
    assert j2_items[0]["questionId"] == items[1]["questionId"]
    # without the job's type and user: only the rows the job itself wrote
    assert [i["stem"] for i in await tx(results.result_items, job_id="j2")] == ["A new one?"]
    # an item repeated within one output is listed once
    await tx(
        results.insert_result_row,
        job_id="j1",
        attempt_no=1,
        output_hash=content_hash(out),
        prompt_version=None,
        output_schema_version="v1",
        output=out,
    )
    j1_items = await tx(results.result_items, job_id="j1", job_type="quiz_generation", user_id="u1")
    assert [i["questionId"] for i in j1_items] == [i["questionId"] for i in items]
    assert await tx(results.result_items, job_id="never-ran") == []


@pytest.mark.parametrize(
    ("mutate", "reason", "field"),
    [
        (
            lambda w, q: q.update(sourceBlockIds=[w.block(3), w.their_material.blocks[0].block_id]),
            "block_not_in_snapshot",
            "items[0].sourceBlockIds[1]",
        ),
        (
            lambda w, q: q.update(sourceBlockIds=[w.other_material.blocks[0].block_id]),
            "block_not_in_snapshot",
            "items[0].sourceBlockIds[0]",
        ),
        (
            lambda w, q: q.update(knowledgePointId=w.their_kp.knowledge_point_id),
            "knowledge_point_not_owned",
            "items[0].knowledgePointId",
        ),
        (
            lambda w, q: q.update(knowledgePointId="no-such-kp"),
            "knowledge_point_not_owned",
            "items[0].knowledgePointId",
        ),
    ],
)
async def test_ownership_violation_rejects_the_whole_result(
    tx: Tx, world: World, mutate: Any, reason: str, field: str
) -> None:
    bad = question("Bad?", [world.block(3)])
    mutate(world, bad)
    out = {"items": [bad, question("Good?", [world.block(1)])]}
    with pytest.raises(AppError) as exc:
        await accept(tx, "j1", "quiz_generation", world.quiz_snapshot, out)
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    assert exc.value.details is not None
    assert exc.value.details["violations"][0]["reason"] == reason
    assert exc.value.details["violations"][0]["field"] == field
    assert exc.value.details["violations"][0]["id"] in exc.value.message
    assert await rows(tx, "questions") == 0


async def test_a_block_outside_a_knowledge_point_snapshot_is_foreign(tx: Tx, world: World) -> None:
    # the kp snapshot holds only block 3; block 4 belongs to the user but not to the snapshot
    out = {"items": [question("Q?", [world.block(4)])]}
    with pytest.raises(AppError) as exc:
        await accept(tx, "j1", "quiz_generation", world.kp_snapshot, out)
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    ok = {"items": [question("Q?", [world.block(3)])]}
    assert await accept(tx, "j1", "quiz_generation", world.kp_snapshot, ok) == AcceptOutcome(
        1, 1, 0
    )


@pytest.mark.parametrize(
    ("output", "version", "loc"),
    [
        ({"items": [question("No sources?", None)]}, "v1", "items.0.sourceBlockIds"),
        ({"items": [question("Empty sources?", [])]}, "v1", "items.0.sourceBlockIds"),
        ({"items": []}, "v1", "items"),
        ({"items": [{**question("Extra?", ["x"]), "secret": 1}]}, "v1", "items.0.secret"),
        ({"items": [question("Version?", ["x"])]}, "v2", None),
    ],
)
async def test_schema_violations_are_invalid_schema(
    tx: Tx, world: World, output: Any, version: str, loc: str | None
) -> None:
    with pytest.raises(AppError) as exc:
        await accept(tx, "j1", "quiz_generation", world.quiz_snapshot, output, version=version)
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    assert exc.value.details is not None
    if loc is None:
        assert exc.value.details == {"outputSchemaVersion": "v2"}
    else:
        assert exc.value.details["errors"][0]["loc"] == loc
    assert await rows(tx, "questions") == 0


async def test_flashcards_and_weak_points(tx: Tx, world: World) -> None:
    await tx(
        plans.create_generation_plan,
        job_id="f1",
        user_id="u1",
        job_type="flashcard_generation",
        target_type="material",
        target_id=world.material.material_id,
        params={"count": 2},
    )
    cards = {
        "items": [
            {"front": "Chlorophyll?", "back": "A pigment.", "sourceBlockIds": [world.block(3)]},
            {
                "front": "Stroma?",
                "back": "Fluid.",
                "sourceBlockIds": [world.block(4)],
                "knowledgePointId": world.kp.knowledge_point_id,
            },
        ]
    }
    assert await accept(
        tx, "f1", "flashcard_generation", world.quiz_snapshot, cards
    ) == AcceptOutcome(2, 2, 0)
    plan = await tx(plans.get_generation_plan, "f1")
    assert plan is not None and (plan["generated"], plan["written"], plan["skippedDuplicates"]) == (
        2,
        2,
        0,
    )
    items = await tx(results.result_items, job_id="f1")
    assert [i["front"] for i in items] == ["Chlorophyll?", "Stroma?"]
    assert all("flashcardId" in i for i in items)

    analysis_snapshot = await tx(
        snapshots.build_snapshot,
        user_id="u1",
        job_type="weak_point_analysis",
        target_type="user",
        target_id="u1",
        params={},
    )
    weak = {
        "items": [
            {
                "knowledgePointId": world.kp.knowledge_point_id,
                "reason": "Low accuracy.",
                "severity": 1,
                "evidenceBlockIds": [world.block(3)],
            }
        ]
    }
    assert await accept(tx, "w1", "weak_point_analysis", analysis_snapshot, weak) == AcceptOutcome(
        1, 1, 0
    )
    [item] = await tx(results.result_items, job_id="w1")
    assert item["severity"] == 1.0 and item["evidenceBlockIds"] == [world.block(3)]
    assert "weakPointId" in item
    bad = {
        "items": [
            {**weak["items"][0], "evidenceBlockIds": [world.their_material.blocks[0].block_id]}
        ]
    }
    with pytest.raises(AppError) as exc:
        await accept(tx, "w2", "weak_point_analysis", analysis_snapshot, bad)
    assert exc.value.details is not None
    assert exc.value.details["violations"][0]["field"] == "items[0].evidenceBlockIds[0]"


async def test_analysis_evidence_ids_are_checked(tx: Tx, world: World) -> None:
    snap = await tx(
        snapshots.build_snapshot,
        user_id="u1",
        job_type="learning_state_analysis",
        target_type="user",
        target_id="u1",
        params={},
    )
    analysis = {
        "summary": "Going well.",
        "masteryLevel": 0.5,
        "strengths": ["reading"],
        "risks": [],
        "evidence": [
            {"blockId": world.block(0), "note": "read"},
            {"knowledgePointId": world.kp.knowledge_point_id, "note": "quiz"},
        ],
    }
    assert await accept(tx, "a1", "learning_state_analysis", snap, analysis) == AcceptOutcome(
        1, 1, 0
    )
    [item] = await tx(results.result_items, job_id="a1")
    assert (
        item["masteryLevel"] == 0.5
        and item["evidence"][1]["knowledgePointId"] == world.kp.knowledge_point_id
    )
    assert "analysisId" in item
    bad = {
        **analysis,
        "evidence": [{"knowledgePointId": world.their_kp.knowledge_point_id, "note": "x"}],
    }
    with pytest.raises(AppError) as exc:
        await accept(tx, "a2", "learning_state_analysis", snap, bad)
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    assert exc.value.details is not None
    assert exc.value.details["violations"][0]["field"] == "evidence[0].knowledgePointId"


@pytest.mark.parametrize(
    ("target_type", "target", "ok"),
    [
        ("user", "u1", True),
        ("user", "u2", False),
        ("material", "OWN_MATERIAL", True),
        ("material", "THEIR_MATERIAL", False),
        ("knowledge_point", "OWN_KP", True),
        ("knowledge_point", "THEIR_KP", False),
        ("knowledge_point", "OWN_MATERIAL", False),
    ],
)
async def test_recommended_targets_must_be_the_users(
    tx: Tx, world: World, target_type: str, target: str, ok: bool
) -> None:
    snap = await tx(
        snapshots.build_snapshot,
        user_id="u1",
        job_type="next_action_planning",
        target_type="user",
        target_id="u1",
        params={},
    )
    target_id = {
        "OWN_MATERIAL": world.other_material.material_id,
        "THEIR_MATERIAL": world.their_material.material_id,
        "OWN_KP": world.kp.knowledge_point_id,
        "THEIR_KP": world.their_kp.knowledge_point_id,
    }.get(target, target)
    out = {
        "items": [
            {
                "actionType": "review",
                "targetType": target_type,
                "targetId": target_id,
                "reason": "Because.",
                "priority": 1,
            }
        ]
    }
    if ok:
        assert await accept(tx, "n1", "next_action_planning", snap, out) == AcceptOutcome(1, 1, 0)
        [item] = await tx(results.result_items, job_id="n1")
        assert (item["targetType"], item["targetId"], item["actionType"]) == (
            target_type,
            target_id,
            "review",
        )
    else:
        with pytest.raises(AppError) as exc:
            await accept(tx, "n1", "next_action_planning", snap, out)
        assert exc.value.code == ErrorCode.INVALID_SCHEMA
        assert exc.value.details is not None
        assert exc.value.details["violations"] == [
            {"field": "items[0].targetId", "id": target_id, "reason": "target_not_owned"}
        ]


async def test_missing_snapshot_is_invalid_snapshot(tx: Tx, world: World) -> None:
    with pytest.raises(AppError) as exc:
        await accept(tx, "j1", "quiz_generation", "gone", {"items": [question("Q?", ["b"])]})
    assert exc.value.code == ErrorCode.INVALID_SNAPSHOT


@pytest.mark.mysql
async def test_list_user_items_pages_newest_first(tx: Tx, world: World) -> None:
    for j in range(3):
        out = {"items": [question(f"Job {j} question {i}?", [world.block(3)]) for i in range(3)]}
        await accept(tx, f"j{j}", "quiz_generation", world.quiz_snapshot, out)
    seen: list[dict[str, Any]] = []
    token: str | None = None
    pages = 0
    while True:
        page, token = await tx(
            results.list_user_items, user_id="u1", kind="questions", page_size=4, page_token=token
        )
        seen.extend(page)
        pages += 1
        if token is None:
            break
    assert pages == 3 and len(seen) == 9
    assert len({i["questionId"] for i in seen}) == 9
    assert [i["jobId"] for i in seen[:3]] == ["j2"] * 3  # newest job first
    assert await tx(
        results.list_user_items, user_id="u2", kind="questions", page_size=0, page_token=None
    ) == ([], None)
    for kw in ({"kind": "poems"}, {"page_size": 101}, {"page_token": "%%%"}):
        args: dict[str, Any] = {
            "user_id": "u1",
            "kind": "questions",
            "page_size": 10,
            "page_token": None,
            **kw,
        }
        with pytest.raises(AppError) as exc:
            await tx(results.list_user_items, **args)
        assert exc.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.mysql
async def test_result_rows_are_unique_by_idempotency_key(tx: Tx) -> None:
    output = {"items": [question("Q?", ["b"])]}
    digest = content_hash(output)
    rid = await tx(
        results.insert_result_row,
        job_id="j1",
        attempt_no=2,
        output_hash=digest,
        prompt_version="quiz_generation.v1",
        output_schema_version="v1",
        output=output,
    )
    found = await tx(results.find_result_row, job_id="j1", attempt_no=2, output_hash=digest)
    assert found is not None and found.result_id == rid
    assert found.idempotency_key == f"j1:2:{digest}" and found.output == output
    assert await tx(results.find_result_row, job_id="j1", attempt_no=3, output_hash=digest) is None
    latest = await tx(results.find_result_row, job_id="j1")
    assert latest is not None and latest.result_id == rid
    with pytest.raises(IntegrityError):
        await tx(
            results.insert_result_row,
            job_id="j1",
            attempt_no=2,
            output_hash=digest,
            prompt_version=None,
            output_schema_version="v1",
            output=output,
        )


@pytest.mark.mysql
async def test_concurrent_results_with_the_same_items_write_each_once(
    sessions: async_sessionmaker[AsyncSession], tx: Tx, world: World
) -> None:
    out = {"items": [question(f"Shared {i}?", [world.block(3)]) for i in range(3)]}  # the count

    async def submit(job_id: str) -> AcceptOutcome:
        async def once() -> AcceptOutcome:
            async with sessions() as s, s.begin():
                return await results.accept_result(
                    s,
                    job_id=job_id,
                    user_id="u1",
                    job_type="quiz_generation",
                    snapshot_id=world.quiz_snapshot,
                    output_schema_version="v1",
                    output=out,
                )

        return await retry_transient(once)

    outcomes = await asyncio.gather(*(submit(f"c{i}") for i in range(4)))
    assert sum(o.written for o in outcomes) == 3
    assert all(o.generated == 3 and o.written + o.skipped == 3 for o in outcomes)
    assert await rows(tx, "questions") == 3
    for i in range(4):
        await tx(
            results.insert_result_row,
            job_id=f"c{i}",
            attempt_no=1,
            output_hash=content_hash(out),
            prompt_version=None,
            output_schema_version="v1",
            output=out,
        )
        listed = await tx(
            results.result_items, job_id=f"c{i}", job_type="quiz_generation", user_id="u1"
        )
        assert [q["stem"] for q in listed] == [f"Shared {n}?" for n in range(3)]


async def test_an_invalid_output_writes_nothing_even_when_the_transaction_commits(
    tx: Tx, world: World
) -> None:
    # The job service's result runs prepare_result without a savepoint and commits
    # the job's move to failed in the same transaction: so the refusal itself must
    # have written no row (prepare_result only reads; the port has no other shape).
    good = [question(f"Good {i}?", [world.block(1)]) for i in range(2)]  # 3 = the count
    bad = question("Bad?", [world.other_material.blocks[0].block_id])

    async def accept_and_commit(session: AsyncSession) -> str:
        try:
            await results.accept_result(
                session,
                job_id="j1",
                user_id="u1",
                job_type="quiz_generation",
                snapshot_id=world.quiz_snapshot,
                output_schema_version="v1",
                output={"items": [*good, bad]},
            )
        except AppError as exc:
            return exc.code
        return "accepted"

    assert await tx(accept_and_commit) == ErrorCode.INVALID_SCHEMA
    assert await rows(tx, "questions") == 0


async def test_a_result_with_more_items_than_the_count_writes_the_first_count(
    tx: Tx, world: World
) -> None:
    """reference §9.4: the snapshot's job asked for 3 questions; five valid ones are sent:
    the first three are written and the plan records three generated."""
    await tx(
        plans.create_generation_plan,
        job_id="j1",
        user_id="u1",
        job_type="quiz_generation",
        target_type="material",
        target_id=world.material.material_id,
        params={"count": 3},
    )
    qs = [question(f"Question {i}?", [world.block(i)]) for i in range(5)]
    outcome = await accept(tx, "j1", "quiz_generation", world.quiz_snapshot, {"items": qs})
    assert outcome == AcceptOutcome(3, 3, 0)
    items = await tx(results.result_items, job_id="j1", job_type="quiz_generation")
    assert [i["stem"] for i in items] == ["Question 0?", "Question 1?", "Question 2?"]
    plan = await tx(plans.get_generation_plan, "j1")
    assert plan is not None and (plan["generated"], plan["written"]) == (3, 3)


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"difficulty": 1}, "items.0.difficulty"),  # a number is not a string
        ({"answer": "D"}, "items.0"),  # single_choice: one of its options
        ({"questionType": "true_false", "options": ["yes", "no"], "answer": "yes"}, "items.0"),
        ({"questionType": "multiple_choice", "answer": []}, "items.0"),
        ({"sourceBlockIds": "b1"}, "items.0.sourceBlockIds"),  # not a list
    ],
)
async def test_the_server_validates_outputs_strictly(
    tx: Tx, world: World, change: dict[str, Any], loc: str
) -> None:
    """The server checks a result with the worker's strict models (reference §9.4): no
    coercion, and a quiz answer must fit its question."""
    bad = {**question("Strict?", [world.block(1)]), **change}
    with pytest.raises(AppError) as exc:
        await accept(tx, "j1", "quiz_generation", world.quiz_snapshot, {"items": [bad]})
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    assert exc.value.details is not None
    assert exc.value.details["errors"][0]["loc"].startswith(loc)
    assert await rows(tx, "questions") == 0


async def test_a_float_score_as_text_is_refused(tx: Tx, world: World) -> None:
    """``"0.5"`` is not a number (no coercion, reference §9.4)."""
    kp = world.kp.knowledge_point_id
    weak = {"knowledgePointId": kp, "reason": "r", "severity": "0.5", "evidenceBlockIds": []}
    with pytest.raises(AppError) as exc:
        await accept(tx, "j9", "weak_point_analysis", world.quiz_snapshot, {"items": [weak]})
    assert exc.value.code == ErrorCode.INVALID_SCHEMA
    assert exc.value.details is not None
    assert exc.value.details["errors"][0]["loc"] == "items.0.severity"
