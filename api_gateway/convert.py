"""Protobuf ↔ JSON conversions of the gateway (reference §3, §3.1).

Messages become the camelCase JSON of the contract: every field present, unset
optional values ``null``, enums as the contract's strings (via
:mod:`airuntime_common.enums`), timestamps RFC 3339 UTC with milliseconds,
``Struct`` values as plain JSON (integral numbers as integers).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

from airuntime_common.enums import API_KEY_MODE, BREAKER_STATE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import invalid_argument
from airuntime_common.timeutil import rfc3339, to_timestamp

MAX_SAFE_INT = 2**53


def _plain(value: Any) -> Any:
    """Struct numbers are doubles: give integral ones back as ints."""
    if (
        isinstance(value, float)
        and math.isfinite(value)
        and value.is_integer()
        and abs(value) <= MAX_SAFE_INT
    ):
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def struct_to_dict(struct: struct_pb2.Struct | None) -> dict[str, Any]:
    """``google.protobuf.Struct`` → dict (empty when unset)."""
    if struct is None:
        return {}
    result = _plain(json_format.MessageToDict(struct))
    return result if isinstance(result, dict) else {}


def dict_to_struct(value: dict[str, Any] | None, field: str = "params") -> struct_pb2.Struct:
    """dict → ``google.protobuf.Struct``.

    Raises:
        AppError: ``INVALID_ARGUMENT`` naming ``field`` when the value cannot be
            represented (e.g. a number out of range).
    """
    struct = struct_pb2.Struct()
    if value:
        try:
            json_format.ParseDict(value, struct)
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise invalid_argument(f"{field} is not representable JSON", field=field) from exc
    return struct


def ts(msg: Message, field: str) -> str | None:
    """A Timestamp field as RFC 3339 (ms, Z), or None when unset."""
    if not msg.HasField(field):
        return None
    value = getattr(msg, field).ToDatetime()
    return rfc3339(value)


def opt(msg: Message, field: str) -> Any:
    """A proto3 ``optional`` scalar, or None when unset."""
    return getattr(msg, field) if msg.HasField(field) else None


def nonempty(value: str) -> str | None:
    """Empty string → None."""
    return value or None


def timestamp_or_none(value: datetime | None) -> Any:
    """datetime → Timestamp for a request (None stays None)."""
    return to_timestamp(value)


def job_json(job: Any) -> dict[str, Any]:
    """A ``Job`` message → the ``Job`` JSON of reference §3 (every key present)."""
    return {
        "jobId": job.job_id,
        "userId": job.user_id,
        "jobType": JOB_TYPE.to_str_or_none(job.job_type),
        "targetType": TARGET_TYPE.to_str_or_none(job.target_type),
        "targetId": job.target_id,
        "snapshotId": opt(job, "snapshot_id"),
        "status": JOB_STATUS.to_str_or_none(job.status),
        "priority": job.priority,
        "params": struct_to_dict(job.params) if job.HasField("params") else {},
        "apiKeyMode": API_KEY_MODE.to_str_or_none(job.api_key_mode),
        "credentialId": opt(job, "credential_id"),
        "modelProvider": job.model_provider,
        "modelName": job.model_name,
        "promptVersion": opt(job, "prompt_version"),
        "outputSchemaVersion": opt(job, "output_schema_version"),
        "attemptNo": job.attempt_no,
        "retryCount": job.retry_count,
        "maxRetryCount": job.max_retry_count,
        "timeoutSeconds": job.timeout_seconds,
        "lockedBy": opt(job, "locked_by"),
        "lockUntil": ts(job, "lock_until"),
        "availableAt": ts(job, "available_at"),
        "cancelRequested": job.cancel_requested,
        "errorCode": opt(job, "error_code"),
        "errorMessage": opt(job, "error_message"),
        "retriedFromJobId": opt(job, "retried_from_job_id"),
        "createdAt": ts(job, "created_at"),
        "updatedAt": ts(job, "updated_at"),
        "startedAt": ts(job, "started_at"),
        "finishedAt": ts(job, "finished_at"),
        "parentJobId": opt(job, "parent_job_id"),
        "batch": batch_json(job.batch) if job.HasField("batch") else None,
    }


def batch_json(batch: Any) -> dict[str, Any]:
    """A ``JobBatch`` → the ``batch`` JSON of a parent (reference §10.3)."""
    return {
        "total": batch.total,
        "pending": batch.pending,
        "running": batch.running,
        "succeeded": batch.succeeded,
        "failed": batch.failed,
        "cancelled": batch.cancelled,
        "minSuccessRatio": batch.min_success_ratio,
    }


def event_json(event: Any) -> dict[str, Any]:
    """A ``JobEvent`` → JSON; ``fromStatus`` null for the creation event."""
    return {
        "jobId": event.job_id,
        "fromStatus": JOB_STATUS.to_str_or_none(event.from_status),
        "toStatus": JOB_STATUS.to_str_or_none(event.to_status),
        "errorCode": opt(event, "error_code"),
        "actor": event.actor,
        "attemptNo": event.attempt_no,
        "at": ts(event, "at"),
        "modelProvider": opt(event, "model_provider"),
    }


def invocation_json(inv: Any) -> dict[str, Any]:
    """An ``Invocation`` → JSON (never a key)."""
    return {
        "id": inv.id,
        "jobId": inv.job_id,
        "attemptNo": inv.attempt_no,
        "modelProvider": inv.model_provider,
        "modelName": inv.model_name,
        "apiKeyMode": API_KEY_MODE.to_str_or_none(inv.api_key_mode),
        "credentialId": opt(inv, "credential_id"),
        "promptTokens": inv.prompt_tokens,
        "completionTokens": inv.completion_tokens,
        "cacheHitTokens": inv.cache_hit_tokens,
        "latencyMs": inv.latency_ms,
        "outcome": inv.outcome,
        "errorCode": opt(inv, "error_code"),
        "providerRequestId": opt(inv, "provider_request_id"),
        "costUsd": float(inv.cost_usd),
        "createdAt": ts(inv, "created_at"),
        "promptVersion": opt(inv, "prompt_version"),
    }


def material_json(material: Any, next_blocks_page_token: str = "") -> dict[str, Any]:
    """A ``Material`` → ``{"materialId","title","blocks":[…],"blockCount","createdAt",
    "nextBlocksPageToken"}``."""
    return {
        "materialId": material.material_id,
        "title": material.title,
        "blocks": [
            {"blockId": b.block_id, "ordinal": b.ordinal, "text": b.text} for b in material.blocks
        ],
        "blockCount": material.block_count,
        "createdAt": ts(material, "created_at"),
        "nextBlocksPageToken": next_blocks_page_token or None,
    }


def material_summary_json(material: Any) -> dict[str, Any]:
    """A listed ``Material`` → ``{"materialId","title","blockCount","createdAt"}``."""
    return {
        "materialId": material.material_id,
        "title": material.title,
        "blockCount": material.block_count,
        "createdAt": ts(material, "created_at"),
    }


def knowledge_point_json(kp: Any) -> dict[str, Any]:
    """A ``KnowledgePoint`` → JSON."""
    return {
        "knowledgePointId": kp.knowledge_point_id,
        "materialId": kp.material_id,
        "name": kp.name,
        "blockIds": list(kp.block_ids),
        "createdAt": ts(kp, "created_at"),
    }


_CREDENTIAL_STATUS = {1: "valid", 2: "invalid"}


def credential_json(cred: Any) -> dict[str, Any]:
    """A masked ``Credential`` → JSON (never the plaintext key)."""
    return {
        "credentialId": cred.credential_id,
        "provider": cred.provider,
        "maskedKey": cred.masked_key,
        "status": _CREDENTIAL_STATUS.get(cred.status),
        "createdAt": ts(cred, "created_at"),
        "baseUrl": cred.base_url or None,
    }


def breaker_json(breaker: Any) -> dict[str, Any]:
    """A ``CircuitBreaker`` → JSON: the first provider's fields, and every provider's
    in ``providers`` (reference §9.4)."""
    return {
        "state": BREAKER_STATE.to_str_or_none(breaker.state),
        "consecutiveFailures": breaker.consecutive_failures,
        "openedAt": ts(breaker, "opened_at"),
        "halfOpenAt": ts(breaker, "half_open_at"),
        "providers": [
            {
                "name": p.name,
                "state": BREAKER_STATE.to_str_or_none(p.state),
                "consecutiveFailures": p.consecutive_failures,
                "openedAt": ts(p, "opened_at"),
                "halfOpenAt": ts(p, "half_open_at"),
            }
            for p in breaker.providers
        ],
    }


def cost_row_json(row: Any) -> dict[str, Any]:
    """A ``CostRow`` → JSON; ``costUsd`` a number."""
    return {
        "key": row.key,
        "calls": row.calls,
        "promptTokens": row.prompt_tokens,
        "completionTokens": row.completion_tokens,
        "cacheHitTokens": row.cache_hit_tokens,
        "costUsd": float(row.cost_usd),
    }


def capabilities(values: Any) -> list[str]:
    """Repeated JobType → contract strings (unknown numbers dropped)."""
    return [s for s in (JOB_TYPE.to_str_or_none(v) for v in values) if s]


def runtime_worker_json(worker: Any) -> dict[str, Any]:
    """A registry ``RuntimeWorker`` → the shim health JSON."""
    return {
        "instanceId": worker.instance_id,
        "capabilities": capabilities(worker.capabilities),
        "inFlight": worker.in_flight,
        "lastSeenAt": ts(worker, "last_seen_at"),
        "status": worker.status,
    }


def worker_status_json(resp: Any) -> dict[str, Any]:
    """``WorkerStatusService.GetStatus`` answer → JSON."""
    return {
        "instanceId": resp.instance_id,
        "version": resp.version,
        "capabilities": capabilities(resp.capabilities),
        "inFlight": [
            {
                "jobId": j.job_id,
                "attemptNo": j.attempt_no,
                "jobType": JOB_TYPE.to_str_or_none(j.job_type),
                "startedAt": ts(j, "started_at"),
                "ageSeconds": float(j.age_seconds),
            }
            for j in resp.in_flight
        ],
        "counters": {k: int(v) for k, v in resp.counters.items()},
        "draining": resp.draining,
        "concurrency": resp.concurrency,
        "startedAt": ts(resp, "started_at"),
    }


def pb_enum(enum_map: Any, value: str) -> Any:
    """Contract string → proto enum value, typed loosely for the generated stubs.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unknown value (closed enums, reference §4).
    """
    return enum_map.to_proto(value)


def job_types(values: list[str]) -> list[int]:
    """Contract job type strings → enum numbers (unknown → ``INVALID_ARGUMENT``)."""
    return [JOB_TYPE.to_proto(v) for v in values]


def attempt_json(attempt: Any) -> dict[str, Any]:
    """A ``JobAttempt`` → JSON (its events and model calls as in the admin job view)."""
    return {
        "attemptNo": attempt.attempt_no,
        "runtimeInstanceId": opt(attempt, "runtime_instance_id"),
        "startedAt": ts(attempt, "started_at"),
        "endedAt": ts(attempt, "ended_at"),
        "outcome": JOB_STATUS.to_str_or_none(attempt.outcome),
        "errorCode": opt(attempt, "error_code"),
        "latencyMs": attempt.latency_ms,
        "costUsd": float(attempt.cost_usd),
        "events": [event_json(e) for e in attempt.events],
        "invocations": [invocation_json(i) for i in attempt.invocations],
    }


def snapshot_summary_json(summary: Any) -> dict[str, Any]:
    """A ``SnapshotSummary`` → JSON."""
    return {
        "snapshotId": summary.snapshot_id,
        "schemaVersion": summary.schema_version,
        "targetType": summary.target_type,
        "targetId": summary.target_id,
        "contentHash": summary.content_hash,
        "payloadBytes": summary.payload_bytes,
        "materialCount": summary.material_count,
        "blockCount": summary.block_count,
        "knowledgePointCount": summary.knowledge_point_count,
        "stats": struct_to_dict(summary.stats) if summary.HasField("stats") else {},
    }


def throughput_json(resp: Any, hours: int) -> dict[str, Any]:
    """A ``GetJobThroughputResponse`` → the ``GET /admin/ai/throughput`` JSON."""
    return {
        "hours": hours,
        "from": ts(resp, "from_time"),
        "to": ts(resp, "to_time"),
        "minutes": [
            {
                "minute": ts(m, "minute"),
                "succeeded": m.succeeded,
                "failed": m.failed,
                "cancelled": m.cancelled,
            }
            for m in resp.minutes
        ],
        "succeeded": resp.succeeded,
        "failed": resp.failed,
        "cancelled": resp.cancelled,
        "failureRate": opt(resp, "failure_rate"),
    }
