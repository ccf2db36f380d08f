"""The learner's walkthrough (``docs/walkthrough.md``) and the README's API lines, run as
written against the real services.

Every ```sh block of the page runs, in order, in one ``bash`` with ``set -euo pipefail``,
in a directory whose ``var/`` is the launcher's (so ``launcher.token`` finds the dev
secrets). Only the gateway's and the stand-in's default ports are swapped for the test
system's, ``.venv/bin/python`` for this interpreter, and the learner's id for a fresh one.
The checks are what the page tells a reader to expect (cases N1, N2).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import REPO_ROOT, RunningSystem

pytestmark = pytest.mark.e2e

PAGE = REPO_ROOT / "docs" / "walkthrough.md"
README = REPO_ROOT / "README.md"


def _pointed(system: RunningSystem, script: str, learner: str) -> str:
    """``script`` with the default ports, interpreter and learner swapped for the test's."""
    gateway = urlsplit(system.gateway_url)
    standin = urlsplit(system.standin_url)
    assert "localhost:3000" in script
    script = script.replace("localhost:3000", f"{gateway.hostname}:{gateway.port}")
    script = script.replace("localhost:8600", f"{standin.hostname}:{standin.port}")
    script = script.replace(".venv/bin/python", sys.executable)
    script = script.replace("--sub alice", f"--sub {learner}")
    return "set -euo pipefail\n" + script


def walkthrough_script(system: RunningSystem, learner: str) -> str:
    """The page's ```sh blocks as one script, pointed at ``system``."""
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 10, f"{PAGE}: expected the walkthrough's steps, found {len(blocks)}"
    return _pointed(system, "\n".join(blocks), learner)


def readme_script(system: RunningSystem, learner: str) -> str:
    """The README's block under "The API in a few lines" that mints a token."""
    section = README.read_text(encoding="utf-8").split("## The API in a few lines", 1)[1]
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "TOKEN=" in b]
    assert blocks, "README: no curl block under 'The API in a few lines'"
    return _pointed(system, blocks[0], learner)


def _run(system: RunningSystem, script: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(
        ["bash", "-c", script],
        cwd=system.tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _need_jq() -> None:
    if shutil.which("jq") is None:
        if os.environ.get("CI"):
            pytest.fail("jq is missing (.ci/run installs it)")
        pytest.skip("jq is not installed")


def test_walkthrough_runs_as_written(system: RunningSystem) -> None:
    _need_jq()
    learner = f"walk-{uuid.uuid4().hex[:8]}"
    script = walkthrough_script(system, learner)
    assert "/_standin/faults" in script, "the walkthrough slows the model to show the wait"
    proc = _run(system, script)
    out = proc.stdout
    assert proc.returncode == 0, f"rc={proc.returncode}\n{out}\n{proc.stderr}"
    lines = out.splitlines()
    # step 5: the repeated create is the same job, replayed
    assert "200 true" in lines, out
    # step 6: the running job's ETag comes from the answer
    etags = re.findall(r'^ETag "(\d+)"$', out, re.M)
    assert len(etags) == 2, out
    # step 7: the held GET answers with the next version once the job changed
    held = re.search(r'^200 "(\d+)"$', out, re.M)
    assert held and int(held[1]) > int(etags[0]), out
    # step 8: done; step 9: a terminal job's own ETag is 304 at once
    assert '{"status":"succeeded","attemptNo":1,"errorCode":null}' in lines, out
    terminal = re.search(r'^304 "(\d+)" in ([0-9.]+) s$', out, re.M)
    assert terminal and terminal[1] == etags[1], out
    assert float(terminal[2]) < 5.0, "a terminal job must not hold the answer"
    # step 11-12: two questions; one deleted, the other still listed
    stems = re.findall(r'^\{"itemId":"[0-9a-f]+","stem":"([^"]+)"', out, re.M)
    assert len(stems) == 2, out
    remaining = re.search(r"^\[(.*)\]$", out, re.M)
    assert remaining and remaining[1].count('"') == 2, out
    # step 13: the admin view's history; step 14: both deletes are 204
    assert f'"actor":"user:{learner}"' in out, out
    assert '"toStatus":"succeeded"' in out, out
    assert lines[-2:] == ["204", "204"], out


def test_readme_api_lines_run_as_written(system: RunningSystem) -> None:
    _need_jq()
    proc = _run(system, readme_script(system, f"readme-{uuid.uuid4().hex[:8]}"))
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert '"status": "succeeded"' in proc.stdout, proc.stdout
    assert proc.stdout.count('"stem":') == 2, proc.stdout
