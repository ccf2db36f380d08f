"""Readable text for the demo's results (not raw JSON).

Each ``render_*`` function takes the result items of one job type (reference §5
shapes, camelCase) and a :class:`Lookup` that turns ids into what a reader
recognises: block ids into their ordinals ("block #12"), knowledge point ids
into names, targets into "material "Title"" / "knowledge point "Name"" / "you".
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WIDTH = 96


@dataclass
class Lookup:
    """Id → display text for the demo's own data."""

    block_ordinals: dict[str, int] = field(default_factory=dict)
    kp_names: dict[str, str] = field(default_factory=dict)
    material_id: str = ""
    material_title: str = ""
    user_id: str = ""

    def blocks(self, ids: Sequence[Any]) -> str:
        """``"blocks #3, #7"`` (unknown ids shown as ``?<id>``)."""
        if not ids:
            return "no block"
        parts = [
            f"#{self.block_ordinals[str(i)]}" if str(i) in self.block_ordinals else f"?{i}"
            for i in ids
        ]
        return ("block " if len(parts) == 1 else "blocks ") + ", ".join(parts)

    def kp(self, kp_id: Any) -> str:
        """A knowledge point's name in quotes (or its raw id if unknown)."""
        return f"“{self.kp_names[str(kp_id)]}”" if str(kp_id) in self.kp_names else f"?{kp_id}"

    def target(self, target_type: Any, target_id: Any) -> str:
        """A recommendation target in words."""
        if target_type == "user":
            return "you (overall)" if str(target_id) == self.user_id else f"user ?{target_id}"
        if target_type == "material":
            if str(target_id) == self.material_id:
                return f"material “{self.material_title}”"
            return f"material ?{target_id}"
        if target_type == "knowledge_point":
            return f"knowledge point {self.kp(target_id)}"
        return f"{target_type} {target_id}"


def char_width(ch: str) -> int:
    """Terminal columns of one character: 2 for East Asian wide/full-width, else 1."""
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    """Terminal columns of a string (CJK characters count double)."""
    return sum(char_width(ch) for ch in text)


def pad(text: str, width: int) -> str:
    """``text`` cut or padded with spaces to exactly ``width`` columns."""
    out, used = [], 0
    for ch in text:
        w = char_width(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out) + " " * (width - used)


def _tokens(text: str) -> list[str]:
    """Words separated by spaces; every wide (CJK) character is a token of its own
    (CJK text may break between any two characters), glued to a following
    punctuation mark so a line never starts with ，。etc."""
    tokens: list[str] = []
    for word in text.split():
        if tokens:
            tokens.append(" ")
        buf = ""
        for ch in word:
            if char_width(ch) == 2:
                if unicodedata.category(ch).startswith("P") and (buf or tokens):
                    if buf:
                        buf += ch
                    else:
                        tokens[-1] += ch
                    continue
                if buf:
                    tokens.append(buf)
                buf = ch
                tokens.append(buf)
                buf = ""
            else:
                buf += ch
        if buf:
            tokens.append(buf)
    return tokens


def wrap(text: Any, indent: str, first: str | None = None) -> list[str]:
    """Wrap ``text`` to :data:`WIDTH` columns with ``indent`` (``first`` for the first
    line); CJK characters count two columns and may break anywhere."""
    first = indent if first is None else first
    lines: list[str] = []
    line, used = first, text_width(first)
    fresh = True
    for token in _tokens(str(text)):
        if token == " ":
            if not fresh:
                line, used = line + " ", used + 1
            continue
        width = text_width(token)
        if not fresh and used + width > WIDTH:
            lines.append(line.rstrip())
            line, used, fresh = indent, text_width(indent), True
        while used + width > WIDTH and len(token) > 1:  # a word longer than a line
            room = WIDTH - used
            head = pad(token, room).rstrip() or token[0]
            lines.append(line + head)
            token = token[len(head) :]
            width = text_width(token)
            line, used = indent, text_width(indent)
        line, used, fresh = line + token, used + width, False
    lines.append(line.rstrip())
    return lines


