"""The sandbox prompt templates render in (reference §10.4).

:class:`PromptSandbox` is Jinja2's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment`
(no attribute starting with ``_``, no internal attribute of functions, frames or
code, no method that mutates a list, dict or set, no unsafe ``str.format``) with
a stricter policy on top:

* no loader: a template is one self-contained source (no include, import or
  extends can find anything);
* undefined variables are errors (:class:`~jinja2.StrictUndefined`);
* only ``range`` is global (no ``lipsum``, ``cycler``, ``joiner``, ``namespace``,
  ``dict``); only the filters of :data:`ALLOWED_FILTERS` exist; a call may reach
  only the methods of :data:`ALLOWED_METHODS` on strings, lists, tuples and dicts,
  ``range`` and ``loop.cycle`` / ``loop.changed``;
* bounded work: every value a template makes (a string, a list) holds at most
  :data:`MAX_VALUE_CHARS` characters / :data:`MAX_ITEMS` items, checked *before*
  it is made where the size is known in advance (``'a' * n``, ``replace``,
  ``center``, ``join`` …); all loops of one render together iterate at most
  :data:`MAX_ITERATIONS` times; one render takes at most :data:`MAX_RENDER_SECONDS`;
* the output is counted as it streams and rendering stops past
  :data:`MAX_OUTPUT_BYTES` (1 MiB, UTF-8).

The structural rules (what a template may contain at all) are checked on the
parsed template by :mod:`airuntime_common.prompts.checks` before it is
compiled; the guards here hold at render time whatever got through.
"""

from __future__ import annotations

import contextvars
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

#: The most one render may output, all blocks together (UTF-8 bytes).
MAX_OUTPUT_BYTES: Final = 1 << 20
#: The longest string a template may make (characters).
MAX_VALUE_CHARS: Final = 1 << 20
#: The most items a list, tuple or dict a template makes may hold.
MAX_ITEMS: Final = 100_000
#: The largest integer a template may make (bits).
MAX_INT_BITS: Final = 4096
#: All the loops of one render together (iterations).
MAX_ITERATIONS: Final = 200_000
#: The longest one render may run (seconds, wall clock).
MAX_RENDER_SECONDS: Final = 2.0

#: Filters a template may use (Jinja2's own, each behind :func:`_guarded`).
ALLOWED_FILTERS: Final = frozenset(
    {
        "abs", "capitalize", "center", "count", "d", "default", "first", "float",
        "indent", "int", "join", "last", "length", "list", "lower", "max", "min",
        "replace", "reverse", "round", "sort", "string", "sum", "title", "tojson",
        "trim", "truncate", "unique", "upper", "wordcount", "wordwrap",
    }
)  # fmt: skip
#: Tests a template may use (``is defined`` …).
ALLOWED_TESTS: Final = frozenset(
    {
        "!=", "<", "<=", "==", ">", ">=", "boolean", "defined", "divisibleby", "eq",
        "equalto", "even", "false", "float", "ge", "greaterthan", "gt", "in", "integer",
        "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number",
        "odd", "sameas", "sequence", "string", "true", "undefined", "upper",
    }
)  # fmt: skip
#: Methods of a string, list, tuple or dict a template may call.
ALLOWED_METHODS: Final = frozenset(
    {
        "capitalize", "casefold", "center", "count", "endswith", "find", "get", "index",
        "isalnum", "isalpha", "isdigit", "islower", "isspace", "istitle", "isupper",
        "items", "join", "keys", "ljust", "lower", "lstrip", "partition", "removeprefix",
        "removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
        "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper",
        "values", "zfill",
    }
)  # fmt: skip
#: Methods of ``loop`` a template may call.
LOOP_METHODS: Final = frozenset({"cycle", "changed"})
#: The sandbox's own helpers the compiled code calls (see :func:`guard_tree`).
_HELPERS: Final = frozenset({"bounded_iter", "bounded_concat"})
_CONTAINERS: Final = (str, list, tuple, dict)


class LimitExceeded(SecurityError):
    """A render went past one of the bounds of this module."""


@dataclass
class RenderBudget:
    """What one render may still use (see the module docstring).

    Attributes:
        deadline: ``time.monotonic()`` past which the render stops.
        iterations: loop iterations left.
        output_bytes: output bytes left.
    """

    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_RENDER_SECONDS)
    iterations: int = MAX_ITERATIONS
    output_bytes: int = MAX_OUTPUT_BYTES

    def tick(self) -> None:
        """One step of work: stop once the render ran out of time.

        Raises:
            LimitExceeded: past :data:`MAX_RENDER_SECONDS`.
        """
        if time.monotonic() > self.deadline:
            raise LimitExceeded(f"the template ran longer than {MAX_RENDER_SECONDS:g} s")

    def iterate(self) -> None:
        """One loop iteration.

        Raises:
            LimitExceeded: past :data:`MAX_ITERATIONS` or the time limit.
        """
        self.iterations -= 1
        if self.iterations < 0:
            raise LimitExceeded(f"the template's loops ran more than {MAX_ITERATIONS:,} times")
        if self.iterations % 256 == 0:
            self.tick()

    def fits(self, chunk: str) -> bool:
        """Count ``chunk`` of output; False once the output went past :data:`MAX_OUTPUT_BYTES`."""
        self.output_bytes -= (
            len(chunk) if chunk.isascii() else len(chunk.encode("utf-8", "replace"))
        )
        return self.output_bytes >= 0

    @staticmethod
    def over_message() -> str:
        """What :meth:`fits` refusing means."""
        return f"the rendered prompt is larger than {MAX_OUTPUT_BYTES:,} bytes"


