"""The demo's walk through the PUBLIC REST API (reference §3.1), as a learner's app would do it.

Upload a document → define knowledge points from its headings → record
reading and quiz activity → create one job of each of the five types (with
an ``Idempotency-Key``, and one replay to show it) → poll until every job is
terminal → print the business results readably → check that every cited
block, knowledge point and target belongs to this user and document.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from airuntime_common.timeutil import utcnow
from demo.knowledge import (
    KnowledgePointPlan,
    check_citations,
    clean_heading,
    document_headings,
    plan_knowledge_points,
    plan_learning_activity,
)
from demo.render import RENDERERS, Lookup, pad, wrap

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

#: The five jobs: (jobType, targetType, params).
JOBS: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("learning_state_analysis", "user", None),
    ("weak_point_analysis", "user", None),
    ("next_action_planning", "user", None),
    (
        "quiz_generation",
        "material",
        {"count": 5, "difficulty": "medium", "questionTypes": ["single_choice", "true_false"]},
    ),
    ("flashcard_generation", "material", {"count": 6}),
)
EVENT_BATCH = 200
POLL_SECONDS = 0.5


class ApiError(RuntimeError):
    """A REST call answered with an unexpected status; carries the reference §4 error body."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path} → {status} {self.code or ''}: {message}")


