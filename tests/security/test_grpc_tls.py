"""TLS on every gRPC listener from configured files, through the whole system (reference §1, §7).

A second system runs with ``GRPC_TLS_CERT_FILE`` / ``GRPC_TLS_KEY_FILE`` (servers) and
``GRPC_TLS_CA_FILE`` (clients) pointing at a throw-away CA and server certificate,
on MariaDB when ``TEST_MYSQL_URL`` is set (SQLite otherwise). The canary flow
runs through it (gateway → job/credential, worker → job/credential, job →
credential all over TLS) and the key shows up nowhere, MariaDB tables included.
Then each listener: a TLS client trusting the CA works, a plaintext client and
a client trusting another CA fail, and the token is still required over TLS.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.healthcheck import check_grpc
from airuntime_common.metadata import outgoing
from tests.security.conftest import System, leaks, mysql_database, start_system
from tests.security.flows import run_canary_flow
from tests.security.grpc_probe import SERVICES, SERVING, expect_code, health, reflected_services
from tests.security.tls import TlsFiles, make_ca_and_server_cert

pytestmark = pytest.mark.e2e
package_loop = pytest.mark.asyncio(loop_scope="package")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TlsFiles]:
    """The system's CA/cert, and an unrelated CA (a client trusting it must fail)."""
    d = tmp_path_factory.mktemp("tls")
    return make_ca_and_server_cert(d, name="system"), make_ca_and_server_cert(d, name="other")


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def tls_system(
    tmp_path_factory: pytest.TempPathFactory, tls_files: tuple[TlsFiles, TlsFiles]
) -> AsyncIterator[System]:
    files, _ = tls_files
    env = {
        "GRPC_TLS_CERT_FILE": str(files.cert_file),
        "GRPC_TLS_KEY_FILE": str(files.key_file),
        "GRPC_TLS_CA_FILE": str(files.ca_file),
    }
    drops = []
    base = os.environ.get("TEST_MYSQL_URL")
    if base:
        job_url, drop_job = mysql_database(base)
        cred_url, drop_cred = mysql_database(base)
        drops = [drop_job, drop_cred]
        env.update({"DATABASE_URL": job_url, "CREDENTIAL_DATABASE_URL": cred_url})
    try:
        sys_ = await start_system(tmp_path_factory.mktemp("tls-system"), env)
        try:
            yield sys_
        finally:
            await sys_.launcher.stop()
        if sys_.canaries:
            found = sys_.scan()
            assert not found, f"canary leaked after shutdown: {found[:20]}"
    finally:
        for drop in drops:
            drop()


@package_loop
async def test_whole_flow_over_tls_leaks_no_key(tls_system: System) -> None:
    if os.environ.get("TEST_MYSQL_URL"):
        assert tls_system.job_db.startswith("mysql") and tls_system.credential_db.startswith(
            "mysql"
        )
    run = await run_canary_flow(tls_system, ca_file=tls_system.env["GRPC_TLS_CA_FILE"])
    keys = list(run.keys.values())
    dumps = tls_system.db_text()
    # a PUT replaces the user's key: the current credential row is there, masked
    assert run.credential_ids["unshaped"] in dumps["credential_service"]
    assert f"****{run.keys['unshaped'][-4:]}" in dumps["credential_service"]
    for job in run.jobs.values():
        assert job["jobId"] in dumps["job_service"]
    found = tls_system.scan(keys)
    for text in run.texts:
        found += [f"worker status: {w}" for w in leaks(text, keys)]
    assert not found, f"canary leaked: {found[:20]}"


@package_loop
@pytest.mark.parametrize("service", list(SERVICES))
async def test_listener_speaks_only_tls(
    tls_system: System, tls_files: tuple[TlsFiles, TlsFiles], service: str
) -> None:
    files, other = tls_files
    addr_var, full_name, calls, _ = SERVICES[service]
    target = tls_system.env[addr_var]
    good = outgoing(tls_system.service_token, "tls-probe")

    tls = insecure_or_tls_channel(target, str(files.ca_file))
    try:
        assert await health(tls) == SERVING
        assert full_name in await reflected_services(tls)
        code, reason = await expect_code(calls[0](tls, ()))
        assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
        try:
            await calls[0](tls, good)
        except grpc.aio.AioRpcError as exc:  # credential probe: unknown user
            assert exc.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await tls.close()

    for label, channel in (
        ("plaintext", grpc.aio.insecure_channel(target)),
        ("untrusted CA", insecure_or_tls_channel(target, str(other.ca_file))),
    ):
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, label
            with pytest.raises(grpc.aio.AioRpcError) as refused_call:
                await calls[0](channel, good)
            assert refused_call.value.code() == grpc.StatusCode.UNAVAILABLE, label
        finally:
            await channel.close()


@package_loop
async def test_container_healthcheck_follows_the_tls_setting(
    tls_system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m airuntime_common.healthcheck grpc`` (compose/k8s probes) dials TLS when
    ``GRPC_TLS_CA_FILE`` is set, and fails against a TLS listener without it."""
    from airuntime_common import healthcheck

    target = tls_system.env["JOB_SERVICE_ADDR"]
    ca = tls_system.env["GRPC_TLS_CA_FILE"]
    assert await asyncio.to_thread(check_grpc, target, 5.0, ca)
    assert not await asyncio.to_thread(check_grpc, target, 5.0, None)
    monkeypatch.setenv("GRPC_TLS_CA_FILE", ca)
    assert await asyncio.to_thread(healthcheck.main, ["grpc", target]) == 0
    monkeypatch.delenv("GRPC_TLS_CA_FILE")
    assert await asyncio.to_thread(healthcheck.main, ["grpc", target]) == 1


@pytest.mark.parametrize("given", ["cert", "key"])
async def test_half_configured_tls_refuses_to_start(
    tls_files: tuple[TlsFiles, TlsFiles], given: str
) -> None:
    """One TLS file without the other must not silently serve plaintext."""
    from airuntime_common.grpc_server import GrpcServer
    from airuntime_common.settings import MissingSetting

    files, _ = tls_files
    kwargs = (
        {"tls_cert_file": str(files.cert_file)}
        if given == "cert"
        else {"tls_key_file": str(files.key_file)}
    )
    missing = "GRPC_TLS_KEY_FILE" if given == "cert" else "GRPC_TLS_CERT_FILE"
    with pytest.raises(MissingSetting, match=missing):
        GrpcServer(
            token="t", address="127.0.0.1:0", service_names=[], register=lambda s: None, **kwargs
        )
