"""Write ``docs/configuration.md``, the configuration reference, from the settings classes.

Each service reads its settings from the environment through one pydantic-settings
class. This script lists, per class, every variable with its type, default, bounds and
description. The description comes from the class's own words, never from this file:

* an entry of the class docstring's ``Attributes:`` section (``NAME: text``, or
  ``NAME, OTHER: text`` for several), or
* the ``#:`` comment lines right above the field.

A class inherits its bases' descriptions; an entry in a subclass wins. A class's
section lists the fields it declares and the inherited ones it describes again.

Usage::

    python scripts/gen_config_docs.py          # write docs/configuration.md
    python scripts/gen_config_docs.py --check  # exit 1 if the page is stale

``tests/docs/test_configuration_page.py`` fails when a field has no description, when
an entry names no field, or when the committed page differs from the generated one.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
REFERENCE = ROOT / "docs" / "reference"

if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, SecretStr  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from airuntime_common.egress import EgressSettings  # noqa: E402
from airuntime_common.model_providers import ModelProviders, ModelProvidersSettings  # noqa: E402
from airuntime_common.settings import CommonSettings  # noqa: E402
from api_gateway.settings import GatewaySettings  # noqa: E402
from credential_service.settings import CredentialSettings  # noqa: E402
from job_service.settings import JobServiceSettings  # noqa: E402
from runtime_worker.settings import WorkerSettings  # noqa: E402


@dataclass(frozen=True)
class Section:
    """One settings class on the page.

    Attributes:
        cls: the class.
        title: the section's heading.
        intro: what the section is about (Markdown, one paragraph).
        readers: the services that read these variables.
    """

    cls: type[BaseModel]
    title: str
    intro: str
    readers: tuple[str, ...]


#: The page's sections, in order. Bases come first: a service's section then lists only
#: what the service adds to them.
SECTIONS: tuple[Section, ...] = (
    Section(
        CommonSettings,
        "Every service",
        "Read by every process: the internal token, logging, the event loop, where the "
        "gRPC services are, and TLS for them.",
        ("api_gateway", "job_service", "credential_service", "runtime_worker"),
    ),
    Section(
        ModelProvidersSettings,
        "Model providers",
        "The model providers, in order of preference. `MODEL_PROVIDERS` is a JSON list: "
        "see [Running the services](operations/running.md#model-providers).",
        ("job_service", "credential_service", "runtime_worker"),
    ),
    Section(
        EgressSettings,
        "Users' own base URLs",
        "Whether a learner's key may carry its own endpoint, and where such an endpoint "
        "may be: give credential_service and the workers the same values (reference "
        "§10.5, [the threat model](security/egress.md)).",
        ("credential_service", "runtime_worker"),
    ),
    Section(
        GatewaySettings,
        "api_gateway",
        "The public HTTP server: tokens, CORS, request limits, event streams.",
        ("api_gateway",),
    ),
    Section(
        JobServiceSettings,
        "job_service",
        "The job state machine: database, leases, retries, the breakers, budgets and "
        "quotas, the change feed, fair order and provider limits, batches, prompts.",
        ("job_service",),
    ),
    Section(
        CredentialSettings,
        "credential_service",
        "Users' model keys and the platform keys.",
        ("credential_service",),
    ),
    Section(
        WorkerSettings,
        "runtime_worker",
        "The worker: slots, claims, heartbeats, model calls, internal calls.",
        ("runtime_worker",),
    ),
)

_ATTR_ENTRY = re.compile(
    r"^(?P<names>[A-Z][A-Z0-9_]*(?:\s*,\s*[A-Z][A-Z0-9_]*)*)\s*:\s*(?P<text>.*)$"
)
_ROLE = re.compile(r":(?:mod|func|meth|data|class|attr|exc):`~?([^`]+)`")
_CITATION = re.compile(r"§(\d+(?:\.\d+)*)")
_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\s+.*?\{\s*#(?P<id>[^\s}]+)\s*\}\s*$")

#: The label of a validated string type, by the name of its validator.
_VALIDATED = {
    "_database_url": "database URL",
    "_listen_address": "`host:port`",
    "_http_base_url": "http(s) URL",
    "_cors_origins": "origin list",
}


@dataclass
class Described:
    """Where a class's descriptions come from, and what is wrong with them.

    Attributes:
        text: field name → its description (Markdown, one line).
        problems: one line per entry naming no field, or field with no description.
    """

    text: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def attributes_section(doc: str | None) -> dict[str, str]:
    """The ``Attributes:`` entries of a Google-style docstring.

    Returns:
        ``{name: text}``; an entry ``A, B: text`` gives both names the text;
        continuation lines are joined with single spaces.
    """
    if not doc:
        return {}
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "Attributes:")
    except StopIteration:
        return {}
    base = len(lines[start]) - len(lines[start].lstrip())
    entries: dict[str, str] = {}
    names: list[str] = []
    entry_indent = -1
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= base:
            break
        match = _ATTR_ENTRY.match(line.strip())
        if match and (entry_indent < 0 or indent == entry_indent):
            entry_indent = indent
            names = [n.strip() for n in match["names"].split(",")]
            for name in names:
                entries[name] = match["text"].strip()
        elif names:
            for name in names:
                entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


def comment_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments right above the fields of ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    out: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        i = node.lineno - 2  # the line above, 0-based
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if comment:
            out[node.target.id] = " ".join(comment)
    return out


def own_fields(cls: type) -> list[str]:
    """The fields ``cls`` declares itself, in source order."""
    return [n for n in inspect.get_annotations(cls) if n.isupper()]


def describe(cls: type[BaseModel]) -> Described:
    """Every field's description, looked up from ``cls`` up its bases.

    ``problems`` names each field with no description, and each ``Attributes:`` entry
    or ``#:`` comment (of ``cls`` or a base) that names no field of its class.
    """
    out = Described()
    chain = [
        c for c in cls.__mro__ if issubclass(c, BaseModel) and c.__module__.split(".")[0] in _OWN
    ]
    for klass in chain:
        names = set(klass.model_fields) if issubclass(klass, BaseModel) else set()
        for source, entries in (
            ("Attributes", attributes_section(klass.__doc__)),
            ("#:", comment_docs(klass)),
        ):
            for name, text in entries.items():
                if name not in names:
                    out.problems.append(
                        f"{klass.__module__}.{klass.__qualname__}: {source} entry {name} "
                        "names no setting"
                    )
                elif not text:
                    out.problems.append(f"{klass.__qualname__}: {name} has an empty description")
                else:
                    out.text.setdefault(name, text)
    for name in cls.model_fields:
        if name not in out.text:
            out.problems.append(
                f"{cls.__module__}.{cls.__qualname__}.{name} has no description: add it to "
                "the class's Attributes: section or as a #: comment above the field"
            )
    return out


_OWN = {"airuntime_common", "api_gateway", "job_service", "credential_service", "runtime_worker"}


def section_fields(section: Section) -> list[str]:
    """The fields a section lists: those its class declares, then the inherited ones its
    own docstring describes again (a service's own words about a shared variable)."""
    cls = section.cls
    names = own_fields(cls)
    redescribed = [
        n
        for n in {**attributes_section(cls.__doc__), **comment_docs(cls)}
        if n in cls.model_fields and n not in names
    ]
    return names + [n for n in cls.model_fields if n in redescribed]


def type_label(info: FieldInfo) -> str:
    """A reader's name of a field's type (``integer``, ``JSON object``, one of …)."""
    for meta in info.metadata:
        func = getattr(meta, "func", None)
        if func is not None and getattr(func, "__name__", "") in _VALIDATED:
            return _VALIDATED[func.__name__]
    return _annotation_label(info.annotation)


def _annotation_label(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation_label(typing.get_args(annotation)[0])
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(annotation) if a is not NoneType]
        if len(args) == 1:
            return _annotation_label(args[0])
        return " or ".join(_annotation_label(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is dict or annotation is dict:
        return "JSON object"
    if annotation is ModelProviders:
        return "JSON list"
    labels: dict[Any, str] = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        SecretStr: "secret string",
    }
    if annotation in labels:
        return labels[annotation]
    alias = getattr(annotation, "__value__", None)  # a ``type X = …`` alias
    if alias is not None:
        return _annotation_label(alias)
    return f"`{getattr(annotation, '__name__', annotation)}`"


def default_label(info: FieldInfo) -> str:
    """The default as a reader would set it; a computed one names its function."""
    factory: Callable[[], Any] | None = info.default_factory  # type: ignore[assignment]
    if factory is not None:
        name = getattr(factory, "__name__", "")
        if name in ("dict", "list"):
            value: Any = factory()
        elif name == "<lambda>":
            value = factory()
        else:
            first = (inspect.getdoc(factory) or "").split("\n\n")[0].replace("\n", " ")
            return _rst(first.split(":")[0]) + " (computed at start)"
    else:
        value = info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return f"`{json.dumps(value, separators=(',', ':'))}`" if value else "`{}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def bounds_label(info: FieldInfo) -> str:
    """``ge``/``gt``/``le``/``lt`` and length bounds of a field, e.g. ``> 0, ≤ 86400``."""
    parts: list[str] = []
    for meta in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None and not callable(value):
                parts.append(f"{sign} {_number(value)}")
        for attr, sign in (("min_length", "length ≥"), ("max_length", "length ≤")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def reference_anchors() -> dict[str, str]:
    """Section number → ``reference/<page>.md#<id>`` of the reference's numbered headings."""
    anchors: dict[str, str] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            match = _HEADING.match(line)
            if match:
                anchors[match[1]] = f"reference/{page.name}#{match['id']}"
    return anchors


def _rst(text: str) -> str:
    """Docstring markup as Markdown: ````x```` → ```x```, ``:mod:`x``` → ```x```."""
    text = _ROLE.sub(lambda m: f"`{m[1]}`", text)
    return text.replace("``", "`")


def markdown(text: str, anchors: dict[str, str]) -> str:
    """A description as one table cell: Markdown code, ``§N`` linked, ``|`` escaped."""
    text = _rst(text).replace("|", "\\|")

    def link(match: re.Match[str]) -> str:
        target = anchors.get(match[1])
        return f"[§{match[1]}]({target})" if target else match[0]

    return _CITATION.sub(link, text)


def rows(section: Section, described: Described, anchors: dict[str, str]) -> Iterator[str]:
    """The table rows of a section."""
    fields = section.cls.model_fields
    for name in section_fields(section):
        info = fields[name]
        desc = markdown(described.text.get(name, ""), anchors)
        cells = [f"`{name}`", type_label(info), default_label(info), bounds_label(info), desc]
        yield "| " + " | ".join(cells) + " |"


def render() -> tuple[str, list[str]]:
    """The page's text, and every problem found on the way."""
    anchors = reference_anchors()
    problems: list[str] = []
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/gen_config_docs.py from the settings classes: do not edit.",
        "     Run `make docs` (or `.venv/bin/python scripts/gen_config_docs.py`) to regenerate. -->",
        "",
        "Every service reads its settings from the environment, one pydantic-settings class",
        "per service. The names are the variables' names. Times are seconds unless the name",
        "ends in `_MS`.",
        "",
        "A value out of its bounds, or of the wrong type, stops the service at start. The",
        "message names the variable and the rule, never the value. A service missing a",
        "required secret refuses to start and names it.",
        "",
        "A few variables are read outside these classes; they are listed",
        "[at the end](#read-outside-the-settings-classes).",
        "",
    ]
    for section in SECTIONS:
        described = describe(section.cls)
        problems.extend(described.problems)
        readers = ", ".join(f"`{r}`" for r in section.readers)
        out += [
            f"## {section.title}",
            "",
            f"{section.intro} Class `{section.cls.__module__}.{section.cls.__qualname__}`; "
            f"read by {readers}.",
            "",
        ]
        bases = [s for s in SECTIONS if s.cls is not section.cls and issubclass(section.cls, s.cls)]
        if bases:
            links = " and ".join(f"[{b.title}](#{_slug(b.title)})" for b in bases)
            out += [f"It also reads the variables of {links}.", ""]
        out += [
            "| variable | type | default | bounds | description |",
            "|---|---|---|---|---|",
            *rows(section, described, anchors),
            "",
        ]
    out += OUTSIDE
    return "\n".join(out), sorted(set(problems))


#: The variables no settings class holds, and where each is described.
OUTSIDE: list[str] = [
    "## Read outside the settings classes",
    "",
    "| variable | read by | see |",
    "|---|---|---|",
    "| `GALERA_ALLOW_DIRECT_NODE` | job_service, credential_service (`airuntime_common/db.py`) "
    "| [Databases and failover](operations/databases.md#galera-behind-haproxy) |",
    "| `OTEL_*` | every service, through the OpenTelemetry SDK | [Tracing](operations/tracing.md) |",
    "| `SSL_CERT_FILE` | runtime_worker: the CA bundle of its model calls (else certifi's) "
    "| [The worker](worker.md) |",
    "| `AIRUNTIME_VAR_DIR`, `STANDIN_PORT`, `GRPC_ENABLE_FORK_SUPPORT` | the launcher "
    "| [Running the services](operations/running.md) |",
    "| `BENCH_*`, `TEST_MYSQL_URL`, `TEST_PG_URL` | the benchmarks and the tests "
    "| [Testing, faults, benchmarks](testing.md) |",
    "",
]


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", title.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    """Write the page (or with ``--check`` compare it); 1 on a problem or a stale page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args(argv)
    text, problems = render()
    for problem in problems:
        print(f"gen_config_docs: {problem}", file=sys.stderr)
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(
                f"gen_config_docs: {PAGE.relative_to(ROOT)} is stale: run `make docs` "
                "(or `.venv/bin/python scripts/gen_config_docs.py`) and commit it",
                file=sys.stderr,
            )
            return 1
        return 1 if problems else 0
    PAGE.write_text(text, encoding="utf-8")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