#: The budget of the render running in this context (None: compiling, e.g. constant folding).
_BUDGET: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "prompt_render_budget", default=None
)


def current_budget() -> RenderBudget | None:
    """The budget of the render running now, or None."""
    return _BUDGET.get()


def use_budget(budget: RenderBudget) -> contextvars.Token[RenderBudget | None]:
    """Make ``budget`` the current render's; reset with :func:`release_budget`."""
    return _BUDGET.set(budget)


def release_budget(token: contextvars.Token[RenderBudget | None]) -> None:
    """Undo :func:`use_budget`."""
    _BUDGET.reset(token)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


def check_value(value: Any) -> Any:
    """``value`` if it is within the size bounds, else an error.

    Raises:
        LimitExceeded: a string over :data:`MAX_VALUE_CHARS`, a container over
            :data:`MAX_ITEMS`, an integer over :data:`MAX_INT_BITS`.
    """
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise LimitExceeded(f"a string would be longer than {MAX_VALUE_CHARS:,} characters")
    elif isinstance(value, list | tuple | dict | set | frozenset):
        if len(value) > MAX_ITEMS:
            raise LimitExceeded(f"a list would hold more than {MAX_ITEMS:,} items")
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise LimitExceeded(f"a number would be larger than {MAX_INT_BITS} bits")
    return value


def _want(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise LimitExceeded(f"{what} would be larger than {limit:,}")


def _check_int_args(args: Iterable[Any]) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_VALUE_CHARS:
            raise LimitExceeded(f"a number argument is larger than {MAX_VALUE_CHARS:,}")


def _replace_size(value: Any, old: Any, new: Any, count: Any = -1) -> int:
    """The length of ``value.replace(old, new, count)``, computed without making it."""
    if not isinstance(value, str):
        return 0
    s, o, n = value, str(old), str(new)
    hits = s.count(o)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(n) - len(o))


def _bounded_list(items: Any) -> list[Any]:
    """``items`` as a list, refused past :data:`MAX_ITEMS` (read at most one item more)."""
    out: list[Any] = []
    for item in items:
        out.append(item)
        _want(len(out), MAX_ITEMS, "a list")
    return out


def _join_size(sep: Any, parts: list[Any]) -> int:
    return sum(len(str(p)) for p in parts) + len(str(sep)) * max(0, len(parts) - 1)


def _pad_size(value: Any, width: Any = 80, *_: Any) -> int:
    return max(len(value) if isinstance(value, str) else 0, int(width))


def _indent_size(value: Any, width: Any = 4, *_: Any, **__: Any) -> int:
    text = str(value)
    pad = len(width) if isinstance(width, str) else int(width)
    return len(text) + (text.count("\n") + 1) * pad


#: Sizes known before a call: method or filter name → the result's length from its arguments.
_PRECHECK: Final[dict[str, Callable[..., int]]] = {
    "replace": _replace_size,
    "center": _pad_size,
    "ljust": _pad_size,
    "rjust": _pad_size,
    "zfill": _pad_size,
    "indent": _indent_size,
}


