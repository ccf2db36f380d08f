"""The prompt protocol of the stand-in's chat requests, and which answerer answers
each task.

A request's system message starts with ``TASK: <jobType>``; its user message holds
the snapshot JSON between ``<snapshot>``/``</snapshot>`` and the params JSON
between ``<params>``/``</params>``. :func:`parse_prompt` reads them (or raises
:class:`PromptError`, an HTTP 400 from the stand-in), :func:`build_answer` hands
the prompt to the answerer of its task (:data:`ANSWERERS`, filled by the package
and by :func:`register_answerer`). Choices are seeded from a hash of the prompt
(:func:`seeded_rng`): the same input always gives the same answer.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from model_standin.answers.analysis import (
    learning_state_analysis,
    next_action_planning,
    weak_point_analysis,
)
from model_standin.answers.flashcards import flashcard_generation
from model_standin.answers.quiz import quiz_generation
from model_standin.answers.snapshot import View

_TASK_RE = re.compile(r"^\s*TASK:\s*(\S+)\s*$")


class PromptError(ValueError):
    """The request does not follow the prompt protocol (→ HTTP 400 from the stand-in)."""


@dataclass(frozen=True)
class Prompt:
    """The parsed prompt protocol of one chat request.

    Attributes:
        task: the job type from the system message's first line.
        snapshot: the snapshot payload v1 (``payload`` unwrapped if present).
        params: the job params (empty dict when absent).
    """

    task: str
    snapshot: dict[str, Any]
    params: dict[str, Any]


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def find_task(messages: Any) -> str | None:
    """Return the ``TASK:`` of the first system message, or None.

    Args:
        messages: the request's ``messages`` list (any JSON).
    """
    if not isinstance(messages, list):
        return None
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system":
            text = content_text(m.get("content")).lstrip()
            first = text.splitlines()[0] if text else ""
            match = _TASK_RE.match(first)
            return match.group(1) if match else None
    return None


def _between(text: str, start: str, end: str) -> str | None:
    i = text.find(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    if j < 0:
        return None
    return text[i + len(start) : j]


def parse_prompt(messages: Any) -> Prompt:
    """Parse the prompt protocol of a chat request.

    Args:
        messages: the request's ``messages`` list.

    Returns:
        The task, snapshot payload and params.

    Raises:
        PromptError: no ``TASK:`` line, an unknown task, or a missing/invalid
            snapshot or params block.
    """
    task = find_task(messages)
    if task is None:
        raise PromptError("the system message must start with 'TASK: <jobType>'")
    if task not in ANSWERERS:
        raise PromptError(f"unknown task {task!r}")
    users = [
        content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user"
    ]
    text = "\n".join(users)
    raw_snapshot = _between(text, "<snapshot>", "</snapshot>")
    if raw_snapshot is None:
        raise PromptError("the user message has no <snapshot>...</snapshot> block")
    try:
        snapshot = json.loads(raw_snapshot)
    except ValueError as exc:
        raise PromptError(f"the snapshot is not valid JSON: {exc}") from None
    if isinstance(snapshot, dict) and isinstance(snapshot.get("payload"), dict):
        snapshot = snapshot["payload"]
    if not isinstance(snapshot, dict):
        raise PromptError("the snapshot must be a JSON object")
    raw_params = _between(text, "<params>", "</params>")
    params: Any = {}
    if raw_params is not None and raw_params.strip():
        try:
            params = json.loads(raw_params)
        except ValueError as exc:
            raise PromptError(f"the params are not valid JSON: {exc}") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise PromptError("the params must be a JSON object")
    return Prompt(task=task, snapshot=snapshot, params=params)


def seeded_rng(prompt: Prompt) -> random.Random:
    seed = hashlib.sha256(
        json.dumps(
            [prompt.task, prompt.snapshot, prompt.params], sort_keys=True, default=str
        ).encode()
    ).hexdigest()
    return random.Random(int(seed[:16], 16))


def build_answer(prompt: Prompt) -> dict[str, Any]:
    """Build the output object (reference §5 shape) for a parsed prompt.

    Args:
        prompt: the parsed request.

    Returns:
        The analysis object for ``learning_state_analysis``, otherwise
        ``{"items": [...]}``. Every cited id comes from the snapshot. The
        generation types return ``{"items": []}`` (schema-invalid, as a real
        model would fail) when the snapshot has no usable text.
    """
    return ANSWERERS[prompt.task](prompt)


#: How the stand-in answers each task (job type); :func:`register_answerer` adds one.
ANSWERERS: dict[str, Callable[[Prompt], dict[str, Any]]] = {
    "learning_state_analysis": lambda p: learning_state_analysis(View.of(p.snapshot)),
    "weak_point_analysis": lambda p: weak_point_analysis(View.of(p.snapshot)),
    "next_action_planning": lambda p: next_action_planning(View.of(p.snapshot)),
    "quiz_generation": lambda p: quiz_generation(View.of(p.snapshot), p.params, seeded_rng(p)),
    "flashcard_generation": lambda p: flashcard_generation(View.of(p.snapshot), p.params),
}


def register_answerer(task: str, answer: Callable[[Prompt], dict[str, Any]]) -> None:
    """Teach the stand-in a new task (a job type registered with
    :func:`airuntime_common.jobtypes.register`): ``answer(prompt)`` returns its output."""
    ANSWERERS[task] = answer
