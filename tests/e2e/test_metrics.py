"""Prometheus endpoints of every service, scraped before and after real jobs.

The shared system serves job_service (``JOB_SERVICE_METRICS_PORT``), the
worker (``WORKER_METRICS_PORT``) and credential_service
(``CREDENTIAL_SERVICE_METRICS_PORT``) on free ports, and the gateway's
``/metrics``. Jobs run through the public API; the test asserts that the
job counters (created/finished by type and outcome), pickup latency, run
time, queue depth by state, lease losses, model latency and tokens, and the
breaker state all exist and MOVE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import RunningSystem

pytestmark = pytest.mark.e2e

Samples = list[tuple[str, dict[str, str], float]]
JOB_TYPE = "learning_state_analysis"


def scrape(url: str) -> Samples:
    """Every sample of a Prometheus text endpoint as (name, labels, value)."""
    reply = httpx.get(url, timeout=10.0, trust_env=False)
    assert reply.status_code == 200, f"{url}: {reply.status_code}"
    assert reply.headers["content-type"].startswith("text/plain"), reply.headers
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    ]


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())
    )


def has(samples: Samples, name: str) -> bool:
    return any(n == name for n, _, _ in samples)


class Scrapes:
    """The four endpoints of one system."""

    def __init__(self, system: RunningSystem) -> None:
        self.urls = {
            "job": system.metrics_url("JOB_SERVICE_METRICS_PORT"),
            "worker": system.metrics_url("WORKER_METRICS_PORT"),
            "credential": system.metrics_url("CREDENTIAL_SERVICE_METRICS_PORT"),
            "gateway": f"{system.gateway_url}/metrics",
        }

    def all(self) -> dict[str, Samples]:
        return {name: scrape(url) for name, url in self.urls.items()}


def wait_for(
    what: str, probe: Callable[[], Samples], check: Callable[[Samples], bool], timeout: float = 15.0
) -> Samples:
    """Scrape until ``check`` holds (gauges are refreshed on an interval)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = probe()
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"metrics: {what} not seen within {timeout} s")
        time.sleep(0.1)


def internal_headers(system: RunningSystem) -> Mapping[str, str]:
    return {"x-internal-api-key": system.internal_token, "X-Runtime-Instance-Id": "e2e-intruder"}


def run_jobs(system: RunningSystem, token: str, user: str, n: int) -> list[dict[str, Any]]:
    created = [system.create_job(token, user) for _ in range(n)]
    return [system.wait_terminal(token, job["jobId"]) for job in created]


def test_every_endpoint_serves_its_metrics(system: RunningSystem) -> None:
    scrapes = Scrapes(system).all()
    job, worker, cred, gw = (scrapes[k] for k in ("job", "worker", "credential", "gateway"))
    for name in (
        "airt_jobs_queue_depth",
        "airt_platform_breaker_state",
        "airt_platform_breaker_consecutive_failures",
    ):
        assert has(job, name), f"job_service lacks {name}"
    # the breaker is one-hot over its three states
    states = {lab["state"]: v for n, lab, v in job if n == "airt_platform_breaker_state"}
    assert set(states) == {"closed", "open", "half_open"} and sum(states.values()) == 1
    for name in ("airt_worker_in_flight", "airt_worker_draining"):
        assert has(worker, name), f"worker lacks {name}"
    # the launcher's readiness probe already went through the gateway
    assert has(gw, "gateway_http_requests_total") and has(
        gw, "gateway_http_request_duration_seconds_count"
    )
    assert has(cred, "python_info")  # credential_service's endpoint is up (its counters
    # appear with the first resolve, checked below)


