"""Deterministic, schema-valid model answers built from a snapshot (payload v1).

The stand-in plays the model: it parses the prompt protocol (system message
whose first line is ``TASK: <jobType>``; user message with the snapshot JSON
between ``<snapshot>``/``</snapshot>`` and the params JSON between
``<params>``/``</params>``) and builds the output object of SPEC §5 for that
job type, citing only ids found in the snapshot. The same input always gives
the same answer (choices are seeded from a hash of the input).

Text handling copes with Markdown (headings, list markers, emphasis) and with
CJK text (sentences split on ``。！？`` as well as ``.!?``); when most of the
material is CJK, the generated prose is Chinese.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Job types the stand-in can answer (SPEC §2.1).
TASKS = (
    "learning_state_analysis",
    "weak_point_analysis",
    "next_action_planning",
    "quiz_generation",
    "flashcard_generation",
)
QUESTION_TYPES = ("single_choice", "multiple_choice", "true_false", "short_answer")
DIFFICULTIES = ("easy", "medium", "hard")

_TASK_RE = re.compile(r"^\s*TASK:\s*(\S+)\s*$")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9\u3400-\u9fff])|(?<=[。！？；])")
_MD_PREFIX_RE = re.compile(r"^\s{0,3}(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,3}[.)]\s+)")
_MD_INLINE_RE = re.compile(r"(\*\*|__|`|\*(?=\S)|(?<=\S)\*)")
_LINK_RE = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z\-]{3,}")
_CJK_RUN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{2,}")
_DEF_EN_RE = re.compile(
    r"^(?:The |A |An )?(?P<subj>[A-Za-z][A-Za-z0-9\- ,()']{1,60}?)\s+(?P<verb>is|are|refers to|means)\s+(?P<rest>.{8,})$"
)
_DEF_ZH_RE = re.compile(r"^(?P<subj>[^，,。：:]{2,14}?)(?P<verb>是指|是|指)(?P<rest>.{4,})$")

_STOPWORDS = frozenset(
    [
        "about",
        "above",
        "after",
        "again",
        "against",
        "also",
        "among",
        "another",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "cannot",
        "could",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "either",
        "every",
        "from",
        "further",
        "have",
        "having",
        "here",
        "into",
        "itself",
        "just",
        "many",
        "more",
        "most",
        "much",
        "must",
        "never",
        "only",
        "other",
        "over",
        "same",
        "should",
        "some",
        "such",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "under",
        "until",
        "very",
        "what",
        "when",
        "where",
        "which",
        "while",
        "whom",
        "whose",
        "will",
        "with",
        "within",
        "without",
        "would",
        "your",
        "using",
        "used",
        "which",
        "called",
        "known",
        "usually",
        "often",
        "always",
        "thus",
        "therefore",
        "however",
        "although",
    ]
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
    if task not in TASKS:
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
    """Split Markdown/plain text into clean sentences (headings excluded).

    Western sentences end in ``.!?`` followed by a space; CJK ones end in
    ``。！？；``. Dropped: sentences ending in a colon, CJK ones shorter than
    6 characters, others shorter than 12 characters or with fewer than three
    words (formulas).
    """
    out: list[str] = []
    paragraphs: list[list[str]] = [[]]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or raw.strip().startswith("```"):
            paragraphs.append([])
            continue
        paragraphs[-1].append(_clean_line(raw))
    for para in paragraphs:
        joined = " ".join(p for p in para if p)
        for s in _SENTENCE_SPLIT_RE.split(joined):
            s = s.strip()
            if not s or s[-1] in ":：":  # an introduction to what follows, not a fact
                continue
            if is_cjk(s):
                if len(s) >= 6:
                    out.append(s)
            elif len(s) >= 12 and len(re.findall(r"[A-Za-z]{3,}", s)) >= 3:
                out.append(s)
    return out


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


def cjk_terms(texts: list[str]) -> Counter[str]:
    """How many text runs contain each CJK 2–4-gram (no function char at either end)."""
    counts: Counter[str] = Counter()
    for text in texts:
        for run in _CJK_RUN_RE.findall(text):
            grams = {
                run[i : i + n]
                for n in (2, 3, 4)
                for i in range(len(run) - n + 1)
                if run[i] not in _CJK_STOP and run[i + n - 1] not in _CJK_STOP
            }
            counts.update(grams)
    return counts


def keywords(
    sentence: str, terms: Counter[str] | None = None, names: tuple[str, ...] = ()
) -> list[str]:
    """Candidate cloze keywords of a sentence, best first.

    Every keyword is an exact substring of ``sentence``. Knowledge-point
    names found in the sentence come first; then, for CJK, n-grams that recur
    across the material (``terms``), longest first; for Western text, long
    non-stopwords.
    """
    out: list[str] = []
    lower = sentence.lower()
    for name in names:
        i = lower.find(name.lower()) if 2 <= len(name) <= 40 else -1
        if i >= 0:
            out.append(sentence[i : i + len(name)])
    if is_cjk(sentence):
        grams: list[str] = []
        for run in _CJK_RUN_RE.findall(sentence):
            for n in (4, 3, 2):
                for i in range(len(run) - n + 1):
                    g = run[i : i + n]
                    if g[0] not in _CJK_STOP and g[-1] not in _CJK_STOP:
                        grams.append(g)
        freq = terms or Counter()
        frequent = [g for g in grams if freq[g] >= 2]
        frequent.sort(key=lambda g: (-len(g), -freq[g], sentence.find(g)))
        out += frequent
        out += [g for g in grams if len(g) in (2, 3)]
    else:
        words = [w.strip("-") for w in _WORD_RE.findall(sentence)]
        words = [w for w in words if len(w) >= 5 and w.lower() not in _STOPWORDS]
        out += sorted(dict.fromkeys(words), key=lambda w: (-len(w), w))
    return list(dict.fromkeys(out))


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

    def sources(self) -> list[Source]:
        """Sentences round-robin across blocks, so answers span the material.

        Blocks are restricted to the target (material / knowledge point) when
        the snapshot names one that has blocks.
        """
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
        kp_of = self.kp_by_block()
        terms = cjk_terms([str(b.get("text", "")) for b in self.blocks])
        names = tuple(str(k.get("name", "")) for k in self.kps if k.get("name"))
        per_block: list[list[Source]] = []
        heading: str | None = None
        for b in blocks:
            text = str(b.get("text", ""))
            heading = heading_of(text) or heading
            mid = b.get("materialId") if isinstance(b.get("materialId"), str) else None
            per_block.append(
                [
                    Source(
                        s,
                        b["blockId"],
                        mid,
                        heading,
                        kp_of.get(b["blockId"]),
                        keywords(s, terms, names),
                    )
                    for s in split_sentences(text)
                ]
            )
        out: list[Source] = []
        depth = 0
        while any(depth < len(p) for p in per_block):
            out.extend(p[depth] for p in per_block if depth < len(p))
            depth += 1
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


# --------------------------------------------------------------------------- generation


def _cloze(sentence: str, word: str) -> str:
    return sentence.replace(word, "____", 1)


def _count(params: dict[str, Any], default: int, maximum: int) -> int:
    raw = params.get("count", default)
    n = int(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else default
    return max(1, min(maximum, n))


def quiz_generation(view: View, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``{"items": [QuizQuestion]}`` v1 built from real block sentences.

    ``params.count`` (default 5, 1..20) distinct questions, ``difficulty``
    (default medium), ``questionTypes`` rotated (default single_choice).
    """
    zh = view.zh
    count = _count(params, 5, 20)
    raw_difficulty = params.get("difficulty")
    difficulty = (
        raw_difficulty
        if isinstance(raw_difficulty, str) and raw_difficulty in DIFFICULTIES
        else "medium"
    )
    raw_types = params.get("questionTypes")
    types = [t for t in raw_types if t in QUESTION_TYPES] if isinstance(raw_types, list) else []
    types = types or ["single_choice"]
    sources = [s for s in view.sources() if s.keys]
    pool = [k for s in sources for k in s.keys[:3]]
    items: list[dict[str, Any]] = []
    stems: set[str] = set()
    i = 0
    for round_no in range(len(types)):
        for src in sources:
            if len(items) >= count:
                break
            qtype = types[(i + round_no) % len(types)]
            q = _question(qtype, src, sources, pool, rng, zh, difficulty)
            i += 1
            if q is None or q["stem"] in stems:
                continue
            stems.add(q["stem"])
            items.append(q)
        if len(items) >= count:
            break
    return {"items": items}


