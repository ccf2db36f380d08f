"""The operator's console (``GET /admin/console``, reference §9.5) in headless Chromium,
driven with Playwright, on a real system (the launcher's processes, one worker, the
model stand-in).

The data: a fresh user with two succeeded jobs, then, a second later, a
``weak_point_analysis`` job the stand-in fails with HTTP 400 once
(``MODEL_BAD_REQUEST``, not retryable). The flows an operator follows:

* a user token is refused and not kept;
* find the failed job by its user → open it → its attempt and the model call's
  error → re-run it → the new job appears and succeeds;
* filter by job type and by creation time (and a refused, empty range);
* the overview: jobs per minute and the failure rate (the API's numbers), the
  breaker(s), the workers, the cost per day;
* a job type's prompts: versions, an upload, the split, a rollback by hand and the guard's.

Each page's screenshot must not be blank. They go to a temporary folder, or, with
``CONSOLE_SCREENSHOTS=update``, to ``tests/artifacts/console/`` (the checked-in ones), so
a test run leaves the working tree as it was.
Skipped only when Chromium is absent (``/usr/bin/chromium``; CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RunningSystem

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
CHECKED_IN = Path(__file__).resolve().parents[1] / "artifacts" / "console"
ARTIFACTS = (
    CHECKED_IN
    if os.environ.get("CONSOLE_SCREENSHOTS") == "update"
    else Path(tempfile.gettempdir()) / f"airt-console-shots-{os.getpid()}"
)
STATES = ("pending", "locked", "running", "succeeded", "failed", "cancelled")
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(
            "headless Chromium not installed (/usr/bin/chromium): "
            "apt-get install chromium chromium-driver (.ci/run does)"
        )
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """One browser tab on the console, with the page's errors collected."""

    def __init__(self, page: Any, system: RunningSystem) -> None:
        self.page = page
        self.system = system
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on(
            "console",
            lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None,
        )
        page.set_default_timeout(WAIT_MS)

    def open(self, hash_: str = "") -> None:
        self.page.goto(f"{self.system.gateway_url}/admin/console{hash_}")

    def login(self, token: str) -> None:
        self.open()
        self.page.fill("#token", token)
        self.page.click("#save")
        self.expect("#app").to_be_visible()

    def go(self, hash_: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", hash_)

    def expect(self, css: str) -> Any:
        from playwright.sync_api import expect

        return expect(self.page.locator(css))  # waits up to WAIT_MS (see browser())

    def text(self, css: str) -> str:
        return str(self.page.locator(css).inner_text())

    def rows(self) -> list[str]:
        return [str(r) for r in self.page.locator("#jobTable tr[data-job]").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )]  # fmt: skip

    def shot(self, name: str, min_bytes: int = 30_000) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert_png_not_blank(path, min_bytes)
        return path


@pytest.fixture
def console(browser: Any, system: RunningSystem) -> Iterator[Console]:
    context = browser.new_context(viewport={"width": 1366, "height": 900}, locale="en-GB")
    try:
        yield Console(context.new_page(), system)
    finally:
        context.close()


@pytest.fixture(scope="module")
def data(system: RunningSystem) -> dict[str, Any]:
    """A fresh user: two succeeded jobs, then (a second later) one failed MODEL_BAD_REQUEST."""
    user = f"e2e-console-{uuid.uuid4().hex[:8]}"
    token = system.token(user)
    succeeded = []
    for _ in range(2):
        job = system.create_job(token, user)
        assert system.wait_terminal(token, job["jobId"])["status"] == "succeeded"
        succeeded.append(job)
    # the failed job is created in a later second than the others (the time filter's edge)
    edge = _parse(succeeded[-1]["createdAt"]).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < edge + timedelta(milliseconds=50):
        time.sleep(0.05)
    system.add_faults([{"kind": "status", "status": 400, "count": 1}])
    failed = system.create_job(token, user, "weak_point_analysis")
    done = system.wait_terminal(token, failed["jobId"])
    assert (done["status"], done["errorCode"]) == ("failed", "MODEL_BAD_REQUEST"), done
    assert _parse(done["createdAt"]) >= edge
    return {"user": user, "succeeded": [j["jobId"] for j in succeeded], "failed": done}


