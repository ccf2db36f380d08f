"""Deterministic, schema-valid model answers built from a snapshot (payload v1).

The stand-in plays the model: it parses the prompt protocol (system message
whose first line is ``TASK: <jobType>``; user message with the snapshot JSON
between ``<snapshot>``/``</snapshot>`` and the params JSON between
``<params>``/``</params>``) and builds the output object of SPEC §5 for that
job type, citing only ids found in the snapshot. The same input always gives
the same answer (choices are seeded from a hash of the input).

Text handling copes with Markdown (headings, list markers, emphasis) and with
CJK text (sentences split on ``。！？；`` as well as ``.!?``); when most of the
material is CJK, the generated prose is Chinese.

Quiz questions and flashcards are written like a careful teacher's:

* sources are prose sentences only: heading-like blocks (one short line
  without sentence punctuation; snapshot blocks carry no ``kind``), code
  blocks, fenced code and formulas are skipped;
* sentences are scored for informativeness (moderate length, a defining verb
  such as "is a / means / is called", numbers, key terms, knowledge-point
  names; sentences leaning on the previous one are penalised);
* picks are spread over groups (knowledge points, then sections), weakest
  knowledge points first for quizzes, evenly spaced sections for flashcards,
  and over the blocks within a group;
* key terms are recurring noun-like phrases (1–3 content words; for CJK,
  KP-name runs and recurring n-grams that are not fragments of longer ones);
  the cloze blanks the best one, distractors are other key terms of the same
  shape, a false true/false statement swaps one key term for another;
* flashcard fronts are questions ("What is X?", "Explain why …",
  "什么是X？", "为什么…？") when the sentence defines, names or explains
  something, a cloze otherwise; the back is the source sentence.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Job types the stand-in can answer (SPEC §2.1).
QUESTION_TYPES = ("single_choice", "multiple_choice", "true_false", "short_answer")
DIFFICULTIES = ("easy", "medium", "hard")

_TASK_RE = re.compile(r"^\s*TASK:\s*(\S+)\s*$")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9\u3400-\u9fff])|(?<=[。！？；])")
_MD_PREFIX_RE = re.compile(r"^\s{0,3}(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,3}[.)]\s+)")
_MD_INLINE_RE = re.compile(r"(\*\*|__|`|\*(?=\S)|(?<=\S)\*)")
_LINK_RE = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_CJK_RUN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{2,}")
_CODE_CHARS = frozenset("=+<>{}[]()/*_|\\^~#;")
_CODE_LINE_RE = re.compile(
    r"^\s*(?:def |class |return\b|import |from \S+ import|(?:if|for|while|elif) .*:\s*$|else:|"
    r"function\b|var |let |const |#include|public |private |[{}])"
)


class PromptError(ValueError):
    """The request does not follow the prompt protocol (→ HTTP 400 from the stand-in)."""


@dataclass(frozen=True)
class Prompt:
    """The parsed prompt protocol of one chat request.

    Attributes:
        task: the job type from the system message's first line.
        snapshot: the snapshot payload v1 (``payload`` unwrapped if present).
        params: the job params (empty dict when absent).
    """

    task: str
    snapshot: dict[str, Any]
    params: dict[str, Any]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def find_task(messages: Any) -> str | None:
    """Return the ``TASK:`` of the first system message, or None.

    Args:
        messages: the request's ``messages`` list (any JSON).
    """
    if not isinstance(messages, list):
        return None
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system":
            text = _content_text(m.get("content")).lstrip()
            first = text.splitlines()[0] if text else ""
            match = _TASK_RE.match(first)
            return match.group(1) if match else None
    return None


def _between(text: str, start: str, end: str) -> str | None:
    i = text.find(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    if j < 0:
        return None
    return text[i + len(start) : j]


def parse_prompt(messages: Any) -> Prompt:
    """Parse the prompt protocol of a chat request.

    Args:
        messages: the request's ``messages`` list.

    Returns:
        The task, snapshot payload and params.

    Raises:
        PromptError: no ``TASK:`` line, an unknown task, or a missing/invalid
            snapshot or params block.
    """
    task = find_task(messages)
    if task is None:
        raise PromptError("the system message must start with 'TASK: <jobType>'")
    if task not in ANSWERERS:
        raise PromptError(f"unknown task {task!r}")
    users = [
        _content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user"
    ]
    text = "\n".join(users)
    raw_snapshot = _between(text, "<snapshot>", "</snapshot>")
    if raw_snapshot is None:
        raise PromptError("the user message has no <snapshot>...</snapshot> block")
    try:
        snapshot = json.loads(raw_snapshot)
    except ValueError as exc:
        raise PromptError(f"the snapshot is not valid JSON: {exc}") from None
    if isinstance(snapshot, dict) and isinstance(snapshot.get("payload"), dict):
        snapshot = snapshot["payload"]
    if not isinstance(snapshot, dict):
        raise PromptError("the snapshot must be a JSON object")
    raw_params = _between(text, "<params>", "</params>")
    params: Any = {}
    if raw_params is not None and raw_params.strip():
        try:
            params = json.loads(raw_params)
        except ValueError as exc:
            raise PromptError(f"the params are not valid JSON: {exc}") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise PromptError("the params must be a JSON object")
    return Prompt(task=task, snapshot=snapshot, params=params)


# --------------------------------------------------------------------------- text


@functools.lru_cache(maxsize=8192)
def is_cjk(text: str) -> bool:
    """True when at least 30 % of the letters of ``text`` are CJK."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    return sum(1 for c in letters if _CJK_RE.match(c)) / len(letters) >= 0.3


