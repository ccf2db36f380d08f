"""No service file over 800 lines, no function over 80 lines (generated code and
migrations aside): a file or a function past that size usually holds two things
that want their own names.

Every hand-written Python file of the repository outside ``tests/``
(:func:`tests.unit.source_tree.python_files`) is measured with :mod:`ast`: a
file by its lines, a function (or method, or nested function; ``async`` too) from
its ``def`` line — decorators aside — to its last line. The failure names every
offender: the file and its line count, the function with its line and length.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.source_tree import python_files, relative

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80


def file_lines(path: Path) -> int:
    """The number of lines of the file at ``path``."""
    return len(path.read_text(encoding="utf-8").splitlines())


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> Iterator[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of every function of ``source`` longer
    than ``limit`` lines (from its ``def`` to its last line)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    yield name, child.lineno, length
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(source), "")


def offenders() -> list[str]:
    """One line per file or function over its limit."""
    found: list[str] = []
    for path in python_files():
        name = relative(path)
        lines = file_lines(path)
        if lines > MAX_FILE_LINES:
            found.append(f"{name}: {lines} lines (at most {MAX_FILE_LINES})")
        for function, line, length in long_functions(path.read_text(encoding="utf-8")):
            found.append(
                f"{name}:{line}: {function} is {length} lines (at most {MAX_FUNCTION_LINES})"
            )
    return found


def test_the_measure() -> None:
    source = "\n".join(
        [
            "class A:",
            "    @property",
            "    def short(self):",
            "        return 1",
            "    async def long(self):",
            *["        x = 1"] * 80,
            "        def inner():",
            *["            y = 2"] * 81,
        ]
    )
    found = list(long_functions(source))
    assert found == [("A.long", 5, 163), ("A.long.inner", 86, 82)]


def test_the_walk_sees_the_services_and_tools_but_not_tests_or_generated_code() -> None:
    names = {relative(p) for p in python_files()}
    assert {"api_gateway/app.py", "job_service/app.py", "chaos/galera.py"} <= names
    assert not any(n.startswith(("tests/", "zhixi/", ".venv/")) for n in names)
    assert not any("/migrations/versions/" in n for n in names)


def test_no_file_or_function_is_over_its_size() -> None:
    found = offenders()
    assert not found, "over the size limits:\n" + "\n".join(found)