def _parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _admin(system: RunningSystem) -> str:
    return system.token("e2e-console-admin", "admin")


def _api(system: RunningSystem, path: str) -> Any:
    with system.client(_admin(system)) as http:
        reply = http.get(path)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _counts(console: Console) -> dict[str, str]:
    return {s: console.text(f'.count[data-state="{s}"] b') for s in STATES}


def test_console_refuses_a_user_token(console: Console, data: dict[str, Any]) -> None:
    console.open()
    console.page.evaluate("sessionStorage.clear()")
    console.open()
    console.expect("#login").to_be_visible()
    console.page.fill("#token", console.system.token(data["user"]))
    console.page.click("#save")
    console.expect("#loginError").to_contain_text("403")
    console.expect("#login").to_be_visible()
    console.expect("#app").to_be_hidden()
    assert console.page.evaluate("sessionStorage.getItem('airuntime.adminToken')") is None
    console.shot("login-refused", min_bytes=10_000)  # a small form on a dark page


def test_find_a_failed_job_by_user_open_it_and_rerun_it(
    console: Console, data: dict[str, Any]
) -> None:
    system, user, failed = console.system, data["user"], data["failed"]
    console.login(_admin(system))

    # the list, filtered by the user and the failed state
    console.page.fill("#fUser", user)
    console.page.select_option("#fStatus", "failed")
    console.page.click("#apply")
    console.expect(f'#jobTable tr[data-job="{failed["jobId"]}"]').to_be_visible()
    assert console.rows() == [failed["jobId"]]
    # counts are the user's jobs per state (every filter but the status), as the API says
    api = _api(system, f"/admin/ai/jobs?userId={user}&includeCounts=true")["counts"]
    assert (api["succeeded"], api["failed"]) == (2, 1)
    console.expect('.count[data-state="failed"] b').to_have_text("1")
    assert _counts(console) == {s: str(api[s]) for s in STATES}
    console.shot("jobs-failed-by-user")

    # the job's page: its attempt, the model call's error, the error
    console.page.click(f'#jobTable tr[data-job="{failed["jobId"]}"] td:nth-child(2)')
    console.expect("#jobId").to_have_text(failed["jobId"])
    detail = _api(system, f"/admin/ai/jobs/{failed['jobId']}")
    (attempt,) = detail["attempts"]
    (call,) = attempt["invocations"]
    assert call["errorCode"] == "MODEL_BAD_REQUEST"
    console.expect("#jobErrorCode").to_have_text("MODEL_BAD_REQUEST")
    console.expect("#attempt-1 .attemptError").to_have_text("MODEL_BAD_REQUEST")
    console.expect("#attempt-1 .pill").to_have_text("failed")
    console.expect(f'#attempt-1 tr[data-invocation="{call["id"]}"] .callError').to_have_text(
        "MODEL_BAD_REQUEST"
    )
    console.expect(f'#attempt-1 tr[data-invocation="{call["id"]}"] .provider').to_have_text(
        call["modelProvider"]
    )
    assert console.page.locator("#attempt-1 .timeline li").count() == len(attempt["events"])
    console.expect('#attempt-1 .timeline li[data-to="failed"]').to_have_count(1)
    assert json.loads(console.text("#params")) == detail["params"]
    console.expect("#snapshot").to_contain_text(detail["snapshotId"])
    console.expect("#cancel").to_be_disabled()
    console.shot("job-failed")

    # re-run: the page moves to the new job, which succeeds
    console.page.click("#rerun")
    console.expect("#retriedFrom").to_have_text(failed["jobId"])
    new_id = console.text("#jobId")
    assert new_id != failed["jobId"]
    console.expect("#jobStatus").to_have_text("succeeded")
    console.expect("#attempt-1 .pill").to_have_text("succeeded")
    console.expect("#attempt-1 tr[data-invocation] td.succeeded").to_have_count(1)
    console.expect("#rerun").to_be_disabled()
    console.shot("job-rerun-succeeded")

    # and it is in the user's list
    console.go(f"#/jobs?userId={user}")
    console.expect(f'#jobTable tr[data-job="{new_id}"]').to_be_visible()
    assert console.rows()[0] == new_id and len(console.rows()) == 4
    console.expect('.count[data-state="succeeded"] b').to_have_text("3")
    assert console.errors == []


