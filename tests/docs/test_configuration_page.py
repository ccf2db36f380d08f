"""The configuration reference (docs/configuration.md) is generated from the settings classes.

It fails when a setting has no description (neither in its class's ``Attributes:``
section nor as a ``#:`` comment), when such an entry names no setting, when a setting
is missing from the page or the page names one that does not exist, and when the
committed page differs from what ``scripts/gen_config_docs.py`` writes.
"""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from scripts import gen_config_docs as gen

REGENERATE = "run `make docs` (or `.venv/bin/python scripts/gen_config_docs.py`) and commit it"


def _listed() -> dict[str, list[str]]:
    """Section title → the variables its table lists, as the page has them."""
    text = gen.PAGE.read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        out[title.strip()] = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", body, re.M)
    return out


def test_every_setting_is_described() -> None:
    problems = [p for s in gen.SECTIONS for p in gen.describe(s.cls).problems]
    assert problems == [], "\n".join(problems)


def test_the_committed_page_is_the_generated_one() -> None:
    text, _ = gen.render()
    current = gen.PAGE.read_text(encoding="utf-8") if gen.PAGE.exists() else ""
    assert current == text, f"{gen.PAGE.relative_to(gen.ROOT)} is stale: {REGENERATE}"


def test_each_service_finds_every_setting_it_reads_and_nothing_else() -> None:
    listed = _listed()
    for section in gen.SECTIONS:
        names = listed.get(section.title)
        assert names is not None, f"no section {section.title!r}: {REGENERATE}"
        assert len(names) == len(set(names)), f"{section.title}: a setting listed twice"
        fields = set(section.cls.model_fields)
        assert set(names) - fields == set(), f"{section.title}: an entry names no setting"
        bases = [s for s in gen.SECTIONS if issubclass(section.cls, s.cls)]
        shown = {n for b in bases for n in listed.get(b.title, [])}
        assert fields - shown == set(), f"{section.title}: settings missing: {REGENERATE}"


def test_a_described_field_has_text_on_the_page() -> None:
    text = gen.PAGE.read_text(encoding="utf-8")
    for row in re.findall(r"^\| `[A-Z][A-Z0-9_]*` \|.*$", text, re.M):
        assert row.rstrip().rstrip("|").rsplit("|", 1)[1].strip(), f"no description: {row}"


class _Sample(BaseModel):
    """A settings-like class with a stale entry and an undescribed field.

    Attributes:
        DESCRIBED: has a description.
        GONE: names no field.
    """

    DESCRIBED: int = 1
    UNDESCRIBED: str = ""
    #: a comment entry.
    COMMENTED: bool = False


def test_the_checks_catch_a_missing_and_a_stale_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen, "_OWN", {*gen._OWN, __name__.split(".")[0]})
    found = gen.describe(_Sample)
    assert found.text == {"DESCRIBED": "has a description.", "COMMENTED": "a comment entry."}
    assert any("GONE names no setting" in p for p in found.problems)
    assert any("UNDESCRIBED has no description" in p for p in found.problems)


def test_attributes_entries_cover_several_names_and_continuations() -> None:
    doc = """Title.

    Attributes:
        A, B: first line
            continued.
        C: other.

    Returns:
        nothing.
    """
    assert gen.attributes_section(doc) == {
        "A": "first line continued.",
        "B": "first line continued.",
        "C": "other.",
    }