def _guarded(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Filter ``func`` behind the size checks (before, where the size is known; after, always)."""
    precheck = _PRECHECK.get(name)
    # a filter marked pass_context / pass_eval_context / pass_environment gets that first
    passes = getattr(func, "jinja_pass_arg", None) is not None

    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        head, values = (args[:1], list(args[1:])) if passes else ((), list(args))
        _check_int_args(values)
        _check_int_args(kwargs.values())
        if name == "join":
            if "attribute" in kwargs or len(values) > 2:
                raise SecurityError("join(attribute=…) is not available in a prompt")
            values[0] = _bounded_list(values[0])
            _want(_join_size(values[1] if len(values) > 1 else "", values[0]), MAX_VALUE_CHARS,
                  "a joined string")  # fmt: skip
        elif precheck is not None and values:
            _want(precheck(*values, **kwargs), MAX_VALUE_CHARS, f"the result of {name}")
        return check_value(func(*head, *values, **kwargs))

    if passes:
        guarded.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    guarded.__name__ = getattr(func, "__name__", name)
    return guarded


class PromptSandbox(ImmutableSandboxedEnvironment):
    """The environment every prompt template compiles and renders in.

    One instance per process is enough (:func:`sandbox`); it holds no state of a
    render (that is the current :class:`RenderBudget`).
    """

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(
            loader=None,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            trim_blocks=True,
            keep_trailing_newline=False,
            auto_reload=False,
            cache_size=0,
        )
        self.globals = {"range": self.bounded_range}
        self.filters = {n: _guarded(n, f) for n, f in self.filters.items() if n in ALLOWED_FILTERS}
        self.tests = {n: t for n, t in self.tests.items() if n in ALLOWED_TESTS}

    # ---- what compiled templates call

    def bounded_range(self, *args: int) -> range:
        """``range`` of the templates: Jinja2's sandboxed one (at most 100,000 items)."""
        _tick()
        _check_int_args(args)
        return safe_range(*args)

    def bounded_iter(self, iterable: Any) -> Iterator[Any]:
        """What a ``{% for %}`` iterates: ``iterable``, each item counted against the
        render's :data:`MAX_ITERATIONS`."""
        budget = _BUDGET.get()
        for item in iterable:
            if budget is not None:
                budget.iterate()
            yield item

    def bounded_concat(self, parts: list[Any]) -> str:
        """The ``~`` operator: the parts as text, joined, refused past :data:`MAX_VALUE_CHARS`."""
        _tick()
        out: list[str] = []
        size = 0
        for part in parts:
            text = str(part)
            size += len(text)
            _want(size, MAX_VALUE_CHARS, "a joined string")
            out.append(text)
        return "".join(out)

    # ---- the sandbox's hooks

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``%`` and ``+`` with their result's size checked before it is made.

        Raises:
            LimitExceeded: the result would be too large.
            SecurityError: ``%`` on a string (printf-style formatting is not available).
        """
        _tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _CONTAINERS) and isinstance(n, int):
                    limit = MAX_VALUE_CHARS if isinstance(seq, str) else MAX_ITEMS
                    _want(len(seq) * max(0, n), limit, "a repeated value")
            if isinstance(left, int) and isinstance(right, int):
                _want(left.bit_length() + right.bit_length(), MAX_INT_BITS, "a product (bits)")
            return check_value(left * right)
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                _want(abs(left).bit_length() * max(0, right), MAX_INT_BITS, "a power (bits)")
            return check_value(left**right)
        if operator == "%":
            if isinstance(left, str | bytes):
                raise SecurityError("formatting strings with % is not available; use ~")
            return check_value(left % right)
        if isinstance(left, _CONTAINERS) and isinstance(right, _CONTAINERS):
            limit = MAX_VALUE_CHARS if isinstance(left, str) else MAX_ITEMS
            _want(len(left) + len(right), limit, "a sum of two values")
        return check_value(left + right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Every call a template makes: only :data:`ALLOWED_METHODS` of strings, lists,
        tuples and dicts, ``range``, ``loop.cycle`` / ``loop.changed`` and the sandbox's
        own helpers, with their result's size checked.

        Raises:
            SecurityError: any other callable.
            LimitExceeded: the result would be too large.
        """
        _tick()
        name = _allowed_callable(self, obj)
        # the compiled code passes the block's and loop's variables along (_block_vars …)
        given = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        _check_int_args(args)
        _check_int_args(given.values())
        holder = getattr(obj, "__self__", None)
        if name == "join" and isinstance(holder, str) and args:
            parts = _bounded_list(args[0])
            _want(_join_size(holder, parts), MAX_VALUE_CHARS, "a joined string")
            args = (parts, *args[1:])
        elif name in _PRECHECK and isinstance(holder, str):
            _want(_PRECHECK[name](holder, *args, **given), MAX_VALUE_CHARS, f"{name}()")
        return check_value(super().call(context, obj, *args, **kwargs))


def _allowed_callable(env: PromptSandbox, obj: Any) -> str:
    """The name ``obj`` may be called by, or an error."""
    holder = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if holder is env and name in (*_HELPERS, "bounded_range"):
        return str(name)
    builtin = isinstance(obj, types.BuiltinMethodType) and isinstance(holder, _CONTAINERS)
    if builtin and name in ALLOWED_METHODS:
        return str(name)
    looping = isinstance(obj, types.MethodType) and isinstance(holder, LoopContext)
    if looping and name in LOOP_METHODS:
        return str(name)
    raise SecurityError(f"calling {name or type(obj).__name__!r} is not available in a prompt")


def guard_tree(tree: nodes.Template) -> nodes.Template:
    """Route every ``{% for %}`` and ``~`` of a parsed template through the sandbox's
    counted helpers (:meth:`PromptSandbox.bounded_iter`, :meth:`~PromptSandbox.bounded_concat`).

    Returns:
        ``tree``, changed in place.
    """
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Call(
            nodes.EnvironmentAttribute("bounded_iter"), [loop.iter], [], None, None,
            lineno=loop.lineno,
        )  # fmt: skip
    for concat in list(tree.find_all(nodes.Concat)):
        parts = nodes.List(list(concat.nodes), lineno=concat.lineno)
        concat.nodes = [
            nodes.Call(
                nodes.EnvironmentAttribute("bounded_concat"), [parts], [], None, None,
                lineno=concat.lineno,
            )
        ]  # fmt: skip
    return tree


_SANDBOX: PromptSandbox | None = None


def sandbox() -> PromptSandbox:
    """The process's one :class:`PromptSandbox`."""
    global _SANDBOX
    if _SANDBOX is None:
        _SANDBOX = PromptSandbox()
    return _SANDBOX
