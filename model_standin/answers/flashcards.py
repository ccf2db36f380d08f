"""Flashcards (reference §5 ``Flashcard``): a question or term front, the source sentence
as the back.

Fronts are questions ("What is X?", "Explain why …", "什么是X？", "为什么…？") when
the sentence defines, names or explains something, a cloze of its key term
otherwise; cards spread over the material's sections and knowledge points.
"""

from __future__ import annotations

from typing import Any

from model_standin.answers.picking import (
    MIN_SCORE,
    blanked,
    fit_budget,
    pick_sources,
    requested_count,
    source_groups,
)
from model_standin.answers.shapes import (
    BECAUSE_RE,
    CALLED_END_RE,
    DEF_IS_RE,
    DEF_MEANS_RE,
    LIST_DEF_RE,
    NAMED_RE,
    PRONOUN_START_RE,
    SHORT_IS_RE,
    WHY_RE,
    ZH_DEF_RE,
    ZH_NAMED_RE,
    ZH_PRONOUN_START,
    ZH_WHY_RE,
    decap,
    is_plural,
    short_ok,
    subject_ok,
    words_ok,
)
from model_standin.answers.snapshot import Source, View
from model_standin.answers.text import clip, is_cjk


def flashcard_generation(view: View, params: dict[str, Any]) -> dict[str, Any]:
    """``{"items": [Flashcard]}`` v1: a question or term front, the source sentence as back.

    ``params.count`` (default 5, 1..50) distinct cards, spread across the
    material's sections (and knowledge points), listed in document order.
    Fronts are questions ("What is X?", "Explain why …", "What does “X”
    mean?") when the sentence defines, names or explains something, and a
    cloze of its key term otherwise.
    """
    count = requested_count(params, 5, 50)
    sources = view.sources()
    chosen = pick_sources(
        source_groups(
            view, [s for s in sources if s.score >= MIN_SCORE], count, weakest_first=False
        ),
        count,
        lambda s: 0.0 if (_front(s) or "").startswith(("Fill in", "填空")) else 1.2,
    )
    chosen.sort(key=lambda s: s.position)
    items: list[tuple[int, dict[str, Any]]] = []
    fronts: set[str] = set()
    taken: set[int] = set()
    backups = sorted(sources, key=lambda s: (-s.score, s.position))
    for src in [*chosen, *backups]:
        if len(items) >= count:
            break
        if id(src) in taken:
            continue
        front = _front(src)
        if front is None or front in fronts:
            continue
        taken.add(id(src))
        fronts.add(front)
        card: dict[str, Any] = {
            "front": clip(front, 4000),
            "back": clip(src.sentence, 4000),
            "sourceBlockIds": [src.block_id],
        }
        if src.kp_id:
            card["knowledgePointId"] = src.kp_id
        items.append((src.position, card))
    # small materials: a second card from a sentence clozes its next key term
    for src in backups:
        if len(items) >= count:
            break
        for key in src.keys[1:3]:
            front = ("填空：" if is_cjk(key) else "Fill in the blank: ") + blanked(
                src.sentence, key
            )
            if front in fronts or "____" not in front:
                continue
            fronts.add(front)
            extra: dict[str, Any] = {
                "front": clip(front, 4000),
                "back": clip(src.sentence, 4000),
                "sourceBlockIds": [src.block_id],
            }
            if src.kp_id:
                extra["knowledgePointId"] = src.kp_id
            items.append((src.position, extra))
            break
    items.sort(key=lambda t: t[0])
    return {"items": fit_budget([c for _, c in items])}


def _front(src: Source) -> str | None:
    s = src.sentence
    if is_cjk(s):
        m = ZH_DEF_RE.match(s)
        if m and not m.group("subj").startswith(ZH_PRONOUN_START):
            return f"什么是{m.group('subj').strip()}？"
        m = ZH_NAMED_RE.search(s)
        if m and m.start() > 2:
            return f"什么是{m.group('term')}？"
        m = ZH_WHY_RE.match(s)
        if m:
            return f"为什么{m.group('effect').strip()}？"
        if not src.keys:
            return None
        return "填空：" + blanked(s, src.keys[0])
    m = DEF_IS_RE.match(s) or DEF_MEANS_RE.match(s)
    if m and subject_ok(m.group("subj")):
        verb = "are" if m.groupdict().get("verb") == "are" else "is"
        return f"What {verb} {decap(m.group('subj').strip())}?"
    m = NAMED_RE.match(s) or CALLED_END_RE.search(s)
    if m and words_ok(m.group("term")):
        term = m.group("term")
        if m.groupdict().get("the"):
            term = "the " + term
        return f"What {'are' if is_plural(term) else 'is'} {decap(term)}?"
    m = LIST_DEF_RE.match(s)
    if m:
        return f"What does “{decap(m.group('term'))}” mean?"
    m = SHORT_IS_RE.match(s)
    if m and short_ok(m):
        return f"What {m.group('verb')} {decap(m.group('subj'))}?"
    m = WHY_RE.match(s)
    if m:
        return f"Explain why {m.group('claim').strip()}."
    m = BECAUSE_RE.match(s)
    if m and not PRONOUN_START_RE.match(m.group("claim")):
        return f"Explain why {decap(m.group('claim').strip())}."
    if not src.keys:
        return None
    return "Fill in the blank: " + blanked(s, src.keys[0])
