"""Routings: which prompt version a new job gets (reference §10.4). No SQL here.

A routing lists variants ``[{"version", "weight"}]``, the first being the
control. A user's variant is chosen by a stable hash of the routing and the
user: ``sha256("<routingId>:<userId>")``, its first 8 bytes read as a number in
``[0, 1)``, walks the cumulative weights. So every replica, with no state but
the routing row, gives a user the same variant for as long as the routing
stands (Python's ``hash()`` is salted per process and would not); a new routing
has a new id, and users are drawn afresh.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airuntime_common.errors import invalid_argument
from airuntime_common.prompts import BUILTIN_VERSION, check_version_name

#: Defaults of a routing's guard (reference §10.4).
DEFAULT_MAX_INVALID_SCHEMA_INCREASE = 0.10
DEFAULT_MIN_ATTEMPTS = 50
#: Most variants a routing may list.
MAX_VARIANTS = 20
#: The largest weight of one variant.
MAX_WEIGHT = 1_000_000.0
#: The largest ``minAttempts``.
MAX_MIN_ATTEMPTS = 1_000_000


@dataclass(frozen=True)
class Variant:
    """One version of a routing and its weight (≥ 0)."""

    version: str
    weight: float

    def json(self) -> dict[str, Any]:
        """``{"version", "weight"}``."""
        return {"version": self.version, "weight": self.weight}


@dataclass(frozen=True)
class Guard:
    """When the guard rolls a variant back (reference §10.4).

    Attributes:
        max_invalid_schema_increase: how far (0..1) a variant's invalidSchemaRate may
            exceed the control's.
        min_attempts: the variant's attempts before it is judged.
    """

    max_invalid_schema_increase: float = DEFAULT_MAX_INVALID_SCHEMA_INCREASE
    min_attempts: int = DEFAULT_MIN_ATTEMPTS

    def json(self) -> dict[str, Any]:
        """``{"maxInvalidSchemaIncrease", "minAttempts"}``."""
        return {
            "maxInvalidSchemaIncrease": self.max_invalid_schema_increase,
            "minAttempts": self.min_attempts,
        }


@dataclass(frozen=True)
class Routing:
    """A job type's routing as stored (``ai_prompt_routings``).

    Attributes:
        job_type: its job type.
        routing_id: the salt of the sticky hash (new with every routing an admin sets).
        variants: the versions and weights in force; the first is the control.
        guard: the guard's thresholds.
        revision: +1 with every change of the row.
        started_at: when the admin's routing came into force (naive UTC).
        updated_at: the row's last change (naive UTC).
        rolled_back_at: when the guard rolled a variant back, or None.
        rollback_reason: why, or None.
        rolled_back_version: the bare version rolled back, or None.
    """

    job_type: str
    routing_id: str
    variants: tuple[Variant, ...]
    guard: Guard
    revision: int
    started_at: datetime
    updated_at: datetime
    rolled_back_at: datetime | None = None
    rollback_reason: str | None = None
    rolled_back_version: str | None = None

    @property
    def control(self) -> str:
        """The first variant's version."""
        return self.variants[0].version

    def choose(self, user_id: str) -> str:
        """The bare version ``user_id``'s new jobs get (:func:`pick`)."""
        return pick(self.routing_id, user_id, self.variants)

    @classmethod
    def of(cls, row: Any) -> Routing:
        """From a ``select(prompt_routings)`` row."""
        m = row._mapping
        guard = m["guard"] or {}
        return cls(
            job_type=m["job_type"],
            routing_id=m["routing_id"],
            variants=tuple(Variant(v["version"], float(v["weight"])) for v in m["variants"]),
            guard=Guard(
                float(guard.get("maxInvalidSchemaIncrease", DEFAULT_MAX_INVALID_SCHEMA_INCREASE)),
                int(guard.get("minAttempts", DEFAULT_MIN_ATTEMPTS)),
            ),
            revision=int(m["revision"]),
            started_at=m["started_at"],
            updated_at=m["updated_at"],
            rolled_back_at=m["rolled_back_at"],
            rollback_reason=m["rollback_reason"],
            rolled_back_version=m["rolled_back_version"],
        )


def position(routing_id: str, user_id: str) -> float:
    """Where ``user_id`` falls in ``[0, 1)`` under routing ``routing_id``: the first 8
    bytes of ``sha256("<routingId>:<userId>")`` (UTF-8) over 2⁶⁴."""
    digest = hashlib.sha256(f"{routing_id}:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick(routing_id: str, user_id: str, variants: Sequence[Variant]) -> str:
    """The variant of ``user_id``: the one whose share of the cumulative weights holds
    :func:`position`. A variant of weight 0 is never picked.

    Raises:
        ValueError: no variant has a positive weight.
    """
    total = sum(v.weight for v in variants)
    if total <= 0:
        raise ValueError("a routing needs a positive weight")
    point = position(routing_id, user_id) * total
    edge = 0.0
    chosen = None
    for variant in variants:
        if variant.weight <= 0:
            continue
        chosen = variant.version
        edge += variant.weight
        if point < edge:
            break
    assert chosen is not None
    return chosen


def parse_variants(raw: Sequence[tuple[str, float]]) -> tuple[Variant, ...]:
    """The variants of a routing an admin sets, checked (reference §10.4).

    Raises:
        AppError: INVALID_ARGUMENT: none, too many, a bad version name, a version named
            twice, a weight below 0 or not finite, every weight 0.
    """
    if not raw:
        raise invalid_argument("a routing needs at least one variant", field="variants")
    if len(raw) > MAX_VARIANTS:
        raise invalid_argument(f"a routing has at most {MAX_VARIANTS} variants", field="variants")
    seen: set[str] = set()
    out = []
    for i, (version, weight) in enumerate(raw):
        check_version_name(version, f"variants[{i}].version")
        if version in seen:
            raise invalid_argument(
                f"version {version!r} is named twice", field=f"variants[{i}].version"
            )
        seen.add(version)
        if not math.isfinite(weight) or not 0 <= weight <= MAX_WEIGHT:
            raise invalid_argument(
                f"a weight is a number from 0 to {MAX_WEIGHT:g}", field=f"variants[{i}].weight"
            )
        out.append(Variant(version, float(weight)))
    if not any(v.weight > 0 for v in out):
        raise invalid_argument("at least one weight must be above 0", field="variants")
    return tuple(out)


def parse_guard(max_increase: float | None, min_attempts: int | None) -> Guard:
    """A routing's guard, defaults filled in.

    Raises:
        AppError: INVALID_ARGUMENT: an increase outside 0..1, ``minAttempts`` below 1.
    """
    increase = DEFAULT_MAX_INVALID_SCHEMA_INCREASE if max_increase is None else max_increase
    attempts = DEFAULT_MIN_ATTEMPTS if min_attempts is None else min_attempts
    if not math.isfinite(increase) or not 0 <= increase <= 1:
        raise invalid_argument(
            "maxInvalidSchemaIncrease is a number from 0 to 1",
            field="guard.maxInvalidSchemaIncrease",
        )
    if not 1 <= attempts <= MAX_MIN_ATTEMPTS:
        raise invalid_argument(
            f"minAttempts is from 1 to {MAX_MIN_ATTEMPTS}", field="guard.minAttempts"
        )
    return Guard(float(increase), int(attempts))


def default_version() -> str:
    """The version a job of a type with no routing gets."""
    return BUILTIN_VERSION
