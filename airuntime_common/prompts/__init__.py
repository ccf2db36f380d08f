"""Prompt templates: the shipped ones, and compiling and rendering any of them in the
sandbox (reference §10.4, §5).

A prompt template is Jinja2 source defining two blocks, ``system`` and ``user``,
given four variables (:data:`TEMPLATE_VARIABLES`): ``job_type``,
``snapshot_json`` (the snapshot, compact JSON, already shortened to fit),
``params_json`` (the job's params, JSON) and ``truncation_note`` (a sentence
saying what the shortening left out, or empty).

The shipped templates are version ``v1`` of each job type
(``templates/<jobType>.v1.j2``; a type registered with a ``prompt_dir`` has its
own there). They may ``{% include %}`` a shared part; :func:`builtin_source`
inlines it, so every template, shipped or uploaded, is one self-contained source
and compiles in the same sandbox (:mod:`.sandbox`, with the rules of
:mod:`.checks`). Both job_service (to validate an upload against
:func:`sample_context`) and the worker (to render an attempt's prompt) use
:func:`compile_prompt` and :func:`render_messages`.

Every problem is :class:`~airuntime_common.errors.AppError`
``INVALID_PROMPT_TEMPLATE`` whose message names the template line (``line N: …``).
"""

from __future__ import annotations

import functools
import json
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import jinja2
from jinja2 import TemplateSyntaxError

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.prompts.checks import REQUIRED_BLOCKS, TemplateProblem, check_template
from airuntime_common.prompts.sample import sample_snapshot
from airuntime_common.prompts.sandbox import (
    RenderBudget,
    guard_tree,
    release_budget,
    sandbox,
    use_budget,
)

#: Where the shipped templates are.
TEMPLATE_DIR: Final = Path(__file__).parent / "templates"
#: The version of the shipped templates (reference §10.4).
BUILTIN_VERSION: Final = "v1"
#: The variables a template is given.
TEMPLATE_VARIABLES: Final = ("job_type", "snapshot_json", "params_json", "truncation_note")
#: The longest template source accepted (characters).
MAX_TEMPLATE_CHARS: Final = 256 * 1024
#: A version name as the admin endpoints spell it (``v2``).
VERSION_PATTERN: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: The file name Jinja2 gives a template compiled from a string: a traceback frame
#: of it (once rewritten) is a template line.
_FILENAME: Final = "<template>"
_INCLUDE: Final = re.compile(r"""\{%-?\s*include\s+["']([A-Za-z0-9_.-]+)["']\s*-?%\}""")


@dataclass(frozen=True)
class PromptTemplate:
    """A compiled prompt template.

    Attributes:
        source: the self-contained Jinja2 source.
        template: its compiled form in the sandbox.
    """

    source: str
    template: jinja2.Template


def template_error(line: int, message: str) -> AppError:
    """``INVALID_PROMPT_TEMPLATE`` naming ``line`` (reference §10.4, §10.6)."""
    return AppError(ErrorCode.INVALID_PROMPT_TEMPLATE, f"line {line}: {message}", {"line": line})


def check_version_name(version: str, field: str = "version") -> str:
    """``version`` if it is a valid version name (1..64 of ``[A-Za-z0-9._-]``).

    Raises:
        AppError: INVALID_ARGUMENT.
    """
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise invalid_argument(
            "a prompt version is 1..64 characters of A-Z a-z 0-9 . _ -", field=field
        )
    return version


def full_version(job_type: str, version: str) -> str:
    """A job's ``promptVersion``: ``<jobType>.<version>`` (``quiz_generation.v2``)."""
    return f"{job_type}.{version}"


def bare_version(job_type: str, prompt_version: str | None) -> str:
    """The version part of a job's ``promptVersion`` (``v2``); ``v1`` when it has none.

    Raises:
        AppError: INVALID_PROMPT_TEMPLATE when it names another job type.
    """
    if not prompt_version:
        return BUILTIN_VERSION
    prefix = f"{job_type}."
    if not prompt_version.startswith(prefix) or len(prompt_version) == len(prefix):
        raise AppError(
            ErrorCode.INVALID_PROMPT_TEMPLATE,
            f"promptVersion {prompt_version!r} is not a version of {job_type}",
            {"promptVersion": prompt_version},
        )
    return prompt_version[len(prefix) :]


def compile_prompt(source: str) -> PromptTemplate:
    """Check and compile a template (the rules of :mod:`.checks`).

    Raises:
        AppError: INVALID_PROMPT_TEMPLATE naming the line (syntax, a refused construct,
            a source over :data:`MAX_TEMPLATE_CHARS`).
    """
    if len(source) > MAX_TEMPLATE_CHARS:
        raise template_error(1, f"the template is longer than {MAX_TEMPLATE_CHARS:,} characters")
    env = sandbox()
    try:
        tree = env.parse(source)
        check_template(tree, TEMPLATE_VARIABLES)
        compiled = env.from_string(guard_tree(tree))
    except TemplateSyntaxError as exc:
        raise template_error(exc.lineno or 1, exc.message or "syntax error") from None
    except TemplateProblem as exc:
        raise template_error(exc.line, exc.message) from None
    except Exception as exc:  # e.g. a constant folded at compile time past a limit
        raise template_error(getattr(exc, "lineno", None) or 1, _describe(exc)) from None
    return PromptTemplate(source, compiled)