def _clean_line(line: str) -> str:
    line = _LINK_RE.sub(r"\1", line)
    line = _MD_PREFIX_RE.sub("", line)
    line = _MD_INLINE_RE.sub("", line)
    return " ".join(line.split())


def _clip(text: str, limit: int) -> str:
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
        paragraphs[-1].append(_clean_line(raw))
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
    line = _clean_line(lines[0])
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
            h = _clean_line(raw)
            if h:
                return h
    return None


_CJK_STOP = frozenset(
    "的了是在和与及也把被就都而或能会这那个为以其之于中上下到从对等并它他她们我你有让使将所可即又很更最"
)


# --------------------------------------------------------------------------- snapshot


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
        blocks.sort(key=lambda b: (str(b.get("materialId", "")), _num(b.get("ordinal"))))
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
                heading = _clip(_clean_line(text.strip().splitlines()[0].lstrip("#")), 120)
                section += 1
                continue
            inner = heading_of(text)
            if inner:
                heading, section = _clip(inner, 120), section + 1
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


def _num(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        return float(value)
    return default


def _accuracy(kp: dict[str, Any]) -> float | None:
    attempts = _num(kp.get("attempts"))
    if attempts <= 0:
        return None
    acc = kp.get("accuracy")
    if isinstance(acc, (int, float)) and not isinstance(acc, bool):
        return max(0.0, min(1.0, float(acc)))
    return max(0.0, min(1.0, _num(kp.get("correct")) / attempts))


def _progress(m: dict[str, Any]) -> float:
    p = m.get("progress")
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        return max(0.0, min(1.0, float(p)))
    total = _num(m.get("blockCount"))
    return max(0.0, min(1.0, _num(m.get("readBlockCount")) / total)) if total > 0 else 0.0


def _pct(x: float) -> str:
    return f"{round(x * 100)}%"


def _name(kp: dict[str, Any]) -> str:
    return _clip(str(kp.get("name") or kp["knowledgePointId"]), 120)


def _title(m: dict[str, Any]) -> str:
    return _clip(str(m.get("title") or m["materialId"]), 120)


def _rng(prompt: Prompt) -> random.Random:
    seed = hashlib.sha256(
        json.dumps(
            [prompt.task, prompt.snapshot, prompt.params], sort_keys=True, default=str
        ).encode()
    ).hexdigest()
    return random.Random(int(seed[:16], 16))


# --------------------------------------------------------------------------- analyses


def learning_state_analysis(view: View) -> dict[str, Any]:
    """``AiLearningAnalysis`` v1 from reading progress and quiz accuracy."""
    zh = view.zh
    mats = view.materials
    read = [m for m in mats if _progress(m) > 0]
    avg_progress = sum(_progress(m) for m in mats) / len(mats) if mats else 0.0
    attempted = [k for k in view.kps if _accuracy(k) is not None]
    attempts = sum(_num(k.get("attempts")) for k in attempted)
    correct = sum(
        _num(k.get("correct"), (_accuracy(k) or 0) * _num(k.get("attempts"))) for k in attempted
    )
    overall = (correct / attempts) if attempts else None
    if overall is None:
        mastery = 0.5 * avg_progress
    else:
        mastery = 0.7 * max(0.0, min(1.0, overall)) + 0.3 * avg_progress
    mastery = round(max(0.0, min(1.0, mastery)), 2)

    if zh:
        summary = f"已阅读 {len(read)}/{len(mats)} 份资料，平均进度 {_pct(avg_progress)}。"
        if overall is not None:
            summary += f"在 {len(attempted)} 个知识点上共答题 {int(attempts)} 次，正确 {int(correct)} 次（正确率 {_pct(overall)}）。"
        else:
            summary += "还没有答题记录。"
    else:
        summary = (
            f"Read {len(read)} of {len(mats)} materials (average progress {_pct(avg_progress)})."
        )
        if overall is not None:
            summary += (
                f" Answered {int(attempts)} quiz questions on {len(attempted)} knowledge points, "
                f"{int(correct)} correct (accuracy {_pct(overall)})."
            )
        else:
            summary += " No quiz attempts yet."

    strengths: list[str] = []
    risks: list[str] = []
    evidence: list[dict[str, Any]] = []
    ranked = sorted(attempted, key=lambda k: (-(_accuracy(k) or 0), k["knowledgePointId"]))
    for kp in ranked:
        acc = _accuracy(kp) or 0.0
        if acc >= 0.7 and len(strengths) < 5:
            strengths.append(
                f"掌握较好：{_name(kp)}（正确率 {_pct(acc)}）"
                if zh
                else f"Strong on {_name(kp)} (accuracy {_pct(acc)})"
            )
            evidence.append({"knowledgePointId": kp["knowledgePointId"], "note": strengths[-1]})
    for kp in reversed(ranked):
        acc = _accuracy(kp) or 0.0
        if acc < 0.6 and len(risks) < 5:
            risks.append(
                f"薄弱：{_name(kp)}（正确率 {_pct(acc)}）"
                if zh
                else f"Weak on {_name(kp)} (accuracy {_pct(acc)})"
            )
            evidence.append({"knowledgePointId": kp["knowledgePointId"], "note": risks[-1]})
    for kp in view.kps:
        if _accuracy(kp) is None and len(risks) < 8:
            risks.append(f"尚未练习：{_name(kp)}" if zh else f"Not practised yet: {_name(kp)}")
            evidence.append({"knowledgePointId": kp["knowledgePointId"], "note": risks[-1]})
    first_block: dict[str, str] = {}
    for b in view.blocks:
        if isinstance(b.get("materialId"), str):
            first_block.setdefault(b["materialId"], b["blockId"])
    for m in sorted(mats, key=lambda m: (-_progress(m), m["materialId"])):
        p = _progress(m)
        if p >= 0.8 and len(strengths) < 8:
            strengths.append(
                f"基本读完《{_title(m)}》（{_pct(p)}）"
                if zh
                else f"Read most of “{_title(m)}” ({_pct(p)})"
            )
        elif p < 0.3 and len(risks) < 10:
            risks.append(
                f"《{_title(m)}》大部分未读（{_pct(p)}）"
                if zh
                else f"“{_title(m)}” is mostly unread ({_pct(p)})"
            )
            if m["materialId"] in first_block:
                evidence.append({"blockId": first_block[m["materialId"]], "note": risks[-1]})
    dwell = sorted(
        (r for r in view.reading if r["blockId"] in view.block_ids),
        key=lambda r: (-_num(r.get("dwellSeconds")), r["blockId"]),
    )
    for r in dwell[:5]:
        secs = int(_num(r.get("dwellSeconds")))
        evidence.append(
            {
                "blockId": r["blockId"],
                "note": f"阅读停留 {secs} 秒" if zh else f"Read for {secs} seconds",
            }
        )
    return {
        "summary": summary,
        "masteryLevel": mastery,
        "strengths": strengths[:20],
        "risks": risks[:20],
        "evidence": evidence[:50],
    }


def weak_point_analysis(view: View) -> dict[str, Any]:
    """``{"items": [WeakPointCandidate]}`` v1: lowest accuracy / unpractised first."""
    zh = view.zh
    read_blocks = {r["blockId"] for r in view.reading if _num(r.get("dwellSeconds")) > 0}
    scored: list[tuple[float, str, dict[str, Any]]] = []
    for kp in view.kps:
        acc = _accuracy(kp)
        blocks = view.kp_blocks(kp)
        if acc is None:
            unread = not any(b in read_blocks for b in blocks)
            severity = 0.6 if unread else 0.5
            if zh:
                reason = "尚未练习" + ("，相关内容也未阅读。" if unread else "，但已阅读相关内容。")
            else:
                reason = "Not practised yet" + (
                    "; its blocks have not been read either."
                    if unread
                    else "; its blocks were read."
                )
        else:
            if acc >= 0.8:
                continue
            severity = 1.0 - acc
            attempts = int(_num(kp.get("attempts")))
            correct = round(acc * attempts)
            reason = (
                f"答题 {attempts} 次，正确 {correct} 次（正确率 {_pct(acc)}）。"
                if zh
                else f"Answered {correct} of {attempts} correctly (accuracy {_pct(acc)})."
            )
        scored.append(
            (
                round(severity, 3),
                kp["knowledgePointId"],
                {
                    "knowledgePointId": kp["knowledgePointId"],
                    "reason": f"{_name(kp)}：{reason}" if zh else f"{_name(kp)}: {reason}",
                    "severity": round(severity, 3),
                    "evidenceBlockIds": blocks[:50],
                },
            )
        )
    scored.sort(key=lambda t: (-t[0], t[1]))
    return {"items": [t[2] for t in scored[:20]]}


def next_action_planning(view: View) -> dict[str, Any]:
    """``{"items": [NextActionRecommendation]}`` v1: review weak, read unread, practise."""
    zh = view.zh
    items: list[dict[str, Any]] = []
    weak = sorted(
        (k for k in view.kps if (_accuracy(k) is not None and (_accuracy(k) or 0) < 0.6)),
        key=lambda k: (_accuracy(k) or 0, k["knowledgePointId"]),
    )
    for kp in weak[:5]:
        acc = _accuracy(kp) or 0.0
        items.append(
            {
                "actionType": "review",
                "targetType": "knowledge_point",
                "targetId": kp["knowledgePointId"],
                "reason": f"复习「{_name(kp)}」：正确率只有 {_pct(acc)}。"
                if zh
                else f"Review {_name(kp)}: accuracy is only {_pct(acc)}.",
            }
        )
    for m in sorted(view.materials, key=lambda m: (_progress(m), m["materialId"])):
        p = _progress(m)
        if p >= 1.0 or len(items) >= 12:
            continue
        items.append(
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": m["materialId"],
                "reason": f"继续阅读《{_title(m)}》：当前进度 {_pct(p)}。"
                if zh
                else f"Continue reading “{_title(m)}”: {_pct(p)} read so far.",
            }
        )
    practise = sorted(
        (k for k in view.kps if _accuracy(k) is None or 0.6 <= (_accuracy(k) or 0) < 0.9),
        key=lambda k: (_accuracy(k) is not None, _accuracy(k) or 0, k["knowledgePointId"]),
    )
    for kp in practise[:5]:
        maybe = _accuracy(kp)
        if zh:
            reason = f"练习「{_name(kp)}」：" + (
                "还没有答题记录。" if maybe is None else f"正确率 {_pct(maybe)}，再巩固一下。"
            )
        else:
            reason = f"Practise {_name(kp)}: " + (
                "no quiz attempts yet."
                if maybe is None
                else f"accuracy {_pct(maybe)}, worth consolidating."
            )
        items.append(
            {
                "actionType": "practice",
                "targetType": "knowledge_point",
                "targetId": kp["knowledgePointId"],
                "reason": reason,
            }
        )
    if not items and view.user_id:
        items.append(
            {
                "actionType": "practice",
                "targetType": "user",
                "targetId": view.user_id,
                "reason": "保持节奏：做一组综合练习。"
                if zh
                else "Keep the pace: take a mixed practice quiz.",
            }
        )
    for i, item in enumerate(items):
        item["priority"] = i
    return {"items": items[:50]}


