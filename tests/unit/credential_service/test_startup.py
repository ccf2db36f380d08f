"""Start-up refusals, the command line (migrate, rotate-keys) and serving (reference §7)."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airuntime_common.db import make_engine, make_sessionmaker
from airuntime_common.settings import MissingSetting
from credential_service import migrate
from credential_service.__main__ import main
from credential_service.app import serve
from credential_service.domain import CredentialStore
from credential_service.settings import CredentialSettings
from credential_service.vault import Keyring

from .conftest import TOKEN, make_key, settings_for

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main()`` installs the JSON handler on the root logger; put pytest's back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"RUNTIME_SERVICE_TOKEN": ""}, "RUNTIME_SERVICE_TOKEN"),
        ({"CREDENTIAL_ENCRYPTION_KEYS": ""}, "CREDENTIAL_ENCRYPTION_KEYS"),
        ({"CREDENTIAL_ENCRYPTION_KEYS": "k1:" + "A" * 20}, "CREDENTIAL_ENCRYPTION_KEYS"),
        ({"CREDENTIAL_ENCRYPTION_KEYS": "k1:%%%"}, "CREDENTIAL_ENCRYPTION_KEYS"),
        (
            {"CREDENTIAL_ENCRYPTION_KEYS": base64.b64encode(b"k" * 32).decode()},
            "CREDENTIAL_ENCRYPTION_KEYS",
        ),
    ],
)
async def test_serve_refuses_without_token_or_good_keys(
    tmp_path: Path, overrides: dict[str, str], variable: str
) -> None:
    settings = settings_for(tmp_path / "x.db", make_key("k1"), **overrides)
    with pytest.raises(MissingSetting) as exc:
        await serve(settings)
    message = str(exc.value)
    assert variable in message and "refusing to start" in message
    raw = overrides.get("CREDENTIAL_ENCRYPTION_KEYS", "")
    secret_part = raw.partition(":")[2] or raw
    if len(secret_part) > 4:
        assert secret_part not in message
    assert not (tmp_path / "x.db").exists()  # refused before touching the database


def test_settings_never_print_secrets(tmp_path: Path) -> None:
    entry = make_key("k1")
    settings = settings_for(tmp_path / "x.db", entry, DEEPSEEK_API_KEY="sk-platform-secret-123456")
    text = repr(settings) + str(settings) + str(settings.model_dump())
    assert entry.split(":")[1] not in text
    assert "sk-platform-secret-123456" not in text
    assert settings.platform_key() == "sk-platform-secret-123456"


def test_settings_read_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = make_key("k1")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", entry)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "")
    monkeypatch.setenv("ALLOW_PLATFORM_KEY_STANDIN", "1")
    monkeypatch.setenv("CREDENTIAL_SERVICE_METRICS_PORT", "0")
    s = CredentialSettings()
    assert s.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value() == entry
    assert s.platform_key() == "sk-standin-local"
    assert s.CREDENTIAL_SERVICE_LISTEN == "[::]:50052"
    assert s.DEEPSEEK_BASE_URL == "https://api.deepseek.com"
    assert s.CREDENTIAL_DATABASE_URL.endswith("var/credential_service.db")
    monkeypatch.setenv("ALLOW_PLATFORM_KEY_STANDIN", "0")
    assert CredentialSettings().platform_key() is None


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREDENTIAL_", "DEEPSEEK_"))}
    env.pop("RUNTIME_SERVICE_TOKEN", None)
    env["CREDENTIAL_DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    env["CREDENTIAL_SERVICE_METRICS_PORT"] = "0"
    env.update(extra)
    return env


def test_main_refuses_to_start_with_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m credential_service`` (serve) exits 2 naming the variable, no key material."""
    secret = base64.b64encode(os.urandom(31)).decode()
    monkeypatch.setenv("CREDENTIAL_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", f"k1:{secret}")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "RUNTIME_SERVICE_TOKEN" in err
    monkeypatch.setenv("RUNTIME_SERVICE_TOKEN", TOKEN)
    assert main(["serve"]) == 2
    out, err = capsys.readouterr()
    assert "CREDENTIAL_ENCRYPTION_KEYS" in err and "32 bytes" in err
    assert secret not in err + out
    assert not (tmp_path / "r.db").exists()


def test_python_m_serves_on_sqlite(tmp_path: Path) -> None:
    """The real process: migrates, serves health on an ephemeral-free port, stops on SIGTERM."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "credential_service"],
        env=_env(
            tmp_path,
            RUNTIME_SERVICE_TOKEN=TOKEN,
            CREDENTIAL_ENCRYPTION_KEYS=make_key("k1"),
            CREDENTIAL_SERVICE_LISTEN=f"127.0.0.1:{port}",
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert '"msg": "credential_service serving"' in err
    tables = sqlite3.connect(tmp_path / "cli.db").execute(
        "select name from sqlite_master where type='table'"
    )
    assert {"ai_model_credentials", "credential_alembic_version"} <= {r[0] for r in tables}


def test_migrate_command_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("CREDENTIAL_DATABASE_URL", url)
    assert main(["migrate"]) == 0
    assert main(["migrate"]) == 0
    assert "latest revision" in capsys.readouterr().out
    db = sqlite3.connect(tmp_path / "m.db")
    from alembic.script import ScriptDirectory

    from credential_service.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head == "0003_user_base_url"
    assert db.execute("select version_num from credential_alembic_version").fetchall() == [(head,)]
    cols = {r[1] for r in db.execute("pragma table_info(ai_model_credentials)")}
    assert cols == {
        "credential_id", "user_id", "provider", "key_id", "nonce", "ciphertext",
        "masked_key", "status", "invalid_reason", "created_at", "updated_at", "base_url",
    }  # fmt: skip


def test_rotate_keys_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    k1, k2 = make_key("k1"), make_key("k2")

    async def seed() -> None:
        await migrate.upgrade(url)
        engine = make_engine(url)
        store = CredentialStore(
            make_sessionmaker(engine), Keyring.from_env_value(k1), settings_for(tmp_path, k1)
        )
        for i in range(9):
            await store.put(f"u{i}", "deepseek", f"sk-cli-rotation-{i:020d}")
        await engine.dispose()

    asyncio.run(seed())
    monkeypatch.setenv("CREDENTIAL_DATABASE_URL", url)
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", f"{k2},{k1}")
    assert main(["rotate-keys", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "rotated 9, remaining 0" in out
    assert "k2=9" in out
    assert out.count("batch:") == 3
    # the old key can now go
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", k2)
    assert main(["rotate-keys"]) == 0
    assert "rotated 0, remaining 0" in capsys.readouterr().out

    async def check() -> None:
        engine = make_engine(url)
        store = CredentialStore(
            make_sessionmaker(engine), Keyring.from_env_value(k2), settings_for(tmp_path, k2)
        )
        for i in range(9):
            assert (await store.check(f"u{i}", "user_deepseek_key")).usable
        await engine.dispose()

    asyncio.run(check())
    # rows on a key id that is not configured: exit 1, named
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", f"{make_key('k3')},{make_key('k4')}")
    assert main(["rotate-keys"]) == 1
    assert "not configured: k2" in capsys.readouterr().out


def test_rotate_keys_command_refuses_bad_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CREDENTIAL_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'b.db'}")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEYS", "k1")
    assert main(["rotate-keys"]) == 2
    assert "CREDENTIAL_ENCRYPTION_KEYS" in capsys.readouterr().err
