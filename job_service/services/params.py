"""Validation of create parameters (reference §2.1, §3.1) → ``INVALID_ARGUMENT`` with field details.

The params models live in :mod:`airuntime_common.params` (the gateway checks with
the same ones); the admin overrides' ranges are here.
"""

from __future__ import annotations

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.params import normalize_params

__all__ = ["check_range", "normalize_params"]


def check_range(name: str, value: int | None, lo: int, hi: int) -> None:
    """Admin override ranges (reference §3.1): ``INVALID_ARGUMENT`` when outside ``lo..hi``."""
    if value is not None and not lo <= value <= hi:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"{name} must be between {lo} and {hi}",
            {"field": name, "value": value},
        )
