"""Create params are closed and strictly typed (reference §2.1, §3.1: bad params → 400)."""

from __future__ import annotations

from typing import Any

import pytest

from airuntime_common.errors import AppError
from job_service.services.params import normalize_params


@pytest.mark.parametrize(
    ("job_type", "params"),
    [
        ("quiz_generation", {"count": True}),
        ("quiz_generation", {"count": "5"}),
        ("quiz_generation", {"count": 2.5}),
        ("flashcard_generation", {"count": False}),
        ("learning_state_analysis", {"bogus": 1}),
        ("weak_point_analysis", {"k" * 10: "v" * 100}),
        ("next_action_planning", {"count": 999, "difficulty": "insane"}),
    ],
)
def test_bad_params_are_invalid_argument(job_type: str, params: dict[str, Any]) -> None:
    with pytest.raises(AppError) as err:
        normalize_params(job_type, params)
    assert err.value.code == "INVALID_ARGUMENT"
    assert err.value.details and err.value.details["fields"][0]["field"].startswith("params.")


def test_defaults_and_integral_numbers_from_struct() -> None:
    assert normalize_params("quiz_generation", {"count": 3.0}) == {
        "count": 3,
        "difficulty": "medium",
        "questionTypes": ["single_choice"],
    }
    assert normalize_params("flashcard_generation", None) == {"count": 5}
    assert normalize_params("learning_state_analysis", None) == {}
    assert normalize_params("next_action_planning", {}) == {}