def render_messages(prompt: PromptTemplate, context: dict[str, Any]) -> tuple[str, str]:
    """Render the ``system`` and ``user`` messages of ``prompt`` in the sandbox.

    The output is counted as it streams; rendering stops at once past the limit.

    Args:
        prompt: a compiled template.
        context: the values of :data:`TEMPLATE_VARIABLES` (strings).

    Returns:
        ``(system, user)``, each stripped of surrounding whitespace.

    Raises:
        AppError: INVALID_PROMPT_TEMPLATE naming the line (an undefined variable, a
            refused call or attribute, a limit of :mod:`.sandbox` passed).
    """
    template = prompt.template
    budget = RenderBudget()
    token = use_budget(budget)
    out: list[str] = []
    try:
        for name in REQUIRED_BLOCKS:
            parts: list[str] = []
            block = cast(
                types.GeneratorType,  # type: ignore[type-arg]
                template.blocks[name](template.new_context(dict(context))),
            )
            for chunk in block:
                if not budget.fits(chunk):  # stop at once, on the line that went past
                    frame = block.gi_frame
                    line = template.get_corresponding_lineno(frame.f_lineno) if frame else 1
                    block.close()
                    raise template_error(line, budget.over_message())
                parts.append(chunk)
            out.append("".join(parts).strip())
    except AppError:
        raise
    except Exception as exc:
        line = None
        try:  # Jinja2 rewrites the traceback onto the template's lines
            template.environment.handle_exception(prompt.source)
        except Exception as rewritten:
            line = _template_line(rewritten)
        raise template_error(line or 1, _describe(exc)) from None
    finally:
        release_budget(token)
    return out[0], out[1]


def _template_line(exc: BaseException) -> int | None:
    """The template line of the innermost frame of the template in ``exc``'s traceback."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _describe(exc: BaseException) -> str:
    """A one-line description of a render error; never more than 300 characters."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    text = " ".join(text.split())
    return text[:300]


# ------------------------------------------------------------------ the shipped templates


def _template_dirs(job_type: str) -> list[Path]:
    spec = jobtypes.find(job_type)
    dirs = [Path(spec.prompt_dir)] if spec is not None and spec.prompt_dir else []
    return [*dirs, TEMPLATE_DIR]


def _read(dirs: list[Path], name: str) -> str:
    for folder in dirs:
        path = folder / name
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            return text[:-1] if text.endswith("\n") else text  # as Jinja2 loads a file
    raise FileNotFoundError(name)


def builtin_source(job_type: str) -> str:
    """The shipped (``v1``) template of ``job_type``, its includes inlined.

    Raises:
        AppError: INVALID_ARGUMENT for an unknown job type; NOT_FOUND when the type
            ships no template.
    """
    spec = jobtypes.get(job_type)
    dirs = _template_dirs(job_type)
    try:
        source = _read(dirs, f"{spec.prompt}.{BUILTIN_VERSION}.j2")
        for _ in range(4):  # includes of includes, a few levels deep
            if not _INCLUDE.search(source):
                break
            source = _INCLUDE.sub(lambda m: _read(dirs, m.group(1)), source)
    except FileNotFoundError as exc:
        raise AppError(
            ErrorCode.NOT_FOUND,
            f"no shipped prompt template for {job_type}",
            {"jobType": job_type, "file": str(exc)},
        ) from None
    return source


@functools.lru_cache(maxsize=64)
def _builtin(job_type: str, prompt_dir: str | None) -> PromptTemplate:
    return compile_prompt(builtin_source(job_type))


def builtin_template(job_type: str) -> PromptTemplate:
    """The shipped template of ``job_type``, compiled once per process."""
    spec = jobtypes.get(job_type)
    return _builtin(job_type, spec.prompt_dir)


# ------------------------------------------------------------------ contexts


def dumps(value: Any) -> str:
    """Compact JSON as the prompts carry it (UTF-8 text, key order kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def prompt_context(
    job_type: str, snapshot: dict[str, Any], params: dict[str, Any], truncation_note: str = ""
) -> dict[str, Any]:
    """The variables of a template (:data:`TEMPLATE_VARIABLES`) for one job."""
    return {
        "job_type": job_type,
        "snapshot_json": dumps(snapshot),
        "params_json": dumps(params),
        "truncation_note": truncation_note,
    }


def sample_context(job_type: str) -> dict[str, Any]:
    """The variables of a template for the sample snapshot of ``job_type`` (an upload
    renders against it) with the type's default params."""
    spec = jobtypes.get(job_type)
    params = spec.params().model_dump(mode="json")
    return prompt_context(job_type, sample_snapshot(job_type, params), params)


def validate_upload(job_type: str, source: str) -> PromptTemplate:
    """Compile ``source`` and render it against the sample snapshot of ``job_type``
    (reference §10.4): what an admin uploads must render, within the limits, and ask
    the model for json (its JSON output mode refuses a prompt without the word).

    Raises:
        AppError: INVALID_PROMPT_TEMPLATE naming the line.
    """
    prompt = compile_prompt(source)
    system, user = render_messages(prompt, sample_context(job_type))
    if "json" not in (system + user).lower():
        raise template_error(
            1, "the rendered messages never say json (the model's JSON output mode needs it)"
        )
    return prompt
