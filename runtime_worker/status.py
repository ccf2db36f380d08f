"""``zhixi.airuntime.worker.v1.WorkerStatusService``: GetStatus and Drain (reference §3)."""

from __future__ import annotations

from typing import Any, cast

import grpc

from airuntime_common.enums import JOB_TYPE
from airuntime_common.timeutil import to_timestamp
from runtime_worker import __version__
from runtime_worker.worker import Worker
from zhixi.airuntime.worker.v1 import message_pb2 as wmsg
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

SERVICE_NAME = "zhixi.airuntime.worker.v1.WorkerStatusService"


class WorkerStatusService(wgrpc.WorkerStatusServiceServicer):  # type: ignore[misc]
    """Reports a worker's identity, load and counters, and drains it on request.

    Args:
        worker: the running :class:`~runtime_worker.worker.Worker`.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def GetStatus(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """Instance id, version, capabilities, in-flight jobs (ages in seconds),
        counters by outcome (``succeeded``, ``failed:<CODE>``, ``lease_lost``…), draining."""
        w = self.worker
        facts = w.status()
        response = wrr.GetStatusResponse(
            instance_id=w.settings.RUNTIME_INSTANCE_ID,
            version=__version__,
            capabilities=cast(Any, [JOB_TYPE.to_proto(c) for c in w.capabilities]),
            counters={k: int(v) for k, v in facts["counters"].items()},
            draining=facts["draining"],
            concurrency=w.settings.WORKER_CONCURRENCY,
            started_at=to_timestamp(w.started_at),
        )
        for item in facts["in_flight"]:
            response.in_flight.append(
                wmsg.InFlightJob(
                    job_id=item["job_id"],
                    attempt_no=item["attempt_no"],
                    job_type=cast(
                        Any, JOB_TYPE.to_proto(item["job_type"]) if item["job_type"] else 0
                    ),
                    started_at=to_timestamp(item["started_at"]),
                    age_seconds=item["age_seconds"],
                )
            )
        return response

    async def Drain(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """Stop claiming; in-flight jobs get ``grace_seconds`` (0 = configured) to finish.

        Returns at once with the number of jobs in flight when the drain began.
        """
        grace = request.grace_seconds if request.grace_seconds > 0 else None
        in_flight = await self.worker.drain(grace)
        return wrr.DrainResponse(in_flight=in_flight)
