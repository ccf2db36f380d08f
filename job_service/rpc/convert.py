"""Domain records ↔ protobuf messages for the JobService servicer (reference §3 field names)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2

from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.model_providers import ProviderConfig
from airuntime_common.timeutil import set_timestamp
from job_service.maintenance.workers import WorkerView
from job_service.services.console import AttemptView, SnapshotSummaryView
from job_service.store.records import EventRecord, InvocationRecord, JobRecord
from zhixi.airuntime.job.v1 import message_pb2 as msg


def _enum(number: int) -> Any:
    """Enum number for a generated message field (the stubs type enum fields narrowly)."""
    return number


def to_struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    """A JSON object → ``google.protobuf.Struct``."""
    out = struct_pb2.Struct()
    if value:
        out.update(value)
    return out


def from_struct(value: struct_pb2.Struct, field: str) -> dict[str, Any]:
    """``google.protobuf.Struct`` → a JSON object (numbers come back as floats).

    Raises:
        AppError: INVALID_ARGUMENT naming ``field`` when the struct holds a number JSON
            cannot carry (NaN, ±Infinity: a Struct can, a JSON document cannot).
    """
    try:
        return json_format.MessageToDict(value)
    except ValueError:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field} holds a number JSON cannot carry (NaN or Infinity)",
            {"field": field},
        ) from None


def _set_time(message: Any, name: str, value: Any) -> None:
    if value is not None:
        set_timestamp(getattr(message, name), value)


def job_to_proto(job: JobRecord, provider: ProviderConfig | None = None) -> msg.Job:
    """Every field of a job; absent optionals stay unset (JSON null).

    Args:
        provider: for a claim or lock answer, the configured provider of the
            attempt (``job.model_provider``): its model name for the job's and its
            base URL are set (reference §9.4).
    """
    out = msg.Job(
        job_id=job.job_id,
        user_id=job.user_id,
        job_type=_enum(JOB_TYPE.to_proto(job.job_type)),
        target_type=_enum(TARGET_TYPE.to_proto(job.target_type)),
        target_id=job.target_id,
        status=_enum(JOB_STATUS.to_proto(job.status)),
        priority=job.priority,
        params=to_struct(job.params),
        api_key_mode=_enum(API_KEY_MODE.to_proto(job.api_key_mode)),
        model_provider=job.model_provider,
        model_name=job.model_name,
        attempt_no=job.attempt_no,
        retry_count=job.retry_count,
        max_retry_count=job.max_retry_count,
        timeout_seconds=job.timeout_seconds,
        cancel_requested=bool(job.cancel_requested),
        version=job.version,
    )
    for name in (
        "snapshot_id",
        "credential_id",
        "prompt_version",
        "output_schema_version",
        "locked_by",
        "error_code",
        "error_message",
        "retried_from_job_id",
        "trace_parent",
    ):
        value = getattr(job, name)
        if value is not None:
            setattr(out, name, value)
    for name in (
        "lock_until",
        "available_at",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "locked_at",
        "cancelled_at",
        "expired_at",
    ):
        _set_time(out, name, getattr(job, name))
    if job.batch_total is not None:
        # a batch's parent is never claimed, whatever its availableAt; its row holds it
        # out of the claim's range, the contract shows a new job's (reference §2.4)
        _set_time(out, "available_at", job.created_at)
    if provider is not None:
        out.provider_model_name = provider.model_for(job.model_name) or ""
        out.provider_base_url = provider.baseUrl if out.provider_model_name else ""
    if job.parent_job_id is not None:
        out.parent_job_id = job.parent_job_id
    if job.batch_total is not None:
        out.batch.CopyFrom(
            msg.JobBatch(
                total=job.batch_total,
                pending=job.batch_pending or 0,
                running=job.batch_running or 0,
                succeeded=job.batch_succeeded or 0,
                failed=job.batch_failed or 0,
                cancelled=job.batch_cancelled or 0,
                min_success_ratio=job.min_success_ratio or 1.0,
            )
        )
    return out


def event_to_proto(ev: EventRecord) -> msg.JobEvent:
    """One history row."""
    out = msg.JobEvent(
        job_id=ev.job_id,
        to_status=_enum(JOB_STATUS.to_proto(ev.to_status)),
        actor=ev.actor,
        attempt_no=ev.attempt_no,
    )
    if ev.from_status is not None:
        out.from_status = _enum(JOB_STATUS.to_proto(ev.from_status))
    if ev.error_code is not None:
        out.error_code = ev.error_code
    if ev.model_provider is not None:
        out.model_provider = ev.model_provider
    _set_time(out, "at", ev.at)
    return out


def invocation_to_proto(inv: InvocationRecord) -> msg.Invocation:
    """One model-call log row."""
    out = msg.Invocation(
        id=inv.id,
        job_id=inv.job_id,
        attempt_no=inv.attempt_no,
        model_provider=inv.model_provider,
        model_name=inv.model_name,
        api_key_mode=_enum(API_KEY_MODE.to_proto(inv.api_key_mode)),
        prompt_tokens=inv.prompt_tokens,
        completion_tokens=inv.completion_tokens,
        cache_hit_tokens=inv.cache_hit_tokens,
        latency_ms=inv.latency_ms,
        outcome=inv.outcome,
        cost_usd=float(inv.cost_usd),
    )
    for name in ("credential_id", "error_code", "provider_request_id", "prompt_version"):
        value = getattr(inv, name)
        if value is not None:
            setattr(out, name, value)
    _set_time(out, "created_at", inv.created_at)
    return out


def worker_to_proto(w: WorkerView) -> msg.RuntimeWorker:
    """One registry row."""
    caps = [_enum(JOB_TYPE.to_proto(c)) for c in w.capabilities if c in JOB_TYPE.values]
    out = msg.RuntimeWorker(
        instance_id=w.instance_id,
        capabilities=caps,
        in_flight=w.in_flight,
        status=w.status,
        status_address=w.status_address or "",
    )
    _set_time(out, "last_seen_at", w.last_seen_at)
    return out


def attempt_to_proto(a: AttemptView) -> msg.JobAttempt:
    """One attempt with its events and model calls (reference §9.5 console)."""
    out = msg.JobAttempt(
        attempt_no=a.attempt_no,
        events=[event_to_proto(e) for e in a.events],
        invocations=[invocation_to_proto(i) for i in a.invocations],
        latency_ms=a.latency_ms,
        cost_usd=float(a.cost_usd),
    )
    if a.runtime_instance_id is not None:
        out.runtime_instance_id = a.runtime_instance_id
    if a.outcome is not None:
        out.outcome = _enum(JOB_STATUS.to_proto(a.outcome))
    if a.error_code is not None:
        out.error_code = a.error_code
    _set_time(out, "started_at", a.started_at)
    _set_time(out, "ended_at", a.ended_at)
    return out


def snapshot_summary_to_proto(s: SnapshotSummaryView) -> msg.SnapshotSummary:
    """What a snapshot holds, without its text."""
    return msg.SnapshotSummary(
        snapshot_id=s.snapshot_id,
        schema_version=s.schema_version,
        target_type=s.target_type,
        target_id=s.target_id,
        content_hash=s.content_hash,
        payload_bytes=s.payload_bytes,
        material_count=s.material_count,
        block_count=s.block_count,
        knowledge_point_count=s.knowledge_point_count,
        stats=to_struct(s.stats),
    )
