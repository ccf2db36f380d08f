"""The worker's prompt templates: the shipped ``v1`` from the code, any other version
fetched from job_service once and kept (reference §10.4).

A job carries its ``promptVersion`` (``<jobType>.<version>``) and the worker renders
exactly that version. Versions are immutable in job_service, so a template,
once fetched and compiled, is kept for the life of the process and never
re-read: there is nothing to go stale (unlike a cache of a mutable "latest"
prompt, which must guess when to refresh). Jobs of one version that start
together wait on the same fetch; a fetch that fails is not kept, so the next
job tries again. The fetched source is checked and compiled in the same
sandbox as an upload (:func:`airuntime_common.prompts.compile_prompt`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.lru import LruCache
from airuntime_common.prompts import BUILTIN_VERSION, PromptTemplate, bare_version, compile_prompt
from runtime_worker.prompts import RenderedPrompt, render_prompt
from runtime_worker.snapshot import SnapshotPayload

#: Versions kept per worker (a version pushed out is fetched again when next used).
MAX_VERSIONS = 512

#: ``fetch(job_type, version)`` → the version's template source.
Fetch = Callable[[str, str], Awaitable[str]]


class PromptCache:
    """Compiled templates by ``(jobType, version)``.

    Args:
        fetch: reads a version's template from job_service (``GetPromptVersion``).
        max_versions: versions kept (least recently used dropped first).
    """

    def __init__(self, fetch: Fetch, max_versions: int = MAX_VERSIONS) -> None:
        self._fetch = fetch
        self._kept: LruCache[tuple[str, str], PromptTemplate] = LruCache(max_versions)
        self._pending: dict[tuple[str, str], asyncio.Future[PromptTemplate]] = {}
        #: fetches made (each version once while it is kept)
        self.fetches = 0

    async def template(self, job_type: str, version: str) -> PromptTemplate | None:
        """The compiled template of ``version``; None for the shipped ``v1``.

        Raises:
            AppError: INVALID_PROMPT_TEMPLATE (job_service has no such version, or its
                source does not compile); the fetch's own error (e.g. UNAVAILABLE).
        """
        if version == BUILTIN_VERSION:
            return None
        key = (job_type, version)
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(job_type, version))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(pending)

    async def _load(self, job_type: str, version: str) -> PromptTemplate:
        self.fetches += 1
        try:
            source = await self._fetch(job_type, version)
        except AppError as exc:
            if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.INVALID_ARGUMENT):
                raise AppError(
                    ErrorCode.INVALID_PROMPT_TEMPLATE,
                    f"job_service has no prompt version {job_type}.{version}",
                    {"promptVersion": f"{job_type}.{version}"},
                ) from None
            raise
        compiled = compile_prompt(source)
        self._kept.put((job_type, version), compiled)
        return compiled

    async def render(
        self, run: Any, snapshot: SnapshotPayload, params: dict[str, Any]
    ) -> RenderedPrompt:
        """Render a job's prompt in the job's own version.

        Args:
            run: the attempt (:class:`runtime_worker.worker.JobRun`): its ``job_type`` and
                claimed ``job`` message, whose ``prompt_version`` names the version
                (none = ``v1``).
            snapshot: the validated snapshot.
            params: the job's params, JSON data.

        Raises:
            AppError: as :meth:`template`, and as
                :func:`~runtime_worker.prompts.render_prompt`.
        """
        job, job_type = run.job, run.job_type
        given = job.prompt_version if job.HasField("prompt_version") else None
        version = bare_version(job_type, given)
        template = await self.template(job_type, version)
        return render_prompt(job_type, snapshot, params, version=version, template=template)
