"""Key terms and how informative a sentence is.

Key terms are recurring noun-like phrases (1–3 content words; for CJK,
knowledge-point-name runs and recurring n-grams that are not fragments of longer
ones) (:class:`TermIndex`). A sentence scores for moderate length, a defining
verb ("is a / means / is called"), numbers, key terms and knowledge-point names,
and loses for leaning on the previous one (:func:`sentence_score`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from model_standin.answers.lexicon import (
    CJK_FUNCTION_WORDS,
    CJK_RUN_RE,
    CJK_STOP,
    CJK_VERBS,
    EN_TOKEN_RE,
    content_token,
    en_key,
    is_acronym,
)
from model_standin.answers.shapes import (
    DEF_IS_RE,
    DEF_MEANS_RE,
    LIST_DEF_RE,
    NAMED_RE,
    PRONOUN_START_RE,
    ZH_DEF_RE,
    ZH_NAMED_RE,
    ZH_PRONOUN_START,
)
from model_standin.answers.text import clean_line, is_cjk

_NOUN_CONTEXT_RE = re.compile(
    r"\b(?:the|a|an|of|its|their|each|every|this|these)\s+([A-Za-z][A-Za-z0-9\-]*)", re.I
)


def en_phrases(sentence: str, max_words: int = 3) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of candidate English terms (1–3 content words) in ``sentence``."""
    spans: list[tuple[int, int]] = []
    run: list[re.Match[str]] = []

    def flush() -> None:
        for n in range(1, max_words + 1):
            for i in range(len(run) - n + 1):
                spans.append((run[i].start(), run[i + n - 1].end()))
        run.clear()

    for m in EN_TOKEN_RE.finditer(sentence):
        if run and sentence[run[-1].end() : m.start()] != " ":
            flush()
        touches_code = sentence[m.start() - 1 : m.start()] in ("_", ":", ".") or sentence[
            m.end() : m.end() + 1
        ] in ("_", "(")
        if content_token(m.group()) and not touches_code:
            run.append(m)
        else:
            flush()
    flush()
    return spans


def _cjk_ok(gram: str) -> bool:
    return (
        gram[0] not in CJK_STOP
        and gram[-1] not in CJK_STOP
        and not any(f in gram for f in CJK_FUNCTION_WORDS)
    )


