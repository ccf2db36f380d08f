"""Plain text out of Markdown blocks: CJK detection, sentence splitting, and telling
prose from headings and code.

Sentences are split on ``.!?`` before a capital or a digit and after the CJK
stops ``。！？；``; Markdown prefixes (headings, quotes, list markers), emphasis
and link targets are dropped from a line.
"""

from __future__ import annotations

import functools
import re

_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9\u3400-\u9fff])|(?<=[。！？；])")


_MD_PREFIX_RE = re.compile(r"^\s{0,3}(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,3}[.)]\s+)")


_MD_INLINE_RE = re.compile(r"(\*\*|__|`|\*(?=\S)|(?<=\S)\*)")


_LINK_RE = re.compile(r"\[([^\]]+)\]\([^)]*\)")


_CODE_CHARS = frozenset("=+<>{}[]()/*_|\\^~#;")


_CODE_LINE_RE = re.compile(
    r"^\s*(?:def |class |return\b|import |from \S+ import|(?:if|for|while|elif) .*:\s*$|else:|"
    r"function\b|var |let |const |#include|public |private |[{}])"
)


@functools.lru_cache(maxsize=8192)
def is_cjk(text: str) -> bool:
    """True when at least 30 % of the letters of ``text`` are CJK."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    return sum(1 for c in letters if _CJK_RE.match(c)) / len(letters) >= 0.3


def clean_line(line: str) -> str:
    line = _LINK_RE.sub(r"\1", line)
    line = _MD_PREFIX_RE.sub("", line)
    line = _MD_INLINE_RE.sub("", line)
    return " ".join(line.split())


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def split_sentences(text: str) -> list[str]:
    """Split Markdown/plain text into clean sentences (headings and code excluded).

    Western sentences end in ``.!?`` followed by a space; CJK ones end in
    ``。！？；``. Dropped: lines inside code fences, sentences ending in a
    colon, formulas and code (``→``, ``==`` or many symbols), CJK sentences
    shorter than 6 characters, others shorter than 12 characters or with
    fewer than four words (or fewer than three words of 3+ letters).
    """
    out: list[str] = []
    paragraphs: list[list[str]] = [[]]
    fenced = False
    for raw in text.splitlines():
        if raw.strip().startswith(("```", "~~~")):
            fenced = not fenced
            paragraphs.append([])
            continue
        if fenced or not raw.strip() or raw.lstrip().startswith("#"):
            paragraphs.append([])
            continue
        paragraphs[-1].append(clean_line(raw))
    for para in paragraphs:
        joined = " ".join(p for p in para if p)
        for s in _SENTENCE_SPLIT_RE.split(joined):
            s = s.strip()
            if not s or s[-1] in ":：":  # an introduction to what follows, not a fact
                continue
            if "→" in s or "==" in s or sum(1 for c in s if c in _CODE_CHARS) > 0.06 * len(s):
                continue
            if is_cjk(s):
                if len(s) >= 6:
                    out.append(s)
            elif len(s) >= 12 and len(s.split()) >= 4 and len(re.findall(r"[A-Za-z]{3,}", s)) >= 3:
                out.append(s)
    return out


def is_heading_like(text: str) -> bool:
    """True for a block that reads like a heading, not prose.

    Snapshot blocks carry no ``kind``, so this is a heuristic: a Markdown
    heading line, or a single short line (at most 12 words, or 30 CJK
    characters) that does not end in sentence punctuation.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return False
    if all(line.lstrip().startswith("#") for line in lines):
        return True
    if len(lines) != 1:
        return False
    line = clean_line(lines[0])
    if not line or line[-1] in ".!?。！？；…:：":
        return False
    return len(line) <= 30 if is_cjk(line) else len(line.split()) <= 12


def is_code_like(text: str) -> bool:
    """True for a block of source code (keywords, braces, symbols, indentation)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return False
    codey = sum(
        1 for line in lines if _CODE_LINE_RE.match(line) or line.rstrip().endswith((";", "{", "}"))
    )
    indented = sum(1 for line in lines if line.startswith(("    ", "\t")))
    symbols = sum(1 for c in text if c in "=(){}[];<>") / max(1, len(text))
    return (
        codey >= max(1, len(lines) // 3)
        or (len(lines) >= 2 and indented >= len(lines) / 2)
        or symbols > 0.08
    )


def heading_of(text: str) -> str | None:
    """The first Markdown heading of ``text``, cleaned, or None."""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            h = clean_line(raw)
            if h:
                return h
    return None
