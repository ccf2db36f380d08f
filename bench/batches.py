"""The ``batches`` scenario (reference §10.3): creating batches of 200, and children
ending at the same moment on two replicas, counted.

Two job_service replicas, the credential service and the gateway (no worker) on a
fresh MariaDB database, one user with 200 materials:

1. **Create**: ``POST /v1/ai/job-batches`` of 200 children (one per material), one
   after the other, each timed from request to answer (p50/p95/p99; target p95 < 1 s):
   the parent, 200 children, their snapshots, events and checks in one transaction.
2. **Two at once**: lanes work on those batches side by side; each round, one lane
   leases two children of one parent (``LockJob``), sends both results at the same
   moment, one to each replica (two transactions racing for the parent's row), and
   when both answered compares the parent's counts with its children's states (one
   SQL read). ``batch_pairs`` rounds in all; every mismatch is counted (target 0).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import grpc
import httpx
from google.protobuf import struct_pb2

from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.metadata import outgoing
from bench.harness import System, fresh_database, pct, summary_ms
from launcher.token import mint_token
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

if TYPE_CHECKING:
    from bench.scenarios import Params

#: Children per batch (``BATCH_MAX_CHILDREN``'s default).
CHILDREN = 200
#: Lanes of the two-at-once phase, each on its own batch at a time.
LANES = 8
USER = "batch-bench-user"
JOB_TYPE = "learning_state_analysis"
OUTPUT: dict[str, Any] = {
    "summary": "steady",
    "masteryLevel": 0.5,
    "strengths": [],
    "risks": [],
    "evidence": [],
}
#: One parent's counts and its children's states, counted, in ONE statement (one
#: consistent read: two statements could straddle another lane's commit).
COUNTS_SQL = (
    "SELECT p.batch_total, p.batch_pending, p.batch_running, p.batch_succeeded,"
    " p.batch_failed, p.batch_cancelled,"
    " COUNT(c.job_id), SUM(c.status = 'pending'), SUM(c.status IN ('locked','running')),"
    " SUM(c.status = 'succeeded'), SUM(c.status = 'failed'), SUM(c.status = 'cancelled')"
    " FROM ai_runtime_jobs p JOIN ai_runtime_jobs c ON c.parent_job_id = p.job_id"
    " WHERE p.job_id = %s GROUP BY p.job_id"
)


def _replica_stubs(system: System) -> list[service_pb2_grpc.JobServiceStub]:
    """One stub per job_service replica (``JOB_SERVICE_ADDR`` lists them)."""
    target = system.launcher.env["JOB_SERVICE_ADDR"].removeprefix("ipv4:")
    return [
        service_pb2_grpc.JobServiceStub(insecure_or_tls_channel(addr)) for addr in target.split(",")
    ]


async def _materials(system: System) -> list[str]:
    assert system.stub is not None
    out = []
    for n in range(CHILDREN):
        made = await system.stub.CreateMaterial(
            rr.CreateMaterialRequest(
                user_id=USER, title=f"Topic {n}", content=f"# Topic {n}\n\nFact {n} about cells."
            ),
            metadata=system.md(),
            timeout=30,
        )
        out.append(str(made.material.material_id))
    return out


async def _create(system: System, targets: list[str], n: int) -> tuple[list[str], list[float]]:
    """Phase 1: ``n`` batches of the 200 targets through the gateway; their ids and times."""
    headers = {"Authorization": f"Bearer {mint_token(system.launcher.env['JWT_SECRET'], sub=USER)}"}
    body = {
        "jobType": JOB_TYPE,
        "targets": [{"targetType": "material", "targetId": t} for t in targets],
    }
    parents: list[str] = []
    took: list[float] = []
    async with httpx.AsyncClient(
        base_url=system.launcher.gateway_url, timeout=60.0, trust_env=False
    ) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            reply = await http.post("/v1/ai/job-batches", json=body, headers=headers)
            took.append(time.perf_counter() - t0)
            assert reply.status_code == 201, reply.text
            parents.append(str(reply.json()["jobId"]))
    return parents, took


def _counts_equal(system: System, parent_id: str) -> bool:
    """Whether the parent's counts equal its children's states (blocking; one read)."""
    row = [int(v or 0) for v in system.sql(COUNTS_SQL, (parent_id,))[0]]
    return row[:6] == row[6:]


async def _pair(
    system: System, stubs: list[Any], children: list[str], lane: int
) -> tuple[float, int]:
    """One round: lease two children, end both at once on two replicas; (seconds from
    the two sends to the later answer, results refused)."""
    instance = f"bench-lane-{lane}"
    md = outgoing(system.token, instance)
    locks = await asyncio.gather(
        *(
            stubs[i % 2].LockJob(rr.LockJobRequest(job_id=c), metadata=md)
            for i, c in enumerate(children)
        )
    )
    output = struct_pb2.Struct()
    output.update(OUTPUT)
    t0 = time.perf_counter()
    answers = await asyncio.gather(
        *(
            stubs[i % 2].SubmitResult(
                rr.SubmitResultRequest(
                    job_id=c,
                    attempt_no=lock.attempt_no,
                    prompt_version="bench",
                    output_schema_version="v1",
                    output=output,
                ),
                metadata=md,
            )
            for i, (c, lock) in enumerate(zip(children, locks, strict=True))
        ),
        return_exceptions=True,
    )
    refused = sum(isinstance(a, grpc.aio.AioRpcError) for a in answers)
    return time.perf_counter() - t0, refused


async def _two_at_once(system: System, parents: list[str], pairs: int) -> dict[str, Any]:
    """Phase 2 (module doc)."""
    stubs = _replica_stubs(system)
    kids = {
        p: [str(r[0]) for r in system.sql(
            "SELECT job_id FROM ai_runtime_jobs WHERE parent_job_id = %s ORDER BY seq", (p,)
        )]
        for p in parents
    }  # fmt: skip
    rounds = [(p, kids[p][i : i + 2]) for p in parents for i in range(0, CHILDREN, 2)][:pairs]
    queue: asyncio.Queue[tuple[str, list[str]]] = asyncio.Queue()
    for one in rounds:
        queue.put_nowait(one)
    took: list[float] = []
    stats = {"mismatches": 0, "refused": 0}

    async def lane(n: int) -> None:
        while not queue.empty():
            parent, children = queue.get_nowait()
            seconds, refused = await _pair(system, stubs, children, n)
            took.append(seconds)
            stats["refused"] += refused
            if not await asyncio.to_thread(_counts_equal, system, parent):
                stats["mismatches"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(lane(n) for n in range(LANES)))
    elapsed = time.perf_counter() - t0
    done = {p for p, _ in rounds}
    final = [await asyncio.to_thread(_counts_equal, system, p) for p in sorted(done)]
    ended = system.sql(
        "SELECT status, COUNT(*) FROM ai_runtime_jobs WHERE batch_total IS NOT NULL GROUP BY status"
    )
    return {
        "pairs": len(took),
        "lanes": LANES,
        "replicas": len(stubs),
        "count_mismatches": stats["mismatches"],
        "final_mismatches": final.count(False),
        "results_refused": stats["refused"],
        "pair_end_ms": summary_ms(took),
        "pairs_per_s": round(len(took) / elapsed, 1),
        "parents_by_status": {str(s): int(c) for s, c in ended},
    }


async def batches(p: Params) -> dict[str, Any]:
    """Scenario: reference §10.3 batch creation and racing child endings (module doc)."""
    n = -(-p.batch_pairs // (CHILDREN // 2))  # batches enough for every pair
    with fresh_database(p.base_url) as url:
        async with System(
            url,
            workers=0,
            job_services=2,
            only=["job_service", "credential_service", "api_gateway"],
        ) as system:
            targets = await _materials(system)
            parents, took = await _create(system, targets, n)
            race = await _two_at_once(system, parents, p.batch_pairs)
    ms = [t * 1000 for t in took]
    return {
        "params": {"children": CHILDREN, "batches": n, "pairs": p.batch_pairs, "job_services": 2},
        "create_batch_200": {**summary_ms(took), "p95_ms": round(pct(ms, 95), 2)},
        "create_p95_under_1s": pct(ms, 95) < 1000,
        "two_at_once": race,
        "counts_always_equal": race["count_mismatches"] == 0 and race["final_mismatches"] == 0,
    }


__all__ = ["batches"]
