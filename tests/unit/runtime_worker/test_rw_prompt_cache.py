"""The worker renders exactly each job's prompt version (reference §10.4): the shipped v1
from the code, any other fetched from job_service once per version per worker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.prompts import builtin_source
from runtime_worker.app import WorkerApp
from runtime_worker.prompt_cache import PromptCache
from runtime_worker.snapshot import validate_snapshot
from tests.unit.runtime_worker.rw_helpers import (
    FakeBackend,
    ScriptedProvider,
    make_job,
    snapshot_payload,
    worker_settings,
)
from tests.unit.runtime_worker.test_rw_worker_loop import apps  # noqa: F401  (fixture)

Backend = tuple[FakeBackend, int, int]
JT = "quiz_generation"
V2 = builtin_source(JT).replace("You are a tutor", "You are a patient tutor (v2)")
V3 = builtin_source(JT).replace("You are a tutor", "You are a strict tutor (v3)")


class _Run:
    """What :meth:`PromptCache.render` reads of an attempt."""

    def __init__(self, version: str | None) -> None:
        self.job_type = JT
        self.job = make_job(job_type=JT)
        if version is not None:
            self.job.prompt_version = version


def _snapshot() -> Any:
    return validate_snapshot(snapshot_payload(JT), schema_version="v1", job_type=JT)


class CountingFetch:
    def __init__(self, templates: dict[str, str], fail_first: int = 0) -> None:
        self.templates = templates
        self.calls: list[tuple[str, str]] = []
        self.fail_first = fail_first

    async def __call__(self, job_type: str, version: str) -> str:
        self.calls.append((job_type, version))
        await asyncio.sleep(0.01)  # jobs starting together wait on the one fetch
        if self.fail_first:
            self.fail_first -= 1
            raise AppError(ErrorCode.UNAVAILABLE, "job_service restarting")
        if version not in self.templates:
            raise AppError(ErrorCode.NOT_FOUND, "no such version")
        return self.templates[version]


async def test_each_version_is_fetched_once_and_v1_never() -> None:
    fetch = CountingFetch({"v2": V2, "v3": V3})
    cache = PromptCache(fetch)
    params = {"count": 1, "difficulty": "medium", "questionTypes": ["single_choice"]}
    runs = [_Run(f"{JT}.v2") for _ in range(20)] + [_Run(f"{JT}.v1"), _Run(None), _Run(f"{JT}.v3")]
    prompts = await asyncio.gather(*(cache.render(r, _snapshot(), params) for r in runs))
    assert sorted(fetch.calls) == [(JT, "v2"), (JT, "v3")]
    assert cache.fetches == 2
    for prompt in prompts[:20]:
        assert prompt.prompt_version == f"{JT}.v2"
        assert "patient tutor (v2)" in prompt.messages[0]["content"]
    assert [p.prompt_version for p in prompts[20:]] == [f"{JT}.v1", f"{JT}.v1", f"{JT}.v3"]
    assert "You are a tutor" in prompts[20].messages[0]["content"]
    for _ in range(5):  # later jobs: still no fetch
        await cache.render(_Run(f"{JT}.v2"), _snapshot(), params)
    assert cache.fetches == 2


async def test_a_failed_fetch_is_not_kept() -> None:
    fetch = CountingFetch({"v2": V2}, fail_first=1)
    cache = PromptCache(fetch)
    with pytest.raises(AppError) as first:
        await cache.template(JT, "v2")
    assert first.value.code == ErrorCode.UNAVAILABLE
    assert await cache.template(JT, "v2") is not None
    assert await cache.template(JT, "v2") is not None
    assert len(fetch.calls) == 2


async def test_an_unknown_version_fails_the_attempt_as_a_template_problem() -> None:
    cache = PromptCache(CountingFetch({}))
    with pytest.raises(AppError) as caught:
        await cache.render(_Run(f"{JT}.v9"), _snapshot(), {})
    assert caught.value.code == ErrorCode.INVALID_PROMPT_TEMPLATE
    with pytest.raises(AppError) as other_type:
        await cache.render(_Run("flashcard_generation.v2"), _snapshot(), {})
    assert other_type.value.code == ErrorCode.INVALID_PROMPT_TEMPLATE


async def test_the_worker_renders_each_jobs_version_fetching_it_once(
    backend: Backend,
    apps: list[WorkerApp],  # noqa: F811
) -> None:
    b, job_port, cred_port = backend
    b.prompt_templates[(JT, "v2")] = V2
    for i in range(6):
        job = make_job(f"job-{i}")
        job.prompt_version = f"{JT}.v2" if i % 2 else f"{JT}.v1"
        b.add_job(job)
    provider = ScriptedProvider()
    app = WorkerApp(worker_settings(job_port, cred_port), provider)
    await app.start()
    apps.append(app)
    await b.wait_for(lambda: len(b.results) == 6, within=10)
    assert b.names().count("GetPromptVersion") == 1
    assert app.worker.attempts.prompts.fetches == 1
    by_job = {r.job_id: r.prompt_version for r in b.results}
    assert by_job == {f"job-{i}": f"{JT}.v2" if i % 2 else f"{JT}.v1" for i in range(6)}
    systems = [r.messages[0]["content"] for r in provider.requests]
    assert sum("patient tutor (v2)" in s for s in systems) == 3
    assert all(json.loads(r.messages[1]["content"].split("<params>")[1].split("</params>")[0])
               for r in provider.requests)  # fmt: skip


async def test_a_version_job_service_does_not_have_fails_the_attempt(
    backend: Backend,
    apps: list[WorkerApp],  # noqa: F811
) -> None:
    b, job_port, cred_port = backend
    job = make_job("job-x")
    job.prompt_version = f"{JT}.gone"
    b.add_job(job)
    app = WorkerApp(worker_settings(job_port, cred_port), ScriptedProvider())
    await app.start()
    apps.append(app)
    await b.wait_for(lambda: bool(b.fails))
    assert b.fails[0].error_code == ErrorCode.INVALID_PROMPT_TEMPLATE
    assert b.results == []
