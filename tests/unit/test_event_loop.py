"""The services' event loop: uvloop by default, ``EVENT_LOOP`` to choose (airuntime_common.aio)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import warnings

import pytest

from airuntime_common import aio


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_default_is_uvloop_where_installed() -> None:
    assert importlib.util.find_spec("uvloop") is not None  # a declared dependency
    assert aio.loop_name({}) == "uvloop"
    assert aio.loop_name({"EVENT_LOOP": "auto"}) == "uvloop"
    assert aio.loop_name({"EVENT_LOOP": " UVLOOP "}) == "uvloop"
    assert aio.loop_name({"EVENT_LOOP": "asyncio"}) == "asyncio"


def test_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert aio.loop_name({}) == "asyncio"
    with pytest.raises(aio.EventLoopSettingError, match="not installed"):
        aio.loop_name({"EVENT_LOOP": "uvloop"})


def test_unknown_value_is_refused() -> None:
    with pytest.raises(
        aio.EventLoopSettingError, match="EVENT_LOOP must be auto, uvloop or asyncio"
    ):
        aio.loop_name({"EVENT_LOOP": "trio"})


@pytest.mark.parametrize(("choice", "module"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_run_uses_the_chosen_loop(
    monkeypatch: pytest.MonkeyPatch, choice: str, module: str
) -> None:
    monkeypatch.setenv("EVENT_LOOP", choice)
    assert aio.run(_loop_module()).split(".")[0] == module


def test_run_with_a_bad_setting_exits_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENT_LOOP", "bogus")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would be one
        with pytest.raises(SystemExit, match="configuration error: EVENT_LOOP"):
            aio.run(_loop_module())
        gc.collect()
