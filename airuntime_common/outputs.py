"""Versioned output models of the five job types (SPEC §5), shared by the
worker (validation before submit) and job_service (validation before any
business row is written).

``output`` of a result, v1: for ``learning_state_analysis`` the
:class:`AiLearningAnalysis` object itself; for the four list types
``{"items": [...]}``. Unknown keys are refused (``extra="forbid"``) so a
model cannot smuggle fields into business rows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from airuntime_common.errors import AppError, ErrorCode

Text = Annotated[str, Field(min_length=1, max_length=4000)]
ShortText = Annotated[str, Field(min_length=1, max_length=400)]
Id = Annotated[str, Field(min_length=1, max_length=64)]
Unit = Annotated[float, Field(ge=0.0, le=1.0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


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
    priority: int = Field(ge=0, le=1000)


class QuizQuestion(_Model):
    """One ``quiz_generation`` item v1."""

    questionType: Literal["single_choice", "multiple_choice", "true_false", "short_answer"]
    stem: Text
    options: list[ShortText] = Field(max_length=10)
    answer: Annotated[str | list[str] | bool, Field()]
    explanation: Text
    difficulty: Literal["easy", "medium", "hard"]
    knowledgePointId: Id | None = None
    sourceBlockIds: list[Id] = Field(min_length=1, max_length=20)


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
