"""Materials, knowledge points and idempotent learning events (reference §3.1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from airuntime_common.db import retry_transient
from airuntime_common.errors import AppError, ErrorCode
from job_service import learning
from job_service.learning.tables import LearningEvent, MaterialBlock

from .conftest import Tx


async def _count_events(tx: Tx, user_id: str) -> int:
    async def count(s: AsyncSession) -> int:
        q = select(func.count()).select_from(LearningEvent).where(LearningEvent.user_id == user_id)
        return int((await s.execute(q)).scalar_one())

    return int(await tx(count))


async def test_material_is_stored_with_ordered_blocks(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    got = await tx(learning.get_material, "u1", photosynthesis.material_id)
    assert got.title == "Photosynthesis"
    assert [b.ordinal for b in got.blocks] == list(range(10))
    assert [b.block_id for b in got.blocks] == [b.block_id for b in photosynthesis.blocks]
    assert got.blocks[0].kind == "heading" and got.blocks[0].text == "Photosynthesis"
    view = got.to_json()
    assert view["materialId"] == photosynthesis.material_id
    assert set(view["blocks"][0]) == {"blockId", "ordinal", "kind", "text"}
    assert view["createdAt"].endswith("Z")


async def test_another_users_material_is_not_found(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    for user, material_id in (("u2", photosynthesis.material_id), ("u1", "no-such-id")):
        with pytest.raises(AppError) as exc:
            await tx(learning.get_material, user, material_id)
        assert exc.value.code == ErrorCode.NOT_FOUND


@pytest.mark.parametrize(
    ("title", "content", "code"),
    [
        ("", "text", ErrorCode.INVALID_ARGUMENT),
        ("t" * 501, "text", ErrorCode.INVALID_ARGUMENT),
        ("ok", "  \n ", ErrorCode.INVALID_ARGUMENT),
        ("ok", "x" * (1024 * 1024 + 1), ErrorCode.PAYLOAD_TOO_LARGE),
    ],
)
async def test_bad_material_is_refused_and_nothing_is_stored(
    tx: Tx, title: str, content: str, code: str
) -> None:
    with pytest.raises(AppError) as exc:
        await tx(learning.create_material, "u1", title, content)
    assert exc.value.code == code

    async def blocks(s: AsyncSession) -> int:
        return int((await s.execute(select(func.count()).select_from(MaterialBlock))).scalar_one())

    assert await tx(blocks) == 0


async def test_knowledge_point_links_blocks_of_its_material(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    ids = [photosynthesis.blocks[1].block_id, photosynthesis.blocks[3].block_id]
    kp = await tx(
        learning.create_knowledge_point,
        "u1",
        photosynthesis.material_id,
        " Inputs ",
        [*ids, ids[0]],
    )
    assert kp.name == "Inputs" and kp.block_ids == ids
    again = await tx(learning.get_knowledge_point, "u1", kp.knowledge_point_id)
    assert again.block_ids == ids and again.material_id == photosynthesis.material_id
    with pytest.raises(AppError) as exc:
        await tx(learning.get_knowledge_point, "u2", kp.knowledge_point_id)
    assert exc.value.code == ErrorCode.NOT_FOUND


@pytest.mark.mysql
async def test_knowledge_point_refuses_foreign_material_and_foreign_blocks(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    other = await tx(learning.create_material, "u1", "Other", "Another text.")
    stranger = await tx(learning.create_material, "u2", "Theirs", "Their text.")
    # another user's material → NOT_FOUND
    with pytest.raises(AppError) as exc:
        await tx(
            learning.create_knowledge_point,
            "u1",
            stranger.material_id,
            "x",
            [stranger.blocks[0].block_id],
        )
    assert exc.value.code == ErrorCode.NOT_FOUND
    # an unknown id or another user's block → NOT_FOUND listing them (reference §3: any
    # unknown id → 404); the user's own block of another material → INVALID_ARGUMENT
    unknown = [stranger.blocks[0].block_id, "nope"]
    mine = [photosynthesis.blocks[0].block_id, other.blocks[0].block_id]
    with pytest.raises(AppError) as exc:
        await tx(
            learning.create_knowledge_point, "u1", photosynthesis.material_id, "x", mine + unknown
        )
    assert exc.value.code == ErrorCode.NOT_FOUND
    assert exc.value.details is not None
    assert exc.value.details["unknownBlockIds"] == unknown
    with pytest.raises(AppError) as exc:
        await tx(learning.create_knowledge_point, "u1", photosynthesis.material_id, "x", mine)
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    assert exc.value.details is not None
    assert exc.value.details["otherMaterialBlockIds"] == [other.blocks[0].block_id]
    # no blocks at all
    with pytest.raises(AppError) as exc:
        await tx(learning.create_knowledge_point, "u1", photosynthesis.material_id, "x", [])
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT


def _reading(event_id: str, block_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "eventId": event_id,
        "type": "reading",
        "blockId": block_id,
        "dwellSeconds": 12.5,
        **extra,
    }


@pytest.mark.mysql
async def test_learning_events_are_idempotent_by_event_id(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    b0, b1 = photosynthesis.blocks[0].block_id, photosynthesis.blocks[1].block_id
    kp = await tx(learning.create_knowledge_point, "u1", photosynthesis.material_id, "k", [b1])
    batch = [
        _reading("e1", b0),
        _reading("e2", b1, materialId=photosynthesis.material_id),
        {
            "eventId": "e3",
            "type": "quiz_attempt",
            "knowledgePointId": kp.knowledge_point_id,
            "correct": False,
        },
        _reading("e1", b1),  # repeat inside the batch
    ]
    assert await tx(learning.record_learning_events, "u1", batch) == (3, 1)
    # the same batch again: all duplicates, nothing written twice
    assert await tx(learning.record_learning_events, "u1", batch) == (0, 4)
    assert await _count_events(tx, "u1") == 3
    # another user may reuse the same event ids on their own data
    theirs = await tx(learning.create_material, "u2", "T", "Their text.")
    assert await tx(
        learning.record_learning_events, "u2", [_reading("e1", theirs.blocks[0].block_id)]
    ) == (1, 0)

    async def stored(s: AsyncSession) -> list[Any]:
        q = (
            select(LearningEvent)
            .where(LearningEvent.user_id == "u1")
            .order_by(LearningEvent.event_id)
        )
        return list((await s.execute(q)).scalars())

    rows = await tx(stored)
    assert [(r.event_id, r.type, r.block_id) for r in rows] == [
        ("e1", "reading", b0),
        ("e2", "reading", b1),
        ("e3", "quiz_attempt", None),
    ]
    # the material is derived from the block / knowledge point when not given
    assert {r.material_id for r in rows} == {photosynthesis.material_id}
    assert rows[0].dwell_seconds == 12.5 and rows[2].correct is False


@pytest.mark.mysql
async def test_concurrent_repeats_of_a_batch_store_each_event_once(
    sessions: async_sessionmaker[AsyncSession], tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    batch = [_reading(f"c{i}", photosynthesis.blocks[i % 10].block_id) for i in range(40)]

    async def send() -> tuple[int, int]:
        async def once() -> tuple[int, int]:
            async with sessions() as s, s.begin():
                return await learning.record_learning_events(s, "u1", batch)

        return await retry_transient(once)  # as the servicer runs it

    outcomes = await asyncio.gather(*(send() for _ in range(6)))
    assert sum(a for a, _ in outcomes) == 40
    assert all(a + d == 40 for a, d in outcomes)
    assert await _count_events(tx, "u1") == 40


NOT_FOUND = ErrorCode.NOT_FOUND
INVALID = ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("event", "field", "code"),
    [
        # an unknown or another user's id is 404, in a body too (reference §3)
        ({"blockId": "FOREIGN_BLOCK"}, "events[1].blockId", NOT_FOUND),
        ({"blockId": "no-such-block"}, "events[1].blockId", NOT_FOUND),
        ({"materialId": "FOREIGN_MATERIAL"}, "events[1].materialId", NOT_FOUND),
        ({"materialId": "no-such-material"}, "events[1].materialId", NOT_FOUND),
        (
            {"type": "quiz_attempt", "knowledgePointId": "FOREIGN_KP", "correct": True},
            "events[1].knowledgePointId",
            NOT_FOUND,
        ),
        (
            {"type": "quiz_attempt", "knowledgePointId": "no-such-kp", "correct": True},
            "events[1].knowledgePointId",
            NOT_FOUND,
        ),
        # ids are opaque: an unknown one longer than any stored id is 404 too
        ({"blockId": "b" * 65}, "events[1].blockId", NOT_FOUND),
        ({"materialId": "m" * 5000}, "events[1].materialId", NOT_FOUND),
        (
            {"type": "quiz_attempt", "knowledgePointId": "k" * 65, "correct": True},
            "events[1].knowledgePointId",
            NOT_FOUND,
        ),
        # the user's own ids that do not fit together, and bad fields, are 400
        (
            {"blockId": "OWN_BLOCK", "materialId": "OTHER_OWN_MATERIAL"},
            "events[1].blockId",
            INVALID,
        ),
        ({"type": "quiz_attempt", "knowledgePointId": "OWN_KP"}, "events[1].correct", INVALID),
        ({"type": "quiz_attempt", "correct": True}, "events[1].knowledgePointId", INVALID),
        ({"type": "skimming", "blockId": "OWN_BLOCK"}, "events[1].type", INVALID),
        ({"blockId": "OWN_BLOCK", "dwellSeconds": -1}, "events[1].dwellSeconds", INVALID),
        ({}, "events[1].blockId", INVALID),
    ],
)
async def test_bad_or_foreign_event_is_refused_naming_index_and_field(
    tx: Tx, photosynthesis: learning.MaterialView, event: dict[str, Any], field: str, code: str
) -> None:
    own_block = photosynthesis.blocks[0].block_id
    other_own = await tx(learning.create_material, "u1", "Second", "More text.")
    theirs = await tx(learning.create_material, "u2", "T", "Their text.")
    own_kp = await tx(
        learning.create_knowledge_point, "u1", photosynthesis.material_id, "k", [own_block]
    )
    their_kp = await tx(
        learning.create_knowledge_point, "u2", theirs.material_id, "k", [theirs.blocks[0].block_id]
    )
    names = {
        "FOREIGN_BLOCK": theirs.blocks[0].block_id,
        "FOREIGN_MATERIAL": theirs.material_id,
        "OWN_BLOCK": own_block,
        "OTHER_OWN_MATERIAL": other_own.material_id,
        "FOREIGN_KP": their_kp.knowledge_point_id,
        "OWN_KP": own_kp.knowledge_point_id,
    }
    bad = {"eventId": "bad", "type": "reading"}
    bad.update({k: names.get(v, v) if isinstance(v, str) else v for k, v in event.items()})
    with pytest.raises(AppError) as exc:
        await tx(learning.record_learning_events, "u1", [_reading("ok", own_block), bad])
    assert exc.value.code == code
    assert exc.value.details is not None
    assert exc.value.details["field"] == field
    assert exc.value.details["index"] == 1
    # the whole batch is refused: not even the good event was written
    assert await _count_events(tx, "u1") == 0


async def test_batch_over_500_events_is_refused(
    tx: Tx, photosynthesis: learning.MaterialView
) -> None:
    batch = [_reading(f"e{i}", photosynthesis.blocks[0].block_id) for i in range(501)]
    with pytest.raises(AppError) as exc:
        await tx(learning.record_learning_events, "u1", batch)
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    assert await tx(learning.record_learning_events, "u1", batch[:500]) == (500, 0)


@pytest.mark.parametrize("user_id", ["", "u" * 129])
async def test_missing_or_overlong_user_id_is_refused(tx: Tx, user_id: str) -> None:
    with pytest.raises(AppError) as exc:
        await tx(learning.create_material, user_id, "T", "Text.")
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    assert exc.value.details == {"field": "userId"}
