"""Worker settings: reference §7 defaults and start-time refusals (case L2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airuntime_common.enums import JOB_TYPES
from airuntime_common.settings import MissingSetting
from runtime_worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[3]


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(
            ("POLL_", "WORKER_", "HEARTBEAT_", "LOCK_", "RUNTIME_", "LONG_", "SHUTDOWN_", "MODEL_")
        ):
            monkeypatch.delenv(name)
    s = WorkerSettings(RUNTIME_SERVICE_TOKEN="t")
    assert (s.POLL_INTERVAL_MS, s.WORKER_CONCURRENCY, s.HEARTBEAT_INTERVAL_SECONDS) == (1000, 8, 20)
    assert s.LOCK_LEASE_SECONDS == 60
    assert s.RUNTIME_WORKER_LISTEN == "[::]:50053"
    assert s.LONG_POLL_WAIT_MS == 10000
    assert s.SHUTDOWN_GRACE_SECONDS == 20
    assert s.MODEL_CALL_MAX_SECONDS == 110
    assert s.MODEL_MAX_RESPONSE_BYTES == 8 * 1024 * 1024  # reference §9.4
    assert s.capabilities == list(JOB_TYPES)
    assert s.RUNTIME_INSTANCE_ID and s.RUNTIME_INSTANCE_ID != WorkerSettings().RUNTIME_INSTANCE_ID
    s.check()  # 20 s heartbeat with a 60 s lease is exactly a third: allowed


def test_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_CAPABILITIES", "quiz_generation, flashcard_generation")
    monkeypatch.setenv("HEARTBEAT_INTERVAL_SECONDS", "5")
    monkeypatch.setenv("RUNTIME_INSTANCE_ID", "w-9")
    s = WorkerSettings()
    assert s.capabilities == ["quiz_generation", "flashcard_generation"]
    assert s.HEARTBEAT_INTERVAL_SECONDS == 5
    assert s.RUNTIME_INSTANCE_ID == "w-9"


async def test_the_response_cap_reaches_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime_worker.app import WorkerApp
    from runtime_worker.providers.deepseek import DeepSeekProvider

    monkeypatch.setenv("MODEL_MAX_RESPONSE_BYTES", "65536")
    app = WorkerApp(WorkerSettings(RUNTIME_SERVICE_TOKEN="t"))
    assert isinstance(app.provider, DeepSeekProvider)
    assert app.provider.max_response_bytes == 65536
    await app.client.close()
    await app.provider.aclose()


@pytest.mark.parametrize("value", ["0", "1023", "1073741825", "8MiB", "-1"])
def test_a_response_cap_out_of_range_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("MODEL_MAX_RESPONSE_BYTES", value)
    with pytest.raises(ValidationError, match="MODEL_MAX_RESPONSE_BYTES"):
        WorkerSettings(RUNTIME_SERVICE_TOKEN="t")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"RUNTIME_SERVICE_TOKEN": ""}, "RUNTIME_SERVICE_TOKEN"),
        ({"HEARTBEAT_INTERVAL_SECONDS": 60}, "HEARTBEAT_INTERVAL_SECONDS"),
        ({"HEARTBEAT_INTERVAL_SECONDS": 21}, "HEARTBEAT_INTERVAL_SECONDS"),
        ({"WORKER_CAPABILITIES": "quiz_generation,poetry"}, "WORKER_CAPABILITIES"),
        ({"WORKER_CAPABILITIES": " , "}, "WORKER_CAPABILITIES"),
    ],
)
def test_refused(overrides: dict[str, object], match: str) -> None:
    values: dict[str, object] = {"RUNTIME_SERVICE_TOKEN": "t", **overrides}
    with pytest.raises(MissingSetting, match=match):
        WorkerSettings(**values).check()  # type: ignore[arg-type]


def test_module_refuses_rare_heartbeat_at_start() -> None:
    env = {
        **os.environ,
        "RUNTIME_SERVICE_TOKEN": "t",
        "HEARTBEAT_INTERVAL_SECONDS": "60",
        "LOCK_LEASE_SECONDS": "60",
        "WORKER_METRICS_PORT": "0",
        "RUNTIME_WORKER_LISTEN": "127.0.0.1:0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "runtime_worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "HEARTBEAT_INTERVAL_SECONDS" in proc.stderr
