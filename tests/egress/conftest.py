"""Fixtures of the egress suite (reference §10.5)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from typing import Any

import aiohappyeyeballs
import pytest

from .support import ConnectSpy, this_host


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectSpy]:
    """Record every connect the HTTP client starts (:class:`ConnectSpy`)."""
    spy = ConnectSpy()
    real = aiohappyeyeballs.start_connection

    async def spying(addr_infos: Sequence[Any], **kw: Any) -> socket.socket:
        targets = [(str(ai[4][0]), int(ai[4][1])) for ai in addr_infos]
        spy.attempts.extend(targets)
        if not all(this_host(host) for host, _ in targets):
            raise OSError(f"test: no connection to {targets}")
        return await real(addr_infos, **kw)

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", spying)
    yield spy