@dataclass
class TermIndex:
    """Key terms of the material: document frequency, KP-name terms, surface forms.

    English terms are runs of 1–3 content words; CJK terms are 2–6-character
    n-grams that recur across sentences (a shorter gram that only ever occurs
    inside one longer gram is dropped) plus the CJK runs of KP names.
    """

    df: Counter[str] = field(default_factory=Counter)
    surface: dict[str, Counter[str]] = field(default_factory=dict)
    name_keys: set[str] = field(default_factory=set)
    name_whole: set[str] = field(default_factory=set)
    name_single: set[str] = field(default_factory=set)
    cjk: dict[str, float] = field(default_factory=dict)
    subsumed: set[str] = field(default_factory=set)
    nounish: set[str] = field(default_factory=set)
    memo: dict[str, float] = field(default_factory=dict)
    pools: dict[bool, list[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, sentences: list[str], names: list[str]) -> TermIndex:
        """Index ``sentences`` (the whole material); ``names``: KP names and titles."""
        idx = cls()
        for s in sentences:
            if is_cjk(s):
                continue
            seen: set[str] = set()
            for m in _NOUN_CONTEXT_RE.finditer(s):
                idx.nounish.add(en_key(m.group(1)))
            for a, b in en_phrases(s):
                surf = s[a:b]
                key = en_key(surf)
                if a == 0 and not is_acronym(surf.split()[0]):
                    idx.surface.setdefault(key, Counter())[surf[:1].lower() + surf[1:]] += 1
                else:
                    idx.surface.setdefault(key, Counter())[surf] += 2
                seen.add(key)
            idx.df.update(seen)
        for key, df in idx.df.items():
            words = key.split()
            if df < 2 or len(words) < 2:
                continue
            for n in range(1, len(words)):
                for i in range(len(words) - n + 1):
                    sub = " ".join(words[i : i + n])
                    if df >= 0.6 * idx.df[sub]:
                        idx.subsumed.add(sub)
        for name in names:
            clean = clean_line(name)
            spans = en_phrases(clean)
            for a, b in spans:
                idx.name_keys.add(en_key(clean[a:b]))
            if len(spans) == 1:
                idx.name_single.add(en_key(clean[spans[0][0] : spans[0][1]]))
            for a, b in spans:
                if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in spans):
                    idx.name_whole.add(en_key(clean[a:b]))
        # CJK
        zh = [s for s in sentences if is_cjk(s)]
        if zh:
            counts: Counter[str] = Counter()
            for s in zh:
                grams = {
                    run[i : i + n]
                    for run in CJK_RUN_RE.findall(s)
                    for n in range(2, 7)
                    for i in range(len(run) - n + 1)
                }
                counts.update(g for g in grams if _cjk_ok(g))
            name_runs = {
                r for n in names for r in CJK_RUN_RE.findall(n) if 2 <= len(r) <= 6 and _cjk_ok(r)
            }
            frequent = {g for g, c in counts.items() if c >= 2}
            for g in frequent | name_runs:
                # a fragment: most of its occurrences extend to a longer recurring term
                longer = sum(
                    counts[h]
                    for c in {ch for h in frequent if len(h) == len(g) + 1 for ch in h}
                    for h in (g + c, c + g)
                    if h in frequent
                )
                if g not in name_runs and longer >= 0.8 * counts[g]:
                    continue
                in_name = g in name_runs or (len(g) >= 3 and any(g in n for n in names))
                idx.cjk[g] = (
                    0.5 * min(counts[g], 6)
                    + 0.3 * (len(g) - 2)
                    + (2.0 if in_name else 0.0)
                    - (1.5 if g in CJK_VERBS else 0.0)
                )
        return idx

    def en_score(self, surface: str) -> float:
        """How good an English phrase is as a key term (higher is better; memoised)."""
        cached = self.memo.get(surface)
        if cached is None:
            cached = self.memo[surface] = self._en_score(surface)
        return cached

    def _en_score(self, surface: str) -> float:
        key = en_key(surface)
        words = key.split()
        df = self.df[key]
        score = 0.5 * min(df, 3) + (0.3 if df > 6 else 0.5 if df > 3 else 0.0)
        if df >= 2:
            score += 0.6 * (len(words) - 1)
        if key in self.name_whole and (len(words) > 1 or key in self.name_single):
            score += 2.0
        elif key in self.name_keys:
            score += 0.5
        if any(is_acronym(w) for w in surface.split()):
            score += 0.6
        if len(words) > 1 and words[-1].endswith(("ed", "ing", "ly")):
            score -= 1.5
        if len(words) == 1:
            w = words[0]
            if w.endswith("ly"):
                score -= 2.0
            elif w.endswith(("ing", "ed")):
                score -= 0.8
            if len(w) < 5 and not is_acronym(surface):
                score -= 0.4
            if key not in self.nounish and not is_acronym(surface):
                score -= 0.6
        if df < 2 and key not in self.name_keys:
            score -= 1.0
        if key in self.subsumed:
            score -= 1.5
        return score

    def keys_of(self, sentence: str) -> list[str]:
        """The sentence's key terms, best first; each is an exact substring of it."""
        if is_cjk(sentence):
            found = [g for g in self.cjk if g in sentence]
            found.sort(key=lambda g: (-self.cjk[g], -len(g), sentence.find(g)))
            # drop a term inside a better, longer one already chosen
            out: list[str] = []
            for g in found:
                if not any(g in h for h in out):
                    out.append(g)
            return out
        scored: list[tuple[float, int, str]] = []
        for a, b in en_phrases(sentence):
            surf = sentence[a:b]
            scored.append((self.en_score(surf), a, surf))
        scored.sort(key=lambda t: (-t[0], -len(t[2]), t[1]))
        out = []
        for score, _, surf in scored:
            if score < 0.5 and out:
                break
            if surf not in out:
                out.append(surf)
        return out

    def good(self, term: str) -> bool:
        """True when ``term`` recurs in the material or names a knowledge point."""
        if is_cjk(term):
            return self.cjk.get(term, 0.0) >= 1.0
        return self.en_score(term) >= 0.5

    def pool(self, cjk: bool) -> list[str]:
        """All usable terms of one script, best first (one surface form per key; memoised)."""
        cached = self.pools.get(cjk)
        if cached is None:
            cached = self.pools[cjk] = self._pool(cjk)
        return cached

    def _pool(self, cjk: bool) -> list[str]:
        if cjk:
            return sorted(self.cjk, key=lambda g: (-self.cjk[g], g))
        out: list[tuple[float, str]] = []
        for forms in self.surface.values():
            surf = forms.most_common(1)[0][0]
            score = self.en_score(surf)
            if score >= 0.5:
                out.append((score, surf))
        out.sort(key=lambda t: (-t[0], t[1]))
        return [s for _, s in out]


def sentence_score(sentence: str, keys: list[str], terms: TermIndex) -> float:
    """How informative a sentence is for a question or card (higher is better).

    Rewards a moderate length, a defining verb, numbers and key terms
    (especially knowledge-point names); penalises sentences that lean on the
    previous one (starting with a pronoun), address the reader, or ask.
    """
    score = 0.0
    if is_cjk(sentence):
        n = len(sentence)
        score += 1.0 if 12 <= n <= 90 else (-0.5 if n < 10 else 0.0)
        if ZH_DEF_RE.match(sentence) or ZH_NAMED_RE.search(sentence):
            score += 1.5
        if sentence.startswith(ZH_PRONOUN_START):
            score -= 1.0
        good = [k for k in keys if terms.good(k)]
    else:
        n = len(sentence.split())
        score += 1.0 if 8 <= n <= 40 else (-0.6 if n < 6 else -0.3)
        if (
            DEF_IS_RE.match(sentence)
            or DEF_MEANS_RE.match(sentence)
            or NAMED_RE.match(sentence)
            or LIST_DEF_RE.match(sentence)
            or re.search(r"\b(?:called|known as|refers to|means)\b", sentence)
        ):
            score += 1.5
        if PRONOUN_START_RE.match(sentence) or re.search(
            r"^(?:\S+\s+){0,2}(?:this|these|those|it|they)\b|^\S+ that\b", sentence, re.I
        ):
            score -= 1.0
        if re.search(r"\b(?:you|your|we|our|I)\b", sentence):
            score -= 0.7
        if sentence.endswith("?"):
            score -= 1.5
        good = [k for k in keys if terms.good(k)]
    if re.search(r"\d", sentence):
        score += 0.4
    score += 0.4 * min(len(good), 3)
    if any(
        (en_key(k) in terms.name_keys) if not is_cjk(k) else terms.cjk.get(k, 0) >= 2.0
        for k in keys[:3]
    ):
        score += 0.8
    return round(score, 3)
