"""The fencing token of reference §3."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    """A lease holder: ``(jobId, X-Runtime-Instance-Id, attemptNo)`` (reference §3).

    A worker whose lease expired and whose job was locked again by another
    worker no longer matches: it can no longer heartbeat, read the snapshot or
    key, submit or fail.
    """

    job_id: str
    instance_id: str
    attempt_no: int