def _distractors(answer: str, pool: list[str], rng: random.Random, n: int) -> list[str]:
    same_script = [w for w in dict.fromkeys(pool) if w != answer and is_cjk(w) == is_cjk(answer)]
    same_script = [w for w in same_script if w.lower() != answer.lower()]
    rng.shuffle(same_script)
    if answer[:1].islower():
        same_script = [w[:1].lower() + w[1:] if w[1:2].islower() else w for w in same_script]
    elif answer[:1].isupper():
        same_script = [w[:1].upper() + w[1:] for w in same_script]
    same_script = [w for w in dict.fromkeys(same_script) if w != answer]
    out = same_script[:n]
    fillers = (
        ["以上都不对", "无法确定", "都有可能"]
        if is_cjk(answer)
        else ["none of these", "cannot be determined", "all of these"]
    )
    for f in fillers:
        if len(out) >= n:
            break
        out.append(f)
    return out


def _question(
    qtype: str,
    src: Source,
    sources: list[Source],
    pool: list[str],
    rng: random.Random,
    zh: bool,
    difficulty: str,
) -> dict[str, Any] | None:
    words = src.keys
    zh = is_cjk(src.sentence)
    if not words:
        return None
    word = words[0]
    sentence = _clip(src.sentence, 600)
    where = src.heading
    explanation = (
        (f"原文（{where}）：" if where else "原文：") + sentence
        if zh
        else (f"From the section “{where}”: " if where else "From the material: ") + sentence
    )
    q: dict[str, Any] = {
        "questionType": qtype,
        "difficulty": difficulty,
        "explanation": _clip(explanation, 4000),
        "sourceBlockIds": [src.block_id],
    }
    if qtype == "single_choice":
        options = [word, *_distractors(word, pool, rng, 3)]
        rng.shuffle(options)
        q["stem"] = (
            "选择最合适的词填空：" if zh else "Which word completes the sentence? "
        ) + _cloze(sentence, word)
        q["options"] = [_clip(o, 400) for o in options]
        q["answer"] = _clip(word, 400)
    elif qtype == "multiple_choice":
        others = [s for s in sources if s.block_id != src.block_id and s.keys]
        if not others:
            others = [s for s in sources if s is not src and s.keys]
        if not others:
            return None
        other = others[rng.randrange(len(others))]
        true_opts = [_clip(sentence, 400), _clip(other.sentence, 400)]
        false_opts = []
        for s in (src, other):
            w = s.keys[0]
            d = _distractors(w, pool, rng, 1)[0]
            false_opts.append(_clip(s.sentence.replace(w, d, 1), 400))
        options = list(dict.fromkeys(true_opts + false_opts))
        rng.shuffle(options)
        q["stem"] = (
            f"根据学习资料，下列哪些说法是正确的？（{_clip(word, 20)}）"
            if zh
            else f"Which of these statements agree with the material? (about “{_clip(word, 40)}”)"
        )
        q["options"] = options
        q["answer"] = [o for o in options if o in true_opts]
        q["sourceBlockIds"] = list(dict.fromkeys([src.block_id, other.block_id]))
    elif qtype == "true_false":
        truth = rng.random() < 0.5
        statement = sentence
        if not truth:
            d = _distractors(word, pool, rng, 1)[0]
            statement = sentence.replace(word, d, 1)
            if statement == sentence:
                truth = True
        q["stem"] = ("判断正误：" if zh else "True or false: ") + statement
        q["options"] = ["正确", "错误"] if zh else ["True", "False"]
        q["answer"] = truth
    else:  # short_answer
        q["stem"] = ("填空：" if zh else "Fill in the blank: ") + _cloze(sentence, word)
        q["options"] = []
        q["answer"] = _clip(word, 400)
    q["stem"] = _clip(q["stem"], 4000)
    if src.kp_id:
        q["knowledgePointId"] = src.kp_id
    return q


