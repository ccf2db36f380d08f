"""The repository's own Python source, for the tests that hold it to its rules.

:func:`python_files` walks the repository's Python files outside ``tests/``, the
generated stubs (``zhixi/``), the migrations' versions and the virtualenv: the
code the size limits (``test_code_size.py``) and the cross-references of
docstrings and comments (``test_doc_references.py``) apply to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Top-level directories that are not the project's hand-written code.
EXCLUDED_DIRS = frozenset(
    {"tests", "zhixi", ".venv", "node_modules", ".git", "build", "dist", ".hypothesis"}
)


def relative(path: Path) -> str:
    """``path`` relative to the repository root, with ``/``."""
    return path.relative_to(ROOT).as_posix()


def python_files() -> Iterator[Path]:
    """Every hand-written Python file of the repository (see the module docstring),
    sorted."""
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in EXCLUDED_DIRS or any(p.startswith(".") for p in parts[:-1]):
            continue
        if "migrations" in parts and "versions" in parts:
            continue
        yield path
