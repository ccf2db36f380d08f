"""Splitting real documents into ordered blocks (reference §3.1)."""

from __future__ import annotations

import re

import pytest

from airuntime_common.errors import AppError, ErrorCode
from job_service.learning.markdown_split import (
    MAX_BLOCK_CHARS,
    MAX_CONTENT_BYTES,
    SplitBlock,
    split_document,
    split_long_text,
)

from .conftest import DOCS


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_structured_markdown_follows_the_document_structure() -> None:
    blocks = split_document((DOCS / "structured.md").read_text())
    assert [(b.kind, b.text.split("\n")[0]) for b in blocks] == [
        ("heading", "Photosynthesis"),
        ("paragraph", "Photosynthesis is the process by which green plants turn light energy into"),
        ("heading", "Inputs and outputs"),
        ("list", "- Carbon dioxide from the air"),
        ("list", "1. Light reactions in the thylakoid membranes"),
        ("quote", "Almost all life on Earth depends, directly or indirectly, on photosynthesis."),
        ("code", "def net_equation() -> str:"),
        ("paragraph", "| Stage | Location |"),
        ("heading", "Summary"),
        ("paragraph", "Plants store the captured energy as glucose."),
    ]
    bullet = blocks[3].text
    # the nested item stays inside its list block, indentation kept
    assert bullet.split("\n") == [
        "- Carbon dioxide from the air",
        "- Water from the soil",
        "  - carried up through the xylem",
        "- Light, absorbed by chlorophyll",
    ]
    assert ">" not in blocks[5].text
    assert blocks[5].text.endswith("It also produces the oxygen we breathe.")
    # code keeps its lines and loses its fences
    assert blocks[6].text == (
        'def net_equation() -> str:\n    return "6 CO2 + 6 H2O -> C6H12O6 + 6 O2"'
    )
    assert all(b.text.strip() != "---" for b in blocks)  # the thematic break is no block


def test_chinese_text_is_split_without_losing_characters() -> None:
    source = (DOCS / "chinese.md").read_text()
    blocks = split_document(source)
    assert [b.kind for b in blocks] == [
        "heading",
        "paragraph",
        "heading",
        "list",
        "quote",
        "paragraph",
    ]
    assert blocks[0].text == "光合作用"
    assert blocks[-1].text.startswith("叶绿素主要吸收红光和蓝紫光")
    # every CJK character of the source is in some block, in order
    cjk = "".join(re.findall(r"[\u4e00-\u9fff]", source))
    assert "".join(re.findall(r"[\u4e00-\u9fff]", "".join(b.text for b in blocks))) == cjk


def test_long_paragraph_is_cut_at_sentence_ends() -> None:
    source = (DOCS / "long_paragraph.txt").read_text()
    assert len(source) > MAX_BLOCK_CHARS
    blocks = split_document(source)
    assert len(blocks) == 2
    assert all(b.kind == "paragraph" for b in blocks)
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)
    # each piece ends at a sentence end, and nothing is lost
    assert blocks[0].text.endswith(".)")
    assert _squash("".join(b.text for b in blocks)) == _squash(source)


def test_long_chinese_paragraph_is_cut_after_cjk_full_stops() -> None:
    sentence = "光合作用把光能转化为化学能，并且释放氧气。"  # 21 characters
    text = sentence * 300  # 6,300 characters, no spaces at all
    pieces = split_long_text(text, 2000)
    assert len(pieces) == 4
    assert all(len(p) <= 2000 for p in pieces)
    assert all(p.endswith("。") for p in pieces)
    assert "".join(pieces) == text


def test_a_sentence_longer_than_a_block_is_cut_hard_without_loss() -> None:
    text = "字" * 4500
    pieces = split_long_text(text, 2000)
    assert [len(p) for p in pieces] == [2000, 2000, 500]
    words = " ".join(["word"] * 1000)  # 4,999 characters, no sentence end
    pieces = split_long_text(words, 2000)
    assert all(len(p) <= 2000 for p in pieces)
    assert all(not p.startswith(" ") and not p.endswith(" ") for p in pieces)
    assert " ".join(pieces) == words


def test_a_long_list_is_cut_between_items_and_long_code_between_lines() -> None:
    items = "\n".join(f"- item number {i} " + "x" * 80 for i in range(60))
    code = "```\n" + "\n".join(f"line_{i} = {i}  # " + "y" * 60 for i in range(80)) + "\n```"
    blocks = split_document(items + "\n\n" + code)
    lists = [b for b in blocks if b.kind == "list"]
    codes = [b for b in blocks if b.kind == "code"]
    assert len(lists) >= 3 and len(codes) >= 3
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)
    assert all(b.text.startswith("- item number") for b in lists)
    assert sum(b.text.count("- item number") for b in lists) == 60
    assert all(b.text.startswith("line_") for b in codes)
    assert sum(len(b.text.split("\n")) for b in codes) == 80


def test_plain_text_paragraphs() -> None:
    blocks = split_document("First paragraph.\r\nStill first.\r\n\r\nSecond one.\n")
    assert [(b.kind, b.text) for b in blocks] == [
        ("paragraph", "First paragraph.\nStill first."),
        ("paragraph", "Second one."),
    ]


def test_content_over_one_mib_is_refused_in_bytes_not_characters() -> None:
    split_document("a" * MAX_CONTENT_BYTES)  # exactly 1 MiB is fine
    with pytest.raises(AppError) as exc:
        split_document("a" * (MAX_CONTENT_BYTES + 1))
    assert exc.value.code == ErrorCode.PAYLOAD_TOO_LARGE
    # 400,000 CJK characters are 1.2 MB of UTF-8
    with pytest.raises(AppError) as exc:
        split_document("字" * 400_000)
    assert exc.value.code == ErrorCode.PAYLOAD_TOO_LARGE


@pytest.mark.parametrize("content", ["", "   \n\n\t", "\u3000\x1c\u2028 "])
def test_blank_content_is_invalid(content: str) -> None:
    with pytest.raises(AppError) as exc:
        split_document(content)
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("---\n\n***\n", "---\n\n***"),
        ("#", "#"),
        (" > ", ">"),
        ("[a]: https://example.com", "[a]: https://example.com"),
        ("\u200b", "\u200b"),
    ],
)
def test_content_that_is_only_markdown_punctuation_is_one_paragraph(
    content: str, text: str
) -> None:
    """Not blank, so a material (the API's document says "not only whitespace"), even
    when its Markdown structure holds no text block."""
    assert split_document(content) == [SplitBlock("paragraph", text)]
