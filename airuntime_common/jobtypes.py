"""The job-type registry: everything the system knows about each job type (reference §2.1).

Every service reads job types from here: the gateway's request schemas, the
proto mapping of ``JobType`` (:data:`airuntime_common.enums.JOB_TYPE`),
job_service's params check, snapshot budgets, business tables and generation
plans, and the worker's prompts, token caps and output validation. Adding a
job type is one :class:`JobTypeSpec` in :data:`BUILTIN`, its output model
(:mod:`airuntime_common.outputs`), its result table (a model in
``job_service/learning/tables.py`` and a migration) and its prompt template
(``airuntime_common/prompts/templates/<name>.v1.j2``); docs/job-types.md
walks through it.

On the wire a job type is a ``zhixi.airuntime.common.v1.JobType`` number
(:attr:`JobTypeSpec.wire`). Proto3 enums are open, so a registered type whose
number the ``.proto`` does not list yet still travels; listing it there only
gives it a name in reflection (grpcurl).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pydantic import BaseModel

from airuntime_common import outputs
from airuntime_common.errors import invalid_argument
from airuntime_common.params import FlashcardParams, NoParams, QuizParams


@dataclass(frozen=True)
class SnapshotBudget:
    """How much material text a job's snapshot may carry (reference §5 snapshots).

    Attributes:
        chars: block text, in characters.
        blocks: blocks at most.
    """

    chars: int
    blocks: int


#: The most characters of a prompt's snapshot JSON: the worker drops from its end past
#: it (``runtime_worker.prompts``).
MAX_SNAPSHOT_CHARS: Final = 48_000
#: The most characters of a whole prompt (the snapshot and the template's own text; the
#: worker refuses to send a longer one). A token is at least one character, so this
#: bounds a prompt's tokens too.
MAX_PROMPT_CHARS: Final = 56_000

#: The three analysis types: a bounded sample of the material.
ANALYSIS_SNAPSHOT: Final = SnapshotBudget(chars=8_000, blocks=40)
#: Quiz and flashcard generation: as much of the material as a prompt holds.
GENERATION_SNAPSHOT: Final = SnapshotBudget(chars=24_000, blocks=200)


@dataclass(frozen=True)
class JobTypeSpec:
    """One job type.

    Attributes:
        name: the ``jobType`` string (reference §2.1), e.g. ``"quiz_generation"``.
        wire: its ``JobType`` enum number in the protos (unique, ≥ 1).
        params: the create params model (:class:`NoParams` when it takes none);
            ``normalize_params`` validates with it and stores its dump.
        outputs: ``outputSchemaVersion`` → the output model of a result.
        itemized: the output is ``{"items": [...]}`` (one business row per item)
            rather than one object (one row).
        result_kind: its kind in ``GET /v1/ai/results/{kind}`` / ``ListResultItems``.
        result_table: the business table its items are written to.
        item_id_key: the JSON key of a stored item's id, e.g. ``"questionId"``.
        max_tokens: the model's output token cap for one call.
        snapshot: the snapshot's text budget.
        plan_table: the generation-plan table, when a job of this type has a plan
            (requested count, then generated / written / skipped counts).
        prompt: the prompt template's stem (``<prompt>.<version>.j2``).
        prompt_dir: a directory searched for that template (and what it includes)
            before ``airuntime_common/prompts/templates/`` (a type shipped outside
            the code base).
    """

    name: str
    wire: int
    params: type[BaseModel]
    outputs: Mapping[str, type[BaseModel]]
    itemized: bool
    result_kind: str
    result_table: str
    item_id_key: str
    max_tokens: int
    snapshot: SnapshotBudget = ANALYSIS_SNAPSHOT
    plan_table: str | None = None
    prompt: str = field(default="")
    prompt_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt:
            object.__setattr__(self, "prompt", self.name)

    @property
    def token_estimate(self) -> int:
        """The tokens one attempt of this type may take (reference §10.2): its input
        budget (:data:`MAX_PROMPT_CHARS`, the prompt's bound the worker enforces) plus
        its output budget (``max_tokens``). Reserved against a provider's
        ``tokensPerMinute`` when the lease is granted, settled with the tokens the
        attempt's model calls used when it ends."""
        return MAX_PROMPT_CHARS + self.max_tokens


#: The five job types of reference §2.1, in proto order.
BUILTIN: Final = (
    JobTypeSpec(
        name="learning_state_analysis",
        wire=1,
        params=NoParams,
        outputs={"v1": outputs.AiLearningAnalysis},
        itemized=False,
        result_kind="analyses",
        result_table="ai_learning_analyses",
        item_id_key="analysisId",
        max_tokens=2048,
    ),
    JobTypeSpec(
        name="weak_point_analysis",
        wire=2,
        params=NoParams,
        outputs={"v1": outputs.WeakPointList},
        itemized=True,
        result_kind="weak_points",
        result_table="ai_weak_point_candidates",
        item_id_key="weakPointId",
        max_tokens=2048,
    ),
    JobTypeSpec(
        name="next_action_planning",
        wire=3,
        params=NoParams,
        outputs={"v1": outputs.NextActionList},
        itemized=True,
        result_kind="recommendations",
        result_table="ai_next_action_recommendations",
        item_id_key="recommendationId",
        max_tokens=2048,
    ),
    JobTypeSpec(
        name="quiz_generation",
        wire=4,
        params=QuizParams,
        outputs={"v1": outputs.QuizQuestionList},
        itemized=True,
        result_kind="questions",
        result_table="ai_quiz_questions",
        item_id_key="questionId",
        max_tokens=6144,
        snapshot=GENERATION_SNAPSHOT,
        plan_table="ai_question_generation_plans",
    ),
    JobTypeSpec(
        name="flashcard_generation",
        wire=5,
        params=FlashcardParams,
        outputs={"v1": outputs.FlashcardList},
        itemized=True,
        result_kind="flashcards",
        result_table="ai_flashcards",
        item_id_key="flashcardId",
        max_tokens=6144,
        snapshot=GENERATION_SNAPSHOT,
        plan_table="ai_flashcard_generation_plans",
    ),
)

_BY_NAME: dict[str, JobTypeSpec] = {}
_BY_WIRE: dict[int, JobTypeSpec] = {}


def register(spec: JobTypeSpec) -> JobTypeSpec:
    """Add a job type; every service reads it from then on. Returns ``spec``.

    Register before a process starts serving (its request schemas and
    capabilities are read at start-up).

    Raises:
        ValueError: the name or wire number is taken, or the wire number is < 1.
    """
    if spec.wire < 1:
        raise ValueError(f"job type {spec.name!r}: wire number must be ≥ 1")
    if spec.name in _BY_NAME:
        raise ValueError(f"job type {spec.name!r} is already registered")
    if spec.wire in _BY_WIRE:
        raise ValueError(f"job type wire number {spec.wire} is taken by {_BY_WIRE[spec.wire].name}")
    _BY_NAME[spec.name] = spec
    _BY_WIRE[spec.wire] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered job type (for tests that register a throwaway one)."""
    spec = _BY_NAME.pop(name, None)
    if spec is not None:
        _BY_WIRE.pop(spec.wire, None)


def names() -> tuple[str, ...]:
    """Every registered job type's name, in wire order."""
    return tuple(s.name for s in sorted(_BY_NAME.values(), key=lambda s: s.wire))


def specs() -> tuple[JobTypeSpec, ...]:
    """Every registered job type, in wire order."""
    return tuple(sorted(_BY_NAME.values(), key=lambda s: s.wire))


def find(name: str) -> JobTypeSpec | None:
    """The spec named ``name``, or None."""
    return _BY_NAME.get(name)


def get(name: str, field_name: str = "jobType") -> JobTypeSpec:
    """The spec named ``name``.

    Raises:
        AppError: ``INVALID_ARGUMENT`` naming ``field_name`` for an unknown type
            (enums of requests are closed, reference §4).
    """
    spec = _BY_NAME.get(name)
    if spec is None:
        raise invalid_argument(
            f"{field_name} must be one of {', '.join(names())}", field=field_name, value=name
        )
    return spec


def by_wire(number: int) -> JobTypeSpec | None:
    """The spec with ``JobType`` number ``number``, or None (0 = unspecified)."""
    return _BY_WIRE.get(number)


def by_kind(kind: str) -> JobTypeSpec | None:
    """The spec whose items are of result kind ``kind``, or None."""
    return next((s for s in _BY_NAME.values() if s.result_kind == kind), None)


for _spec in BUILTIN:
    register(_spec)
