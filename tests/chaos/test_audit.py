"""The audit itself: it must find what it claims to find (synthetic rows on MariaDB).

A clean history passes; a second result row, an extra business row, rows of a
failed job, a broken event path, a job missing from the table, a job left
running, two holders of one attempt and a retry locked again before its
backoff are each reported.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.engine import make_url

import job_service.learning.tables as lm
import job_service.store.tables as jm
from airuntime_common.canonical import content_hash
from chaos.audit import AuditConfig, audit
from chaos.system import pymysql_connector
from job_service.store.base import Base

pytestmark = pytest.mark.mysql

T0 = datetime(2026, 1, 1, 12, 0, 0)
ANALYSIS = {
    "summary": "s",
    "masteryLevel": 0.5,
    "strengths": [],
    "risks": [],
    "evidence": [],
}


def _job(
    job_id: str, status: str, *, attempt: int = 1, retries: int = 0, **kw: Any
) -> dict[str, Any]:
    row = {
        "job_id": job_id,
        "user_id": f"u-{job_id}",
        "job_type": "learning_state_analysis",
        "target_type": "user",
        "target_id": f"u-{job_id}",
        "status": status,
        "priority": 0,
        "params": {},
        "api_key_mode": "platform_key",
        "model_provider": "deepseek",
        "model_name": "deepseek-chat",
        "attempt_no": attempt,
        "retry_count": retries,
        "max_retry_count": 3,
        "timeout_seconds": 10,
        "available_at": T0,
        "cancel_requested": False,
        "created_at": T0,
        "updated_at": T0,
        "error_code": None,
        "lock_until": None,
        "locked_by": None,
    }
    row.update(kw)
    return row


def _path(
    job_id: str, steps: list[tuple[str | None, str, str | None, str, int, float]]
) -> list[dict[str, Any]]:
    return [
        {
            "job_id": job_id,
            "from_status": f,
            "to_status": t,
            "error_code": code,
            "actor": actor,
            "attempt_no": attempt,
            "at": T0 + timedelta(seconds=sec),
        }
        for f, t, code, actor, attempt, sec in steps
    ]


def _ok_path(job_id: str, actor: str = "runtime:w1") -> list[dict[str, Any]]:
    return _path(
        job_id,
        [
            (None, "pending", None, "user:u", 0, 0),
            ("pending", "locked", None, actor, 1, 1),
            ("locked", "running", None, actor, 1, 2),
            ("running", "succeeded", None, actor, 1, 3),
        ],
    )


def _result(job_id: str, attempt: int = 1, n: int = 0) -> dict[str, Any]:
    return {
        "result_id": f"r-{job_id}-{n}",
        "job_id": job_id,
        "attempt_no": attempt,
        "output_hash": "h" * 64,
        "idempotency_key": f"{job_id}:{attempt}:{n}",
        "output_schema_version": "v1",
        "output": ANALYSIS,
        "created_at": T0,
    }


def _analysis_row(job_id: str, n: int = 0) -> dict[str, Any]:
    return {
        "id": f"a-{job_id}-{n}",
        "user_id": f"u-{job_id}",
        "job_id": job_id,
        "ordinal": 0,
        "content_hash": content_hash(ANALYSIS) if n == 0 else f"{n:064d}",
        "created_at": T0,
        "summary": "s",
        "mastery_level": 0.5,
        "strengths": [],
        "risks": [],
        "evidence": [],
    }


def test_audit_finds_each_kind_of_problem(mysql_url: str) -> None:
    sync_url = make_url(mysql_url).set(drivername="mysql+pymysql")
    engine = create_engine(sync_url)
    assert jm.Job.__table__ is not None and lm.AiResult.__table__ is not None
    Base.metadata.create_all(engine)
    jobs = [
        _job("good", "succeeded"),
        _job("tworesults", "succeeded"),
        _job("extrarow", "succeeded"),
        _job("failedrows", "failed", error_code="MODEL_BAD_REQUEST"),
        _job("badpath", "succeeded"),
        _job("leftrunning", "running", lock_until=T0, locked_by="w1"),
        _job("twoholders", "succeeded", attempt=2, retries=1),
        _job("fastretry", "succeeded", attempt=2, retries=1),
    ]
    events = [
        *_ok_path("good"),
        *_ok_path("tworesults"),
        *_ok_path("extrarow"),
        *_path(
            "failedrows",
            [
                (None, "pending", None, "user:u", 0, 0),
                ("pending", "locked", None, "runtime:w1", 1, 1),
                ("locked", "failed", "MODEL_BAD_REQUEST", "runtime:w1", 1, 2),
            ],
        ),
        *_path(
            "badpath",
            [
                (None, "pending", None, "user:u", 0, 0),
                ("pending", "running", None, "runtime:w1", 1, 1),  # skipped locked
                ("running", "succeeded", None, "runtime:w1", 1, 3),
            ],
        ),
        *_path(
            "leftrunning",
            [
                (None, "pending", None, "user:u", 0, 0),
                ("pending", "locked", None, "runtime:w1", 1, 1),
                ("locked", "running", None, "runtime:w1", 1, 2),
            ],
        ),
        *_path(
            "twoholders",
            [
                (None, "pending", None, "user:u", 0, 0),
                ("pending", "locked", None, "runtime:w1", 1, 1),
                ("locked", "running", None, "runtime:w2", 1, 2),  # another worker acted
                ("running", "pending", "NETWORK_ERROR", "runtime:w1", 1, 3),
                ("pending", "locked", None, "runtime:w1", 2, 10),
                ("locked", "succeeded", None, "runtime:w1", 2, 11),
            ],
        ),
        *_path(
            "fastretry",
            [
                (None, "pending", None, "user:u", 0, 0),
                ("pending", "locked", None, "runtime:w1", 1, 1),
                ("locked", "pending", "TEMPORARY_PROVIDER_ERROR", "runtime:w1", 1, 2),
                ("pending", "locked", None, "runtime:w1", 2, 2.1),  # backoff 0.5 s ignored
                ("locked", "succeeded", None, "runtime:w1", 2, 3),
            ],
        ),
    ]
    results = [
        _result("good"),
        _result("tworesults"),
        _result("tworesults", n=1),
        _result("extrarow"),
        _result("badpath"),
        _result("twoholders", attempt=2),
        _result("fastretry", attempt=2),
    ]
    rows = [
        _analysis_row("good"),
        _analysis_row("tworesults"),
        _analysis_row("extrarow"),
        _analysis_row("extrarow", n=1),
        _analysis_row("failedrows"),
        _analysis_row("badpath"),
        _analysis_row("twoholders"),
        _analysis_row("fastretry"),
    ]
    with engine.begin() as conn:
        conn.execute(insert(jm.Job.__table__), jobs)
        conn.execute(insert(jm.JobEvent.__table__), events)
        conn.execute(insert(lm.AiResult.__table__), results)
        conn.execute(insert(lm.AiLearningAnalysis.__table__), rows)
    engine.dispose()

    connect = pymysql_connector(mysql_url)
    clean = audit(connect, ["good"], AuditConfig(backoff_base=0.5))
    # database-wide findings (rows of the failed job, the extra rows) show even here
    assert clean.by_status == {"succeeded": 1} and clean.lost == 0 and clean.stuck == 0

    ids = [j["job_id"] for j in jobs] + ["never-written"]
    rep = audit(connect, ids, AuditConfig(backoff_base=0.5, live_workers=set()))
    text = "\n".join(rep.problems)
    assert rep.lost == 1 and "never-written" in text
    assert rep.stuck == 1 and "leftrunning" in text
    assert "tworesults: 2 result rows" in text
    assert "extrarow: 2 business rows for 1 items" in text
    assert "failedrows" in text and "not succeeded" in text
    assert "badpath: transition pending→running not allowed" in text
    assert "twoholders: attempt 1 acted on by ['runtime:w1', 'runtime:w2']" in text
    assert "fastretry: retry 1 (TEMPORARY_PROVIDER_ERROR) locked after 0.100 s" in text
    assert rep.failed_by_code == {"MODEL_BAD_REQUEST": 1}
    assert rep.retries == {"NETWORK_ERROR": 1, "TEMPORARY_PROVIDER_ERROR": 1}
    assert rep.duplicates >= 3 and not rep.ok
    assert "good:" not in text
