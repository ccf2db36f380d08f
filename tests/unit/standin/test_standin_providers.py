"""The stand-in plays several providers at once, one port each, each with its own
faults and its own record of the keys and models it was sent (reference §9.4, case P6)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from model_standin import ProviderSpec, key_fingerprint, run_standins

from .conftest import chat_body

REPO = Path(__file__).resolve().parents[3]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_each_provider_has_its_own_faults_and_record() -> None:
    async with run_standins({"primary": {}, "backup": {"models": ["backup-chat"]}}) as s:
        primary, backup = s["primary"], s["backup"]
        assert primary.port != backup.port
        primary.add_faults([{"kind": "status", "status": 503, "count": 2}])
        async with httpx.AsyncClient() as c:
            for _ in range(2):
                r = await c.post(
                    primary.base_url + "/chat/completions",
                    json=chat_body("quiz_generation"),
                    headers=auth("sk-primary-0001"),
                )
                assert r.status_code == 503  # the primary is down …
            r = await c.post(
                backup.base_url + "/chat/completions",
                json={**chat_body("quiz_generation"), "model": "backup-chat"},
                headers=auth("sk-backup-0002"),
            )
            assert r.status_code == 200  # … the backup answers
            # the backup serves its own model names only
            wrong = await c.post(
                backup.base_url + "/chat/completions",
                json=chat_body("quiz_generation"),
                headers=auth("sk-backup-0002"),
            )
            assert wrong.status_code == 400 and "Model Not Exist" in wrong.text
            listed = (await c.get(backup.base_url + "/models")).json()["data"]
            assert [m["id"] for m in listed] == ["backup-chat"]
            seen = (await c.get(backup.base_url + "/_standin/seen")).json()
        assert primary.seen_keys() == {key_fingerprint("sk-primary-0001")}
        assert backup.seen_keys() == {key_fingerprint("sk-backup-0002")}
        assert seen == {
            "provider": "backup",
            "keys": [{"sha256": key_fingerprint("sk-backup-0002"), "mask": "****0002", "calls": 2}],
            "models": {"backup-chat": 1, "deepseek-chat": 1},
        }
        assert "sk-backup-0002" not in json.dumps(seen)  # never the key in clear
        assert primary.seen()["models"] == {"deepseek-chat": 2}
        assert (primary.stats()["provider"], primary.stats()["byOutcome"]) == (
            "primary",
            {"status_503": 2},
        )
        assert backup.stats()["byOutcome"] == {"ok": 1, "bad_request": 1}
        primary.reset()
        assert primary.seen() == {"provider": "primary", "keys": [], "models": {}}


@pytest.mark.parametrize(
    ("text", "specs"),
    [
        ("a=8600", [ProviderSpec("a", 8600)]),
        (
            "deepseek=0, backup=8601:backup-chat+backup-r1",
            [
                ProviderSpec("deepseek", 0),
                ProviderSpec("backup", 8601, ("backup-chat", "backup-r1")),
            ],
        ),
        ("", []),
    ],
)
def test_providers_option(text: str, specs: list[ProviderSpec]) -> None:
    assert ProviderSpec.parse_list(text) == specs


@pytest.mark.parametrize("text", ["a", "a=", "a=x", "=1", "a=70000", "a=1,a=2"])
def test_providers_option_refuses_malformed_entries(text: str) -> None:
    with pytest.raises(ValueError):
        ProviderSpec.parse_list(text)


async def test_cli_serves_one_port_per_provider() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "model_standin", "--providers", "primary=0,backup=0:backup-chat",
        cwd=REPO, env=dict(os.environ), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        async with asyncio.timeout(15):
            for _ in range(2):
                event = json.loads(await proc.stdout.readline())
                urls[event["provider"]] = event["baseUrl"]
        assert set(urls) == {"primary", "backup"} and urls["primary"] != urls["backup"]
        async with httpx.AsyncClient() as c:
            added = await c.post(
                urls["primary"] + "/_standin/faults", json=[{"kind": "status", "status": 503}]
            )
            assert added.status_code == 200
            down = await c.post(
                urls["primary"] + "/chat/completions",
                json=chat_body("quiz_generation"),
                headers=auth("sk-primary-0001"),
            )
            up = await c.post(
                urls["backup"] + "/chat/completions",
                json={**chat_body("quiz_generation"), "model": "backup-chat"},
                headers=auth("sk-backup-0002"),
            )
            assert (down.status_code, up.status_code) == (503, 200)
            assert (await c.get(urls["backup"] + "/_standin/faults")).json() == {"faults": []}
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            rc = await proc.wait()
    assert rc == 0


async def test_cli_refuses_a_malformed_providers_option() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "model_standin", "--providers", "primary=x",
        cwd=REPO, env=dict(os.environ), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 2
    assert b"--providers" in stderr
