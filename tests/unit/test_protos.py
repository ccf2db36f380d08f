"""The committed stubs match the protos, and the enum maps cover the contract's strings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airuntime_common import enums
from airuntime_common.errors import AppError

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_match_protos() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_enum_maps_use_the_spec_strings() -> None:
    assert enums.JOB_TYPE.values == enums.JOB_TYPES
    assert enums.JOB_STATUS.values == enums.JOB_STATUSES
    assert enums.TARGET_TYPE.values == enums.TARGET_TYPES
    assert enums.API_KEY_MODE.values == enums.API_KEY_MODES
    for value in enums.JOB_TYPES:
        assert enums.JOB_TYPE.to_str(enums.JOB_TYPE.to_proto(value)) == value


@pytest.mark.parametrize("value", ["", "QUIZ_GENERATION", "quiz", None])
def test_unknown_enum_strings_are_invalid_argument(value: str) -> None:
    with pytest.raises(AppError) as info:
        enums.JOB_TYPE.to_proto(value)
    assert info.value.code == "INVALID_ARGUMENT"


def test_unspecified_enum_is_invalid_argument() -> None:
    with pytest.raises(AppError) as info:
        enums.TARGET_TYPE.to_str(0)
    assert info.value.code == "INVALID_ARGUMENT"
