"""SubmitResult never claims: its deprecated ``claim_next`` is ignored, the result commits as
any other and every job behind it stays pending for ClaimJobs (reference §3), on SQLite
and on MariaDB."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from airuntime_common import metadata
from airuntime_common.enums import JOB_TYPE
from tests.contract.conftest import TOKEN, RuntimeStack
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

LSA = "learning_state_analysis"
pytestmark = pytest.mark.parametrize("contract_db", ["sqlite", "mysql"], indirect=True)


def md(instance: str) -> Any:
    return metadata.outgoing(TOKEN, instance)


async def test_a_deprecated_claim_next_is_ignored(stack: RuntimeStack) -> None:
    ids = [(await stack.create())["jobId"] for _ in range(3)]
    claimed = await stack.stub.ClaimJobs(
        rr.ClaimJobsRequest(
            capabilities=[JOB_TYPE.to_proto(LSA)],  # type: ignore[list-item]
            limit=1,
            with_snapshots=True,
        ),
        metadata=md("w1"),
    )
    assert [j.job_id for j in claimed.jobs] == ids[:1]
    output = struct_pb2.Struct()
    output.update(ANALYSIS_OUTPUT)
    request = rr.SubmitResultRequest(
        job_id=ids[0], attempt_no=1, output_schema_version="v1", output=output
    )
    request.claim_next.CopyFrom(  # deprecated: a bad limit is not even looked at
        rr.ClaimNext(capabilities=[JOB_TYPE.to_proto(LSA)], limit=0)  # type: ignore[list-item]
    )
    answer = await stack.stub.SubmitResult(request, metadata=md("w1"))
    assert (answer.job_id, answer.replayed) == (ids[0], False)
    assert not answer.claimed_jobs and not answer.snapshots
    assert (await stack.get(ids[0]))["status"] == "succeeded"
    assert [(await stack.get(i))["status"] for i in ids[1:]] == ["pending", "pending"]