def test_filter_by_type_and_creation_time(console: Console, data: dict[str, Any]) -> None:
    system, user, failed = console.system, data["user"], data["failed"]
    console.login(_admin(system))
    weak = {
        j["jobId"]
        for j in _api(system, f"/admin/ai/jobs?userId={user}&jobType=weak_point_analysis")["jobs"]
    }
    assert failed["jobId"] in weak

    console.page.fill("#fUser", user)
    console.page.select_option("#fType", "weak_point_analysis")
    console.page.click("#apply")
    console.expect(f'#jobTable tr[data-job="{failed["jobId"]}"]').to_be_visible()
    assert set(console.rows()) == weak
    console.expect("#countTotal").to_have_text(str(len(weak)))

    # created from the failed job's second on: the two earlier jobs drop out, whatever the type
    since = _parse(failed["createdAt"]).replace(microsecond=0)
    console.page.select_option("#fType", "")
    console.page.fill("#fFrom", since.strftime("%Y-%m-%dT%H:%M:%S"))
    console.page.click("#apply")
    console.expect("#countTotal").to_have_text(str(len(weak)))
    console.expect(f'#jobTable tr[data-job="{failed["jobId"]}"]').to_be_visible()
    assert set(console.rows()) == weak
    assert not set(data["succeeded"]) & set(console.rows())
    console.shot("jobs-by-creation-time")

    # an empty range is refused (400 INVALID_ARGUMENT), said on the page
    console.page.fill("#fTo", since.strftime("%Y-%m-%dT%H:%M:%S"))
    console.page.click("#apply")
    console.expect("#listError").to_contain_text("createdFrom must be before createdTo")
    # a range with no job
    console.page.fill("#fFrom", "2000-01-01T00:00:00")
    console.page.fill("#fTo", "2000-01-02T00:00:00")
    console.page.click("#apply")
    console.expect("#noJobs").to_be_visible()
    console.expect("#countTotal").to_have_text("0")
    assert [e for e in console.errors if "400" not in e] == []


def test_overview_jobs_per_minute_breakers_and_workers(
    console: Console, data: dict[str, Any]
) -> None:
    system, failed = console.system, data["failed"]
    console.login(_admin(system))
    console.go("#/overview")

    # the failure rate and the totals are the API's (nothing else runs meanwhile)
    api = _api(system, "/admin/ai/throughput?hours=6")
    assert api["failed"] >= 1 and api["failureRate"] is not None
    console.expect("#failureRate").to_have_text(f"{api['failureRate'] * 100:.1f}%")
    console.expect("#tFailed").to_have_text(str(api["failed"]))
    console.expect("#tSucceeded").to_have_text(str(api["succeeded"]))
    # the failed job's minute has a red bar
    minute = failed["finishedAt"][:16]
    bar = console.page.locator(f'#throughputChart rect.bar-failed[data-minute="{minute}"]')
    assert int(bar.get_attribute("data-count") or 0) >= 1
    assert float(bar.get_attribute("height") or 0) > 0

    breaker = _api(system, "/admin/ai/circuit-breaker")
    console.expect("#breakerState").to_have_text(breaker["state"])
    providers = breaker.get("providers") or []
    console.expect("#breakers tr[data-provider]").to_have_count(max(1, len(providers)))

    runtime = _api(system, "/admin/ai/runtime")
    console.expect("#runtimeStatus").to_have_text(runtime["status"])
    for worker in runtime["workers"]:
        console.expect(f'#workers tr[data-worker="{worker["instanceId"]}"]').to_contain_text(
            worker["status"]
        )
    console.expect("#costs rect.bar").to_have_count(14)
    today = datetime.now(UTC).date().isoformat()
    cost = _api(system, f"/admin/ai/costs?from={today}&to={today}&groupBy=day")["rows"]
    shown = console.page.locator(f'#costs rect.bar[data-day="{today}"]').get_attribute("data-cost")
    assert float(shown or 0) == pytest.approx(cost[0]["costUsd"] if cost else 0)

    # another window: the select changes the chart's span
    console.page.select_option("#hours", "1")
    console.expect("#throughputTotals").to_contain_text("in 1 h")
    console.page.select_option("#hours", "6")
    console.expect("#throughputTotals").to_contain_text("in 6 h")
    console.shot("overview")
    assert console.errors == []


