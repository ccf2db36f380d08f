"""Quiz questions, written like a careful teacher's (reference §5 ``QuizQuestion``).

* sources are prose sentences only, the most informative first, from the
  weakest knowledge points first (:mod:`~model_standin.answers.picking`);
* the cloze blanks the sentence's best key term; distractors are other key terms
  of the same shape (:func:`distractors`); a false true/false statement swaps
  one key term for another;
* ``questionTypes`` rotate; a sentence that does not suit a type is tried with
  another requested one.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from model_standin.answers.lexicon import en_key, is_acronym
from model_standin.answers.picking import (
    MIN_SCORE,
    blanked,
    fit_budget,
    pick_sources,
    requested_count,
    source_groups,
)
from model_standin.answers.shapes import (
    DEF_IS_RE,
    NAMED_RE,
    SHORT_IS_RE,
    ZH_DEF_RE,
    ZH_NAMED_RE,
    decap,
    desc_ok,
    is_plural,
    short_ok,
    subject_ok,
    words_ok,
)
from model_standin.answers.snapshot import Source, View
from model_standin.answers.terms import TermIndex
from model_standin.answers.text import clip, is_cjk

#: Job types the stand-in can answer (reference §2.1).
QUESTION_TYPES = ("single_choice", "multiple_choice", "true_false", "short_answer")


DIFFICULTIES = ("easy", "medium", "hard")


_FILLERS_EN = ("none of these", "cannot be determined", "all of these")


_FILLERS_ZH = ("以上都不对", "无法确定", "都有可能")


def _swap(sentence: str, term: str, other: str) -> str:
    """``sentence`` with ``term`` replaced by ``other`` (articles fixed for English)."""
    if is_cjk(term):
        return sentence.replace(term, other)
    out = re.sub(r"(?<![\w])" + re.escape(term) + r"(?![\w])", other, sentence)
    article = "an" if other[:1].lower() in "aeiou" else "a"
    return re.sub(
        r"\b([Aa])n? (" + re.escape(other) + r")(?![A-Za-z0-9])",
        lambda m: (article if m.group(1) == "a" else article.capitalize()) + " " + m.group(2),
        out,
    )


def _match_case(word: str, like: str) -> str:
    """``word`` capitalised when ``like`` is (a sentence start); otherwise as written."""
    if is_cjk(word) or not like[:1].isupper():
        return word
    return word[:1].upper() + word[1:]


@functools.lru_cache(maxsize=8192)
def _suffix_class(phrase: str) -> str:
    """A rough part-of-speech class of an English phrase's last word."""
    last = phrase.split()[-1].lower() if phrase.split() else ""
    for suffix in (
        "ly",
        "ing",
        "ed",
        "tion",
        "sion",
        "ment",
        "ness",
        "ity",
        "al",
        "ic",
        "ous",
        "ive",
    ):
        if last.endswith(suffix):
            return suffix
    return "s" if last.endswith("s") and not last.endswith(("ss", "us", "is")) else ""


def _overlaps(a: str, b: str) -> bool:
    if is_cjk(a) or is_cjk(b):
        return a in b or b in a
    ka, kb = set(en_key(a).split()), set(en_key(b).split())
    return bool(ka & kb)


