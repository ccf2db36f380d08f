"""Every cross-reference in the code's docstrings and comments names something that
exists.

Two kinds are read from the comments and docstrings of every hand-written Python
file (:func:`tests.unit.source_tree.python_files`):

* Sphinx roles — ``:func:`…```, ``:class:``, ``:mod:``, ``:meth:``, ``:attr:``,
  ``:data:``, ``:exc:``, ``:obj:``, ``:const:`` — qualified (``~`` and an explicit
  title allowed) or short, as Sphinx reads them: a short name is looked up in the
  file's own module, then among its classes' members (a role quoted as an example
  inside an inline literal is not one);
* plain dotted mentions of the project's own packages, e.g.
  ``job_service.learning.MAX_EVENT_BATCH`` (a trailing ``*`` names a package's
  contents and is not checked).

Each is resolved by importing its longest importable module prefix and looking up
the rest as attributes (an attribute declared only as an annotation, a dataclass
or pydantic field, counts). A reference left behind by a move or a rename fails
the test, naming the file, the line and the reference.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.source_tree import python_files, relative

#: The project's own top-level packages (a plain dotted mention of one is checked).
PACKAGES = (
    "airuntime_common",
    "api_gateway",
    "job_service",
    "credential_service",
    "runtime_worker",
    "model_standin",
    "launcher",
    "demo",
    "chaos",
    "bench",
)
_ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|attr|data|exc|obj|const):`([^`]+)`")
#: A role shown as an example inside an inline literal (````:mod:`x````): not a reference.
_QUOTED_ROLE = re.compile(r"``[^`]*:(?:py:)?\w+:`[^`]*`[^`]*``")
_MENTION = re.compile(
    r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)(?![\w*-]|\.\*|/)"
)


@dataclass(frozen=True)
class Reference:
    """One cross-reference found in a file."""

    file: str
    line: int
    target: str
    role: str | None  # None for a plain dotted mention

    def __str__(self) -> str:
        shown = f":{self.role}:`{self.target}`" if self.role else self.target
        return f"{self.file}:{self.line}: {shown}"


def _texts(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of every comment and every docstring of ``source``: a bare
    string statement (a module's, class's or function's docstring, or an attribute's
    after its assignment). Other string literals (a logger's name, a file name, an
    f-string's expressions) are code, not references."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value


def _role_target(raw: str) -> str:
    """The target of a role's text: ``title <target>`` → target; ``~``/``!``/``()`` off."""
    if (explicit := re.search(r"<([^>]+)>\s*$", raw)) is not None:
        raw = explicit.group(1)
    return raw.strip().lstrip("~!").removesuffix("()")


def references(path: Path) -> Iterator[Reference]:
    """Every reference of the file at ``path`` (see the module docstring)."""
    name = relative(path)
    for line, raw in _texts(path.read_text(encoding="utf-8")):
        text = _QUOTED_ROLE.sub(lambda m: " " * len(m.group()), raw)
        for match in _ROLE.finditer(text):
            at = line + text.count("\n", 0, match.start())
            yield Reference(name, at, _role_target(match.group(2)), match.group(1))
        outside_roles = _ROLE.sub(lambda m: " " * len(m.group()), text)
        for match in _MENTION.finditer(outside_roles):
            at = line + outside_roles.count("\n", 0, match.start())
            yield Reference(name, at, match.group(1).rstrip("."), None)


def _module_name(file: str) -> str | None:
    """The import name of a file of a package (None for a loose script)."""
    parts = file.removesuffix(".py").split("/")
    if parts[0] not in PACKAGES:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _member(owner: Any, name: str) -> bool:
    """Whether ``owner`` has ``name``: an attribute, or a declared field of a class."""
    if hasattr(owner, name):
        return True
    if inspect.isclass(owner):
        for klass in owner.__mro__:
            if name in getattr(klass, "__annotations__", {}):
                return True
        if name in getattr(owner, "model_fields", {}):
            return True
    return False


def _lookup(owner: Any, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if not _member(owner, part):
            return False
        if i < len(parts) - 1:
            owner = getattr(owner, part)
    return True


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _absolute(target: str) -> bool:
    """Whether ``target`` names something from the top: its longest importable module
    prefix, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        found = _import(".".join(parts[:cut]))
        if found is not None:
            return _lookup(found, parts[cut:])
    return False


def _imports(module: ModuleType) -> dict[str, str]:
    """Names a module's source imports (``typing.TYPE_CHECKING`` blocks included, which
    are not attributes at run time), each with what it names."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    names: dict[str, str] = {}
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
    return names


def _packages_of(module: str) -> list[str]:
    """``a.b.c`` → ``["a.b.c", "a.b", "a"]``: where a relative name may live."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def resolves(target: str, module: str | None) -> bool:
    """Whether ``target`` names something, as Sphinx would look it up from ``module``:
    absolutely; a leading ``.`` from the module and the packages above it; a short
    name in the module's scope (its imports included), then among its classes."""
    if not target.startswith(".") and _absolute(target):
        return True
    bare = target.lstrip(".")
    if "." not in bare and hasattr(builtins, bare):
        return True
    home = _import(module) if module else None
    if home is None or module is None:
        return False
    if target.startswith("."):
        return any(_absolute(f"{package}.{bare}") for package in _packages_of(module))
    parts = bare.split(".")
    if _lookup(home, parts):
        return True
    imported = _imports(home).get(parts[0])
    if imported is not None and _absolute(".".join([imported, *parts[1:]])):
        return True
    classes = [v for v in vars(home).values() if inspect.isclass(v)]
    return any(_lookup(klass, parts) for klass in classes)


def _all_references() -> list[Reference]:
    return [ref for path in python_files() for ref in references(path)]


def test_the_scanner_finds_roles_and_mentions() -> None:
    """The test reads what it claims to: roles and plain mentions, with their lines."""
    found = _all_references()
    assert len(found) > 300
    assert {r.role for r in found} >= {"func", "class", "mod", "meth", None}
    sample = next(r for r in found if r.file == "airuntime_common/db.py" and r.role == "mod")
    assert sample.line > 1


@pytest.mark.parametrize(
    ("target", "module", "ok"),
    [
        ("airuntime_common.db.retry_transient", None, True),
        ("retry_transient", "airuntime_common.db", True),
        ("job_service.learning.MAX_EVENT_BATCH", None, True),
        ("job_service.domain.learning.MAX_EVENT_BATCH", None, False),
        ("airuntime_common.db.no_such_name", None, False),
        ("no_such_name", "airuntime_common.db", False),
        ("ValueError", None, True),
        ("sqlalchemy.exc.DBAPIError", None, True),
    ],
)
def test_the_resolver(target: str, module: str | None, ok: bool) -> None:
    assert resolves(target, module) is ok


def test_every_reference_in_docstrings_and_comments_resolves() -> None:
    broken = [
        str(ref) for ref in _all_references() if not resolves(ref.target, _module_name(ref.file))
    ]
    assert not broken, "references to names that do not exist:\n" + "\n".join(broken)
