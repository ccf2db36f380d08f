"""JobService RPCs of waiting without polling (reference §9.1): ``WatchJobs`` and
``ListJobChanges``. Proto ↔ domain translation only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sqlalchemy.exc import DBAPIError

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from job_service.maintenance.changes import Change
from job_service.rpc.common import Ctx, rpc
from job_service.rpc.convert import job_to_proto
from job_service.services.domain import JobDomain
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

#: Seconds without a change after which the stream sends an empty message, so a
#: watcher can tell a quiet stream from a dead connection.
KEEPALIVE_SECONDS = 10.0


def change_to_proto(change: Change) -> msg.JobChange:
    """A change as its message: the cursor and the whole job."""
    return msg.JobChange(seq=change.seq, job=job_to_proto(change.job))


class WatchRpcs:
    """``WatchJobs, ListJobChanges``."""

    domain: JobDomain

    async def WatchJobs(
        self, request: rr.WatchJobsRequest, context: Ctx
    ) -> AsyncIterator[rr.WatchJobsResponse]:
        """Stream every job change this replica's poller sees, from now on.

        The first message carries only ``head_seq``; after :data:`KEEPALIVE_SECONDS`
        without a change an empty message follows. The stream ends (OK) when the
        watcher falls too far behind or the service stops: the watcher reconnects
        and re-reads what it waits on. An unreachable database → ``UNAVAILABLE``.
        """
        feed = self.domain.changes
        try:
            sub = await feed.subscribe()
        except DBAPIError:
            await abort(
                context, AppError(ErrorCode.UNAVAILABLE, "the job database is unavailable", None)
            )
            return
        try:
            yield rr.WatchJobsResponse(head_seq=sub.head)
            while True:
                try:
                    batch = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield rr.WatchJobsResponse()
                    continue
                if batch is None:
                    return
                yield rr.WatchJobsResponse(changes=[change_to_proto(c) for c in batch])
        finally:
            feed.unsubscribe(sub)

    @rpc
    async def ListJobChanges(
        self, request: rr.ListJobChangesRequest, context: Ctx
    ) -> rr.ListJobChangesResponse:
        after = request.after_seq if request.HasField("after_seq") else None
        changes, head, more = await self.domain.user_changes(request.user_id, after, request.limit)
        return rr.ListJobChangesResponse(
            changes=[change_to_proto(c) for c in changes], head_seq=head, more=more
        )