def test_pages_of_a_users_jobs(console: Console, data: dict[str, Any]) -> None:
    """Two per page: older pages follow the API's page tokens, newer ones come back."""
    system, user = console.system, data["user"]
    everything = [j["jobId"] for j in _api(system, f"/admin/ai/jobs?userId={user}")["jobs"]]
    assert len(everything) >= 3
    console.login(_admin(system))
    console.go(f"#/jobs?userId={user}&pageSize=2")
    console.expect("#jobTable tr[data-job]").to_have_count(2)
    assert console.rows() == everything[:2]
    console.expect("#prev").to_be_disabled()
    console.page.click("#next")
    console.expect(f'#jobTable tr[data-job="{everything[2]}"]').to_be_visible()
    assert console.rows() == everything[2:4]
    console.expect("#pageInfo").to_have_text("page 2")
    console.page.click("#prev")
    console.expect(f'#jobTable tr[data-job="{everything[0]}"]').to_be_visible()
    assert console.rows() == everything[:2]
    # the counts are for the filter, not the page
    console.expect("#countTotal").to_have_text(str(len(everything)))
    assert console.errors == []


def test_cancel_a_running_job(console: Console, data: dict[str, Any]) -> None:
    """A job whose model call takes a while is cancelled from its page: the cancel is
    requested (shown in the timeline), and the job ends as the API says."""
    system, user = console.system, data["user"]
    system.add_faults([{"kind": "delay", "ms": 8000, "count": 1}])
    job = system.create_job(system.token(user), user)
    console.login(_admin(system))
    console.go(f"#/job/{job['jobId']}")
    console.expect("#jobStatus").to_have_text("running")
    console.expect("#rerun").to_be_disabled()
    console.page.click("#cancel")
    console.expect("#actionMsg").to_contain_text("Cancel requested")
    console.expect("#attempt-1 .timeline").to_contain_text("(cancel requested)")
    done = system.wait_terminal(system.token(user), job["jobId"])
    console.expect("#jobStatus").to_have_text(done["status"])
    assert done["status"] in ("cancelled", "succeeded")  # the cancel race of reference §2.3
    console.expect("#cancel").to_be_disabled()
    console.shot("job-cancelled")
    assert console.errors == []