def bar(value: float, width: int = 20) -> str:
    """``[#######.............]`` for a 0..1 value."""
    value = min(1.0, max(0.0, value))
    filled = round(value * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def render_analysis(items: Sequence[Mapping[str, Any]], look: Lookup) -> list[str]:
    """``learning_state_analysis``: mastery, summary, strengths, risks, evidence."""
    if not items:
        return ["    (no analysis returned)"]
    a = items[0]
    mastery = _as_float(a.get("masteryLevel"))
    out = [f"    Mastery   {bar(mastery)} {mastery * 100:.0f}%"]
    out += wrap(a.get("summary", ""), "              ", "    Summary   ")
    for title, key in (("Strengths", "strengths"), ("Risks", "risks")):
        entries = a.get(key) or []
        if not entries:
            out.append(f"    {title:<9} (none)")
        for n, entry in enumerate(entries):
            out += wrap(entry, "                ", f"    {title if n == 0 else '':<9} • ")
    evidence = a.get("evidence") or []
    for n, ev in enumerate(evidence[:8]):
        ref = (
            look.blocks([ev["blockId"]])
            if ev.get("blockId")
            else f"KP {look.kp(ev.get('knowledgePointId'))}"
        )
        out += wrap(
            f"{ref}: {ev.get('note', '')}",
            "                ",
            f"    {'Evidence' if n == 0 else '':<9} • ",
        )
    if len(evidence) > 8:
        out.append(f"                … and {len(evidence) - 8} more")
    return out


def render_weak_points(items: Sequence[Mapping[str, Any]], look: Lookup) -> list[str]:
    """``weak_point_analysis``: KP name, severity, reason, evidence blocks."""
    if not items:
        return ["    (no weak points found)"]
    out: list[str] = []
    for n, wp in enumerate(items, 1):
        severity = _as_float(wp.get("severity"))
        out.append(f"    {n}. {look.kp(wp.get('knowledgePointId'))}")
        out.append(f"       severity {bar(severity, 10)} {severity:.2f}")
        out += wrap(wp.get("reason", ""), " " * 13, "       why   ")
        out.append(f"       seen in {look.blocks(wp.get('evidenceBlockIds') or [])}")
    return out


def render_recommendations(items: Sequence[Mapping[str, Any]], look: Lookup) -> list[str]:
    """``next_action_planning``: ordered by priority (0 first), action, target, reason."""
    if not items:
        return ["    (no recommendations)"]
    out: list[str] = []
    ordered = sorted(items, key=lambda r: _as_float(r.get("priority")))
    for n, rec in enumerate(ordered, 1):
        action = str(rec.get("actionType", "?")).upper()
        target = look.target(rec.get("targetType"), rec.get("targetId"))
        out.append(f"    {n}. {action:<8} {target}   (priority {rec.get('priority')})")
        out += wrap(rec.get("reason", ""), "                ")
    return out


def _answer_text(q: Mapping[str, Any]) -> str:
    answer = q.get("answer")
    options = [str(o) for o in q.get("options") or []]
    answers = answer if isinstance(answer, list) else [answer]
    shown: list[str] = []
    for a in answers:
        if isinstance(a, bool):
            word = "true" if a else "false"
            named = [i for i, o in enumerate(options) if o.casefold() == word]
            if named:
                index = named[0]
            elif len(options) == 2:  # e.g. ["正确", "错误"]: true first
                index = 0 if a else 1
            else:
                shown.append("True" if a else "False")
                continue
            shown.append(f"{chr(ord('A') + index)}) {options[index]}")
            continue
        text = str(a)
        if text in options:
            shown.append(f"{chr(ord('A') + options.index(text))}) {text}")
        elif len(text) == 1 and text.upper().isalpha() and ord(text.upper()) - 65 < len(options):
            shown.append(f"{text.upper()}) {options[ord(text.upper()) - 65]}")
        else:
            shown.append(text)
    return "; ".join(shown)


def render_quiz(items: Sequence[Mapping[str, Any]], look: Lookup) -> list[str]:
    """``quiz_generation``: stem, lettered options, answer, explanation, sources."""
    if not items:
        return ["    (no questions)"]
    out: list[str] = []
    for n, q in enumerate(items, 1):
        kind = f"{q.get('questionType', '?')}, {q.get('difficulty', '?')}"
        out += wrap(q.get("stem", ""), " " * 10, f"    Q{n:<2}   ")
        out.append(f"          ({kind})")
        for k, option in enumerate(q.get("options") or []):
            out += wrap(option, " " * 13, f"          {chr(ord('A') + k)}) ")
        out += wrap(_answer_text(q), " " * 15, "       Answer: ")
        out += wrap(q.get("explanation", ""), " " * 15, "       Why:    ")
        source = look.blocks(q.get("sourceBlockIds") or [])
        if q.get("knowledgePointId"):
            source += f" · KP {look.kp(q['knowledgePointId'])}"
        out.append(f"       Source: {source}")
        out.append("")
    return out[:-1]


def render_flashcards(items: Sequence[Mapping[str, Any]], look: Lookup) -> list[str]:
    """``flashcard_generation``: front, back, sources."""
    if not items:
        return ["    (no flashcards)"]
    out: list[str] = []
    for n, card in enumerate(items, 1):
        out += wrap(card.get("front", ""), " " * 14, f"    {n:>2}. Front ")
        out += wrap(card.get("back", ""), " " * 14, "        Back  ")
        source = look.blocks(card.get("sourceBlockIds") or [])
        if card.get("knowledgePointId"):
            source += f" · KP {look.kp(card['knowledgePointId'])}"
        out.append(f"        from  {source}")
    return out


RENDERERS = {
    "learning_state_analysis": ("Learning state analysis", render_analysis),
    "weak_point_analysis": ("Weak points", render_weak_points),
    "next_action_planning": ("Next actions", render_recommendations),
    "quiz_generation": ("Quiz", render_quiz),
    "flashcard_generation": ("Flashcards", render_flashcards),
}
