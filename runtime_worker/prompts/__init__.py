"""Versioned prompt templates, one Jinja2 file per job type and version (SPEC §5).

``<jobType>.<version>.j2`` defines two blocks, ``system`` and ``user``;
``promptVersion`` is ``"<jobType>.<version>"``, e.g. ``quiz_generation.v1``.
Every system message starts with the line ``TASK: <jobType>``, says "json"
(DeepSeek's JSON mode requires it) and shows an example output; every user
message carries the snapshot JSON between ``<snapshot>``/``</snapshot>`` and the
params JSON between ``<params>``/``</params>`` (the protocol the local
stand-in parses).

Truncation rule (keeps the prompt inside deepseek-chat's 64K-token context
with room for the answer): the snapshot JSON (compact, UTF-8 characters) may
be at most :data:`MAX_SNAPSHOT_CHARS` = 48,000 characters (≈ 30K tokens even
for CJK text). While it is longer, items are dropped from the END of
``blocks`` first, then of ``reading``, then of ``knowledgePoints``, then of
``materials``; the user message then says how many were left out. A snapshot
still too long after that (huge ``stats`` or ``params``) fails the attempt
with ``INVALID_SNAPSHOT``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from runtime_worker.snapshot import SnapshotPayload

PROMPT_DIR = Path(__file__).parent
DEFAULT_PROMPT_VERSION = "v1"
MAX_SNAPSHOT_CHARS = jobtypes.MAX_SNAPSHOT_CHARS


#: Order in which snapshot lists are shortened (from their end).
TRUNCATION_ORDER = ("blocks", "reading", "knowledgePoints", "materials")


def _environment(*dirs: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(dirs)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        trim_blocks=True,
        # the templates ship with the code and never change under a running worker:
        # no stat() of every template file on every render
        auto_reload=False,
    )


_env = _environment(str(PROMPT_DIR))


@functools.cache
def _env_with(prompt_dir: str) -> jinja2.Environment:
    """Templates of ``prompt_dir`` first, then the worker's own (a job type's
    :attr:`~airuntime_common.jobtypes.JobTypeSpec.prompt_dir`)."""
    return _environment(prompt_dir, str(PROMPT_DIR))


@dataclass(frozen=True)
class RenderedPrompt:
    """The messages of one attempt.

    Attributes:
        prompt_version: e.g. ``"quiz_generation.v1"``.
        messages: ``[{"role": "system", ...}, {"role": "user", ...}]``.
        max_tokens: output cap for this job type.
        dropped: how many items each list lost to truncation, e.g. ``{"blocks": 3}``.
    """

    prompt_version: str
    messages: list[dict[str, str]]
    max_tokens: int
    dropped: dict[str, int] = field(default_factory=dict)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def truncate_snapshot(
    data: dict[str, Any], max_chars: int = MAX_SNAPSHOT_CHARS
) -> tuple[dict[str, Any], dict[str, int]]:
    """Apply the truncation rule of this module to a snapshot dict.

    Args:
        data: the snapshot payload as plain JSON data (not modified).
        max_chars: limit on the compact JSON length (characters).

    Returns:
        ``(snapshot, dropped)``: the possibly shortened copy and the counts dropped.

    Raises:
        AppError: ``INVALID_SNAPSHOT`` when even the emptied lists do not fit.
    """
    out = dict(data)
    dropped: dict[str, int] = {}
    total = len(_dumps(out))
    for key in TRUNCATION_ORDER:
        if total <= max_chars:
            break
        items = list(out.get(key) or [])
        while items and total > max_chars:
            item = items.pop()
            # the item plus its separating comma (none when it was the only item)
            total -= len(_dumps(item)) + (1 if items else 0)
            dropped[key] = dropped.get(key, 0) + 1
        out[key] = items
        total = len(_dumps(out))
    if total > max_chars:
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            f"snapshot does not fit the model context ({total} > {max_chars} characters)",
            {"chars": total, "limit": max_chars},
        )
    return out, dropped


def template_for(job_type: str, version: str = DEFAULT_PROMPT_VERSION) -> jinja2.Template:
    """The template of ``<job_type>.<version>``.

    Raises:
        AppError: ``INVALID_ARGUMENT`` when no such template exists.
    """
    spec = jobtypes.find(job_type)
    stem = spec.prompt if spec is not None else job_type
    try:
        env = _env_with(spec.prompt_dir) if spec is not None and spec.prompt_dir else _env
        return env.get_template(f"{stem}.{version}.j2")
    except jinja2.TemplateNotFound:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"no prompt template {job_type}.{version}",
            {"promptVersion": f"{job_type}.{version}"},
        ) from None


def _block(template: jinja2.Template, name: str, ctx: dict[str, Any]) -> str:
    return "".join(template.blocks[name](template.new_context(ctx))).strip()


def render_prompt(
    job_type: str,
    snapshot: SnapshotPayload,
    params: dict[str, Any],
    *,
    version: str = DEFAULT_PROMPT_VERSION,
    max_snapshot_chars: int = MAX_SNAPSHOT_CHARS,
) -> RenderedPrompt:
    """Render the system and user messages of one job.

    Args:
        job_type: a registered job type (its template and token cap come from
            :mod:`airuntime_common.jobtypes`).
        snapshot: the validated snapshot payload.
        params: the job's params (already with server defaults), JSON data.
        version: template version, default ``"v1"``.
        max_snapshot_chars: truncation limit (see the module docstring).

    Returns:
        The rendered prompt with its ``promptVersion``.

    Raises:
        AppError: ``INVALID_SNAPSHOT`` (too large), ``INVALID_ARGUMENT`` (no template).
    """
    template = template_for(job_type, version)
    data, dropped = truncate_snapshot(snapshot.model_dump(mode="json"), max_snapshot_chars)
    note = ""
    if dropped:
        parts = ", ".join(f"{n} {key}" for key, n in dropped.items())
        note = f"Note: the snapshot was shortened to fit; left out from the end: {parts}."
    ctx = {
        "job_type": job_type,
        "snapshot_json": _dumps(data),
        "params_json": _dumps(params),
        "truncation_note": note,
    }
    system = _block(template, "system", ctx)
    user = _block(template, "user", ctx)
    if len(system) + len(user) > jobtypes.MAX_PROMPT_CHARS:  # the budget job_service reserves
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            "the prompt does not fit the model context",
            {"chars": len(system) + len(user), "limit": jobtypes.MAX_PROMPT_CHARS},
        )
    return RenderedPrompt(
        prompt_version=f"{job_type}.{version}",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=jobtypes.get(job_type).max_tokens,
        dropped=dropped,
    )


def reask_messages(prompt: RenderedPrompt, problem: str) -> list[dict[str, str]]:
    """Messages of the one in-attempt re-ask.

    The model's previous answer is NEVER included (it may be truncated or
    empty, case D2); only a description of what was wrong is appended.

    Args:
        prompt: the attempt's original prompt.
        problem: what was wrong, e.g. ``"it was empty"``; must not contain model text.

    Returns:
        The original messages plus one user message asking again.
    """
    return [
        *prompt.messages,
        {
            "role": "user",
            "content": (
                f"Your previous reply could not be used: {problem}. Reply again with one "
                "complete json object that follows the rules and the example output of the "
                "system message exactly. Keep every text short so the whole reply fits."
            ),
        },
    ]