def flashcard_generation(view: View, params: dict[str, Any]) -> dict[str, Any]:
    """``{"items": [Flashcard]}`` v1: a term/question front, the sentence as back.

    ``params.count`` (default 5, 1..50) distinct cards.
    """
    count = _count(params, 5, 50)
    items: list[dict[str, Any]] = []
    fronts: set[str] = set()
    for src in view.sources():
        if len(items) >= count:
            break
        front = _front(src)
        if front is None or front in fronts:
            continue
        fronts.add(front)
        card: dict[str, Any] = {
            "front": _clip(front, 4000),
            "back": _clip(src.sentence, 4000),
            "sourceBlockIds": [src.block_id],
        }
        if src.kp_id:
            card["knowledgePointId"] = src.kp_id
        items.append(card)
    return {"items": items}


def _front(src: Source) -> str | None:
    s = src.sentence
    if is_cjk(s):
        m = _DEF_ZH_RE.match(s)
        if m:
            return f"什么是{m.group('subj').strip()}？"
    else:
        m = _DEF_EN_RE.match(s)
        if m and len(m.group("subj").split()) <= 6:
            subj = m.group("subj").strip()
            verb = "are" if m.group("verb") == "are" else "is"
            return f"What {verb} {subj}?"
    words = src.keys
    if not words:
        return None
    prefix = "填空：" if is_cjk(s) else "Complete: "
    return prefix + _cloze(s, words[0])


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
    view = View.of(prompt.snapshot)
    if prompt.task == "learning_state_analysis":
        return learning_state_analysis(view)
    if prompt.task == "weak_point_analysis":
        return weak_point_analysis(view)
    if prompt.task == "next_action_planning":
        return next_action_planning(view)
    if prompt.task == "quiz_generation":
        return quiz_generation(view, prompt.params, _rng(prompt))
    return flashcard_generation(view, prompt.params)


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
        }[task]
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
