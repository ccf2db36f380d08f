"""Fast checks of the Galera profile's parts that need no cluster: HAProxy's
configuration and health check, how a rejoin is read from a node's log, the
directory modes lent to the nodes' user, and the plan of the multi-writer system."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from chaos import galera
from chaos.galera import GaleraCluster, GaleraNode
from chaos.galera_backend import GaleraBackend
from chaos.haproxy import CHECK_SCRIPT, HAProxy
from chaos.system import System

needs_galera = pytest.mark.skipif(
    not galera.available(), reason=f"Galera profile needs {', '.join(galera.missing())}"
)


def _check(tmp_path: Path, answer: str, status: int = 0) -> int:
    """Run the health check with a stand-in ``mariadb`` client that prints ``answer``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    client = bin_dir / "mariadb"
    client.write_text(f"#!/bin/sh\nprintf '%s\\n' '{answer}'\nexit {status}\n")
    client.chmod(0o755)
    script = tmp_path / "check.sh"
    script.write_text(CHECK_SCRIPT)
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    argv = [str(script), "127.0.0.1", "6033", "127.0.0.1", "3311"]
    return subprocess.run(argv, env=env, check=False).returncode


def test_the_health_check_passes_only_a_synced_ready_primary_writable_node(
    tmp_path: Path,
) -> None:
    assert _check(tmp_path, "4 ON Primary 0") == 0
    assert _check(tmp_path, "4 ON Primary OFF") == 0  # read_only shown as a word
    assert _check(tmp_path, "2 ON Primary 0") == 1  # a donor (rsync SST: frozen)
    assert _check(tmp_path, "1 OFF Primary 0") == 1  # a joiner
    assert _check(tmp_path, "4 OFF non-Primary 0") == 1  # lost quorum
    assert _check(tmp_path, "4 ON Primary 1") == 1  # read only
    assert _check(tmp_path, "OFF Disconnected 0") == 1  # MariaDB without Galera
    assert _check(tmp_path, "4 ON Primary 0", status=1) == 1  # no answer


@pytest.mark.mysql
def test_the_health_check_fails_a_plain_mariadb(tmp_path: Path) -> None:
    if not os.environ.get("TEST_MYSQL_URL") or shutil.which("mariadb") is None:
        pytest.skip("needs TEST_MYSQL_URL and the mariadb client")
    from sqlalchemy.engine import make_url

    url = make_url(os.environ["TEST_MYSQL_URL"])
    script = tmp_path / "check.sh"
    script.write_text(CHECK_SCRIPT)
    script.chmod(0o755)
    argv = [str(script), "x", "0", url.host or "127.0.0.1", str(url.port or 3306)]
    assert subprocess.run(argv, check=False).returncode == 1


@needs_galera
def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    cluster = GaleraCluster(tmp_path / "galera")
    proxy = HAProxy(cluster, tmp_path / "haproxy")
    text = proxy._config()
    lines = [line.strip() for line in text.splitlines()]
    servers = [line for line in lines if line.startswith("server ")]
    assert len(servers) == 3 and "backup" not in servers[0]
    assert all(line.endswith("check backup") for line in servers[1:])
    assert any("shutdown-sessions" in line and "shutdown-backup-sessions" in line for line in lines)
    proxy.base.mkdir(parents=True)
    proxy.cfg.write_text(text)
    proxy.check.write_text(CHECK_SCRIPT)
    haproxy = shutil.which("haproxy") or "haproxy"
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(proxy.cfg)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_galera
def test_a_rejoin_is_read_from_the_nodes_log(tmp_path: Path) -> None:
    cluster = GaleraCluster(tmp_path / "galera", size=1)
    node = cluster.nodes[0]
    node.base.mkdir(parents=True)
    node.log.write_text("first start\nWSREP_SST: [INFO] rsync SST completed on joiner\n")
    node.log_offsets.append(0)
    assert cluster.rejoin_kind(node) == "SST"
    node.log_offsets.append(node.log.stat().st_size)
    with node.log.open("a") as f:
        f.write("WSREP_SST: [INFO] rsync IST completed on joiner\n")
        f.write("[Note] WSREP: SST received\n")  # said after an IST too
        f.write("[Note] WSREP: IST received: uuid:108\n")
    assert cluster.rejoin_kind(node) == "IST"
    node.log_offsets.append(node.log.stat().st_size)
    assert cluster.rejoin_kind(node) == "none"