# --------------------------------------------------------------------------- key terms

_EN_TOKEN_RE = re.compile(r"[A-Za-z0-9]+(?:['\-][A-Za-z0-9]+)*\+?")


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


_EN_STOP = _word_set(
    "a an the and or but nor so yet if of to in on at by for with from into onto as than then "
    "is are was were be been being am do does did done doing has have had having can could may "
    "might must shall should will would it its it's this that these those they them their theirs "
    "he him his she her hers we us our ours you your yours i me my mine who whom whose which what "
    "when where why how all any both each every either neither few more most much many other "
    "another some such no not only own same very too also just even still again once here there "
    "about above after against along among around before behind below beneath beside between "
    "beyond down during except inside near off out outside over past per since through "
    "throughout toward towards under until up upon within without via whether while because "
    "although though however therefore thus hence instead rather quite almost nearly roughly "
    "about approximately often usually always never sometimes soon already perhaps probably "
    "simply exactly really actually especially mainly mostly largely partly fully directly "
    "first second third last next new old good better best bad worse worst great little large "
    "small big long short high low certain several various whole half one two three four five "
    "six seven eight nine ten twelve hundred thousand million billion way ways thing things "
    "something anything nothing everything kind kinds sort lot lots part parts number numbers "
    "make makes made making take takes took taken taking give gives gave given giving get gets "
    "got use uses used using called call calls known know knows need needs needed keep keeps "
    "kept let lets put puts see sees seen say says said tell tells told find finds found look "
    "looks looked show shows shown come comes came go goes went gone become becomes became "
    "work works worked happen happens happened mean means meant refer refers referred seem "
    "seems like unlike well able unable possible likely enough less least further example "
    "instance case cases fact idea way rest end ends start starts begin begins form forms "
    "version versions time times day days year years same different important useful simple "
    "true false yes began begun grew grown led held ran lost left gained spent sent brought "
    "thought bought stood fell rose won fed reduce reduces produce produces absorb absorbs "
    "contain contains allow allows carry carries convert converts remove removes provide "
    "provides require requires depend depends cause causes create creates increase increases "
    "decrease decreases replace replaces explain explains"
)
_DEF_IS_RE = re.compile(
    r"^(?P<subj>[A-Z][^,;:()]{1,60}?)\s+(?P<verb>is|are)\s+(?P<det>a|an|the|one|any)\s+(?P<rest>.{6,})$"
)
_DEF_MEANS_RE = re.compile(
    r"^(?P<subj>[A-Z][^,;:()]{1,60}?)\s+(?:means|refers to)\s+(?P<rest>.{6,})$"
)
_NAMED_RE = re.compile(
    r"^(?P<desc>.{8,160}?)\s+(?:is|are)\s+(?:usually |often |also |sometimes )?"
    r"(?:called|known as|named)\s+(?P<term>[^,;.]{2,50}?)[.!]$"
)
_SHORT_IS_RE = re.compile(
    r"^(?P<subj>The [a-z][^,;:()]{3,60}?)\s+(?P<verb>is|are)\s+"
    r"(?P<ans>(?:(?:a|an|the) )?[A-Za-z0-9][\w\-+]*(?: [\w\-+]+){0,2})[.!]$"
)
_LIST_DEF_RE = re.compile(r"^(?P<term>[A-Za-z][A-Za-z0-9 \-']{1,40}):\s+(?P<rest>.{10,})$")
_WHY_RE = re.compile(r"^(?P<head>.{10,}?),?\s+which is why\s+(?P<claim>[^;]{6,}?)[.!]$")
_BECAUSE_RE = re.compile(r"^(?P<claim>[A-Z][^;]{10,}?),?\s+because\s+(?P<reason>.{6,})$")
_NOUN_CONTEXT_RE = re.compile(
    r"\b(?:the|a|an|of|its|their|each|every|this|these)\s+([A-Za-z][A-Za-z0-9\-]*)", re.I
)
_PRONOUN_START_RE = re.compile(
    r"^(?:it|this|that|these|those|they|them|he|she|we|you|its|their|there|here|then|such|so|"
    r"and|but|or|also|both|another|each|the same)\b",
    re.IGNORECASE,
)
_ZH_DEF_RE = re.compile(r"^(?P<subj>[^，,。：:、（(的]{2,12}?)(?:是指|是|指的是)(?P<rest>.{4,})$")
_ZH_NAMED_RE = re.compile(
    r"(?:叫作|叫做|称为|简称|也叫|被称为)(?P<term>[\u3400-\u9fffA-Za-z0-9\-]{2,12}?)(?=的|[，,。！？；）)]|$)"
)
_ZH_WHY_RE = re.compile(
    r"^(?P<cause>.{4,}?)[，,](?:所以|因此|因而)(?P<effect>[^，,。！？；]{3,})[。！？；]$"
)
_ZH_PRONOUN_START = ("它", "这", "此", "其", "他", "她", "该", "那")
_CJK_FUNCTION_WORDS = (
    "主要",
    "可以",
    "能够",
    "进行",
    "通过",
    "一定",
    "需要",
    "没有",
    "不是",
    "这些",
    "一些",
    "许多",
    "已经",
    "同时",
    "最终",
    "首先",
    "接着",
    "最后",
    "此外",
    "因此",
    "所以",
    "因为",
    "如果",
    "但是",
    "而且",
    "以及",
    "几乎",
    "所有",
    "之间",
    "作为",
    "看起来",
    "归根结底",
    "值得注意",
    "重新",
    "不再",
    "一部分",
    "直接",
    "越高",
    "越快",
    "越强",
)
#: Common CJK verbs: poor cloze answers and poor distractors for nouns.
_CJK_VERBS = _word_set(
    "吸收 释放 产生 生成 形成 结合 影响 提供 储存 分解 增加 减少 合成 利用 发生 传递 推动 还原 "
    "保护 维持 转化 覆盖 积累 证明 包着 充满 悬浮 叠在 流回 关闭 下降 提高 延长 需要 使用 含有"
)
_FILLERS_EN = ("none of these", "cannot be determined", "all of these")
_FILLERS_ZH = ("以上都不对", "无法确定", "都有可能")


