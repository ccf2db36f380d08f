"""The prompt registry in job_service (reference §10.4): uploads, versions, routings and
the choice at create, on SQLite and MariaDB."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.prompts import builtin_source
from job_service.lifecycle import Lease
from job_service.prompts.routing import Variant, pick, position
from job_service.services.domain import JobDomain
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT, new_job

JT = "learning_state_analysis"
CAPS = [JT]


def variant_source(word: str = "kind") -> str:
    """The shipped template with one word changed: a valid new version."""
    return builtin_source(JT).replace("You are a learning coach", f"You are a {word} coach")


async def upload(domain: JobDomain, version: str, word: str = "kind") -> None:
    await domain.prompts.put_version(JT, version, variant_source(word), f"{word} coach", "admin:a")


async def route(domain: JobDomain, *variants: tuple[str, float], **guard: Any) -> None:
    await domain.prompts.put_routing(
        JT, list(variants), guard.get("increase"), guard.get("min_attempts"), "admin:a"
    )


# ------------------------------------------------------------------ versions


async def test_an_upload_is_stored_once_and_immutable(domain: JobDomain) -> None:
    view, created = await domain.prompts.put_version(JT, "v2", variant_source(), "kinder", "a")
    assert created and view.version == "v2" and not view.builtin and view.created_at is not None
    same, again = await domain.prompts.put_version(JT, "v2", variant_source(), "other text", "a")
    assert not again and same.template == view.template and same.description == "kinder"
    with pytest.raises(AppError) as other:
        await domain.prompts.put_version(JT, "v2", variant_source("calm"), None, "a")
    assert other.value.code == ErrorCode.PROMPT_VERSION_EXISTS
    stored = await domain.prompts.get_version(JT, "v2")
    assert stored.template == variant_source() and stored.description == "kinder"


@pytest.mark.parametrize("template", ["{{ broken", None])
async def test_v1_can_never_be_uploaded(domain: JobDomain, template: str | None) -> None:
    with pytest.raises(AppError) as caught:
        await domain.prompts.put_version(JT, "v1", template or builtin_source(JT), None, "a")
    assert caught.value.code == ErrorCode.PROMPT_VERSION_EXISTS


@pytest.mark.parametrize("version", ["", "v 2", "v2/x", "ü", "v" * 65, "v2\n"])
async def test_a_bad_version_name_is_invalid_argument(domain: JobDomain, version: str) -> None:
    with pytest.raises(AppError) as caught:
        await domain.prompts.put_version(JT, version, variant_source(), None, "a")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


async def test_a_template_that_does_not_render_names_its_line(domain: JobDomain) -> None:
    bad = variant_source().replace("Use the language", "{{ snapshot.blocks }} Use the language")
    with pytest.raises(AppError) as caught:
        await domain.prompts.put_version(JT, "v3", bad, None, "a")
    assert caught.value.code == ErrorCode.INVALID_PROMPT_TEMPLATE
    line = 1 + bad[: bad.index("{{ snapshot.blocks")].count("\n")
    assert caught.value.message.startswith(f"line {line}: 'snapshot' is not defined")
    with pytest.raises(AppError) as missing:
        await domain.prompts.get_version(JT, "v3")
    assert missing.value.code == ErrorCode.NOT_FOUND  # nothing was stored


async def test_the_shipped_version_reads_with_its_include_inlined(domain: JobDomain) -> None:
    v1 = await domain.prompts.get_version(JT, "v1")
    assert v1.builtin and v1.created_at is None
    assert "include" not in v1.template and "<snapshot>" in v1.template
    with pytest.raises(AppError) as caught:
        await domain.prompts.get_version("no_such_type", "v1")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


async def test_the_overview_lists_v1_first_then_uploads(domain: JobDomain) -> None:
    await upload(domain, "v3")
    await upload(domain, "v2", "calm")
    found = await domain.prompts.overview(JT, 24)
    assert [v.version for v in found.versions] == ["v1", "v3", "v2"]
    assert found.routing is None
    assert [s.version for s in found.stats] == ["v1", "v3", "v2"]
    assert all(s.counts.attempts == 0 and s.counts.invalid_schema_rate is None for s in found.stats)


# ------------------------------------------------------------------ routing


def test_the_sticky_hash_is_stable_and_salted_by_the_routing() -> None:
    assert position("rt_a", "u1") == position("rt_a", "u1")
    assert position("rt_a", "u1") != position("rt_b", "u1")
    assert 0 <= position("rt_a", "u1") < 1
    variants = (Variant("v1", 1), Variant("v2", 0), Variant("v3", 1))
    assert all(pick("rt_a", f"u{i}", variants) != "v2" for i in range(1000))


def test_a_fifty_fifty_split_over_5000_users_is_within_two_points() -> None:
    variants = (Variant("v1", 50), Variant("v2", 50))
    arms = Counter(pick("rt_split", f"user-{i}", variants) for i in range(5000))
    assert abs(arms["v2"] / 5000 - 0.5) <= 0.02, arms
    skewed = Counter(
        pick("rt_split", f"user-{i}", (Variant("v1", 90), Variant("v2", 10))) for i in range(5000)
    )
    assert abs(skewed["v2"] / 5000 - 0.1) <= 0.02, skewed


@pytest.mark.parametrize(
    "variants",
    [
        [],
        [("v1", 0.0)],
        [("v1", -1.0)],
        [("v1", float("nan"))],
        [("v1", 1.0), ("v1", 1.0)],
        [("v1", 1.0), ("nope", 1.0)],
        [("v 1", 1.0)],
    ],
)
async def test_a_bad_routing_is_invalid_argument(
    domain: JobDomain, variants: list[tuple[str, float]]
) -> None:
    with pytest.raises(AppError) as caught:
        await domain.prompts.put_routing(JT, variants, None, None, "a")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("increase", "attempts"), [(-0.1, None), (1.5, None), (None, 0)])
async def test_a_bad_guard_is_invalid_argument(
    domain: JobDomain, increase: float | None, attempts: int | None
) -> None:
    with pytest.raises(AppError) as caught:
        await domain.prompts.put_routing(JT, [("v1", 1.0)], increase, attempts, "a")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


async def test_new_jobs_follow_the_routing_sticky_per_user(domain: JobDomain) -> None:
    job = await new_job(domain, user_id="u0")
    assert job.prompt_version == f"{JT}.v1"  # no routing: the shipped version
    await upload(domain, "v2")
    await route(domain, ("v1", 50.0), ("v2", 50.0))
    seen: dict[str, str | None] = {}
    for i in range(40):
        user = f"user-{i}"
        first = await new_job(domain, user_id=user)
        second = await new_job(domain, user_id=user)
        assert first.prompt_version == second.prompt_version  # sticky
        seen[user] = first.prompt_version
    assert set(seen.values()) == {f"{JT}.v1", f"{JT}.v2"}
    routing = (await domain.prompts.overview(JT, 1)).routing
    assert routing is not None
    for user, version in seen.items():
        assert version == f"{JT}.{routing.choose(user)}"


async def test_a_job_keeps_its_version_across_retries(domain: JobDomain) -> None:
    await upload(domain, "v2")
    await route(domain, ("v2", 1.0))
    job = await new_job(domain, user_id="keeper")
    assert job.prompt_version == f"{JT}.v2"
    await route(domain, ("v1", 1.0))  # a new routing: the job is not created again
    await domain.claim("w1", CAPS, 1, 0)
    after = await domain.fail(Lease(job.job_id, "w1", 1), error_code="MODEL_TIMEOUT",
                              error_message="slow")  # fmt: skip
    assert after.status == "pending"
    [again] = await domain.claim("w1", CAPS, 1, 0)
    assert again.attempt_no == 2 and again.prompt_version == f"{JT}.v2"
    assert (await new_job(domain, user_id="keeper")).prompt_version == f"{JT}.v1"


async def test_a_routing_change_reaches_another_replica_at_its_next_create(
    make_domain: Callable[..., Any],
) -> None:
    one: JobDomain = await make_domain()
    two: JobDomain = await make_domain()
    await upload(one, "v2")
    assert (await new_job(two, user_id="r1")).prompt_version == f"{JT}.v1"
    await route(one, ("v2", 1.0))
    assert (await new_job(two, user_id="r1")).prompt_version == f"{JT}.v2"
    await route(two, ("v1", 1.0), ("v2", 0.0))
    assert (await new_job(one, user_id="r1")).prompt_version == f"{JT}.v1"


async def test_a_rerun_is_routed_as_a_create(domain: JobDomain) -> None:
    job = await new_job(domain, user_id="rr")
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(Lease(job.job_id, "w1", 1), error_code="MODEL_BAD_REQUEST", error_message="x")
    await upload(domain, "v2")
    await route(domain, ("v2", 1.0))
    rerun = await domain.rerun(job.job_id, rebuild_snapshot=False, actor="admin:a")
    assert rerun.prompt_version == f"{JT}.v2"


async def test_the_calls_log_the_version_their_attempt_ran(domain: JobDomain) -> None:
    from tests.unit.job_service.test_invocations_with_ending import call

    await upload(domain, "v2")
    await route(domain, ("v2", 1.0))
    job = await new_job(domain, user_id="logger")
    await domain.claim("w1", CAPS, 1, 0)
    await domain.fail(Lease(job.job_id, "w1", 1), error_code="MODEL_TIMEOUT", error_message="t",
                      calls=[call("failed", error_code="MODEL_TIMEOUT")])  # fmt: skip
    await domain.claim("w1", CAPS, 1, 0)
    await domain.accounting.record_invocation(job_id=job.job_id, attempt_no=2, call=call())
    await domain.submit_result(
        Lease(job.job_id, "w1", 2), prompt_version=f"{JT}.v2", output_schema_version="v1",
        output=ANALYSIS_OUTPUT, calls=[call()],
    )  # fmt: skip
    _, invocations = await domain.history(job.job_id)
    assert [(i.attempt_no, i.prompt_version) for i in invocations] == [
        (1, f"{JT}.v2"),
        (2, f"{JT}.v2"),
        (2, f"{JT}.v2"),
    ]


async def test_the_longest_version_name_fits_every_column(domain: JobDomain) -> None:
    from tests.unit.job_service.test_invocations_with_ending import call

    longest = "v" + "x" * 63
    await upload(domain, longest)
    await route(domain, (longest, 1.0))
    job = await new_job(domain, user_id="long")
    assert job.prompt_version == f"{JT}.{longest}" and len(job.prompt_version) == 88
    await domain.claim("w1", CAPS, 1, 0)
    done = await domain.submit_result(
        Lease(job.job_id, "w1", 1), prompt_version=job.prompt_version, output_schema_version="v1",
        output=ANALYSIS_OUTPUT, calls=[call()],
    )  # fmt: skip
    assert done.status == "succeeded"
    _, [logged] = await domain.history(job.job_id)
    assert logged.prompt_version == job.prompt_version