def distractors(
    answer: str,
    sentence: str,
    terms: TermIndex,
    rng: random.Random,
    n: int,
    difficulty: str = "medium",
) -> list[str]:
    """``n`` plausible wrong options for ``answer``: other key terms of the material.

    Candidates share the answer's script, do not overlap it (no shared word),
    do not already appear in the sentence, and are ranked by likeness (same
    number of words, plural-ness, acronym-ness and similar length); the
    choice among the closest ones is seeded. Generic fillers only when the
    material has too few terms.
    """
    cjk = is_cjk(answer)
    akey = answer if cjk else en_key(answer)
    ranked: list[tuple[float, str]] = []
    seen = {akey}
    for cand in terms.pool(cjk)[:300]:  # the material's best terms are plenty
        key = cand if cjk else en_key(cand)
        if key in seen or _overlaps(cand, answer):
            continue
        if (cand in sentence) if cjk else (cand.lower() in sentence.lower()):
            continue
        seen.add(key)
        like = 0.0
        if cjk:
            like -= abs(len(cand) - len(answer)) * 0.5
        else:
            like += 2.0 if len(cand.split()) == len(answer.split()) else 0.0
            like += 0.5 if cand.endswith("s") == answer.endswith("s") else 0.0
            like += 0.7 if is_acronym(cand) == is_acronym(answer) else 0.0
            like += 0.8 if _suffix_class(cand) == _suffix_class(answer) else -1.0
            like -= abs(len(cand) - len(answer)) / 12
        like += 0.5 * terms.en_score(cand) if not cjk else 0.2 * terms.cjk.get(cand, 0.0)
        ranked.append((like, cand))
    ranked.sort(key=lambda t: (-t[0], t[1]))
    top = [c for _, c in ranked[: n if difficulty == "hard" else n + 2]]
    if difficulty != "hard":
        rng.shuffle(top)
    out = [_match_case(c, answer) for c in top[:n]]
    out = [o for o in dict.fromkeys(out) if o.lower() != answer.lower()]
    for f in _FILLERS_ZH if cjk else _FILLERS_EN:
        if len(out) >= n:
            break
        out.append(f)
    return out[:n]


def _explanation(src: Source, zh: bool, lead: str = "") -> str:
    sentence = clip(src.sentence, 600)
    where = src.heading
    if zh:
        text = lead + (f"资料（{where}）中写道：" if where else "资料中写道：") + sentence
    else:
        text = (
            lead + (f"The section “{where}” says: " if where else "The material says: ") + sentence
        )
    return clip(text, 4000)


