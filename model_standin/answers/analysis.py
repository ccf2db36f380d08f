"""The three analyses (reference §5) from reading progress and quiz accuracy: the
learning state, the weak points, and the next actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from model_standin.answers.snapshot import (
    View,
    as_number,
    kp_accuracy,
    kp_name,
    material_progress,
    material_title,
    percent,
)


@dataclass(frozen=True)
class _Totals:
    """What the learning state is measured by: reading and quiz attempts."""

    materials: int
    read: int
    avg_progress: float
    attempted: list[dict[str, Any]]
    attempts: float
    correct: float

    @property
    def accuracy(self) -> float | None:
        if not self.attempts:
            return None
        return max(0.0, min(1.0, self.correct / self.attempts))

    @property
    def mastery(self) -> float:
        """0..1: accuracy weighs 0.7 and progress 0.3; without attempts, half the progress."""
        overall = self.accuracy
        if overall is None:
            mastery = 0.5 * self.avg_progress
        else:
            mastery = 0.7 * max(0.0, min(1.0, overall)) + 0.3 * self.avg_progress
        return round(max(0.0, min(1.0, mastery)), 2)


@dataclass
class _Notes:
    """The analysis's strengths, risks and the evidence citing them, in order."""

    strengths: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)


def _totals(view: View) -> _Totals:
    mats = view.materials
    attempted = [k for k in view.kps if kp_accuracy(k) is not None]
    return _Totals(
        materials=len(mats),
        read=len([m for m in mats if material_progress(m) > 0]),
        avg_progress=sum(material_progress(m) for m in mats) / len(mats) if mats else 0.0,
        attempted=attempted,
        attempts=sum(as_number(k.get("attempts")) for k in attempted),
        correct=sum(
            as_number(k.get("correct"), (kp_accuracy(k) or 0) * as_number(k.get("attempts")))
            for k in attempted
        ),
    )


def _summary(t: _Totals, zh: bool) -> str:
    overall = t.accuracy
    if zh:
        summary = f"已阅读 {t.read}/{t.materials} 份资料，平均进度 {percent(t.avg_progress)}。"
        if overall is not None:
            summary += f"在 {len(t.attempted)} 个知识点上共答题 {int(t.attempts)} 次，正确 {int(t.correct)} 次（正确率 {percent(overall)}）。"
        else:
            summary += "还没有答题记录。"
        return summary
    summary = (
        f"Read {t.read} of {t.materials} materials (average progress {percent(t.avg_progress)})."
    )
    if overall is not None:
        summary += (
            f" Answered {int(t.attempts)} quiz questions on {len(t.attempted)} knowledge points, "
            f"{int(t.correct)} correct (accuracy {percent(overall)})."
        )
    else:
        summary += " No quiz attempts yet."
    return summary


def _knowledge_point_notes(view: View, attempted: list[dict[str, Any]], notes: _Notes) -> None:
    """Strong knowledge points (accuracy ≥ 0.7), weak ones (< 0.6), unpractised ones."""
    zh = view.zh
    ranked = sorted(attempted, key=lambda k: (-(kp_accuracy(k) or 0), k["knowledgePointId"]))
    for kp in ranked:
        acc = kp_accuracy(kp) or 0.0
        if acc >= 0.7 and len(notes.strengths) < 5:
            notes.strengths.append(
                f"掌握较好：{kp_name(kp)}（正确率 {percent(acc)}）"
                if zh
                else f"Strong on {kp_name(kp)} (accuracy {percent(acc)})"
            )
            notes.evidence.append(
                {"knowledgePointId": kp["knowledgePointId"], "note": notes.strengths[-1]}
            )
    for kp in reversed(ranked):
        acc = kp_accuracy(kp) or 0.0
        if acc < 0.6 and len(notes.risks) < 5:
            notes.risks.append(
                f"薄弱：{kp_name(kp)}（正确率 {percent(acc)}）"
                if zh
                else f"Weak on {kp_name(kp)} (accuracy {percent(acc)})"
            )
            notes.evidence.append(
                {"knowledgePointId": kp["knowledgePointId"], "note": notes.risks[-1]}
            )
    for kp in view.kps:
        if kp_accuracy(kp) is None and len(notes.risks) < 8:
            notes.risks.append(
                f"尚未练习：{kp_name(kp)}" if zh else f"Not practised yet: {kp_name(kp)}"
            )
            notes.evidence.append(
                {"knowledgePointId": kp["knowledgePointId"], "note": notes.risks[-1]}
            )


