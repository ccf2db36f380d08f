"""``airuntime_common.aio``: the event loop each service process runs on (``EVENT_LOOP``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings

import grpc
import pytest
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError

from airuntime_common import aio
from airuntime_common.settings import CommonSettings, InvalidSetting, load


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVENT_LOOP", raising=False)
    assert aio.resolve_event_loop() == "uvloop"
    assert aio.run(_loop_type()) is uvloop.Loop
    assert CommonSettings().EVENT_LOOP == "uvloop"


def test_asyncio_runs_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not issubclass(aio.run(_loop_type(), loop="asyncio"), uvloop.Loop)
    monkeypatch.setenv("EVENT_LOOP", " AsyncIO ")
    assert not issubclass(aio.run(_loop_type()), uvloop.Loop)


def test_run_returns_the_result_and_closes_the_loop() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return 42

    assert aio.run(main(), loop="uvloop") == 42
    assert loops[0].is_closed()


def test_unknown_loop_is_refused_without_leaving_a_coroutine_unawaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        with pytest.raises(ValueError, match="EVENT_LOOP must be one of uvloop, asyncio"):
            aio.run(_loop_type(), loop="trio")
    monkeypatch.setenv("EVENT_LOOP", "tokio")
    with pytest.raises(ValidationError, match="EVENT_LOOP"):
        CommonSettings()


def test_uvloop_falls_back_to_asyncio_where_it_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aio, "uvloop_available", lambda: False)
    assert aio.resolve_event_loop("uvloop") == "asyncio"
    assert not issubclass(aio.run(_loop_type(), loop="uvloop"), uvloop.Loop)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_grpc_aio_serves_and_calls_on_either_loop(loop: str) -> None:
    """grpc.aio (server and channel, as every service uses them) works on both loops."""

    async def main() -> tuple[int, int]:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await servicer.set("svc", health_pb2.HealthCheckResponse.SERVING)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                answers = await asyncio.gather(
                    *(stub.Check(health_pb2.HealthCheckRequest(service="svc")) for _ in range(20))
                )
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
            return (
                sum(a.status == health_pb2.HealthCheckResponse.SERVING for a in answers),
                missing.value.code().value[0],
            )
        finally:
            await server.stop(grace=None)

    served, missing_code = aio.run(main(), loop=loop)
    assert served == 20
    assert missing_code == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.mark.parametrize(
    "module", ["job_service", "credential_service", "api_gateway", "runtime_worker"]
)
def test_a_bad_setting_stops_a_service_with_one_line_per_variable(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each service's entry point reads its settings through ``settings.load``: a
    refused value names the variable and the rule, shows no traceback and no value."""
    import importlib

    entry = importlib.import_module(f"{module}.__main__")
    monkeypatch.setenv("EVENT_LOOP", "tokio")
    monkeypatch.setenv("LOG_LEVEL", "INFO")
    monkeypatch.setattr("sys.argv", [module])
    with pytest.raises(InvalidSetting) as exc:
        entry.main()
    assert str(exc.value.code) == (
        f"{module}: refusing to start: EVENT_LOOP: Input should be 'uvloop' or 'asyncio' (reference §7)"
    )


def test_load_never_echoes_a_refused_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENT_LOOP", "sk-secret-looking-value")
    with pytest.raises(InvalidSetting) as exc:
        load(CommonSettings, "svc")
    assert "sk-secret" not in str(exc.value.code)
    assert str(exc.value.code).startswith("svc: refusing to start: EVENT_LOOP: ")


def test_the_stand_in_refuses_a_bad_loop_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from model_standin.__main__ import main as standin_main

    monkeypatch.setenv("EVENT_LOOP", "tokio")
    assert standin_main(["--port", "0"]) == 2
    assert capsys.readouterr().err == (
        "standin: refusing to start: EVENT_LOOP must be one of uvloop, asyncio, not 'tokio'\n"
    )


_SETTLED = """
import gc, weakref
from airuntime_common import aio

class Node:
    pass

kept = Node()                      # allocated before: frozen, still reachable
aio.settle_heap()
print(gc.get_threshold() == aio.GC_THRESHOLDS, gc.get_freeze_count() > 1000)
a, b = Node(), Node()              # a cycle made once the service runs
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(gone() is None, isinstance(kept, Node))
"""


def test_a_settled_heap_still_collects_the_cycles_made_after_it() -> None:
    """settle_heap freezes start-up's objects and raises the thresholds; cycles made
    afterwards are collected as before (memory stays flat in the soak). In a child
    process: freezing is per process, and this one's heap must stay collectable."""
    out = subprocess.run(
        [sys.executable, "-c", _SETTLED], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["True", "True", "True", "True"]
