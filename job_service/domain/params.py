"""Validation of create parameters (SPEC §2.1, §3.1) → ``INVALID_ARGUMENT`` with field details."""

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
        AppError: ``INVALID_ARGUMENT`` with ``details.errors`` listing offending fields.
    """
    raw = dict(params or {})
    models: dict[str, type[BaseModel]] = {
        "quiz_generation": QuizParams,
        "flashcard_generation": FlashcardParams,
    }
    model = models.get(job_type, NoParams)
    try:
        return model.model_validate(raw).model_dump()
    except ValidationError as exc:
        errors = [
            {"field": "params." + ".".join(str(p) for p in e["loc"]), "message": e["msg"]}
            for e in exc.errors()
        ]
        raise AppError(ErrorCode.INVALID_ARGUMENT, "invalid params", {"errors": errors}) from None


def check_range(name: str, value: int | None, lo: int, hi: int) -> None:
    """Admin override ranges (SPEC §3.1): ``INVALID_ARGUMENT`` when outside ``lo..hi``."""
    if value is not None and not lo <= value <= hi:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"{name} must be between {lo} and {hi}",
            {"field": name, "value": value},
        )