def test_a_batch_shows_its_counts_and_children(console: Console, data: dict[str, Any]) -> None:
    """A batch's parent page (reference §10.3): its counts by state as the API says, its
    children in target order, each linking to its page, which links back."""
    system, user = console.system, data["user"]
    token = system.token(user)
    with system.client(token) as http:
        for title in ("Cells", "Rivers", "Stars"):
            made = http.post("/v1/materials", json={"title": title, "content": f"# {title}\n\nA."})
            assert made.status_code == 201, made.text
        system.add_faults([{"kind": "status", "status": 400, "count": 1}])
        body = {
            "jobType": "learning_state_analysis",
            "targetsOf": {"targetType": "material"},
            "minSuccessRatio": 0.5,
        }
        reply = http.post("/v1/ai/job-batches", json=body)
        assert reply.status_code == 201, reply.text
    parent = reply.json()
    done = system.wait_terminal(token, parent["jobId"])
    assert done["status"] == "succeeded" and done["batch"]["failed"] == 1, done
    kids = _api(system, f"/admin/ai/jobs?parentJobId={parent['jobId']}")["jobs"][::-1]
    assert len(kids) == 3

    console.login(_admin(system))
    console.go(f"#/jobs?userId={user}")
    console.expect(f'#jobTable tr[data-job="{parent["jobId"]}"] .chip').to_have_text("batch 2/3")
    console.go(f"#/job/{parent['jobId']}")
    console.expect("#jobStatus").to_have_text("succeeded")
    for state in ("total", "pending", "running", "succeeded", "failed", "cancelled"):
        expected = done["batch"]["total" if state == "total" else state]
        console.expect(f'#batchCounts [data-batch="{state}"] b').to_have_text(str(expected))
    rows = console.page.locator("#childTable tr[data-child]").evaluate_all(
        "rows => rows.map(r => r.dataset.child)"
    )
    assert rows == [k["jobId"] for k in kids]
    console.expect(f'#childTable tr[data-child="{kids[0]["jobId"]}"] .pill').to_have_text(
        kids[0]["status"]
    )
    console.expect("#attempts").to_contain_text("never claimed")
    console.shot("batch-parent")
    failed = next(k for k in kids if k["status"] == "failed")
    console.page.click(f'#childTable tr[data-child="{failed["jobId"]}"] td:nth-child(2)')
    console.expect("#jobId").to_have_text(failed["jobId"])
    console.expect("#parentJob").to_have_text(parent["jobId"])
    console.expect("#jobErrorCode").to_have_text("MODEL_BAD_REQUEST")
    assert console.errors == []


def test_breakers_of_each_provider(console: Console, data: dict[str, Any]) -> None:
    """With a ``providers`` list (reference §9.4) each provider's breaker has its row and its
    reset names it (the answer is stubbed in the browser; the real one has the fields)."""
    answer = {
        "state": "closed",
        "consecutiveFailures": 0,
        "openedAt": None,
        "halfOpenAt": None,
        "providers": [
            {"name": "deepseek", "state": "closed", "consecutiveFailures": 0,
             "openedAt": None, "halfOpenAt": None},
            {"name": "backup", "state": "open", "consecutiveFailures": 5,
             "openedAt": "2026-12-03T10:00:00.000Z", "halfOpenAt": "2026-12-03T10:01:00.000Z"},
        ],
    }  # fmt: skip

    def breaker(route: Any) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answer))

    console.page.route("**/admin/ai/circuit-breaker**", breaker)
    console.login(_admin(console.system))
    console.go("#/overview")
    console.expect("#breakers tr[data-provider]").to_have_count(2)
    console.expect('#breakers tr[data-provider="backup"]').to_contain_text("open")
    console.expect('#breakers tr[data-provider="backup"]').to_contain_text("5")
    console.expect('#breakers tr[data-provider="deepseek"] button.reset').to_be_disabled()
    with console.page.expect_request("**/admin/ai/circuit-breaker/reset**") as sent:
        console.page.click('#breakers tr[data-provider="backup"] button.reset')
    assert sent.value.method == "POST"
    assert sent.value.url.endswith("/admin/ai/circuit-breaker/reset?provider=backup")
    console.expect('#breakers tr[data-provider="backup"]').to_be_visible()
    assert console.errors == []