@dataclass
class JobRun:
    """One demo job and what happened to it."""

    job_type: str
    target_type: str
    job_id: str = ""
    status: str = "?"
    created_at: float = 0.0
    finished_after: float | None = None
    attempt_no: int = 0
    error: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class DemoOutcome:
    """The demo's verdict: every job succeeded and every citation is the user's own."""

    jobs: list[JobRun]
    citations_ok: bool
    idempotency_ok: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when all five jobs succeeded and every check passed."""
        return (
            all(j.status == "succeeded" for j in self.jobs)
            and self.citations_ok
            and self.idempotency_ok
            and not self.problems
        )


def document_title(path: Path, text: str) -> str:
    """The first level-1 heading of the document, else a title made from the file name."""
    for heading in document_headings(text):
        if heading.level == 1:
            title = clean_heading(heading.text)
            if title:
                return title[:200]
    return path.stem.replace("-", " ").replace("_", " ").strip().title() or "Study notes"


class Api:
    """A thin JSON client of the public API that raises :class:`ApiError` on surprises."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        """Send one request; a status outside ``expect`` raises :class:`ApiError`."""
        reply = await self.client.request(method, path, json=json, headers=headers)
        if reply.status_code not in expect:
            try:
                body = reply.json()
            except ValueError:
                body = reply.text
            raise ApiError(method, path, reply.status_code, body)
        return reply


class Demo:
    """Runs the flow against a gateway and prints as it goes.

    Args:
        client: an ``httpx.AsyncClient`` with ``base_url`` = the gateway and the
            user's ``Authorization`` header.
        user_id: the token's ``sub``.
        document: path of the study document.
        timeout: seconds to wait for all jobs to become terminal.
        say: where lines go (default ``print``).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        user_id: str,
        document: Path,
        timeout: float = 90.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.api = Api(client)
        self.user_id = user_id
        self.document = document
        self.timeout = timeout
        self.say = say
        self.run_tag = uuid.uuid4().hex[:8]
        self.look = Lookup(user_id=user_id)

    async def run(self) -> DemoOutcome:
        """The whole flow; raises :class:`ApiError` when a setup call fails."""
        text = self.document.read_text(encoding="utf-8")
        title = document_title(self.document, text)
        material_id, blocks = await self._upload(title, text)
        kps = await self._knowledge_points(text, material_id, blocks)
        problems = await self._learning_activity(material_id, kps, blocks)
        runs = await self._create_jobs(material_id)
        idempotency_ok = await self._replay(runs[3], material_id)
        self.say(f"\n5. Waiting for the jobs (up to {self.timeout:.0f} s):")
        await self._wait(runs)
        results = await self._results(runs)
        citations_ok = self._check_citations(results, material_id, title, len(blocks))
        for run in runs:
            generative = run.job_type in ("quiz_generation", "flashcard_generation")
            if run.status == "succeeded" and generative and not run.items:
                problems.append(f"{run.job_type} succeeded with no items")
        return DemoOutcome(runs, citations_ok, idempotency_ok, problems)

    async def _upload(self, title: str, text: str) -> tuple[str, list[dict[str, Any]]]:
        """1. The material: its id and its blocks in order."""
        reply = await self.api.call(
            "POST", "/v1/materials", json={"title": title, "content": text}, expect=(201,)
        )
        material = reply.json()
        material_id = str(material["materialId"])
        blocks: list[dict[str, Any]] = sorted(material["blocks"], key=lambda b: int(b["ordinal"]))
        self.look.material_id, self.look.material_title = material_id, title
        self.look.block_ordinals = {str(b["blockId"]): int(b["ordinal"]) for b in blocks}
        self.say(f"\n1. Uploaded “{title}” ({len(text):,} characters) → {len(blocks)} blocks")
        self.say(f"   materialId {material_id}")
        return material_id, blocks

    async def _knowledge_points(
        self, text: str, material_id: str, blocks: list[dict[str, Any]]
    ) -> list[tuple[str, KnowledgePointPlan]]:
        """2. One knowledge point per section heading."""
        plans = plan_knowledge_points(text, blocks)
        kps: list[tuple[str, KnowledgePointPlan]] = []
        self.say(f"\n2. Knowledge points ({len(plans)}, one per section heading):")
        for plan in plans:
            reply = await self.api.call(
                "POST",
                "/v1/knowledge-points",
                json={
                    "materialId": material_id,
                    "name": plan.name,
                    "blockIds": list(plan.block_ids),
                },
                expect=(201,),
            )
            kp_id = str(reply.json()["knowledgePointId"])
            kps.append((kp_id, plan))
            self.look.kp_names[kp_id] = plan.name
            span = _span(plan.ordinals)
            self.say(f"   • {plan.name}  ({_count(len(plan.block_ids), 'block')}: {span})")
        return kps

    async def _learning_activity(
        self,
        material_id: str,
        kps: list[tuple[str, KnowledgePointPlan]],
        blocks: list[dict[str, Any]],
    ) -> list[str]:
        """3. Reading and quiz attempts, sent in batches; the problems found (events
        not all accepted)."""
        activity = plan_learning_activity(
            material_id=material_id,
            knowledge_points=kps,
            block_texts={str(b["blockId"]): str(b.get("text", "")) for b in blocks},
            now=utcnow(),
            run_tag=self.run_tag,
        )
        accepted = duplicates = 0
        events = activity.events
        for start in range(0, len(events), EVENT_BATCH):
            reply = await self.api.call(
                "POST",
                "/v1/learning-events",
                json={"events": events[start : start + EVENT_BATCH]},
                expect=(202,),
            )
            counts = reply.json()
            accepted += int(counts.get("accepted", 0))
            duplicates += int(counts.get("duplicates", 0))
        self.say(
            f"\n3. Learning activity: {len(activity.reading)} reading events, "
            f"{len(activity.quiz)} quiz attempts (accepted {accepted}, duplicates {duplicates})"
        )
        for kp_id, (read, linked, correct, attempts) in activity.summary.items():
            self.say(
                f"   • {pad(self.look.kp_names[kp_id], 40)}  read {read}/{linked} blocks,"
                f" quiz {correct}/{attempts} correct"
            )
        if accepted != len(events):
            return [f"{len(events)} events sent but {accepted} accepted"]
        return []

    async def _create_jobs(self, material_id: str) -> list[JobRun]:
        """4. One job of each type, each with an ``Idempotency-Key``."""
        self.say("\n4. AI jobs (POST /v1/ai/jobs, each with an Idempotency-Key):")
        runs: list[JobRun] = []
        for job_type, target_type, params in JOBS:
            run = JobRun(job_type, target_type)
            request: dict[str, Any] = {
                "jobType": job_type,
                "targetType": target_type,
                "targetId": self.user_id if target_type == "user" else material_id,
                "apiKeyMode": "platform_key",
            }
            if params is not None:
                request["params"] = params
            reply = await self.api.call(
                "POST",
                "/v1/ai/jobs",
                json=request,
                headers={"Idempotency-Key": self._key(job_type)},
                expect=(201,),
            )
            job = reply.json()
            run.job_id, run.status, run.created_at = (
                str(job["jobId"]),
                job["status"],
                time.monotonic(),
            )
            runs.append(run)
            detail = f" params {params}" if params else ""
            self.say(
                f"   • {job_type:<24} on {target_type:<8} → {run.job_id}  {run.status}{detail}"
            )
        return runs

    async def _results(self, runs: list[JobRun]) -> dict[str, list[dict[str, Any]]]:
        """6. Each succeeded job's business rows, rendered; by job type."""
        self.say("\n6. Results (GET /v1/ai/jobs/{id}/result):")
        results: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            title_text, render = RENDERERS[run.job_type]
            if run.status != "succeeded":
                self.say(f"\n  ── {title_text}: no result ({run.status}: {run.error or '-'})")
                continue
            reply = await self.api.call("GET", f"/v1/ai/jobs/{run.job_id}/result")
            payload = reply.json()
            run.items = list(payload.get("items") or [])
            results[run.job_type] = run.items
            count = "" if run.job_type == "learning_state_analysis" else f" ({len(run.items)})"
            self.say(f"\n  ── {title_text}{count} ──")
            for line in render(run.items, self.look):
                self.say(line)
        return results

    def _check_citations(
        self,
        results: dict[str, list[dict[str, Any]]],
        material_id: str,
        title: str,
        block_count: int,
    ) -> bool:
        """7. Every cited id is this user's document's or knowledge points'."""
        report = check_citations(
            results,
            block_ids=self.look.block_ordinals,
            kp_ids=self.look.kp_names,
            material_id=material_id,
            user_id=self.user_id,
        )
        self.say("\n7. Citation check:")
        if not results:
            self.say("   (no results to check)")
        elif report.ok:
            self.say(
                f"   ✓ all {len(report.blocks_cited)} cited block ids belong to “{title}”"
                f" ({block_count} blocks); {len(report.kps_cited)} cited knowledge points and"
                f" {len(report.targets_cited)} recommended targets are this user's own"
            )
        else:
            if report.foreign_blocks:
                self.say(f"   ✗ block ids not in the document: {sorted(report.foreign_blocks)}")
            if report.foreign_kps:
                self.say(f"   ✗ knowledge points not the user's: {sorted(report.foreign_kps)}")
            if report.foreign_targets:
                self.say(f"   ✗ foreign recommendation targets: {sorted(report.foreign_targets)}")
            if report.items_without_source:
                self.say(f"   ✗ items citing no block: {report.items_without_source}")
        return report.ok

    def _key(self, job_type: str) -> str:
        return f"demo-{self.run_tag}-{job_type}"

    async def _replay(self, run: JobRun, material_id: str) -> bool:
        """Repeat one create with the same key: expect 200, the replay header and the same job."""
        _, target_type, params = next(j for j in JOBS if j[0] == run.job_type)
        reply = await self.api.call(
            "POST",
            "/v1/ai/jobs",
            json={
                "jobType": run.job_type,
                "targetType": target_type,
                "targetId": self.user_id if target_type == "user" else material_id,
                "apiKeyMode": "platform_key",
                "params": params,
            },
            headers={"Idempotency-Key": self._key(run.job_type)},
            expect=(200, 201),
        )
        same = str(reply.json().get("jobId")) == run.job_id
        flagged = reply.headers.get("Idempotent-Replayed", "").lower() == "true"
        ok = reply.status_code == 200 and same and flagged
        mark = "✓" if ok else "✗"
        self.say(
            f"   {mark} repeating the {run.job_type} create with the same key → "
            f"{reply.status_code}, Idempotent-Replayed: {reply.headers.get('Idempotent-Replayed')},"
            f" {'same' if same else 'a DIFFERENT'} jobId"
        )
        return ok

    async def _wait(self, runs: list[JobRun]) -> None:
        deadline = time.monotonic() + self.timeout
        pending = {r.job_id: r for r in runs if r.status not in TERMINAL}
        for run in runs:
            if run.status in TERMINAL:
                self._report(run)
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            for job_id, run in list(pending.items()):
                job = (await self.api.call("GET", f"/v1/ai/jobs/{job_id}")).json()
                status, attempt = str(job.get("status")), int(job.get("attemptNo") or 0)
                if status not in TERMINAL and (status, attempt) != (run.status, run.attempt_no):
                    retry = f", retry {job.get('retryCount')}" if job.get("retryCount") else ""
                    self.say(f"     {run.job_type:<24} {status} (attempt {attempt}{retry})")
                run.status, run.attempt_no = status, attempt
                if run.status in TERMINAL:
                    run.finished_after = time.monotonic() - run.created_at
                    if job.get("errorCode"):
                        run.error = f"{job.get('errorCode')}: {job.get('errorMessage') or ''}"
                    del pending[job_id]
                    self._report(run)
        for run in pending.values():
            run.error = f"still {run.status} after {self.timeout:.0f} s"
            self.say(f"   ✗ {run.job_type:<24} {run.error}")

    def _report(self, run: JobRun) -> None:
        mark = "✓" if run.status == "succeeded" else "✗"
        after = f" after {run.finished_after:.1f} s" if run.finished_after is not None else ""
        line = f"   {mark} {run.job_type:<24} {run.status}{after} (attempt {run.attempt_no})"
        self.say(line)
        if run.error:
            for part in wrap(run.error, "       "):
                self.say(part)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _span(ordinals: tuple[int, ...]) -> str:
    if not ordinals:
        return "no blocks"
    lo, hi = min(ordinals), max(ordinals)
    return f"block #{lo}" if lo == hi else f"blocks #{lo}–#{hi}"
