"""What a prompt template may contain, checked on its parsed form before it is compiled
(reference §10.4).

A template defines the blocks ``system`` and ``user`` and nothing else at its top
level; inside them: text, ``{{ … }}`` and the statements ``if``, ``for`` (not
``recursive``), ``set`` (of an expression), ``with`` and comments. Refused, each
with the line it is on:

* ``include``, ``import``, ``from … import`` and ``extends`` (a template is
  self-contained);
* ``macro``, ``call``, ``filter`` blocks and ``{% set x %}…{% endset %}`` (no
  recursion; all output is counted as it streams);
* a name that is neither one of the template's variables
  (:data:`~airuntime_common.prompts.TEMPLATE_VARIABLES`), ``loop``, ``range``,
  nor set by the template itself (so no ``self``, ``config``, ``lipsum``,
  ``cycler``, ``joiner``, ``namespace``…);
* an attribute or item whose name starts with ``_``;
* a filter outside :data:`~airuntime_common.prompts.sandbox.ALLOWED_FILTERS`, a
  test outside :data:`~airuntime_common.prompts.sandbox.ALLOWED_TESTS`;
* a call of anything but a method named in
  :data:`~airuntime_common.prompts.sandbox.ALLOWED_METHODS`, ``range(…)`` and
  ``loop.cycle`` / ``loop.changed``.

The sandbox (:mod:`airuntime_common.prompts.sandbox`) enforces the same at render
time; these checks give the admin the line at upload.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from jinja2 import nodes

from airuntime_common.prompts.sandbox import (
    ALLOWED_FILTERS,
    ALLOWED_METHODS,
    ALLOWED_TESTS,
    LOOP_METHODS,
)

#: The blocks every prompt template defines, in the order of the messages.
REQUIRED_BLOCKS = ("system", "user")

_REFUSED: dict[type[nodes.Node], str] = {
    nodes.Include: "include is not available: a prompt template is self-contained",
    nodes.Import: "import is not available: a prompt template is self-contained",
    nodes.FromImport: "import is not available: a prompt template is self-contained",
    nodes.Extends: "extends is not available: a prompt template is self-contained",
    nodes.Macro: "macros are not available in a prompt template",
    nodes.CallBlock: "call blocks are not available in a prompt template",
    nodes.FilterBlock: "filter blocks are not available in a prompt template",
    nodes.AssignBlock: "{% set %} … {% endset %} is not available; set a value with {% set x = … %}",
}


@dataclass(frozen=True)
class TemplateProblem(Exception):
    """A rule of this module the template breaks.

    Attributes:
        line: the template line (1-based).
        message: what is wrong there.
    """

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def check_template(tree: nodes.Template, variables: Collection[str]) -> None:
    """Check a parsed template against the rules of this module.

    Args:
        tree: the template as :meth:`jinja2.Environment.parse` returns it.
        variables: the names the template is given when it renders.

    Raises:
        TemplateProblem: the first rule broken, with its line.
    """
    _check_top_level(tree)
    assigned = _assigned_names(tree)
    allowed_names = {*variables, *assigned, "loop", "range"}
    for node in tree.find_all(nodes.Node):
        _check_node(node, allowed_names)


def _check_top_level(tree: nodes.Template) -> None:
    seen: list[str] = []
    for node in tree.body:
        if isinstance(node, nodes.Block):
            if node.name not in REQUIRED_BLOCKS:
                raise TemplateProblem(
                    node.lineno, f"unknown block {node.name!r}: the blocks are system and user"
                )
            seen.append(node.name)
            continue
        if isinstance(node, nodes.Output) and all(
            isinstance(c, nodes.TemplateData) and not c.data.strip() for c in node.nodes
        ):
            continue
        raise TemplateProblem(
            _first_text_line(node),
            "only the blocks system and user may hold text and statements "
            "(anything outside them is never rendered)",
        )
    missing = [b for b in REQUIRED_BLOCKS if b not in seen]
    if missing:
        raise TemplateProblem(1, f"the template must define the block {missing[0]!r}")


def _first_text_line(node: nodes.Node) -> int:
    """The line of ``node``'s first character that is not white space (text nodes start
    where the previous tag ended)."""
    line = node.lineno or 1
    if isinstance(node, nodes.Output) and node.nodes:
        first = node.nodes[0]
        if isinstance(first, nodes.TemplateData):
            data = first.data
            line += data[: len(data) - len(data.lstrip())].count("\n")
    return line


def _assigned_names(tree: nodes.Template) -> set[str]:
    names: set[str] = set()
    for node in tree.find_all((nodes.Assign, nodes.For, nodes.With)):
        targets: list[nodes.Node] = []
        if isinstance(node, nodes.With):
            targets = list(node.targets)
        elif isinstance(node, nodes.Assign | nodes.For):
            targets = [node.target]
        for target in targets:
            names.update(n.name for n in _names_in(target))
    return names


def _names_in(target: nodes.Node) -> list[nodes.Name]:
    if isinstance(target, nodes.Name):
        return [target]
    return list(target.find_all(nodes.Name))


def _check_node(node: nodes.Node, allowed_names: set[str]) -> None:
    line = node.lineno or 1
    for kind, message in _REFUSED.items():
        if isinstance(node, kind):
            raise TemplateProblem(line, message)
    if isinstance(node, nodes.For) and node.recursive:
        raise TemplateProblem(line, "recursive loops are not available in a prompt template")
    if isinstance(node, nodes.Name) and node.ctx == "load" and node.name not in allowed_names:
        raise TemplateProblem(line, f"{node.name!r} is not defined in a prompt template")
    if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
        raise TemplateProblem(line, f"the attribute {node.attr!r} is not accessible")
    if isinstance(node, nodes.Getitem):
        key = node.arg
        if (
            isinstance(key, nodes.Const)
            and isinstance(key.value, str)
            and key.value.startswith("_")
        ):
            raise TemplateProblem(line, f"the item {key.value!r} is not accessible")
    if isinstance(node, nodes.Filter) and node.name not in ALLOWED_FILTERS:
        raise TemplateProblem(line, f"the filter {node.name!r} is not available")
    if isinstance(node, nodes.Test) and node.name not in ALLOWED_TESTS:
        raise TemplateProblem(line, f"the test {node.name!r} is not available")
    if isinstance(node, nodes.Call):
        _check_call(node, line)


def _check_call(node: nodes.Call, line: int) -> None:
    callee = node.node
    if node.dyn_args is not None or node.dyn_kwargs is not None:
        raise TemplateProblem(line, "*args and **kwargs are not available in a prompt template")
    if isinstance(callee, nodes.Name) and callee.name == "range":
        return
    if isinstance(callee, nodes.Getattr):
        if isinstance(callee.node, nodes.Name) and callee.node.name == "loop":
            if callee.attr in LOOP_METHODS:
                return
        elif callee.attr in ALLOWED_METHODS:
            return
        raise TemplateProblem(line, f"calling {callee.attr!r} is not available in a prompt")
    raise TemplateProblem(
        line, "only range(…), loop.cycle(…) and the methods of text may be called in a prompt"
    )
