"""The operator's console (``GET /admin/console``) in headless Chromium, on real data.

The system has succeeded jobs and one job failed with ``MODEL_BAD_REQUEST``
(a stand-in fault: HTTP 400 once). The page refuses a user token, then with
an admin token shows the jobs by state (the same numbers as the admin API),
the newest failure with its code, the cost-per-day chart with today's cost,
the breaker state and the worker. A screenshot goes to the test's tmp dir
(and to ``$CONSOLE_SCREENSHOT`` when set) and must not be blank.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RunningSystem

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1366,900",
]
STATES = ("pending", "locked", "running", "succeeded", "failed", "cancelled")
WAIT_SECONDS = 20


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip("headless Chromium not installed (/usr/bin/chromium, /usr/bin/chromedriver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def data(system: RunningSystem) -> dict[str, Any]:
    """Two succeeded jobs and one failed with MODEL_BAD_REQUEST (the newest failure)."""
    user = "e2e-console-user"
    token = system.token(user)
    succeeded = [system.create_job(token, user)["jobId"] for _ in range(2)]
    for job_id in succeeded:
        assert system.wait_terminal(token, job_id)["status"] == "succeeded"
    system.add_faults([{"kind": "status", "status": 400, "count": 1}])
    failed = system.create_job(token, user, "weak_point_analysis")
    done = system.wait_terminal(token, failed["jobId"])
    assert (done["status"], done["errorCode"]) == ("failed", "MODEL_BAD_REQUEST"), done
    return {"user": user, "succeeded": succeeded, "failed": done}


def _wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.1).until(condition)
    except TimeoutException:
        body = driver.find_element("tag name", "body").text
        raise AssertionError(f"console: {what} not shown within {WAIT_SECONDS} s\n{body}") from None


def _text(driver: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("css selector", css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _admin_api(system: RunningSystem, token: str, path: str) -> Any:
    with system.client(token) as http:
        reply = http.get(path)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_console_refuses_a_user_token(system: RunningSystem, driver: Any) -> None:
    driver.get(f"{system.gateway_url}/admin/console")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    assert driver.find_element("id", "login").is_displayed()
    driver.find_element("id", "token").send_keys(system.token("e2e-console-user"))
    driver.find_element("id", "save").click()
    _wait(driver, lambda d: "403" in _text(d, "#loginError"), "the refusal of a user token")
    assert driver.find_element("id", "login").is_displayed()
    assert not driver.find_element("id", "app").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('airuntime.adminToken')") is None
    driver.get_log("browser")  # drop the expected 403 lines


def test_console_shows_the_system(
    system: RunningSystem, driver: Any, data: dict[str, Any], tmp_path: Path
) -> None:
    admin = system.token("e2e-console-admin", "admin")
    driver.get(f"{system.gateway_url}/admin/console")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    # drop what the previous page logged: a refused panel call that landed after that
    # test read the log (this page has made no call yet: it shows the login form)
    driver.get_log("browser")
    driver.find_element("id", "token").send_keys(admin)
    driver.find_element("id", "save").click()
    assert driver.execute_script("return sessionStorage.getItem('airuntime.adminToken')") == admin

    # jobs by state: the same counts as the admin API (nothing else runs meanwhile)
    expected: dict[str, str] = {}
    for state in STATES:
        page = _admin_api(system, admin, f"/admin/ai/jobs?pageSize=100&status={state}")
        expected[state] = f"{len(page['jobs'])}{'+' if page['nextPageToken'] else ''}"
    assert int(expected["succeeded"].rstrip("+")) >= 2 and int(expected["failed"].rstrip("+")) >= 1

    def counts(d: Any) -> dict[str, str] | None:
        shown = {s: _text(d, f'[data-state="{s}"] b') for s in STATES}
        return shown if shown == expected else None

    _wait(driver, counts, f"the job counts {expected}")

    # newest failure with its code
    failed = data["failed"]
    _wait(
        driver,
        lambda d: failed["jobId"] in _text(d, "#newestFailure"),
        "the newest failure's job id",
    )
    assert _text(driver, "#newestCode") == "MODEL_BAD_REQUEST"
    newest = _text(driver, "#newestFailure")
    assert "weak_point_analysis" in newest and data["user"] in newest
    assert "MODEL_BAD_REQUEST" in _text(driver, "#failures")

    # cost per day: 14 bars, today's (UTC) is the only non-zero one for a fresh system
    today = datetime.now(UTC).date().isoformat()
    _wait(
        driver, lambda d: len(d.find_elements("css selector", "#costs rect.bar")) == 14, "14 bars"
    )
    bar = driver.find_element("css selector", f'#costs rect.bar[data-day="{today}"]')
    costs = _admin_api(system, admin, f"/admin/ai/costs?from={today}&to={today}&groupBy=day")
    assert costs["rows"] and costs["rows"][0]["costUsd"] > 0
    assert float(bar.get_attribute("data-cost")) == pytest.approx(costs["rows"][0]["costUsd"])
    assert float(bar.get_attribute("height")) > 0
    assert f"over {costs['rows'][0]['calls']} model calls" in _text(driver, "#costTotal")

    # breaker state, as the admin API reports it
    breaker = _admin_api(system, admin, "/admin/ai/circuit-breaker")
    _wait(driver, lambda d: _text(d, "#breakerState") == breaker["state"], "the breaker state")
    assert breaker["state"] == "closed"  # MODEL_BAD_REQUEST is neutral for the breaker

    # workers
    runtime = _admin_api(system, admin, "/admin/ai/runtime")
    instances = [w["instanceId"] for w in runtime["workers"]]
    assert instances
    _wait(driver, lambda d: all(i in _text(d, "#workers") for i in instances), "the workers")
    assert _text(driver, "#runtimeStatus") == runtime["status"] == "SERVING"
    workers = _text(driver, "#workers")
    assert "alive" in workers and "quiz_generation" in workers
    assert "panel(s) failed" not in _text(driver, "#status")

    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe

    shot = save_screenshot(driver, tmp_path / "console.png")
    target = os.environ.get("CONSOLE_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    assert_png_not_blank(shot)


def save_screenshot(driver: Any, path: Path) -> Path:
    """A screenshot of the whole page (the window grown to the page's height)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": 1366,
            "height": max(900, min(height, 4000)),
            "deviceScaleFactor": 1,
            "mobile": False,
        },
    )
    try:
        assert driver.save_screenshot(str(path)), "no screenshot written"
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return path


def assert_png_not_blank(path: Path) -> None:
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
    assert len(raw) > 30_000, f"screenshot suspiciously small ({len(raw)} bytes): blank?"
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