def test_providers_limits_usage_and_pauses(console: Console, data: dict[str, Any]) -> None:
    """The providers panel (reference §10.2): each provider's usage against its limits,
    a 429's pause, its breaker; the real answer first, then a stubbed one with limits."""
    real = _api(console.system, "/admin/ai/providers")["providers"]
    console.login(_admin(console.system))
    console.go("#/overview")
    console.expect("#providers tr[data-provider]").to_have_count(len(real))
    answer = {
        "providers": [
            {"name": "deepseek",
             "limits": {"requestsPerMinute": 60, "tokensPerMinute": None, "maxConcurrent": 4},
             "usage": {"requestsLastMinute": 60, "tokensLastMinute": 1234, "inFlight": 3},
             "pausedUntil": "2026-12-03T10:00:20.000Z",
             "breaker": {"name": "deepseek", "state": "closed", "consecutiveFailures": 0,
                         "openedAt": None, "halfOpenAt": None}},
            {"name": "backup",
             "limits": {"requestsPerMinute": None, "tokensPerMinute": None, "maxConcurrent": None},
             "usage": {"requestsLastMinute": 2, "tokensLastMinute": 40, "inFlight": 0},
             "pausedUntil": None,
             "breaker": {"name": "backup", "state": "open", "consecutiveFailures": 5,
                         "openedAt": None, "halfOpenAt": None}},
        ]
    }  # fmt: skip

    def providers(route: Any) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answer))

    console.page.route("**/admin/ai/providers", providers)
    console.go("#/overview")
    row = '#providers tr[data-provider="deepseek"]'
    console.expect(f"{row}").to_contain_text("/ 60")
    console.expect(f"{row} .warn").to_have_count(2)  # the minute is full, and the pause
    console.expect(f"{row}").to_contain_text("paused until")
    console.expect('#providers tr[data-provider="backup"]').to_contain_text("open")
    assert console.errors == []