def test_metrics_move_with_jobs(system: RunningSystem) -> None:
    user = "e2e-metrics-user"
    token = system.token(user)
    scrapes = Scrapes(system)
    before = scrapes.all()

    # a job held by a slow model answer shows in the queue depth while it runs
    system.add_faults([{"kind": "delay", "ms": 2500, "count": 1}])
    slow = system.create_job(token, user)
    wait_for(
        "queue depth of the held job",
        lambda: scrape(scrapes.urls["job"]),
        lambda s: total(s, "airt_jobs_queue_depth", job_type=JOB_TYPE) >= 1,
    )
    assert system.wait_terminal(token, slow["jobId"])["status"] == "succeeded"
    done = run_jobs(system, token, user, 2)
    assert all(j["status"] == "succeeded" for j in done), done
    wait_for(
        "queue depth back to 0",
        lambda: scrape(scrapes.urls["job"]),
        lambda s: total(s, "airt_jobs_queue_depth", job_type=JOB_TYPE) == 0,
    )

    # a holder call from a runtime that holds no lease: a lease loss (LOCK_NOT_HELD)
    with system.client() as http:
        refused = http.post(
            f"/internal/runtime/jobs/{slow['jobId']}/heartbeat",
            json={"attemptNo": 1},
            headers=internal_headers(system),
        )
    assert refused.status_code == 409 and refused.json()["code"] == "LOCK_NOT_HELD", refused.text

    after = scrapes.all()
    jb, ja = before["job"], after["job"]
    wb, wa = before["worker"], after["worker"]
    n = 3

    def moved(
        samples_b: Samples, samples_a: Samples, name: str, by: float = 1, **labels: str
    ) -> None:
        b, a = total(samples_b, name, **labels), total(samples_a, name, **labels)
        assert a - b >= by, f"{name}{labels or ''}: {b} → {a} (expected +{by})"

    # job_service: created / finished by type and outcome, pickup latency, run time, lease losses
    moved(jb, ja, "airt_jobs_created_total", n, job_type=JOB_TYPE, api_key_mode="platform_key")
    moved(jb, ja, "airt_jobs_finished_total", n, job_type=JOB_TYPE, outcome="succeeded")
    moved(jb, ja, "airt_job_pickup_latency_seconds_count", n, job_type=JOB_TYPE)
    moved(jb, ja, "airt_job_run_seconds_count", n, job_type=JOB_TYPE, outcome="succeeded")
    # the held job ran ≥ 2.5 s: the run-time sum grew by at least that
    moved(jb, ja, "airt_job_run_seconds_sum", 2.4, job_type=JOB_TYPE)
    moved(jb, ja, "airt_lease_losses_total", 1, where="heartbeat")

    # worker: attempts, model latency and tokens
    moved(wb, wa, "airt_worker_attempts_total", n)
    moved(wb, wa, "airt_model_call_latency_seconds_count", n, outcome="succeeded")
    moved(wb, wa, "airt_model_call_latency_seconds_sum", 2.4)
    moved(wb, wa, "airt_model_tokens_total", 1, kind="prompt")
    moved(wb, wa, "airt_model_tokens_total", 1, kind="completion")

    # credential_service resolved the platform key for every attempt
    moved(
        before["credential"],
        after["credential"],
        "credential_resolves_total",
        n,
        api_key_mode="platform_key",
        outcome="ok",
    )

    # gateway: the creates went through the public API
    gb, ga = before["gateway"], after["gateway"]
    moved(
        gb, ga, "gateway_http_requests_total", n, method="POST", route="/v1/ai/jobs", status="201"
    )
    moved(
        gb, ga, "gateway_http_request_duration_seconds_count", n, method="POST", route="/v1/ai/jobs"
    )


def test_breaker_gauges_follow_the_breaker(system: RunningSystem) -> None:
    """INSUFFICIENT_BALANCE (model 402) counts for the breaker and is final at once:
    enough of them open it; the admin reset closes it; the gauges follow."""
    user = "e2e-metrics-breaker"
    token = system.token(user)
    admin = system.token("e2e-metrics-admin", "admin")
    threshold = int(system.env.get("BREAKER_FAILURE_THRESHOLD") or 5)
    job_url = Scrapes(system).urls["job"]
    with system.client(admin) as http:
        assert http.post("/admin/ai/circuit-breaker/reset").status_code == 200
    try:
        system.add_faults([{"kind": "status", "status": 402, "count": 1}])
        first = run_jobs(system, token, user, 1)[0]
        assert first["errorCode"] == "INSUFFICIENT_BALANCE", first
        wait_for(
            "one breaker failure",
            lambda: scrape(job_url),
            lambda s: total(s, "airt_platform_breaker_consecutive_failures") == 1,
        )
        system.add_faults([{"kind": "status", "status": 402, "count": threshold - 1}])
        rest = run_jobs(system, token, user, threshold - 1)
        assert all(j["errorCode"] == "INSUFFICIENT_BALANCE" for j in rest), rest
        opened = wait_for(
            "breaker open",
            lambda: scrape(job_url),
            lambda s: total(s, "airt_platform_breaker_state", state="open") == 1,
        )
        assert total(opened, "airt_platform_breaker_state", state="closed") == 0
        assert (
            total(opened, "airt_jobs_finished_total", job_type=JOB_TYPE, outcome="failed")
            >= threshold
        )
        with system.client(token) as http:
            refused = http.post(
                "/v1/ai/jobs",
                json={"jobType": JOB_TYPE, "targetType": "user", "targetId": user},
            )
        assert refused.status_code == 503 and refused.json()["code"] == "PLATFORM_CIRCUIT_OPEN"
    finally:
        with system.client(admin) as http:
            assert http.post("/admin/ai/circuit-breaker/reset").status_code == 200
    closed = wait_for(
        "breaker closed again",
        lambda: scrape(job_url),
        lambda s: total(s, "airt_platform_breaker_state", state="closed") == 1,
    )
    assert total(closed, "airt_platform_breaker_consecutive_failures") == 0