def quiz_generation(view: View, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``{"items": [QuizQuestion]}`` v1 built from the material's most informative sentences.

    ``params.count`` (default 5, 1..20) distinct questions, ``difficulty``
    (default medium), ``questionTypes`` rotated (default single_choice).
    Sentences come from the weakest knowledge points first, then from the
    other sections, spread across blocks; heading and code blocks are never
    used. Every item cites the block(s) its sentence(s) came from.
    """
    count = requested_count(params, 5, 20)
    raw_difficulty = params.get("difficulty")
    difficulty = (
        raw_difficulty
        if isinstance(raw_difficulty, str) and raw_difficulty in DIFFICULTIES
        else "medium"
    )
    raw_types = params.get("questionTypes")
    types = [t for t in raw_types if t in QUESTION_TYPES] if isinstance(raw_types, list) else []
    types = list(dict.fromkeys(types)) or ["single_choice"]
    terms = view.term_index()
    sources = [s for s in view.sources() if s.keys]
    good = [s for s in sources if s.score >= MIN_SCORE]
    chosen = pick_sources(source_groups(view, good, count, weakest_first=True), count)
    # a second pass over every sentence fills up small materials
    backups = sorted(sources, key=lambda s: (-s.score, s.position))
    items: list[dict[str, Any]] = []
    stems: set[str] = set()
    used: dict[int, int] = {}
    truth_flip = rng.random() < 0.5
    tf_count = 0
    for attempt in range(3):
        queue = chosen if attempt == 0 else backups
        for src in queue:
            if len(items) >= count:
                break
            nth = used.get(id(src), 0)
            if nth > max(0, attempt - 1):  # passes 0–1: unused sentences; pass 2: a 2nd question
                continue
            qtype = types[len(items) % len(types)]
            truth = (tf_count % 2 == 0) != truth_flip
            q = _question(qtype, src, sources, terms, rng, difficulty, nth, truth, stems)
            for alt in types:  # the sentence does not suit this type: another requested one
                if q is not None or alt == qtype:
                    continue
                q = _question(alt, src, sources, terms, rng, difficulty, nth, truth, stems)
            if q is None or q["stem"] in stems:
                continue
            if q["questionType"] == "true_false":
                tf_count += 1
            used[id(src)] = nth + 1
            stems.add(q["stem"])
            items.append(q)
    return {"items": fit_budget(items)}


def _question(
    qtype: str,
    src: Source,
    sources: list[Source],
    terms: TermIndex,
    rng: random.Random,
    difficulty: str,
    nth: int,
    truth: bool,
    avoid: set[str] | None = None,
) -> dict[str, Any] | None:
    """One question of ``qtype`` from ``src`` (``nth`` picks its nth-best key term)."""
    zh = is_cjk(src.sentence)
    keys = src.keys
    if nth >= len(keys):
        return None
    word = keys[nth]
    sentence = clip(src.sentence, 600)
    q: dict[str, Any] = {
        "questionType": qtype,
        "difficulty": difficulty,
        "explanation": _explanation(src, zh),
        "sourceBlockIds": [src.block_id],
    }
    if qtype == "single_choice":
        options = [word, *distractors(word, sentence, terms, rng, 3, difficulty)]
        rng.shuffle(options)
        q["stem"] = (
            "下列哪一项最适合填入空白处？" if zh else "Which term best completes the sentence? "
        ) + blanked(sentence, word)
        q["options"] = [clip(o, 400) for o in options]
        q["answer"] = clip(word, 400)
    elif qtype == "multiple_choice":
        q.update(_multiple_choice(src, sources, terms, rng, difficulty, zh, avoid) or {})
        if "stem" not in q:
            return None
    elif qtype == "true_false":
        statement = sentence
        if not truth:
            swapped = _false_variant(src, terms, rng, difficulty)
            if swapped is None:
                truth = True
            else:
                statement = swapped[0]
                wrong, right = swapped[1], swapped[2]
                lead = (
                    f"错误：应为「{right}」，而不是「{wrong}」。"
                    if zh
                    else f"False: it is “{right}”, not “{wrong}”. "
                )
                q["explanation"] = _explanation(src, zh, lead)
        if truth:
            q["explanation"] = _explanation(src, zh, "正确。" if zh else "True. ")
        q["stem"] = ("判断正误：" if zh else "True or false: ") + statement
        # fixed options, whatever the language: the app shows them in its own (reference §9.4)
        q["options"] = ["true", "false"]
        q["answer"] = "true" if truth else "false"
    else:  # short_answer
        stem, answer = _short_answer(src, word, zh)
        q["stem"] = stem
        q["options"] = []
        q["answer"] = clip(answer, 400)
    q["stem"] = clip(q["stem"], 4000)
    if src.kp_id:
        q["knowledgePointId"] = src.kp_id
    return q


def _false_variant(
    src: Source, terms: TermIndex, rng: random.Random, difficulty: str
) -> tuple[str, str, str] | None:
    """``(statement, wrong term, right term)``: the sentence with a key term swapped."""
    for key in src.keys[:3]:
        for d in distractors(key, src.sentence, terms, rng, 3, difficulty):
            if d in _FILLERS_EN or d in _FILLERS_ZH:
                continue
            if not is_cjk(key) and (
                _suffix_class(d) != _suffix_class(key)
                or is_plural(d.lower()) != is_plural(key.lower())
            ):
                continue
            statement = _swap(src.sentence, key, d)
            if statement != src.sentence:
                return clip(statement, 600), d, key
    return None


#: Longest sentence used as a multiple-choice statement (keeps 20 questions within budget).
_MC_MAX_CHARS = 160


def _multiple_choice(
    src: Source,
    sources: list[Source],
    terms: TermIndex,
    rng: random.Random,
    difficulty: str,
    zh: bool,
    avoid: set[str] | None = None,
) -> dict[str, Any] | None:
    """Two true statements (this sentence and a neighbour) and two term-swapped false ones.

    The stem names the section (or, when that stem is in ``avoid``, a key term).
    """
    others = [s for s in sources if s.block_id != src.block_id and s.keys] or [
        s for s in sources if s is not src and s.keys
    ]
    if not others or len(src.sentence) > _MC_MAX_CHARS:
        return None
    same = [s for s in others if s.group == src.group and len(s.sentence) <= _MC_MAX_CHARS]
    short = [s for s in others if len(s.sentence) <= _MC_MAX_CHARS]
    pool = sorted(same or short or others, key=lambda s: (-s.score, abs(s.position - src.position)))
    other = pool[rng.randrange(min(3, len(pool)))]
    false_src = [s for s in others if s is not other] or [other]
    false_src.sort(key=lambda s: (len(s.sentence) > _MC_MAX_CHARS, -s.score, s.position))
    true_opts = [clip(src.sentence, 400), clip(other.sentence, 400)]
    false_opts: list[str] = []
    swaps: list[tuple[str, str]] = []
    for s in [src, other, *false_src[:4]]:
        if len(false_opts) >= 2:
            break
        v = _false_variant(s, terms, rng, difficulty)
        if v is not None and v[0] not in true_opts and clip(v[0], 400) not in false_opts:
            false_opts.append(clip(v[0], 400))
            swaps.append((v[1], v[2]))
    if not false_opts:
        return None
    options = list(dict.fromkeys(true_opts + false_opts))
    rng.shuffle(options)
    topics = [src.heading] if src.heading else []
    if topics and re.search(
        r"summary|key points|introduction|overview|conclusion|总结|小结|要点|简介", topics[0], re.I
    ):
        topics = []
    stem = ""
    for topic in [*topics, *src.keys[:3], *other.keys[:3]]:
        if zh:
            stem = f"关于「{clip(topic, 30)}」，根据学习资料，下列哪些说法是正确的？（多选）"
        else:
            stem = f"Which statements about “{clip(topic, 60)}” are true? Select all that apply."
        if not avoid or stem not in avoid:
            break
    return {
        "stem": stem,
        "options": options,
        "answer": [o for o in options if o in true_opts],
        "sourceBlockIds": list(dict.fromkeys([src.block_id, other.block_id])),
        "explanation": clip(
            (
                "错误的说法替换了关键词（"
                + "；".join(f"「{w}」应为「{r}」" for w, r in swaps)
                + "）。资料中写道："
                if zh
                else "The wrong statements swap a key term ("
                + "; ".join(f"“{w}” should be “{r}”" for w, r in swaps)
                + "). The material says: "
            )
            + src.sentence,
            4000,
        ),
    }


def _short_answer(src: Source, word: str, zh: bool) -> tuple[str, str]:
    """A question answered by a short phrase of the sentence."""
    s = src.sentence
    if zh:
        m = ZH_NAMED_RE.search(s)
        if m and m.start() > 4:
            before = s[: m.start()].rstrip("，,")
            return f"{before}，这叫作什么？", m.group("term")
        m = ZH_DEF_RE.match(s)
        if m and len(m.group("rest")) <= 80:
            rest = m.group("rest").rstrip("。！？；")
            return f"哪个概念是指：{rest}？", m.group("subj")
        return "填空：" + blanked(s, word), word
    m = NAMED_RE.match(s)
    if m and desc_ok(m.group("desc")) and words_ok(m.group("term")):
        verb = "are" if is_plural(m.group("term")) else "is"
        return f"What {verb} {decap(m.group('desc'))} called?", m.group("term")
    m = SHORT_IS_RE.match(s)
    if m and short_ok(m):
        return f"What {m.group('verb')} {decap(m.group('subj'))}?", m.group("ans")
    m = DEF_IS_RE.match(s)
    if m and subject_ok(m.group("subj")):
        rest = f"{m.group('det')} {m.group('rest')}".rstrip(".!")
        return f"Which term does the material define as “{rest}”?", m.group("subj")
    return "Fill in the blank: " + blanked(s, word), word
