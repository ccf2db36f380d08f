"""Children started by a process that uses gRPC start every time (grpc/grpc#43055):
the launcher and the harnesses turn gRPC's fork handlers off before gRPC loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from airuntime_common.spawning import FORK_SUPPORT_VAR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Start ``N`` children (``-c pass``) while four tasks keep gRPC calls in flight;
#: print how many did not exit 0. The first import is the entry point under test.
STRESS = """
import {entry}
import asyncio, sys
import grpc, uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

async def main():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{{port}}")
    stub = health_pb2_grpc.HealthStub(channel)
    done = False

    async def calls():
        while not done:
            await stub.Check(health_pb2.HealthCheckRequest())

    tasks = [asyncio.create_task(calls()) for _ in range(4)]
    failed = 0
    for _ in range({n}):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "pass", start_new_session=True
        )
        failed += await child.wait() != 0
    done = True
    await asyncio.gather(*tasks)
    await channel.close()
    await server.stop(None)
    print(failed)

uvloop.run(main())
"""


def _run(code: str, env_extra: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != FORK_SUPPORT_VAR}
    env.update(env_extra or {})
    env["PYTHONPATH"] = REPO
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("entry", ["launcher", "bench", "chaos", "demo"])
def test_each_entry_point_turns_grpc_fork_handlers_off_before_grpc_loads(entry: str) -> None:
    code = f"import sys\nimport {entry}, os\nprint(os.environ.get({FORK_SUPPORT_VAR!r}))"
    assert _run(code) == "false"


def test_an_operator_s_setting_wins() -> None:
    code = f"import launcher, os\nprint(os.environ.get({FORK_SUPPORT_VAR!r}))"
    assert _run(code, {FORK_SUPPORT_VAR: "true"}) == "true"


def test_children_started_while_grpc_calls_are_in_flight_all_start() -> None:
    """With gRPC's fork handlers on, 2 to 19 of these 200 children died before exec
    on this machine (SIGSEGV), in six runs; with them off, none."""
    assert _run(STRESS.format(entry="launcher", n=200)) == "0"
