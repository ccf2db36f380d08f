"""Rendering an attempt's prompt (reference §5, §10.4).

A job's ``promptVersion`` is ``"<jobType>.<version>"``, e.g. ``quiz_generation.v1``.
Version ``v1`` of each type is the shipped template
(:func:`airuntime_common.prompts.builtin_template`); any other version is one an
admin uploaded to job_service, fetched once by the worker
(:mod:`runtime_worker.prompt_cache`). Every template renders in the same sandbox
(:mod:`airuntime_common.prompts.sandbox`) with the variables ``job_type``,
``snapshot_json``, ``params_json`` and ``truncation_note``, into two blocks,
``system`` and ``user``. The shipped system messages start with the line
``TASK: <jobType>``, say "json" (DeepSeek's JSON mode requires it) and show an
example output; their user messages carry the snapshot JSON between
``<snapshot>``/``</snapshot>`` and the params JSON between ``<params>``/``</params>``
(the protocol the local stand-in parses).

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

from dataclasses import dataclass, field
from typing import Any

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.prompts import (
    BUILTIN_VERSION,
    PromptTemplate,
    builtin_template,
    dumps,
    full_version,
    prompt_context,
    render_messages,
)
from runtime_worker.snapshot import SnapshotPayload

DEFAULT_PROMPT_VERSION = BUILTIN_VERSION
MAX_SNAPSHOT_CHARS = jobtypes.MAX_SNAPSHOT_CHARS


#: Order in which snapshot lists are shortened (from their end).
TRUNCATION_ORDER = ("blocks", "reading", "knowledgePoints", "materials")


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
    return dumps(value)


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


def render_prompt(
    job_type: str,
    snapshot: SnapshotPayload,
    params: dict[str, Any],
    *,
    version: str = DEFAULT_PROMPT_VERSION,
    template: PromptTemplate | None = None,
    max_snapshot_chars: int = MAX_SNAPSHOT_CHARS,
) -> RenderedPrompt:
    """Render the system and user messages of one job.

    Args:
        job_type: a registered job type (its token cap comes from
            :mod:`airuntime_common.jobtypes`).
        snapshot: the validated snapshot payload.
        params: the job's params (already with server defaults), JSON data.
        version: the template version, default ``"v1"`` (the shipped template).
        template: the compiled template of ``version`` when it is not the shipped
            one (:class:`runtime_worker.prompt_cache.PromptCache` fetches it).
        max_snapshot_chars: truncation limit (see the module docstring).

    Returns:
        The rendered prompt with its ``promptVersion``.

    Raises:
        AppError: ``INVALID_SNAPSHOT`` (too large); ``INVALID_PROMPT_TEMPLATE`` (the
            template fails in the sandbox, or a version other than v1 without its
            template); INVALID_ARGUMENT (unknown job type).
    """
    if template is None:
        if version != BUILTIN_VERSION:
            raise AppError(
                ErrorCode.INVALID_PROMPT_TEMPLATE,
                f"no template given for {full_version(job_type, version)}",
                {"promptVersion": full_version(job_type, version)},
            )
        template = builtin_template(job_type)
    data, dropped = truncate_snapshot(snapshot.model_dump(mode="json"), max_snapshot_chars)
    note = ""
    if dropped:
        parts = ", ".join(f"{n} {key}" for key, n in dropped.items())
        note = f"Note: the snapshot was shortened to fit; left out from the end: {parts}."
    system, user = render_messages(template, prompt_context(job_type, data, params, note))
    if len(system) + len(user) > jobtypes.MAX_PROMPT_CHARS:  # the budget job_service reserves
        raise AppError(
            ErrorCode.INVALID_SNAPSHOT,
            "the prompt does not fit the model context",
            {"chars": len(system) + len(user), "limit": jobtypes.MAX_PROMPT_CHARS},
        )
    return RenderedPrompt(
        prompt_version=full_version(job_type, version),
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
