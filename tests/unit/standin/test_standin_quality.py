"""Quality of the stand-in's quiz questions and flashcards on the shipped documents.

The documents are split exactly as job_service splits a material
(``split_document``), so heading and code blocks look as they do in a real
snapshot (no ``kind``); knowledge points are one per ``##`` section, with
accuracies from weak to strong. Checked: no item built from a heading or code
block, items spread across the material and its knowledge points (weakest
first for quizzes), distractors distinct from the answer and from each other,
true/false with real false variants, question-like flashcard fronts, CJK
handling, the output token budget, and determinism.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from airuntime_common.outputs import validate_output
from job_service.learning.markdown_split import split_document
from model_standin.answers import (
    OUTPUT_TOKEN_BUDGET,
    Prompt,
    View,
    build_answer,
    distractors,
    estimate_tokens,
    is_code_like,
    is_heading_like,
    split_sentences,
)

DOCS = Path(__file__).resolve().parents[3] / "demo" / "documents"
DOC_NAMES = ["photosynthesis.md", "binary-search.md", "photosynthesis-zh.md"]
ALL_TYPES = ["single_choice", "multiple_choice", "true_false", "short_answer"]
ACCURACIES = [0.8, 0.2, 0.6, 0.4, 0.8, 0.2, 1.0, 0.0]
EN_FUNCTION_WORDS = {
    "the",
    "a",
    "an",
    "it",
    "its",
    "this",
    "that",
    "these",
    "they",
    "them",
    "he",
    "she",
    "we",
    "you",
    "and",
    "or",
    "of",
    "is",
    "are",
    "which",
    "there",
}
FILLERS = {"none of these", "cannot be determined", "all of these", "以上都不对", "无法确定"}


def doc_snapshot(name: str, target: str = "material") -> tuple[dict[str, Any], dict[str, str]]:
    """A snapshot of a shipped document and each block's kind (heading, code, ...)."""
    text = (DOCS / name).read_text("utf-8")
    split = split_document(text)
    blocks = [
        {"blockId": f"b{i:03d}", "materialId": "mat", "ordinal": i, "text": b.text}
        for i, b in enumerate(split)
    ]
    kinds: dict[str, str] = {f"b{i:03d}": b.kind for i, b in enumerate(split)}
    kps: list[dict[str, Any]] = []
    for i, b in enumerate(split):
        if b.kind == "heading" and text.find("## " + b.text) >= 0 and "### " + b.text not in text:
            acc = ACCURACIES[len(kps) % len(ACCURACIES)]
            kps.append(
                {
                    "knowledgePointId": f"kp{len(kps):02d}",
                    "name": b.text,
                    "materialId": "mat",
                    "blockIds": [],
                    "attempts": 5,
                    "correct": round(acc * 5),
                    "accuracy": acc,
                    "lastAttemptAt": None,
                }
            )
        elif kps and b.kind != "heading":
            kps[-1]["blockIds"].append(f"b{i:03d}")
    snapshot: dict[str, Any] = {
        "jobType": "quiz_generation",
        "targetType": target,
        "targetId": "mat" if target == "material" else "usr",
        "userId": "usr",
        "params": {},
        "materials": [
            {
                "materialId": "mat",
                "title": name,
                "blockCount": len(blocks),
                "readBlockCount": 0,
                "progress": 0.0,
            }
        ],
        "blocks": blocks,
        "knowledgePoints": [k for k in kps if k["blockIds"]],
        "reading": [],
        "stats": {},
    }
    return snapshot, kinds


