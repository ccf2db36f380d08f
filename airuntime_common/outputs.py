"""Versioned output models of the five job types (reference §5), shared by the
worker (validation before submit) and job_service (validation before any
business row is written).

``output`` of a result, v1: for ``learning_state_analysis`` the
:class:`AiLearningAnalysis` object itself; for the four list types
``{"items": [...]}``. Unknown keys are refused (``extra="forbid"``) so a
model cannot smuggle fields into business rows.

Validation is strict (reference §9.4): nothing is coerced. A string is never a
number (``"0.5"``) nor an integer (``"3"``), a number never a boolean or a
string. The one allowance is JSON's own: an integer may come as an integral
number (``3.0``), as every number does once it crossed a ``google.protobuf.Struct``
(the gRPC result path); it is kept as the integer ``3``.

A quiz question's ``answer`` fits its ``questionType`` and ``options``
(:class:`QuizQuestion`):

============================  =================================  ==========================
questionType                  options                            answer
============================  =================================  ==========================
``single_choice``             2..10 distinct texts               one of the options (a string)
``multiple_choice``           2..10 distinct texts               a non-empty list of distinct
                                                                 options (a JSON array)
``true_false``                exactly ``["true", "false"]``      ``"true"`` or ``"false"``
``short_answer``              ``[]``                             a non-empty string
============================  =================================  ==========================

Options and answers are compared exactly, as the learner's app shows them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from airuntime_common.errors import AppError, ErrorCode


def _integral_number(value: Any) -> Any:
    """``3.0`` → ``3`` (JSON does not tell the two apart, nor does a Struct); any
    other value is left to the strict ``int`` check, which refuses it."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


Text = Annotated[str, Field(min_length=1, max_length=4000)]
ShortText = Annotated[str, Field(min_length=1, max_length=400)]
Id = Annotated[str, Field(min_length=1, max_length=64)]
#: A number in 0..1: a JSON number (an int or a float), never a string or a boolean.
Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
#: A JSON integer: an int, or a float with no fraction (kept as the int).
JsonInt = Annotated[int, BeforeValidator(_integral_number)]

#: The options of every ``true_false`` question, in this order (reference §9.4).
TRUE_FALSE_OPTIONS = ("true", "false")
#: The most options of a choice question, and the fewest.
MAX_OPTIONS = 10
MIN_CHOICE_OPTIONS = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Evidence(_Model):
    """One piece of evidence: a block or a knowledge point, and a note."""

    blockId: Id | None = None
    knowledgePointId: Id | None = None
    note: Text

    @model_validator(mode="after")
    def _one_ref(self) -> Evidence:
        if not self.blockId and not self.knowledgePointId:
            raise ValueError("evidence needs blockId or knowledgePointId")
        return self


class AiLearningAnalysis(_Model):
    """``learning_state_analysis`` output v1."""

    summary: Text
    masteryLevel: Unit
    strengths: list[ShortText] = Field(max_length=20)
    risks: list[ShortText] = Field(max_length=20)
    evidence: list[Evidence] = Field(max_length=50)


class WeakPointCandidate(_Model):
    """One ``weak_point_analysis`` item v1."""

    knowledgePointId: Id
    reason: Text
    severity: Unit
    evidenceBlockIds: list[Id] = Field(max_length=50)


class NextActionRecommendation(_Model):
    """One ``next_action_planning`` item v1."""

    actionType: Literal["read", "review", "practice"]
    targetType: Literal["user", "material", "knowledge_point"]
    targetId: Id
    reason: Text
    priority: JsonInt = Field(ge=0, le=1000)


