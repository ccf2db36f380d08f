"""Create parameters of the generation job types, validated strictly (reference §2.1, §3.1).

One definition for the gateway (which refuses bad params before any call) and
job_service (which refuses them from any other caller): ``count: true`` or
``count: "7"`` is 400 ``INVALID_ARGUMENT``, never read as 1 or 7, and an
analysis job takes no params at all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from airuntime_common.errors import AppError, ErrorCode

QuestionType = Literal["single_choice", "multiple_choice", "true_false", "short_answer"]


def _integral(value: Any) -> Any:
    # google.protobuf.Struct carries every number as a double.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _default_types() -> list[QuestionType]:
    return ["single_choice"]


class QuizParams(BaseModel):
    """``quiz_generation`` params: count 1..20 (5), difficulty (medium), questionTypes ([single_choice])."""

    model_config = ConfigDict(extra="forbid", strict=False)

    count: int = Field(default=5, ge=1, le=20, strict=True)
    difficulty: Literal["easy", "medium", "hard"] = "medium"
    questionTypes: list[QuestionType] = Field(default_factory=_default_types, min_length=1)

    _count = field_validator("count", mode="before")(_integral)

    @field_validator("questionTypes")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class FlashcardParams(BaseModel):
    """``flashcard_generation`` params: count 1..50 (5)."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=5, ge=1, le=50, strict=True)

    _count = field_validator("count", mode="before")(_integral)


class NoParams(BaseModel):
    """The analysis types take no params: anything given is refused, not stored."""

    model_config = ConfigDict(extra="forbid")


def normalize_params(job_type: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate ``params`` for ``job_type`` and fill the defaults.

    Returns:
        The stored params: full quiz/flashcard params; ``{}`` for the analysis types.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unknown job type; with ``details.fields``, one
            ``{"field": "params.count", "message", "type"}`` per offending field (the
            shape of every other body field's refusal).
    """
    from airuntime_common import jobtypes  # the registry imports these models

    model = jobtypes.get(job_type).params
    try:
        return model.model_validate(dict(params or {})).model_dump()
    except ValidationError as exc:
        fields = [
            {
                "field": ".".join(["params", *(str(p) for p in e["loc"])]),
                "message": e["msg"],
                "type": e["type"],
            }
            for e in exc.errors()
        ]
        raise AppError(ErrorCode.INVALID_ARGUMENT, "invalid params", {"fields": fields}) from None
