"""Pure helpers of the demo: knowledge points from headings, learning activity, citation check.

Nothing here does I/O, so every rule is unit-tested on its own.

Knowledge points (:func:`plan_knowledge_points`): the document's Markdown
headings (ATX ``##`` and setext, outside code fences) are matched, in order,
to the blocks the API returned (a block whose text, without ``#`` marks and
inline emphasis, equals the heading's). The heading level used is the first
of 2, 1, 3, 4, 5, 6 with at least ``minimum`` matched headings; each heading
of that level opens a section that runs to the next heading of that level or
higher, and a section's blocks become one knowledge point named after the
heading (heading blocks, its own and sub-headings, are left out unless the
section has nothing else). More than
``maximum`` sections: evenly spaced ones are kept (first and last included).
No usable headings (plain text): the blocks are cut into ``minimum``
contiguous parts named "Part i: <opening words>".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from airuntime_common.timeutil import rfc3339

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_INLINE = re.compile(r"[*_`~]+")
_SPACES = re.compile(r"\s+")
_LEVEL_PREFERENCE = (2, 1, 3, 4, 5, 6)
NAME_LIMIT = 120


@dataclass(frozen=True)
class Heading:
    """A Markdown heading: level 1..6 and its text (markup kept)."""

    level: int
    text: str


@dataclass(frozen=True)
class KnowledgePointPlan:
    """A knowledge point to create: its name and the blocks it links (ids and ordinals)."""

    name: str
    block_ids: tuple[str, ...]
    ordinals: tuple[int, ...]


def clean_heading(text: str) -> str:
    """Heading text for display: links to their label, emphasis marks and ``#`` removed."""
    text = _LINK.sub(r"\1", text.strip())
    text = text.strip().lstrip("#").strip()
    text = re.sub(r"[ \t]+#+$", "", text)
    text = _INLINE.sub("", text)
    return _SPACES.sub(" ", text).strip()


def normalize(text: str) -> str:
    """Comparison key of a heading or block text (clean, case-folded)."""
    return clean_heading(text).casefold()


def document_headings(document: str) -> list[Heading]:
    """ATX and setext headings of a Markdown text, in order, outside fenced code."""
    headings: list[Heading] = []
    fence: str | None = None
    previous = ""
    for line in document.splitlines():
        stripped = line.strip()
        match_fence = _FENCE.match(line)
        if fence is not None:
            if (
                match_fence
                and match_fence.group(1)[0] == fence[0]
                and len(match_fence.group(1)) >= len(fence)
            ):
                fence = None
            previous = ""
            continue
        if match_fence:
            fence = match_fence.group(1)
            previous = ""
            continue
        atx = _ATX.match(line)
        if atx and (atx.group(2) or "").strip():
            headings.append(Heading(len(atx.group(1)), atx.group(2).strip()))
            previous = ""
            continue
        setext = _SETEXT.match(line)
        if setext and previous and not previous.startswith(("-", "*", "+", ">", "|")):
            headings.append(Heading(1 if setext.group(1)[0] == "=" else 2, previous))
            previous = ""
            continue
        previous = stripped
    return headings


