"""Which sentences questions and flashcards are made from, and the answer's size.

Picks are spread over groups — knowledge points (weakest first for quizzes),
then sections, evenly spaced — and over the blocks within a group
(:func:`pick_sources`). An answer is kept within :data:`OUTPUT_TOKEN_BUDGET`
estimated tokens, as a model writes within its ``max_tokens`` (:func:`fit_budget`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from model_standin.answers.snapshot import Source, View, kp_accuracy
from model_standin.answers.text import clip, is_cjk


def blanked(sentence: str, term: str) -> str:
    """``sentence`` with every occurrence of ``term`` replaced by ``____``.

    An article before the blank becomes "a(n)" so it does not give the answer away.
    """
    if is_cjk(term):
        return sentence.replace(term, "____")
    out = re.sub(r"(?<![\w])" + re.escape(term) + r"(?![\w])", "____", sentence)
    return re.sub(r"\b([Aa])n? ____", r"\1(n) ____", out)


def requested_count(params: dict[str, Any], default: int, maximum: int) -> int:
    raw = params.get("count", default)
    n = int(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else default
    return max(1, min(maximum, n))


#: Sentences scoring below this are used only when better ones run out.
MIN_SCORE = 1.0


def _spread(count: int, total: int) -> list[int]:
    """``count`` evenly spaced indices of ``range(total)`` (first and last included)."""
    if count >= total:
        return list(range(total))
    if count == 1:
        return [0]
    return sorted({round(i * (total - 1) / (count - 1)) for i in range(count)})


def pick_sources(
    groups: list[list[Source]], count: int, bonus: Callable[[Source], float] | None = None
) -> list[Source]:
    """Choose up to ``count`` sentences spread over ``groups`` (in order) and their blocks.

    The groups share the count round-robin (a group with nothing left passes
    its turn on); within a group each pick is the best-scoring sentence of an
    evenly spaced slice of the group's blocks, so picks spread across the
    material rather than cluster at its start. ``bonus`` adds to a
    sentence's score for this choice.
    """

    def rank(s: Source) -> float:
        return s.score + (bonus(s) if bonus else 0.0)

    groups = [g for g in groups if g]
    quota = [0] * len(groups)
    left = count
    while left > 0:
        progressed = False
        for i, g in enumerate(groups):
            if left and quota[i] < len(g):
                quota[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    picked: list[Source] = []
    for g, q in zip(groups, quota, strict=True):
        if not q:
            continue
        blocks = list(dict.fromkeys(s.block_id for s in g))
        chosen: list[Source] = []
        # one slice of blocks per pick
        bounds = [round(i * len(blocks) / q) for i in range(q + 1)] if q <= len(blocks) else []
        if bounds:
            for i in range(q):
                ids = set(blocks[bounds[i] : bounds[i + 1]])
                cands = [s for s in g if s.block_id in ids and s not in chosen]
                if cands:
                    chosen.append(max(cands, key=lambda s: (rank(s), -s.position)))
        for s in sorted(g, key=lambda s: (-rank(s), s.position)):
            if len(chosen) >= q:
                break
            if s not in chosen:
                chosen.append(s)
        picked.extend(chosen)
    return picked


def _kp_weakness(kp: dict[str, Any]) -> tuple[int, float, str]:
    acc = kp_accuracy(kp)
    return (0 if acc is not None else 1, acc if acc is not None else 0.0, kp["knowledgePointId"])


def source_groups(
    view: View, sources: list[Source], count: int, weakest_first: bool
) -> list[list[Source]]:
    """Sources grouped by knowledge point, then by section (heading) for unlinked blocks.

    Quizzes (``weakest_first``): KP groups by weakness (lowest accuracy first,
    never-practised next), then the other sections. Flashcards: all groups.
    Sections are ordered so that the first ones served are evenly spaced over
    the material (the first and last section included), the rest follow in
    document order.
    """
    by: dict[str, list[Source]] = {}
    for s in sources:
        by.setdefault(s.group, []).append(s)
    ordered = sorted(by.values(), key=lambda g: g[0].position)

    def spread_first(groups: list[list[Source]], wanted: int) -> list[list[Source]]:
        picks = _spread(max(0, min(wanted, len(groups))), len(groups)) if wanted > 0 else []
        return [groups[i] for i in picks] + [g for i, g in enumerate(groups) if i not in set(picks)]

    if not weakest_first:
        return spread_first(ordered, count)
    kps = {k["knowledgePointId"]: k for k in view.kps}
    kp_groups = [g for g in ordered if g[0].group in kps]
    kp_groups.sort(key=lambda g: _kp_weakness(kps[g[0].group]))
    other = [g for g in ordered if g[0].group not in kps]
    return kp_groups + spread_first(other, count - len(kp_groups))


#: Output budget in estimated tokens, below the worker's generation max_tokens (6144).
OUTPUT_TOKEN_BUDGET = 5600


def estimate_tokens(text: str) -> int:
    """DeepSeek's rule of thumb: ≈0.3 token per ASCII char, ≈0.6 per other char."""
    ascii_chars = sum(1 for c in text if ord(c) < 128)
    return max(1, math.ceil(ascii_chars * 0.3 + (len(text) - ascii_chars) * 0.6))


def fit_budget(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the answer within :data:`OUTPUT_TOKEN_BUDGET` (as a model writes within max_tokens).

    Long explanations are shortened first, then items are dropped from the end.
    """

    def size() -> int:
        return estimate_tokens(json.dumps({"items": items}, ensure_ascii=False))

    if size() <= OUTPUT_TOKEN_BUDGET:
        return items
    for q in items:
        if "explanation" in q:
            q["explanation"] = clip(q["explanation"], 200)
    while len(items) > 1 and size() > OUTPUT_TOKEN_BUDGET:
        items.pop()
    return items