@functools.lru_cache(maxsize=8192)
def _en_key(phrase: str) -> str:
    """Case- and plural-insensitive key of an English phrase."""
    words = []
    for w in phrase.lower().split():
        if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
            w = w[:-1]
        words.append(w)
    return " ".join(words)


@functools.lru_cache(maxsize=8192)
def _is_acronym(word: str) -> bool:
    return sum(1 for c in word if c.isupper()) >= 2 or (
        any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
    )


def _content_token(tok: str) -> bool:
    low = tok.lower()
    if low in _EN_STOP or low.rstrip("s") in _EN_STOP or low.isdigit():
        return False
    if any(c.isdigit() for c in tok):
        return any(c.isalpha() for c in tok)
    return len(tok) >= 3 or _is_acronym(tok)


def en_phrases(sentence: str, max_words: int = 3) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of candidate English terms (1–3 content words) in ``sentence``."""
    spans: list[tuple[int, int]] = []
    run: list[re.Match[str]] = []

    def flush() -> None:
        for n in range(1, max_words + 1):
            for i in range(len(run) - n + 1):
                spans.append((run[i].start(), run[i + n - 1].end()))
        run.clear()

    for m in _EN_TOKEN_RE.finditer(sentence):
        if run and sentence[run[-1].end() : m.start()] != " ":
            flush()
        touches_code = sentence[m.start() - 1 : m.start()] in ("_", ":", ".") or sentence[
            m.end() : m.end() + 1
        ] in ("_", "(")
        if _content_token(m.group()) and not touches_code:
            run.append(m)
        else:
            flush()
    flush()
    return spans


def _cjk_ok(gram: str) -> bool:
    return (
        gram[0] not in _CJK_STOP
        and gram[-1] not in _CJK_STOP
        and not any(f in gram for f in _CJK_FUNCTION_WORDS)
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
                idx.nounish.add(_en_key(m.group(1)))
            for a, b in en_phrases(s):
                surf = s[a:b]
                key = _en_key(surf)
                if a == 0 and not _is_acronym(surf.split()[0]):
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
            clean = _clean_line(name)
            spans = en_phrases(clean)
            for a, b in spans:
                idx.name_keys.add(_en_key(clean[a:b]))
            if len(spans) == 1:
                idx.name_single.add(_en_key(clean[spans[0][0] : spans[0][1]]))
            for a, b in spans:
                if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in spans):
                    idx.name_whole.add(_en_key(clean[a:b]))
        # CJK
        zh = [s for s in sentences if is_cjk(s)]
        if zh:
            counts: Counter[str] = Counter()
            for s in zh:
                grams = {
                    run[i : i + n]
                    for run in _CJK_RUN_RE.findall(s)
                    for n in range(2, 7)
                    for i in range(len(run) - n + 1)
                }
                counts.update(g for g in grams if _cjk_ok(g))
            name_runs = {
                r for n in names for r in _CJK_RUN_RE.findall(n) if 2 <= len(r) <= 6 and _cjk_ok(r)
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
                    - (1.5 if g in _CJK_VERBS else 0.0)
                )
        return idx

    def en_score(self, surface: str) -> float:
        """How good an English phrase is as a key term (higher is better; memoised)."""
        cached = self.memo.get(surface)
        if cached is None:
            cached = self.memo[surface] = self._en_score(surface)
        return cached

    def _en_score(self, surface: str) -> float:
        key = _en_key(surface)
        words = key.split()
        df = self.df[key]
        score = 0.5 * min(df, 3) + (0.3 if df > 6 else 0.5 if df > 3 else 0.0)
        if df >= 2:
            score += 0.6 * (len(words) - 1)
        if key in self.name_whole and (len(words) > 1 or key in self.name_single):
            score += 2.0
        elif key in self.name_keys:
            score += 0.5
        if any(_is_acronym(w) for w in surface.split()):
            score += 0.6
        if len(words) > 1 and words[-1].endswith(("ed", "ing", "ly")):
            score -= 1.5
        if len(words) == 1:
            w = words[0]
            if w.endswith("ly"):
                score -= 2.0
            elif w.endswith(("ing", "ed")):
                score -= 0.8
            if len(w) < 5 and not _is_acronym(surface):
                score -= 0.4
            if key not in self.nounish and not _is_acronym(surface):
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
        if _ZH_DEF_RE.match(sentence) or _ZH_NAMED_RE.search(sentence):
            score += 1.5
        if sentence.startswith(_ZH_PRONOUN_START):
            score -= 1.0
        good = [k for k in keys if terms.good(k)]
    else:
        n = len(sentence.split())
        score += 1.0 if 8 <= n <= 40 else (-0.6 if n < 6 else -0.3)
        if (
            _DEF_IS_RE.match(sentence)
            or _DEF_MEANS_RE.match(sentence)
            or _NAMED_RE.match(sentence)
            or _LIST_DEF_RE.match(sentence)
            or re.search(r"\b(?:called|known as|refers to|means)\b", sentence)
        ):
            score += 1.5
        if _PRONOUN_START_RE.match(sentence) or re.search(
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
        (_en_key(k) in terms.name_keys) if not is_cjk(k) else terms.cjk.get(k, 0) >= 2.0
        for k in keys[:3]
    ):
        score += 0.8
    return round(score, 3)


# --------------------------------------------------------------------------- generation


def _blank(sentence: str, term: str) -> str:
    """``sentence`` with every occurrence of ``term`` replaced by ``____``.

    An article before the blank becomes "a(n)" so it does not give the answer away.
    """
    if is_cjk(term):
        return sentence.replace(term, "____")
    out = re.sub(r"(?<![\w])" + re.escape(term) + r"(?![\w])", "____", sentence)
    return re.sub(r"\b([Aa])n? ____", r"\1(n) ____", out)


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


def _count(params: dict[str, Any], default: int, maximum: int) -> int:
    raw = params.get("count", default)
    n = int(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else default
    return max(1, min(maximum, n))


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
    ka, kb = set(_en_key(a).split()), set(_en_key(b).split())
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
    akey = answer if cjk else _en_key(answer)
    ranked: list[tuple[float, str]] = []
    seen = {akey}
    for cand in terms.pool(cjk)[:300]:  # the material's best terms are plenty
        key = cand if cjk else _en_key(cand)
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
            like += 0.7 if _is_acronym(cand) == _is_acronym(answer) else 0.0
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


#: Sentences scoring below this are used only when better ones run out.
_MIN_SCORE = 1.0


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
    acc = _accuracy(kp)
    return (0 if acc is not None else 1, acc if acc is not None else 0.0, kp["knowledgePointId"])


def _groups(
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


def _explanation(src: Source, zh: bool, lead: str = "") -> str:
    sentence = _clip(src.sentence, 600)
    where = src.heading
    if zh:
        text = lead + (f"资料（{where}）中写道：" if where else "资料中写道：") + sentence
    else:
        text = (
            lead + (f"The section “{where}” says: " if where else "The material says: ") + sentence
        )
    return _clip(text, 4000)


def quiz_generation(view: View, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``{"items": [QuizQuestion]}`` v1 built from the material's most informative sentences.

    ``params.count`` (default 5, 1..20) distinct questions, ``difficulty``
    (default medium), ``questionTypes`` rotated (default single_choice).
    Sentences come from the weakest knowledge points first, then from the
    other sections, spread across blocks; heading and code blocks are never
    used. Every item cites the block(s) its sentence(s) came from.
    """
    count = _count(params, 5, 20)
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
    good = [s for s in sources if s.score >= _MIN_SCORE]
    chosen = pick_sources(_groups(view, good, count, weakest_first=True), count)
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
    return {"items": _fit_budget(items)}