def _material_notes(view: View, notes: _Notes) -> None:
    """Materials mostly read (≥ 80 %) and mostly unread (< 30 %, citing its first block)."""
    zh = view.zh
    first_block: dict[str, str] = {}
    for b in view.blocks:
        if isinstance(b.get("materialId"), str):
            first_block.setdefault(b["materialId"], b["blockId"])
    for m in sorted(view.materials, key=lambda m: (-material_progress(m), m["materialId"])):
        p = material_progress(m)
        if p >= 0.8 and len(notes.strengths) < 8:
            notes.strengths.append(
                f"基本读完《{material_title(m)}》（{percent(p)}）"
                if zh
                else f"Read most of “{material_title(m)}” ({percent(p)})"
            )
        elif p < 0.3 and len(notes.risks) < 10:
            notes.risks.append(
                f"《{material_title(m)}》大部分未读（{percent(p)}）"
                if zh
                else f"“{material_title(m)}” is mostly unread ({percent(p)})"
            )
            if m["materialId"] in first_block:
                notes.evidence.append(
                    {"blockId": first_block[m["materialId"]], "note": notes.risks[-1]}
                )


def _dwell_evidence(view: View, notes: _Notes) -> None:
    """The five blocks read longest."""
    dwell = sorted(
        (r for r in view.reading if r["blockId"] in view.block_ids),
        key=lambda r: (-as_number(r.get("dwellSeconds")), r["blockId"]),
    )
    for r in dwell[:5]:
        secs = int(as_number(r.get("dwellSeconds")))
        notes.evidence.append(
            {
                "blockId": r["blockId"],
                "note": f"阅读停留 {secs} 秒" if view.zh else f"Read for {secs} seconds",
            }
        )


def learning_state_analysis(view: View) -> dict[str, Any]:
    """``AiLearningAnalysis`` v1 from reading progress and quiz accuracy."""
    totals = _totals(view)
    notes = _Notes()
    _knowledge_point_notes(view, totals.attempted, notes)
    _material_notes(view, notes)
    _dwell_evidence(view, notes)
    return {
        "summary": _summary(totals, view.zh),
        "masteryLevel": totals.mastery,
        "strengths": notes.strengths[:20],
        "risks": notes.risks[:20],
        "evidence": notes.evidence[:50],
    }


def weak_point_analysis(view: View) -> dict[str, Any]:
    """``{"items": [WeakPointCandidate]}`` v1: lowest accuracy / unpractised first."""
    zh = view.zh
    read_blocks = {r["blockId"] for r in view.reading if as_number(r.get("dwellSeconds")) > 0}
    scored: list[tuple[float, str, dict[str, Any]]] = []
    for kp in view.kps:
        acc = kp_accuracy(kp)
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
            attempts = int(as_number(kp.get("attempts")))
            correct = round(acc * attempts)
            reason = (
                f"答题 {attempts} 次，正确 {correct} 次（正确率 {percent(acc)}）。"
                if zh
                else f"Answered {correct} of {attempts} correctly (accuracy {percent(acc)})."
            )
        scored.append(
            (
                round(severity, 3),
                kp["knowledgePointId"],
                {
                    "knowledgePointId": kp["knowledgePointId"],
                    "reason": f"{kp_name(kp)}：{reason}" if zh else f"{kp_name(kp)}: {reason}",
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
        (k for k in view.kps if (kp_accuracy(k) is not None and (kp_accuracy(k) or 0) < 0.6)),
        key=lambda k: (kp_accuracy(k) or 0, k["knowledgePointId"]),
    )
    for kp in weak[:5]:
        acc = kp_accuracy(kp) or 0.0
        items.append(
            {
                "actionType": "review",
                "targetType": "knowledge_point",
                "targetId": kp["knowledgePointId"],
                "reason": f"复习「{kp_name(kp)}」：正确率只有 {percent(acc)}。"
                if zh
                else f"Review {kp_name(kp)}: accuracy is only {percent(acc)}.",
            }
        )
    for m in sorted(view.materials, key=lambda m: (material_progress(m), m["materialId"])):
        p = material_progress(m)
        if p >= 1.0 or len(items) >= 12:
            continue
        items.append(
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": m["materialId"],
                "reason": f"继续阅读《{material_title(m)}》：当前进度 {percent(p)}。"
                if zh
                else f"Continue reading “{material_title(m)}”: {percent(p)} read so far.",
            }
        )
    practise = sorted(
        (k for k in view.kps if kp_accuracy(k) is None or 0.6 <= (kp_accuracy(k) or 0) < 0.9),
        key=lambda k: (kp_accuracy(k) is not None, kp_accuracy(k) or 0, k["knowledgePointId"]),
    )
    for kp in practise[:5]:
        maybe = kp_accuracy(kp)
        if zh:
            reason = f"练习「{kp_name(kp)}」：" + (
                "还没有答题记录。" if maybe is None else f"正确率 {percent(maybe)}，再巩固一下。"
            )
        else:
            reason = f"Practise {kp_name(kp)}: " + (
                "no quiz attempts yet."
                if maybe is None
                else f"accuracy {percent(maybe)}, worth consolidating."
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