def test_directories_are_lent_to_other_users_for_traversal_only_and_given_back(
    tmp_path: Path,
) -> None:
    private = tmp_path / "private"
    inner = private / "run" / "galera"
    inner.mkdir(parents=True)
    private.chmod(0o700)
    (private / "run").chmod(0o700)
    changed = galera._grant_traverse(inner)
    assert stat.S_IMODE(private.stat().st_mode) == 0o701
    assert stat.S_IMODE((private / "run").stat().st_mode) == 0o701
    galera._restore_modes(changed)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((private / "run").stat().st_mode) == 0o700


def test_a_node_knows_its_files(tmp_path: Path) -> None:
    node = GaleraNode("node1", 1, 2, 3, 4, tmp_path)
    assert node.datadir == tmp_path / "data" and node.address == "127.0.0.1:1"
    assert not node.running()


def test_the_multi_writer_plan_puts_each_replica_on_its_node_and_spreads_every_client(
    tmp_path: Path,
) -> None:
    urls = [
        "mysql+aiomysql://root@127.0.0.1:3311/chaos",
        "mysql+aiomysql://root@127.0.0.1:3312/chaos",
    ]
    system = System(
        "mysql+aiomysql://root@127.0.0.1:6033/chaos",
        tmp_path,
        workers=2,
        replicas=2,
        replica_urls=urls,
        replicas_together=True,
        spread=True,
    )
    replicas = system.specs("job_service")
    assert [s.env["DATABASE_URL"] for s in replicas] == urls
    assert replicas[0].tier == replicas[1].tier  # both migrate at once
    both = f"ipv4:{replicas[0].target},{replicas[1].target}"
    for kind in ("api_gateway", "credential_service", "runtime_worker"):
        assert {s.env["JOB_SERVICE_ADDR"] for s in system.specs(kind)} == {both}
    cred = system.specs("credential_service")[0]
    assert cred.env["CREDENTIAL_DATABASE_URL"].endswith(":6033/chaos")  # through the proxy


@needs_galera
def test_a_start_that_lost_a_port_is_begun_again_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[list[int]] = []

    def start(self: GaleraCluster, timeout: float = 180.0) -> float:
        starts.append([n.port for n in self.nodes])
        if len(starts) == 1:
            raise RuntimeError(
                "node2 exited with 1:\nrsync daemon port '4444' has been taken by another program"
            )
        return 12.5

    monkeypatch.setattr(GaleraCluster, "start", start)
    monkeypatch.setattr(HAProxy, "start", lambda self, timeout=30.0: 0.1)
    monkeypatch.setattr(GaleraCluster, "create_database", lambda self, name: None)
    backend = GaleraBackend(tmp_path)
    backend.start()
    assert backend.port_retries == 1 and backend.formed_seconds == 12.5
    assert len(starts) == 2 and not set(starts[0]) & set(starts[1])
    assert backend.cluster.base == (tmp_path / "retry-1" / "galera").resolve()
    backend.stop()

    failing = GaleraBackend(tmp_path / "other")

    def broken(self: GaleraCluster, timeout: float = 180.0) -> float:
        raise RuntimeError("node1 exited with 1: [ERROR] InnoDB: cannot open datafile")

    monkeypatch.setattr(GaleraCluster, "start", broken)
    with pytest.raises(RuntimeError, match="InnoDB"):
        failing.start()  # not a taken port: raised at once
    assert failing.port_retries == 0
    failing.stop()