def answer(task: str, snapshot: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    output = build_answer(Prompt(task=task, snapshot=snapshot, params=params))
    validate_output(task, "v1", output)
    items: list[dict[str, Any]] = output["items"]
    return items


def block_text(snapshot: dict[str, Any], block_id: str) -> str:
    return next(str(b["text"]) for b in snapshot["blocks"] if b["blockId"] == block_id)


def ordinal(block_id: str) -> int:
    return int(block_id[1:])


# ----------------------------------------------------------------------------- headings & code


@pytest.mark.parametrize("doc", DOC_NAMES)
@pytest.mark.parametrize("task", ["quiz_generation", "flashcard_generation"])
def test_no_item_comes_from_a_heading_or_code_block(doc: str, task: str) -> None:
    snapshot, kinds = doc_snapshot(doc)
    params = {"count": 20, "questionTypes": ALL_TYPES}
    items = answer(task, snapshot, params)
    assert len(items) >= 15
    headings = {str(b["text"]) for b in snapshot["blocks"] if kinds[b["blockId"]] == "heading"}
    for item in items:
        for block_id in item["sourceBlockIds"]:
            assert kinds[block_id] not in ("heading", "code"), (item, kinds[block_id])
        text = item.get("stem") or item["front"]
        # no "Complete: ____" / "How ____ Works": the prompt is a real sentence or question
        if "____" in text:
            rest = re.sub(r"^[^:：？?]*[:：？?]", "", text).replace("____", "")
            assert len(rest.split()) >= 4 or re.search(r"[\u4e00-\u9fff]{6}", rest), text
        else:
            assert text.endswith(("?", "？", ".", "。", "（多选）", "apply.")), text
        assert item.get("back", "x") not in headings


def test_heading_and_code_heuristics() -> None:
    assert is_heading_like("How Photosynthesis Works")
    assert is_heading_like("The precondition: sorted data")
    assert is_heading_like("## The idea")
    assert is_heading_like("叶绿体：光合作用的场所")
    assert not is_heading_like("Binary search is a method for finding a value.")
    assert not is_heading_like("The most common mistakes are:")  # an introduction, not a title
    assert not is_heading_like("光合作用是绿色植物利用光能的过程。")
    code = "def f(items, target):\n    low, high = 0, len(items) - 1\n    return -1"
    assert is_code_like(code)
    assert not is_code_like("The loop continues while that range is non-empty.")
    md = (
        "Intro sentence is here.\n```python\nx = compute(a, b) if a else None\n```\nAfter it, text."
    )
    sentences = split_sentences(md)
    assert sentences[0] == "Intro sentence is here."
    assert not any("compute" in s for s in sentences)
    assert split_sentences("6 CO2 + 6 H2O + light energy → C6H12O6 + 6 O2") == []


# ----------------------------------------------------------------------------- spread


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_quiz_covers_the_weakest_knowledge_points_first(doc: str) -> None:
    snapshot, _ = doc_snapshot(doc)
    kps = snapshot["knowledgePoints"]
    items = answer("quiz_generation", snapshot, {"count": 5})
    cited = [q.get("knowledgePointId") for q in items]
    assert len(set(cited)) == len(cited) == 5  # five different knowledge points
    weakest = min(kps, key=lambda k: (k["accuracy"], k["knowledgePointId"]))
    assert cited[0] == weakest["knowledgePointId"]
    accuracies = {k["knowledgePointId"]: k["accuracy"] for k in kps}
    assert [accuracies[c] for c in cited] == sorted(accuracies[c] for c in cited)


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_flashcards_spread_across_the_material(doc: str) -> None:
    snapshot, _ = doc_snapshot(doc)
    last = len(snapshot["blocks"]) - 1
    cards = answer("flashcard_generation", snapshot, {"count": 6})
    assert len(cards) == 6
    ordinals = [ordinal(c["sourceBlockIds"][0]) for c in cards]
    assert ordinals == sorted(ordinals)  # listed in document order
    assert len(set(ordinals)) >= 5
    assert ordinals[-1] >= last * 0.6  # not only the first blocks
    assert ordinals[0] <= last * 0.4


def test_quiz_without_knowledge_points_still_spreads() -> None:
    snapshot, _ = doc_snapshot("photosynthesis.md")
    snapshot["knowledgePoints"] = []
    items = answer("quiz_generation", snapshot, {"count": 6})
    ordinals = sorted(ordinal(q["sourceBlockIds"][0]) for q in items)
    assert len(set(ordinals)) == 6
    assert ordinals[-1] - ordinals[0] >= len(snapshot["blocks"]) // 2


# ----------------------------------------------------------------------------- question types


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_single_choice_distractors(doc: str) -> None:
    snapshot, _ = doc_snapshot(doc)
    items = answer("quiz_generation", snapshot, {"count": 12, "difficulty": "hard"})
    assert {q["questionType"] for q in items} == {"single_choice"}
    for q in items:
        options, right = q["options"], q["answer"]
        assert len(options) == 4 and options.count(right) == 1
        assert len({o.casefold() for o in options}) == 4  # distinct, also ignoring case
        assert not FILLERS & set(options)  # real terms of the material, not fillers
        for o in options:
            assert o.casefold() not in EN_FUNCTION_WORDS
            if o != right:
                assert o.casefold() not in right.casefold()
                assert right.casefold() not in o.casefold()
        # the blank is the answer: filling it in gives back the quoted sentence
        sentence = (
            q["stem"].split("？", 1)[-1] if "？" in q["stem"] else q["stem"].split("? ", 1)[1]
        )
        filled = sentence.replace("a(n) ____", "a ____").replace("____", right)
        src = block_text(snapshot, q["sourceBlockIds"][0])
        assert "____" in q["stem"]
        quoted = [s for s in split_sentences(src) if q["explanation"].endswith(s)]
        assert quoted, q["explanation"]
        assert filled.replace("an ", "a ") == quoted[0].replace("an ", "a ")


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_true_false_has_real_false_variants(doc: str) -> None:
    snapshot, _ = doc_snapshot(doc)
    items = answer("quiz_generation", snapshot, {"count": 12, "questionTypes": ["true_false"]})
    answers = [q["answer"] for q in items]
    assert 4 <= answers.count("false") <= 8 and 4 <= answers.count("true") <= 8
    for q in items:
        assert q["options"] == ["true", "false"]  # reference §9.4, whatever the language
        statement = re.sub(r"^(True or false: |判断正误：)", "", q["stem"])
        src = " ".join(split_sentences(block_text(snapshot, q["sourceBlockIds"][0])))
        if q["answer"] == "true":
            assert statement in src
        else:
            assert statement not in src
            # exactly one key term swapped: the explanation names both terms
            m = re.search(
                r"(?:it is “(.+?)”, not “(.+?)”|应为「(.+?)」，而不是「(.+?)」)", q["explanation"]
            )
            assert m is not None
            right, wrong = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            assert wrong in statement and right.casefold() != wrong.casefold()


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_multiple_choice_and_short_answer(doc: str) -> None:
    snapshot, _ = doc_snapshot(doc)
    params = {"count": 8, "questionTypes": ["multiple_choice", "short_answer"]}
    items = answer("quiz_generation", snapshot, params)
    assert len(items) == 8
    assert {q["questionType"] for q in items} == {"multiple_choice", "short_answer"}
    for q in items:
        cited = " ".join(
            s for b in q["sourceBlockIds"] for s in split_sentences(block_text(snapshot, b))
        )
        if q["questionType"] == "multiple_choice":
            assert len(set(q["options"])) == len(q["options"]) == 4
            assert 1 <= len(q["answer"]) < len(q["options"])
            assert all(a in cited for a in q["answer"])
            assert all(o not in cited for o in q["options"] if o not in q["answer"])
        else:
            assert q["options"] == [] and q["answer"] and q["answer"] in cited
            assert q["stem"].endswith(("?", "？")) or "____" in q["stem"]
            assert q["answer"].casefold() not in EN_FUNCTION_WORDS


def test_short_answer_asks_for_a_named_term() -> None:
    snapshot, _ = doc_snapshot("photosynthesis.md")
    items = answer("quiz_generation", snapshot, {"count": 20, "questionTypes": ["short_answer"]})
    questions = [q for q in items if q["stem"].endswith("?")]
    assert questions, [q["stem"] for q in items]
    for q in questions:
        assert q["answer"] not in q["stem"]


# ----------------------------------------------------------------------------- flashcards


def test_english_flashcard_fronts_are_questions() -> None:
    snapshot, _ = doc_snapshot("photosynthesis.md")
    cards = answer("flashcard_generation", snapshot, {"count": 30})
    fronts = [c["front"] for c in cards]
    assert len(set(fronts)) == len(fronts)
    questions = [f for f in fronts if re.match(r"^(What (is|are) |Explain why |What does )", f)]
    assert len(questions) >= 8, fronts
    assert not any(re.match(r"^What is (if|it|this|that|when) ", f, re.I) for f in fronts)
    assert "What is binary search?" in [
        c["front"]
        for c in answer("flashcard_generation", doc_snapshot("binary-search.md")[0], {"count": 20})
    ]
    for card in cards:
        assert card["back"] in split_sentences(block_text(snapshot, card["sourceBlockIds"][0]))


def test_chinese_flashcards_ask_what_and_why() -> None:
    snapshot, _ = doc_snapshot("photosynthesis-zh.md")
    cards = answer("flashcard_generation", snapshot, {"count": 20})
    fronts = [c["front"] for c in cards]
    assert "什么是光合作用？" in fronts
    assert "为什么叶片看起来是绿色的？" in fronts
    assert "什么是类囊体？" in fronts
    for card in cards:
        assert card["back"][-1] in "。！？；"
        assert card["back"] in block_text(snapshot, card["sourceBlockIds"][0])


# ----------------------------------------------------------------------------- terms


def test_key_terms_are_recurring_noun_phrases() -> None:
    snapshot, _ = doc_snapshot("binary-search.md")
    view = View.of(snapshot)
    terms = view.term_index()
    pool = terms.pool(cjk=False)
    assert "binary search" in [p.casefold() for p in pool[:10]]
    assert not EN_FUNCTION_WORDS & {p.casefold() for p in pool}
    assert not any(p.casefold().endswith("ly") for p in pool[:30])
    for src in view.sources():
        for key in src.keys[:1]:
            assert key in src.sentence and key.casefold() not in EN_FUNCTION_WORDS


def test_chinese_terms_come_from_kp_names_and_recurring_ngrams() -> None:
    snapshot, _ = doc_snapshot("photosynthesis-zh.md")
    terms = View.of(snapshot).term_index()
    pool = terms.pool(cjk=True)
    for term in ("光合作用", "叶绿体", "二氧化碳", "光反应", "卡尔文循环"):
        assert term in pool
    # fragments of longer terms are not terms
    for fragment in ("叶绿", "合作用", "碳化合物", "氧化碳"):
        assert fragment not in pool


def test_distractors_are_distinct_and_never_the_answer() -> None:
    snapshot, _ = doc_snapshot("photosynthesis.md")
    terms = View.of(snapshot).term_index()
    sentence = "ATP and NADPH are then spent in the Calvin cycle."
    for seed in range(20):
        out = distractors("Calvin cycle", sentence, terms, random.Random(seed), 3)
        assert len(out) == 3 and len({o.casefold() for o in out}) == 3
        assert all("calvin" not in o.casefold() and "cycle" not in o.casefold() for o in out)
        assert all(o.casefold() not in sentence.casefold() for o in out)
        assert all(len(o.split()) >= 2 for o in out)  # a two-word term gets two-word options


# ----------------------------------------------------------------------------- budget, determinism


@pytest.mark.parametrize("doc", DOC_NAMES)
@pytest.mark.parametrize(
    ("task", "params"),
    [
        ("quiz_generation", {"count": 20, "questionTypes": ALL_TYPES}),
        ("quiz_generation", {"count": 20, "questionTypes": ["multiple_choice"]}),
        ("flashcard_generation", {"count": 50}),
    ],
)
def test_answers_fit_the_worker_token_budget(doc: str, task: str, params: dict[str, Any]) -> None:
    snapshot, _ = doc_snapshot(doc)
    items = answer(task, snapshot, params)
    assert estimate_tokens(json.dumps({"items": items}, ensure_ascii=False)) <= OUTPUT_TOKEN_BUDGET
    assert OUTPUT_TOKEN_BUDGET < 6144  # the worker's max_tokens for generation jobs
    assert len(items) >= (15 if params.get("count") == 20 else 25)


def test_same_input_same_questions_and_other_params_other_questions() -> None:
    snapshot, _ = doc_snapshot("binary-search.md")
    params = {"count": 10, "questionTypes": ALL_TYPES}
    first = answer("quiz_generation", snapshot, params)
    assert answer("quiz_generation", snapshot, params) == first
    other = answer("quiz_generation", snapshot, {**params, "difficulty": "easy"})
    assert [q["stem"] for q in other] != [q["stem"] for q in first] or [
        q["options"] for q in other
    ] != [q["options"] for q in first]
