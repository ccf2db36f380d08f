"""The snapshot payload v1 as the answerers read it (:class:`View`): materials,
blocks in document order, knowledge points with their accuracy, reading, and the
target's prose sentences (:class:`Source`) with key terms and scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from model_standin.answers.terms import TermIndex, sentence_score
from model_standin.answers.text import (
    clean_line,
    clip,
    heading_of,
    is_cjk,
    is_code_like,
    is_heading_like,
    split_sentences,
)


@dataclass
class Source:
    """One sentence with the block it came from."""

    sentence: str
    block_id: str
    material_id: str | None
    heading: str | None
    kp_id: str | None
    keys: list[str] = field(default_factory=list)
    position: int = 0
    group: str = ""
    score: float = 0.0


@dataclass
class View:
    """Normalised view of a snapshot payload v1."""

    user_id: str | None
    target_type: str | None
    target_id: str | None
    materials: list[dict[str, Any]]
    blocks: list[dict[str, Any]]
    kps: list[dict[str, Any]]
    reading: list[dict[str, Any]]
    stats: dict[str, Any]
    block_ids: set[str] = field(default_factory=set)
    zh: bool = False
    cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> View:
        """Build a view, dropping malformed entries (entries without ids)."""

        def items(key: str, id_key: str) -> list[dict[str, Any]]:
            raw = snapshot.get(key)
            if not isinstance(raw, list):
                return []
            return [
                x
                for x in raw
                if isinstance(x, dict) and isinstance(x.get(id_key), str) and x[id_key]
            ]

        blocks = items("blocks", "blockId")
        blocks.sort(key=lambda b: (str(b.get("materialId", "")), as_number(b.get("ordinal"))))
        user_id = snapshot.get("userId")
        view = cls(
            user_id=user_id if isinstance(user_id, str) and user_id else None,
            target_type=snapshot.get("targetType")
            if isinstance(snapshot.get("targetType"), str)
            else None,
            target_id=snapshot.get("targetId")
            if isinstance(snapshot.get("targetId"), str)
            else None,
            materials=items("materials", "materialId"),
            blocks=blocks,
            kps=items("knowledgePoints", "knowledgePointId"),
            reading=items("reading", "blockId"),
            stats=stats if isinstance(stats := snapshot.get("stats"), dict) else {},
        )
        view.block_ids = {b["blockId"] for b in blocks}
        view.zh = is_cjk(
            " ".join(str(b.get("text", "")) for b in blocks[:50])
            or " ".join(str(k.get("name", "")) for k in view.kps)
        )
        return view

    def kp_blocks(self, kp: dict[str, Any]) -> list[str]:
        """The KP's block ids that exist in the snapshot."""
        raw = kp.get("blockIds")
        if not isinstance(raw, list):
            return []
        return [b for b in raw if isinstance(b, str) and b in self.block_ids]

    def kp_by_block(self) -> dict[str, str]:
        """Block id → the first knowledge point linking it."""
        out: dict[str, str] = {}
        for kp in self.kps:
            for b in self.kp_blocks(kp):
                out.setdefault(b, kp["knowledgePointId"])
        return out

    def target_blocks(self) -> list[dict[str, Any]]:
        """The blocks of the target (material / knowledge point), else all blocks."""
        blocks = self.blocks
        if self.target_type == "material" and self.target_id:
            sub = [b for b in blocks if b.get("materialId") == self.target_id]
            blocks = sub or blocks
        elif self.target_type == "knowledge_point" and self.target_id:
            kp = next((k for k in self.kps if k["knowledgePointId"] == self.target_id), None)
            if kp is not None:
                ids = set(self.kp_blocks(kp))
                sub = [b for b in blocks if b["blockId"] in ids]
                blocks = sub or blocks
        return blocks

    def term_index(self) -> TermIndex:
        """Key terms of every block's prose (cached)."""
        cached = self.cache.get("terms")
        if isinstance(cached, TermIndex):
            return cached
        sentences = [
            s
            for b in self.blocks
            if not is_code_like(str(b.get("text", "")))
            and not is_heading_like(str(b.get("text", "")))
            for s in split_sentences(str(b.get("text", "")))
        ]
        names = [str(k.get("name", "")) for k in self.kps if k.get("name")]
        names += [str(m.get("title", "")) for m in self.materials if m.get("title")]
        terms = TermIndex.build(sentences, names)
        self.cache["terms"] = terms
        return terms

    def sources(self) -> list[Source]:
        """The target's prose sentences in document order, with key terms and scores.

        Heading-like and code blocks give no sentences (a heading names the
        section of the blocks after it). ``group`` is the knowledge point
        linking the block, else the material section (heading) it is in.
        """
        cached = self.cache.get("sources")
        if isinstance(cached, list):
            return cached
        terms = self.term_index()
        kp_of = self.kp_by_block()
        out: list[Source] = []
        heading: str | None = None
        section = 0
        material: str | None = None
        for b in self.target_blocks():
            text = str(b.get("text", ""))
            mid = b.get("materialId") if isinstance(b.get("materialId"), str) else None
            if mid != material:
                material, heading, section = mid, None, section + 1
            if is_heading_like(text):
                heading = clip(clean_line(text.strip().splitlines()[0].lstrip("#")), 120)
                section += 1
                continue
            inner = heading_of(text)
            if inner:
                heading, section = clip(inner, 120), section + 1
            if is_code_like(text):
                continue
            kp_id = kp_of.get(b["blockId"])
            for s in split_sentences(text):
                keys = terms.keys_of(s)
                out.append(
                    Source(
                        s,
                        b["blockId"],
                        mid,
                        heading,
                        kp_id,
                        keys,
                        position=len(out),
                        group=kp_id or f"{material}#{section}",
                        score=sentence_score(s, keys, terms),
                    )
                )
        self.cache["sources"] = out
        return out


#: The largest count or measure a snapshot's number is taken as (a sum of many stays
#: finite, so every figure derived from them is printable).
NUMBER_BOUND = 1e12


def as_number(value: Any, default: float = 0.0) -> float:
    """``value`` as a float within ±:data:`NUMBER_BOUND`; ``default`` for a non-number,
    a boolean, NaN or an infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        return default
    return max(-NUMBER_BOUND, min(NUMBER_BOUND, number))


def kp_accuracy(kp: dict[str, Any]) -> float | None:
    attempts = as_number(kp.get("attempts"))
    if attempts <= 0:
        return None
    acc = kp.get("accuracy")
    if isinstance(acc, (int, float)) and not isinstance(acc, bool):
        return max(0.0, min(1.0, float(acc)))
    return max(0.0, min(1.0, as_number(kp.get("correct")) / attempts))


def material_progress(m: dict[str, Any]) -> float:
    p = m.get("progress")
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        return max(0.0, min(1.0, float(p)))
    total = as_number(m.get("blockCount"))
    return max(0.0, min(1.0, as_number(m.get("readBlockCount")) / total)) if total > 0 else 0.0


def percent(x: float) -> str:
    return f"{round(x * 100)}%"


def kp_name(kp: dict[str, Any]) -> str:
    return clip(str(kp.get("name") or kp["knowledgePointId"]), 120)


def material_title(m: dict[str, Any]) -> str:
    return clip(str(m.get("title") or m["materialId"]), 120)
