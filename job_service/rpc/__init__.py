"""``zhixi.airuntime.job.v1.JobService``: the servicers, proto ↔ domain translation only (reference §3).

One servicer class answers every RPC; each area's RPCs live in their own module
and are combined here: :mod:`.jobs` (users' and admins' jobs), :mod:`.runtime`
(the runtime contract), :mod:`.session` (the same calls over one stream),
:mod:`.learning` (the learner's data and results),
:mod:`.admin` (costs, the breaker, runtime health), :mod:`.prompts` (the prompt
registry, reference §10.4) and :mod:`.watch` (job changes, reference §9.1). Request checks and the
error mapping shared by all are in :mod:`.common`.
"""

from __future__ import annotations

from job_service.rpc.admin import AdminRpcs
from job_service.rpc.jobs import JobRpcs
from job_service.rpc.learning import LearningRpcs
from job_service.rpc.prompts import PromptRpcs
from job_service.rpc.runtime import RuntimeRpcs
from job_service.rpc.session import SessionRpcs
from job_service.rpc.watch import WatchRpcs
from job_service.services.domain import JobDomain
from zhixi.airuntime.job.v1 import service_pb2_grpc


class JobServiceServicer(
    JobRpcs,
    RuntimeRpcs,
    SessionRpcs,
    LearningRpcs,
    AdminRpcs,
    PromptRpcs,
    WatchRpcs,
    service_pb2_grpc.JobServiceServicer,  # type: ignore[misc]
):
    """Every JobService RPC.

    Args:
        domain: the job core.
    """

    def __init__(self, domain: JobDomain) -> None:
        RuntimeRpcs.__init__(self)
        self.domain = domain


__all__ = ["JobServiceServicer"]
