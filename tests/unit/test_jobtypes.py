"""The job-type registry and the one definition of job states (reference §2.1, §2.3)."""

from __future__ import annotations

import pytest

from airuntime_common import jobtypes
from airuntime_common.enums import JOB_STATUS, JOB_TYPE
from airuntime_common.errors import AppError
from airuntime_common.lru import LruCache
from airuntime_common.params import NoParams
from airuntime_common.states import JobStatus
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2


def test_the_builtin_types_are_the_proto_enum_in_order() -> None:
    proto = {n: v for n, v in common_pb2.JobType.items() if v}
    assert {f"JOB_TYPE_{s.name.upper()}": s.wire for s in jobtypes.BUILTIN} == proto
    assert jobtypes.names()[:5] == tuple(s.name for s in jobtypes.BUILTIN)


def test_states_are_the_proto_enum() -> None:
    proto = {n.removeprefix("JOB_STATUS_").lower() for n, v in common_pb2.JobStatus.items() if v}
    assert {s.value for s in JobStatus} == proto
    assert JOB_STATUS.values == tuple(s.value for s in JobStatus)


def test_a_registered_type_maps_on_the_wire_and_goes_away() -> None:
    spec = jobtypes.JobTypeSpec(
        name="throwaway_type", wire=77, params=NoParams, outputs={}, itemized=False,
        result_kind="throwaways", result_table="nowhere", item_id_key="throwawayId",
        max_tokens=64,
    )  # fmt: skip
    jobtypes.register(spec)
    try:
        assert JOB_TYPE.to_proto("throwaway_type") == 77
        assert JOB_TYPE.to_str(77) == "throwaway_type"
        assert spec.prompt == "throwaway_type"
        with pytest.raises(ValueError):
            jobtypes.register(spec)
    finally:
        jobtypes.unregister("throwaway_type")
    with pytest.raises(AppError) as err:
        JOB_TYPE.to_proto("throwaway_type")
    assert err.value.code == "INVALID_ARGUMENT"
    assert JOB_TYPE.to_str_or_none(77) is None


def test_wire_numbers_are_unique_and_positive() -> None:
    with pytest.raises(ValueError):
        jobtypes.register(
            jobtypes.JobTypeSpec(
                name="dup",
                wire=1,
                params=NoParams,
                outputs={},
                itemized=False,
                result_kind="d",
                result_table="d",
                item_id_key="d",
                max_tokens=1,
            )
        )


def test_lru_cache_drops_the_least_recently_used() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"] and "b" not in cache and len(cache) == 2
    assert cache.pop("a") == 1 and cache.get("a") is None
    with pytest.raises(ValueError):
        LruCache(0)