def _ordered(blocks: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(blocks, key=lambda b: int(b["ordinal"]))


def match_heading_blocks(
    headings: Sequence[Heading], blocks: Sequence[Mapping[str, Any]]
) -> dict[int, int]:
    """Index of each heading's block in ``blocks`` (ordinal order) → the heading's level.

    Matching is in document order: heading *j* is searched after the block
    of the last matched heading; a heading with no equal block is skipped.
    """
    keys = [normalize(str(b.get("text", ""))) for b in blocks]
    found: dict[int, int] = {}
    cursor = 0
    for heading in headings:
        key = normalize(heading.text)
        if not key:
            continue
        for k in range(cursor, len(blocks)):
            if keys[k] == key:
                found[k] = heading.level
                cursor = k + 1
                break
    return found


def _spread(count: int, keep: int) -> list[int]:
    """``keep`` evenly spaced indices of ``range(count)``, first and last included."""
    if count <= keep:
        return list(range(count))
    if keep == 1:
        return [0]
    return sorted({round(i * (count - 1) / (keep - 1)) for i in range(keep)})


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out: list[str] = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return out


def _snippet(text: str, words: int = 6, chars: int = 40) -> str:
    text = clean_heading(text)
    parts = text.split()
    short = " ".join(parts[:words])
    if len(short) > chars:
        short = short[:chars].rstrip()
    return short + ("…" if len(short) < len(text) else "")


def plan_knowledge_points(
    document: str,
    blocks: Iterable[Mapping[str, Any]],
    *,
    minimum: int = 3,
    maximum: int = 6,
) -> list[KnowledgePointPlan]:
    """Knowledge points for a document, from its headings (see the module docstring).

    Args:
        document: the Markdown / plain text uploaded.
        blocks: the API's blocks, each ``{"blockId", "ordinal", "text"}``.
        minimum: sections wanted at least (also the number of parts without headings).
        maximum: sections kept at most.

    Returns:
        Between 1 and ``maximum`` plans (fewer than ``minimum`` only when the
        document has fewer blocks); each links at least one block.

    Raises:
        ValueError: no blocks, or ``minimum``/``maximum`` out of order.
    """
    if not 1 <= minimum <= maximum:
        raise ValueError("need 1 <= minimum <= maximum")
    ordered = _ordered(blocks)
    if not ordered:
        raise ValueError("the material has no blocks")
    matched = match_heading_blocks(document_headings(document), ordered)

    level = next(
        (
            lvl
            for lvl in _LEVEL_PREFERENCE
            if sum(1 for v in matched.values() if v == lvl) >= minimum
        ),
        None,
    )
    plans: list[tuple[str, list[Mapping[str, Any]]]] = []
    if level is not None:
        starts = sorted(k for k, v in matched.items() if v == level)
        for start in starts:
            body: list[Mapping[str, Any]] = []
            for k in range(start + 1, len(ordered)):
                if k in matched and matched[k] <= level:
                    break
                if k not in matched:
                    body.append(ordered[k])
            name = clean_heading(str(ordered[start].get("text", "")))
            plans.append((name, body or [ordered[start]]))
        plans = [plans[i] for i in _spread(len(plans), maximum)]
    if len(plans) < minimum:
        plans = _parts(ordered, matched, minimum)

    names = _unique([name[:NAME_LIMIT] or f"Part {i + 1}" for i, (name, _) in enumerate(plans)])
    return [
        KnowledgePointPlan(
            name=name,
            block_ids=tuple(str(b["blockId"]) for b in body),
            ordinals=tuple(int(b["ordinal"]) for b in body),
        )
        for name, (_, body) in zip(names, plans, strict=True)
    ]


def _parts(
    ordered: list[Mapping[str, Any]], matched: Mapping[int, int], count: int
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """Contiguous, near-equal parts of the blocks, named "Part i: <opening words>"."""
    count = min(count, len(ordered))
    size, extra = divmod(len(ordered), count)
    parts: list[tuple[str, list[Mapping[str, Any]]]] = []
    start = 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        chunk = ordered[start:end]
        body = [b for j, b in enumerate(chunk, start) if j not in matched] or chunk
        opener = next(
            (str(b.get("text", "")) for j, b in enumerate(chunk, start) if j in matched),
            str(body[0].get("text", "")),
        )
        parts.append((f"Part {i + 1}: {_snippet(opener)}", body))
        start = end
    return parts


# -- learning activity ------------------------------------------------------

#: Quiz attempts per knowledge point and how many of them are correct, by KP index
#: (cycled): some strong, some weak, every one mixed.
ATTEMPTS_PER_KP = 5
CORRECT_PATTERN = (4, 1, 3, 2, 4, 1)
#: Share of a knowledge point's blocks that get a reading event, by KP index (cycled).
READ_SHARE_PATTERN = (1.0, 0.5, 1.0, 0.34, 0.75, 0.2)
READING_CHARS_PER_SECOND = 15.0


@dataclass
class LearningActivity:
    """The events the demo records, and a per-KP summary for printing."""

    reading: list[dict[str, Any]] = field(default_factory=list)
    quiz: list[dict[str, Any]] = field(default_factory=list)
    #: KP id → (blocks read, blocks linked, correct answers, attempts).
    summary: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Reading events first, then quiz attempts (oldest first within each)."""
        return [*self.reading, *self.quiz]


def plan_learning_activity(
    *,
    material_id: str,
    knowledge_points: Sequence[tuple[str, KnowledgePointPlan]],
    block_texts: Mapping[str, str],
    now: datetime,
    run_tag: str,
) -> LearningActivity:
    """Reading events and quiz attempts over the last three days (reference §3.1 event shape).

    Knowledge point *i* gets reading events for the first
    ``READ_SHARE_PATTERN[i]`` of its blocks (dwell seconds = text length / 15
    chars per second, clamped to 5..600; halved for weakly answered KPs) and
    ``ATTEMPTS_PER_KP`` quiz attempts, ``CORRECT_PATTERN[i]`` of them correct,
    interleaved. Event ids are ``<run_tag>-r<ordinal>`` / ``<run_tag>-q<i>-<n>``.

    Args:
        material_id: the uploaded material.
        knowledge_points: ``(knowledgePointId, plan)`` pairs, in order.
        block_texts: block id → text (for dwell times).
        now: the current UTC time; events are placed before it.
        run_tag: makes event ids unique per run.
    """
    activity = LearningActivity()
    start = now - timedelta(days=3)
    step = timedelta(minutes=7)
    clock = start
    for i, (kp_id, plan) in enumerate(knowledge_points):
        correct = CORRECT_PATTERN[i % len(CORRECT_PATTERN)]
        share = READ_SHARE_PATTERN[i % len(READ_SHARE_PATTERN)]
        read_count = max(1, round(share * len(plan.block_ids))) if plan.block_ids else 0
        weak = correct * 2 < ATTEMPTS_PER_KP
        for block_id, ordinal in list(zip(plan.block_ids, plan.ordinals, strict=True))[:read_count]:
            dwell = len(block_texts.get(block_id, "")) / READING_CHARS_PER_SECOND
            dwell = min(600.0, max(5.0, dwell * (0.5 if weak else 1.0)))
            activity.reading.append(
                {
                    "eventId": f"{run_tag}-r{ordinal}",
                    "type": "reading",
                    "materialId": material_id,
                    "blockId": block_id,
                    "dwellSeconds": round(dwell, 1),
                    "occurredAt": rfc3339(clock),
                }
            )
            clock += step
        outcomes = [n < correct for n in range(ATTEMPTS_PER_KP)]
        # interleave right and wrong answers so every KP's history is mixed
        outcomes = outcomes[::2] + outcomes[1::2]
        for n, is_correct in enumerate(outcomes):
            activity.quiz.append(
                {
                    "eventId": f"{run_tag}-q{i + 1}-{n + 1}",
                    "type": "quiz_attempt",
                    "materialId": material_id,
                    "knowledgePointId": kp_id,
                    "correct": is_correct,
                    "occurredAt": rfc3339(clock),
                }
            )
            clock += step
        activity.summary[kp_id] = (read_count, len(plan.block_ids), correct, ATTEMPTS_PER_KP)
    return activity


# -- citations --------------------------------------------------------------


@dataclass
class CitationReport:
    """What the results cite and what of it is foreign to the demo's data."""

    blocks_cited: set[str] = field(default_factory=set)
    foreign_blocks: set[str] = field(default_factory=set)
    kps_cited: set[str] = field(default_factory=set)
    foreign_kps: set[str] = field(default_factory=set)
    targets_cited: set[tuple[str, str]] = field(default_factory=set)
    foreign_targets: set[tuple[str, str]] = field(default_factory=set)
    items_without_source: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every citation belongs to the document, its KPs and the user."""
        return not (
            self.foreign_blocks
            or self.foreign_kps
            or self.foreign_targets
            or self.items_without_source
        )


def cited_block_ids(item: Mapping[str, Any]) -> list[str]:
    """Block ids an item cites: ``sourceBlockIds``, ``evidenceBlockIds``, ``evidence[].blockId``."""
    ids: list[str] = []
    for key in ("sourceBlockIds", "evidenceBlockIds"):
        ids.extend(str(x) for x in item.get(key) or [])
    for ev in item.get("evidence") or []:
        if isinstance(ev, Mapping) and ev.get("blockId"):
            ids.append(str(ev["blockId"]))
    return ids


def cited_kp_ids(item: Mapping[str, Any]) -> list[str]:
    """Knowledge point ids an item cites: ``knowledgePointId`` and ``evidence[].knowledgePointId``."""
    ids = [str(item["knowledgePointId"])] if item.get("knowledgePointId") else []
    for ev in item.get("evidence") or []:
        if isinstance(ev, Mapping) and ev.get("knowledgePointId"):
            ids.append(str(ev["knowledgePointId"]))
    return ids


def check_citations(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    block_ids: Iterable[str],
    kp_ids: Iterable[str],
    material_id: str,
    user_id: str,
) -> CitationReport:
    """Check every id the results cite against the demo's own data (reference §5 ownership).

    Args:
        results: jobType → result items.
        block_ids: the document's blocks.
        kp_ids: the knowledge points the demo created.
        material_id: the uploaded material.
        user_id: the demo's user.

    Returns:
        The report; quiz questions and flashcards without any source block are listed too.
    """
    blocks, kps = set(block_ids), set(kp_ids)
    targets = {("user", user_id), ("material", material_id)} | {("knowledge_point", k) for k in kps}
    report = CitationReport()
    for job_type, items in results.items():
        for n, item in enumerate(items, 1):
            cited = cited_block_ids(item)
            report.blocks_cited.update(cited)
            report.foreign_blocks.update(b for b in cited if b not in blocks)
            kp_cited = cited_kp_ids(item)
            report.kps_cited.update(kp_cited)
            report.foreign_kps.update(k for k in kp_cited if k not in kps)
            if job_type in ("quiz_generation", "flashcard_generation") and not item.get(
                "sourceBlockIds"
            ):
                report.items_without_source.append(f"{job_type} item {n}")
            if job_type == "next_action_planning" and item.get("targetType"):
                target = (str(item["targetType"]), str(item.get("targetId")))
                report.targets_cited.add(target)
                if target not in targets:
                    report.foreign_targets.add(target)
    return report