#: Output budget in estimated tokens, below the worker's generation max_tokens (6144).
OUTPUT_TOKEN_BUDGET = 5600


def estimate_tokens(text: str) -> int:
    """DeepSeek's rule of thumb: ≈0.3 token per ASCII char, ≈0.6 per other char."""
    ascii_chars = sum(1 for c in text if ord(c) < 128)
    return max(1, math.ceil(ascii_chars * 0.3 + (len(text) - ascii_chars) * 0.6))


def _fit_budget(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the answer within :data:`OUTPUT_TOKEN_BUDGET` (as a model writes within max_tokens).

    Long explanations are shortened first, then items are dropped from the end.
    """

    def size() -> int:
        return estimate_tokens(json.dumps({"items": items}, ensure_ascii=False))

    if size() <= OUTPUT_TOKEN_BUDGET:
        return items
    for q in items:
        if "explanation" in q:
            q["explanation"] = _clip(q["explanation"], 200)
    while len(items) > 1 and size() > OUTPUT_TOKEN_BUDGET:
        items.pop()
    return items


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
    sentence = _clip(src.sentence, 600)
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
        ) + _blank(sentence, word)
        q["options"] = [_clip(o, 400) for o in options]
        q["answer"] = _clip(word, 400)
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
        # fixed options, whatever the language: the app shows them in its own (SPEC §9.4)
        q["options"] = ["true", "false"]
        q["answer"] = "true" if truth else "false"
    else:  # short_answer
        stem, answer = _short_answer(src, word, zh)
        q["stem"] = stem
        q["options"] = []
        q["answer"] = _clip(answer, 400)
    q["stem"] = _clip(q["stem"], 4000)
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
                _suffix_class(d) != _suffix_class(key) or _plural(d.lower()) != _plural(key.lower())
            ):
                continue
            statement = _swap(src.sentence, key, d)
            if statement != src.sentence:
                return _clip(statement, 600), d, key
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
    true_opts = [_clip(src.sentence, 400), _clip(other.sentence, 400)]
    false_opts: list[str] = []
    swaps: list[tuple[str, str]] = []
    for s in [src, other, *false_src[:4]]:
        if len(false_opts) >= 2:
            break
        v = _false_variant(s, terms, rng, difficulty)
        if v is not None and v[0] not in true_opts and _clip(v[0], 400) not in false_opts:
            false_opts.append(_clip(v[0], 400))
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
            stem = f"关于「{_clip(topic, 30)}」，根据学习资料，下列哪些说法是正确的？（多选）"
        else:
            stem = f"Which statements about “{_clip(topic, 60)}” are true? Select all that apply."
        if not avoid or stem not in avoid:
            break
    return {
        "stem": stem,
        "options": options,
        "answer": [o for o in options if o in true_opts],
        "sourceBlockIds": list(dict.fromkeys([src.block_id, other.block_id])),
        "explanation": _clip(
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


_SUBJECT_WORDS = frozenset(("the", "a", "an", "of", "and"))
_CALLED_END_RE = re.compile(
    r"\b(?:called|known as|named)\s+(?P<the>the\s+)?"
    r"(?P<term>[A-Za-z0-9][\w\-+]*(?: [\w\-+]+){0,3})[.!]$"
)


def _plural(term: str) -> bool:
    last = term.split()[-1] if term.split() else term
    return last.endswith("s") and not last.endswith(("ss", "us", "is", "sis")) and last.islower()


def _words_ok(term: str) -> bool:
    """A term of 1–4 words that are not function words."""
    words = term.split()
    return 1 <= len(words) <= 4 and all(w.lower() not in _EN_STOP for w in words)


def _desc_ok(desc: str) -> bool:
    """A description usable as "What is <desc> called?" (a noun phrase, no clause before it)."""
    first = desc.split()[0].lower() if desc.split() else ""
    return "," not in desc and (first in ("the", "a", "an") or first not in _EN_STOP)


def _short_ok(m: re.Match[str]) -> bool:
    """A "The X is Y." sentence whose Y is a short noun phrase."""
    words = [w for w in m.group("ans").split() if w.lower() not in ("a", "an", "the")]
    return bool(words) and _subject_ok(m.group("subj")) and words[0].lower() not in _EN_STOP


def _subject_ok(subj: str) -> bool:
    """True for a short noun-phrase-like subject ("Binary search", "The main pigment of X")."""
    words = subj.split()
    if not 1 <= len(words) <= 6 or _PRONOUN_START_RE.match(subj):
        return False
    return all(w.lower() in _SUBJECT_WORDS or w.lower() not in _EN_STOP for w in words)


def _decap(phrase: str) -> str:
    first = phrase.split()[0] if phrase.split() else phrase
    if _is_acronym(first) or (first[:1].isupper() and first[1:2].isupper()):
        return phrase
    return phrase[:1].lower() + phrase[1:]


def _short_answer(src: Source, word: str, zh: bool) -> tuple[str, str]:
    """A question answered by a short phrase of the sentence."""
    s = src.sentence
    if zh:
        m = _ZH_NAMED_RE.search(s)
        if m and m.start() > 4:
            before = s[: m.start()].rstrip("，,")
            return f"{before}，这叫作什么？", m.group("term")
        m = _ZH_DEF_RE.match(s)
        if m and len(m.group("rest")) <= 80:
            rest = m.group("rest").rstrip("。！？；")
            return f"哪个概念是指：{rest}？", m.group("subj")
        return "填空：" + _blank(s, word), word
    m = _NAMED_RE.match(s)
    if m and _desc_ok(m.group("desc")) and _words_ok(m.group("term")):
        verb = "are" if _plural(m.group("term")) else "is"
        return f"What {verb} {_decap(m.group('desc'))} called?", m.group("term")
    m = _SHORT_IS_RE.match(s)
    if m and _short_ok(m):
        return f"What {m.group('verb')} {_decap(m.group('subj'))}?", m.group("ans")
    m = _DEF_IS_RE.match(s)
    if m and _subject_ok(m.group("subj")):
        rest = f"{m.group('det')} {m.group('rest')}".rstrip(".!")
        return f"Which term does the material define as “{rest}”?", m.group("subj")
    return "Fill in the blank: " + _blank(s, word), word


def flashcard_generation(view: View, params: dict[str, Any]) -> dict[str, Any]:
    """``{"items": [Flashcard]}`` v1: a question or term front, the source sentence as back.

    ``params.count`` (default 5, 1..50) distinct cards, spread across the
    material's sections (and knowledge points), listed in document order.
    Fronts are questions ("What is X?", "Explain why …", "What does “X”
    mean?") when the sentence defines, names or explains something, and a
    cloze of its key term otherwise.
    """
    count = _count(params, 5, 50)
    sources = view.sources()
    chosen = pick_sources(
        _groups(view, [s for s in sources if s.score >= _MIN_SCORE], count, weakest_first=False),
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
            "front": _clip(front, 4000),
            "back": _clip(src.sentence, 4000),
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
            front = ("填空：" if is_cjk(key) else "Fill in the blank: ") + _blank(src.sentence, key)
            if front in fronts or "____" not in front:
                continue
            fronts.add(front)
            extra: dict[str, Any] = {
                "front": _clip(front, 4000),
                "back": _clip(src.sentence, 4000),
                "sourceBlockIds": [src.block_id],
            }
            if src.kp_id:
                extra["knowledgePointId"] = src.kp_id
            items.append((src.position, extra))
            break
    items.sort(key=lambda t: t[0])
    return {"items": _fit_budget([c for _, c in items])}


def _front(src: Source) -> str | None:
    s = src.sentence
    if is_cjk(s):
        m = _ZH_DEF_RE.match(s)
        if m and not m.group("subj").startswith(_ZH_PRONOUN_START):
            return f"什么是{m.group('subj').strip()}？"
        m = _ZH_NAMED_RE.search(s)
        if m and m.start() > 2:
            return f"什么是{m.group('term')}？"
        m = _ZH_WHY_RE.match(s)
        if m:
            return f"为什么{m.group('effect').strip()}？"
        if not src.keys:
            return None
        return "填空：" + _blank(s, src.keys[0])
    m = _DEF_IS_RE.match(s) or _DEF_MEANS_RE.match(s)
    if m and _subject_ok(m.group("subj")):
        verb = "are" if m.groupdict().get("verb") == "are" else "is"
        return f"What {verb} {_decap(m.group('subj').strip())}?"
    m = _NAMED_RE.match(s) or _CALLED_END_RE.search(s)
    if m and _words_ok(m.group("term")):
        term = m.group("term")
        if m.groupdict().get("the"):
            term = "the " + term
        return f"What {'are' if _plural(term) else 'is'} {_decap(term)}?"
    m = _LIST_DEF_RE.match(s)
    if m:
        return f"What does “{_decap(m.group('term'))}” mean?"
    m = _SHORT_IS_RE.match(s)
    if m and _short_ok(m):
        return f"What {m.group('verb')} {_decap(m.group('subj'))}?"
    m = _WHY_RE.match(s)
    if m:
        return f"Explain why {m.group('claim').strip()}."
    m = _BECAUSE_RE.match(s)
    if m and not _PRONOUN_START_RE.match(m.group("claim")):
        return f"Explain why {_decap(m.group('claim').strip())}."
    if not src.keys:
        return None
    return "Fill in the blank: " + _blank(s, src.keys[0])


# --------------------------------------------------------------------------- entry


def build_answer(prompt: Prompt) -> dict[str, Any]:
    """Build the output object (SPEC §5 shape) for a parsed prompt.

    Args:
        prompt: the parsed request.

    Returns:
        The analysis object for ``learning_state_analysis``, otherwise
        ``{"items": [...]}``. Every cited id comes from the snapshot. The
        generation types return ``{"items": []}`` (schema-invalid, as a real
        model would fail) when the snapshot has no usable text.
    """
    return ANSWERERS[prompt.task](prompt)


#: How the stand-in answers each task (job type); :func:`register_answerer` adds one.
ANSWERERS: dict[str, Callable[[Prompt], dict[str, Any]]] = {
    "learning_state_analysis": lambda p: learning_state_analysis(View.of(p.snapshot)),
    "weak_point_analysis": lambda p: weak_point_analysis(View.of(p.snapshot)),
    "next_action_planning": lambda p: next_action_planning(View.of(p.snapshot)),
    "quiz_generation": lambda p: quiz_generation(View.of(p.snapshot), p.params, _rng(p)),
    "flashcard_generation": lambda p: flashcard_generation(View.of(p.snapshot), p.params),
}


def register_answerer(task: str, answer: Callable[[Prompt], dict[str, Any]]) -> None:
    """Teach the stand-in a new task (a job type registered with
    :func:`airuntime_common.jobtypes.register`): ``answer(prompt)`` returns its output."""
    ANSWERERS[task] = answer


def schema_violation(task: str, answer: dict[str, Any]) -> dict[str, Any]:
    """Valid JSON that misses a required field of the task's v1 schema."""
    out: dict[str, Any] = json.loads(json.dumps(answer))
    if task == "learning_state_analysis":
        out.pop("summary", None)
        return out
    items = out.get("items") or []
    if items:
        required = {
            "weak_point_analysis": "knowledgePointId",
            "next_action_planning": "targetId",
            "quiz_generation": "stem",
            "flashcard_generation": "back",
        }.get(task, next(iter(items[0]), ""))
        items[0].pop(required, None)
        return out
    return {"results": []}


def foreign_ids(task: str, answer: dict[str, Any], foreign: str) -> dict[str, Any]:
    """A schema-valid answer that cites an id absent from the snapshot.

    Args:
        task: the job type.
        answer: the honest answer.
        foreign: the id to cite.
    """
    out: dict[str, Any] = json.loads(json.dumps(answer))
    if task == "learning_state_analysis":
        out["evidence"] = [{"blockId": foreign, "note": "see this block"}, *out["evidence"]][:50]
    elif task == "weak_point_analysis":
        if out["items"]:
            out["items"][0]["evidenceBlockIds"] = [foreign, *out["items"][0]["evidenceBlockIds"]][
                :50
            ]
        else:
            out["items"] = [
                {
                    "knowledgePointId": foreign,
                    "reason": "Low accuracy.",
                    "severity": 0.9,
                    "evidenceBlockIds": [foreign],
                }
            ]
    elif task == "next_action_planning":
        out["items"].insert(
            0,
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": foreign,
                "reason": "Read this material.",
                "priority": 0,
            },
        )
        out["items"] = out["items"][:50]
    else:
        if out["items"]:
            out["items"][0]["sourceBlockIds"] = [foreign]
        else:
            item: dict[str, Any] = {
                "front": "What is this?",
                "back": "Something.",
                "sourceBlockIds": [foreign],
            }
            if task == "quiz_generation":
                item = {
                    "questionType": "short_answer",
                    "stem": "What is this?",
                    "options": [],
                    "answer": "Something.",
                    "explanation": "Made up.",
                    "difficulty": "medium",
                    "sourceBlockIds": [foreign],
                }
            out["items"] = [item]
    return out
