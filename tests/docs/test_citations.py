"""Every citation in the repository resolves to something the repository holds.

* A section citation ``§2.3`` (``reference §2.3``, and each further ``§N`` of a list such
  as ``§2.3, §2.4``) names a numbered heading of ``docs/reference/`` (``## 2.3 …``).
  Citations of other documents (``RFC 9110 §13.1.2``) are not ours and are skipped.
* A case citation (``case L2``, ``cases D1, D2``, ``cases L1–L3``) names a case of
  ``docs/reference/cases.md``.
* No file cites the contract under any other name than the reference, nor a file that
  is not in the repository (``some/dir/file.md``).

Every file git tracks (or would track) is read: code, protos, tests, deploy files, docs.
This file is the only one allowed to spell the name it forbids.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
CASES = REFERENCE / "cases.md"
THIS = Path(__file__).resolve()

#: Files that are data, not prose: never read.
SKIP_SUFFIXES = {".png", ".jpg", ".gif", ".ico", ".woff", ".woff2", ".lock"}
SKIP_FILES = {"package-lock.json"}

_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\s", re.M)
_CASE_HEADING = re.compile(r"^#{2,6}\s+([A-Z]\d+'?)\s", re.M)
_SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
_OTHER_DOCUMENT = re.compile(r"\b(?:RFC|ISO|IEEE)\s?[\d-]+(?:\s+[\w.]+)?\s*$")
_ID = r"[A-Z]\d+(?:'(?![a-z]))?"
_ID_OR_RANGE = rf"{_ID}(?:\s?[–-]\s?{_ID})?"
_CASES = re.compile(
    rf"\b[Cc]ases?\s+({_ID_OR_RANGE}(?:(?:\s*,\s*|\s*/\s*|\s+and\s+){_ID_OR_RANGE})*)(?!\w)"
)
_FORBIDDEN = re.compile(r"\b" + "SP" + r"EC\b")
_FILE = re.compile(r"(?<![\w./:-])((?:[\w-]+/)+[\w.-]+\.(?:md|py|proto|ya?ml|toml|j2))(?![\w/])")


@cache
def files() -> tuple[Path, ...]:
    """Every file git tracks or would track, read as text."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = []
    for name in sorted(set(out.split("\0"))):
        path = ROOT / name
        if (
            not name
            or not path.is_file()
            or path.suffix in SKIP_SUFFIXES
            or path.name in SKIP_FILES
            or path.resolve() == THIS
        ):
            continue
        paths.append(path)
    return tuple(paths)


def texts() -> Iterator[tuple[Path, str]]:
    for path in files():
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


@cache
def sections() -> frozenset[str]:
    """The numbers of the reference's numbered headings."""
    found: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        found.update(_HEADING.findall(page.read_text(encoding="utf-8")))
    return frozenset(found)


@cache
def cases() -> frozenset[str]:
    """The case ids of the cases page."""
    return frozenset(_CASE_HEADING.findall(CASES.read_text(encoding="utf-8")))


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def section_citations(text: str) -> Iterator[tuple[int, str]]:
    """``(offset, number)`` of each ``§N`` that cites the reference."""
    for match in _SECTION.finditer(text):
        before = text[max(0, match.start() - 30) : match.start()]
        before = re.sub(r"(?:§\s?[\d.]+\s*(?:,|/|and|-|–)\s*)+$", "", before)
        if _OTHER_DOCUMENT.search(before):
            continue
        yield match.start(), match[1].rstrip(".")


def case_citations(text: str) -> Iterator[tuple[int, str]]:
    """``(offset, id)`` of each case a ``case …`` citation names (ranges: both ends)."""
    for match in _CASES.finditer(text):
        for ident in re.findall(_ID, match[1]):
            yield match.start(), ident


def test_the_reference_has_its_sections_and_cases() -> None:
    assert {"1", "2", "2.3", "3", "3.1", "4", "9.6"} <= sections()
    assert {"L1", "L7", "M3", "C1", "D8", "P6", "C1'", "C2'", "N1", "N9"} <= cases()


def test_every_section_citation_resolves() -> None:
    bad = [
        f"{_where(path, text, pos)}: §{number}"
        for path, text in texts()
        for pos, number in section_citations(text)
        if number not in sections()
    ]
    assert bad == [], "citations of no numbered heading in docs/reference/:\n" + "\n".join(bad)


def test_every_case_citation_resolves() -> None:
    bad = [
        f"{_where(path, text, pos)}: case {ident}"
        for path, text in texts()
        for pos, ident in case_citations(text)
        if ident not in cases()
    ]
    assert bad == [], "cases not on docs/reference/cases.md:\n" + "\n".join(bad)


def test_nothing_cites_the_contract_under_another_name() -> None:
    bad = [
        f"{_where(path, text, m.start())}: {text[m.start() : m.start() + 40]!r}"
        for path, text in texts()
        for m in _FORBIDDEN.finditer(text)
    ]
    assert bad == [], "cite the reference (`reference §N.N`) instead:\n" + "\n".join(bad)


#: Paths cited that belong to a dependency, not to the repository.
EXTERNAL_PREFIXES = ("google/protobuf/",)


def _exists(cited: str, citing: Path, tracked: frozenset[str]) -> bool:
    if cited.startswith(EXTERNAL_PREFIXES):
        return True
    if (ROOT / cited).exists() or (citing.parent / cited).exists():
        return True
    return any(t == cited or t.endswith("/" + cited) for t in tracked)


def test_every_cited_file_exists() -> None:
    tracked = frozenset(str(p.relative_to(ROOT)) for p in files()) | {str(THIS.relative_to(ROOT))}
    bad = [
        f"{_where(path, text, m.start())}: {m[1]}"
        for path, text in texts()
        if not path.name.endswith("_pb2.py")  # serialized descriptors, not prose
        for m in _FILE.finditer(text)
        if not _exists(m[1], path, tracked)
    ]
    assert bad == [], "files cited that the repository does not hold:\n" + "\n".join(bad)


def test_the_parsers_find_what_they_should() -> None:
    text = (
        "(reference §2.3, §2.4) and reference §9.1's rule; RFC 9110 §13.1.2 is not ours; "
        "cases L1–L3, L5/L6 and D1, D2; Case P6's key; case C1'."
    )
    assert [n for _, n in section_citations(text)] == ["2.3", "2.4", "9.1"]
    assert [i for _, i in case_citations(text)] == ["L1", "L3", "L5", "L6", "D1", "D2", "P6", "C1'"]
    assert _FORBIDDEN.search("see " + "SP" + "EC §2.3")
    assert not _FORBIDDEN.search("UNSPECIFIED, SPEC_CODES")
    assert [m[1] for m in _FILE.finditer("see `runtime_worker/settings.py` and x/y.md.")] == [
        "runtime_worker/settings.py",
        "x/y.md",
    ]
