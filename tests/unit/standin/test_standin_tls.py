"""The stand-in over TLS (``--tls-cert``/``--tls-key``): it plays a provider reached
over verified HTTPS, and a 3xx fault carries its ``Location``."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from model_standin.__main__ import _parse, _tls
from model_standin.server import StandIn
from tests.egress.support import quiz_prompt
from tests.security.tls import make_ca_and_server_cert


def test_cert_and_key_go_together(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _parse(["--tls-cert", str(tmp_path / "c.pem")])
    assert _tls("", "") is None


async def test_https_with_the_certificate_and_a_redirect_fault(tmp_path: Path) -> None:
    files = make_ca_and_server_cert(tmp_path, hosts=("localhost",), name="standin")
    server = StandIn("127.0.0.1", 0, tls=_tls(str(files.cert_file), str(files.key_file)))
    await server.start()
    try:
        assert server.base_url.startswith("https://")
        url = f"https://localhost:{server.port}/_standin/health"
        trusted = ssl.create_default_context(cafile=str(files.ca_file))
        async with httpx.AsyncClient(verify=trusted, trust_env=False) as client:
            assert (await client.get(url)).status_code == 200
            server.add_faults([{"kind": "status", "status": 302, "location": "http://x/"}])
            moved = await client.post(
                f"https://localhost:{server.port}/v1/chat/completions",
                headers={"Authorization": "Bearer sk-test-key-0001"},
                json={"model": "deepseek-chat", "messages": quiz_prompt().messages},
            )
            assert (moved.status_code, moved.headers["location"]) == (302, "http://x/")
        async with httpx.AsyncClient(trust_env=False) as untrusting:
            with pytest.raises(httpx.ConnectError):
                await untrusting.get(url)  # not a certificate the public roots know
    finally:
        await server.stop()