def test_prompts_of_a_job_type_versions_split_stats_and_rollback(
    console: Console, data: dict[str, Any]
) -> None:
    """A job type's prompt page (reference §10.4): the shipped template, an upload refused
    naming its line, a variant uploaded from v1, a split set and rolled back by hand, then
    a variant that leaves the material out of the prompt (its outputs fail validation)
    rolled back by the guard, with the stats and the reason shown."""
    system, user = console.system, data["user"]
    jt, version = "flashcard_generation", f"v2-{uuid.uuid4().hex[:6]}"
    console.login(_admin(system))
    console.page.click("#navPrompts")
    console.expect('#promptsHead[data-job-type="quiz_generation"]').to_be_visible()
    console.page.select_option("#jobTypePick", jt)
    console.expect(f'#promptsHead[data-job-type="{jt}"]').to_be_visible()
    console.expect('#versions tr[data-version="v1"]').to_contain_text("shipped")
    console.page.click('#versions button.show[data-version="v1"]')
    console.expect("#template").to_contain_text(f"TASK: {jt}")
    console.expect("#template").not_to_contain_text("include")
    try:
        # start from v1: a template naming an unknown variable is refused with its line
        console.page.click('#versions button.startFrom[data-version="v1"]')
        console.expect("#newTemplate").to_have_value(
            re.compile(r"^\{% block system.*TASK: flash", re.S)
        )
        shipped = console.page.input_value("#newTemplate")
        line = 1 + shipped[: shipped.index("<snapshot>")].count("\n")
        console.page.fill("#newVersion", version)
        console.page.fill("#newTemplate", shipped.replace("<snapshot>", "{{ nope }}<snapshot>"))
        console.page.click("#upload")
        console.expect("#uploadMsg").to_contain_text(f"INVALID_PROMPT_TEMPLATE: line {line}:")
        # the variant: its snapshot's blocks renamed, so the model sees no material
        bad = shipped.replace(
            "{{ snapshot_json }}", "{{ snapshot_json|replace('\"blocks\":[', '\"gone\":[') }}"
        )
        console.page.fill("#newTemplate", bad)
        console.page.fill("#newDescription", "leaves the blocks out")
        console.page.click("#upload")
        console.expect("#uploadMsg").to_contain_text(f"Uploaded {version}")
        console.expect(f'#versions tr[data-version="{version}"]').to_contain_text("leaves")

        # a 1:1 split, then rolled back to the control by hand
        console.page.click("#addVariant")
        console.page.locator(".variantRow .vVersion").nth(1).select_option(version)
        console.page.locator(".variantRow .vWeight").nth(1).fill("1")
        console.page.click("#saveRouting")
        console.expect(f'#split tr[data-variant="{version}"] .share').to_have_text("50.0%")
        console.page.click("#rollBack")
        console.expect("#split tr[data-variant]").to_have_count(1)
        console.expect('#split tr[data-variant="v1"] .share').to_have_text("100.0%")

        # every new job on the variant (the control at weight 0), judged after 1 attempt
        console.page.locator(".variantRow .vWeight").nth(0).fill("0")
        console.page.click("#addVariant")
        console.page.locator(".variantRow .vVersion").nth(1).select_option(version)
        console.page.locator(".variantRow .vWeight").nth(1).fill("1")
        console.page.fill("#minAttempts", "1")
        console.page.click("#saveRouting")
        console.expect(f'#split tr[data-variant="{version}"] .share').to_have_text("100.0%")
        console.expect("#guardMin").to_have_text("1")
        token = system.token(user)
        job = system.create_job(token, user, jt)
        assert job["promptVersion"] == f"{jt}.{version}"
        done = system.wait_terminal(token, job["jobId"])
        assert (done["status"], done["errorCode"]) == ("failed", "INVALID_SCHEMA"), done
        console.expect("#rollback").to_be_visible()  # the guard's, shown at the next refresh
        console.expect("#rollbackReason").to_contain_text(version)
        console.expect(f'#stats tr[data-stats="{version}"] .attempts').to_have_text("1")
        console.expect(f'#stats tr[data-stats="{version}"] .invalidRate').to_have_text("100.0%")
        console.expect("#split tr[data-variant]").to_have_count(1)
        assert system.create_job(token, user, jt)["promptVersion"] == f"{jt}.v1"
        console.shot("prompts-rolled-back")
    finally:
        with system.client(_admin(system)) as http:
            http.put(
                f"/admin/ai/prompts/{jt}/routing",
                json={"variants": [{"version": "v1", "weight": 1}]},
            )
    assert console.errors == [e for e in console.errors if "422" in e]


def assert_png_not_blank(path: Path, min_bytes: int = 30_000) -> None:
    """A real PNG of the window's size with many distinct pixel values (not one flat colour)."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, depth, colour = 8, b"", 0, 0, 0, 0
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert width >= 1000 and height >= 800, (width, height)
    assert depth == 8 and colour in (2, 6), (depth, colour)
    assert len(raw) > min_bytes, f"screenshot suspiciously small ({len(raw)} bytes): blank?"
    step = 3 if colour == 2 else 4
    rows = 160  # the header and the top panels; unfiltering all of it in Python is slow
    pixels = unfilter(zlib.decompress(idat), width, rows, step)
    distinct = {pixels[i : i + 3] for i in range(0, len(pixels), step)}
    assert len(distinct) > 20, f"screenshot looks blank: {len(distinct)} distinct colours"


def unfilter(data: bytes, width: int, height: int, bpp: int) -> bytes:
    """Undo the PNG scanline filters (None, Sub, Up, Average, Paeth) of the first ``height`` rows."""
    stride = width * bpp
    out = bytearray()
    prev = bytearray(stride)
    pos = 0
    for _ in range(height):
        kind = data[pos]
        line = bytearray(data[pos + 1 : pos + 1 + stride])
        pos += 1 + stride
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                corner = prev[i - bpp] if i >= bpp else 0
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        out += line
        prev = line
    return bytes(out)