class QuizQuestion(_Model):
    """One ``quiz_generation`` item v1; ``answer`` fits ``questionType`` and ``options``
    as the module's table says (reference §9.4)."""

    questionType: Literal["single_choice", "multiple_choice", "true_false", "short_answer"]
    stem: Text
    options: list[ShortText] = Field(max_length=MAX_OPTIONS)
    answer: ShortText | list[ShortText]
    explanation: Text
    difficulty: Literal["easy", "medium", "hard"]
    knowledgePointId: Id | None = None
    sourceBlockIds: list[Id] = Field(min_length=1, max_length=20)

    @model_validator(mode="after")
    def _answer_fits(self) -> QuizQuestion:
        kind, options, answer = self.questionType, self.options, self.answer
        if kind == "true_false":
            if tuple(options) != TRUE_FALSE_OPTIONS:
                raise ValueError('a true_false question\'s options must be ["true", "false"]')
            if answer not in TRUE_FALSE_OPTIONS:
                raise ValueError('a true_false answer must be "true" or "false"')
            return self
        if kind == "short_answer":
            if options:
                raise ValueError("a short_answer question has no options ([])")
            if not isinstance(answer, str):
                raise ValueError("a short_answer answer must be a string")
            return self
        if len(options) < MIN_CHOICE_OPTIONS:
            raise ValueError(f"a {kind} question needs at least {MIN_CHOICE_OPTIONS} options")
        if len(set(options)) != len(options):
            raise ValueError(f"a {kind} question's options must be distinct")
        if kind == "single_choice":
            if not isinstance(answer, str) or answer not in options:
                raise ValueError("a single_choice answer must be exactly one of its options")
            return self
        # multiple_choice
        if not isinstance(answer, list) or not answer:
            raise ValueError("a multiple_choice answer must be a non-empty list of its options")
        if len(set(answer)) != len(answer) or not set(answer) <= set(options):
            raise ValueError(
                "a multiple_choice answer must list distinct options, each exactly one of them"
            )
        return self


class Flashcard(_Model):
    """One ``flashcard_generation`` item v1."""

    front: Text
    back: Text
    knowledgePointId: Id | None = None
    sourceBlockIds: list[Id] = Field(min_length=1, max_length=20)


class WeakPointList(_Model):
    """``weak_point_analysis`` output v1."""

    items: list[WeakPointCandidate] = Field(max_length=50)


class NextActionList(_Model):
    """``next_action_planning`` output v1."""

    items: list[NextActionRecommendation] = Field(max_length=50)


class QuizQuestionList(_Model):
    """``quiz_generation`` output v1."""

    items: list[QuizQuestion] = Field(min_length=1, max_length=20)


class FlashcardList(_Model):
    """``flashcard_generation`` output v1."""

    items: list[Flashcard] = Field(min_length=1, max_length=50)


CURRENT_OUTPUT_SCHEMA_VERSION = "v1"


def validate_output(job_type: str, schema_version: str, output: Any) -> BaseModel:
    """Validate a result's ``output`` against its job type's schema.

    The models come from the job-type registry
    (:attr:`airuntime_common.jobtypes.JobTypeSpec.outputs`).

    Args:
        job_type: a registered job type.
        schema_version: ``outputSchemaVersion`` of the result, e.g. ``"v1"``.
        output: the parsed JSON output.

    Returns:
        The validated model.

    Raises:
        AppError: ``INVALID_SCHEMA`` with the first errors in ``details`` when the
        version is unknown or the output does not match.
    """
    from airuntime_common import jobtypes  # the registry imports these models

    spec = jobtypes.find(job_type)
    model = spec.outputs.get(schema_version) if spec is not None else None
    if model is None:
        raise AppError(
            ErrorCode.INVALID_SCHEMA,
            f"unknown outputSchemaVersion {schema_version!r} for {job_type}",
            {"outputSchemaVersion": schema_version},
        )
    try:
        return model.model_validate(output)
    except ValidationError as exc:
        errors = [
            {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]} for e in exc.errors()[:10]
        ]
        raise AppError(
            ErrorCode.INVALID_SCHEMA,
            f"output does not match {job_type} {schema_version}: {errors[0]['loc']}: {errors[0]['msg']}",
            {"errors": errors},
        ) from None
