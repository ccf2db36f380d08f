"""Field lists copied from reference §3, shared by the tests that check them (independent of
the product's own converters, so a converter bug cannot hide)."""

from __future__ import annotations

#: Every key of the ``Job`` JSON (reference §3), in the contract's order.
JOB_KEYS = (
    "jobId",
    "userId",
    "jobType",
    "targetType",
    "targetId",
    "snapshotId",
    "status",
    "priority",
    "params",
    "apiKeyMode",
    "credentialId",
    "modelProvider",
    "modelName",
    "promptVersion",
    "outputSchemaVersion",
    "attemptNo",
    "retryCount",
    "maxRetryCount",
    "timeoutSeconds",
    "lockedBy",
    "lockUntil",
    "availableAt",
    "cancelRequested",
    "errorCode",
    "errorMessage",
    "retriedFromJobId",
    "createdAt",
    "updatedAt",
    "startedAt",
    "finishedAt",
    # reference §10.3
    "parentJobId",
    "batch",
)
