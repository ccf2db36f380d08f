"""A private 3-node MariaDB Galera cluster for the harness (reference §9.6).

:class:`GaleraCluster` starts its own ``mariadbd`` processes with Debian's
``galera-4`` provider on loopback ports, each node in its own data directory
under the run's temp dir, running as the ``mysql`` user (``--user=mysql``):
the first node is bootstrapped with ``--wsrep-new-cluster`` on a data
directory made by ``mariadb-install-db``; the others join it one at a time
by state snapshot transfer (``wsrep_sst_method=rsync``), so the start is
over when all three report ``wsrep_local_state = 4`` (Synced) in a Primary
component of size 3. A node can be SIGKILLed and started again; it then
rejoins from its own data by incremental state transfer (IST) from a
donor's gcache, which :meth:`GaleraCluster.rejoin_kind` reads from its log.

HAProxy in front of it is :mod:`chaos.haproxy`; the two with the services'
database are :class:`chaos.galera_backend.GaleraBackend`.

Everything started is stopped by :meth:`GaleraCluster.stop` (and
:meth:`chaos.haproxy.HAProxy.stop`), which the runner calls on every exit path.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from chaos.mariadb import INSTALL_DB_CANDIDATES, MARIADBD_CANDIDATES, _find_binary
from launcher.plan import free_port

#: Debian's ``galera-4`` provider library, in the order looked for.
PROVIDER_CANDIDATES = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so")
#: The user the nodes run as (Debian's ``mariadb-server`` creates it).
NODE_USER = "mysql"
#: ``wsrep_local_state`` of a node that is in sync with its cluster (4 = Synced).
SYNCED = 4


class GaleraUnavailable(RuntimeError):
    """The Galera provider, ``mariadbd``, ``rsync`` or ``haproxy`` is missing (skipped)."""


def missing() -> list[str]:
    """What this machine lacks to run the Galera profile (empty: nothing)."""
    lacks = []
    if _find_binary(MARIADBD_CANDIDATES) is None:
        lacks.append("mariadbd")
    if _find_binary(INSTALL_DB_CANDIDATES) is None:
        lacks.append("mariadb-install-db")
    if not any(os.path.exists(p) for p in PROVIDER_CANDIDATES):
        lacks.append("galera-4 (libgalera_smm.so)")
    for tool in ("rsync", "haproxy", "mariadb"):
        if shutil.which(tool) is None:
            lacks.append(tool)
    try:
        pwd.getpwnam(NODE_USER)
    except KeyError:
        lacks.append(f"user {NODE_USER}")
    return lacks


def available() -> bool:
    """True when everything :func:`missing` looks for is installed."""
    return not missing()


def _grant_traverse(path: Path) -> list[tuple[Path, int]]:
    """Let other users (the nodes' ``mysql``) traverse ``path`` and its parents.

    A run's temp dir is usually private to its creator (``mkdtemp``: mode 0700,
    pytest's ``/tmp/pytest-of-<user>`` as well), so ``mysql`` could not reach a
    data directory below it. Adds only the ``o+x`` bit (enter, not list), and
    only on directories this process owns. Returns ``[(dir, old mode)]`` for
    :func:`_restore_modes`.
    """
    changed = []
    uid = os.geteuid()
    for directory in [path, *path.parents]:
        try:
            st = directory.stat()
        except OSError:
            continue
        if st.st_uid != uid or st.st_mode & stat.S_IXOTH:
            continue
        mode = stat.S_IMODE(st.st_mode)
        os.chmod(directory, mode | stat.S_IXOTH)
        changed.append((directory, mode))
    return changed


def _restore_modes(changed: Iterable[tuple[Path, int]]) -> None:
    for directory, mode in changed:
        with contextlib.suppress(OSError):
            os.chmod(directory, mode)


@dataclass
class GaleraNode:
    """One node: its ports, files and process.

    Attributes:
        name: ``node1`` … ``node3`` (``wsrep_node_name``).
        port: client port on 127.0.0.1.
        gcomm_port: group communication port (``gmcast.listen_addr``).
        ist_port: incremental state transfer port (``ist.recv_addr``).
        sst_port: rsync state snapshot transfer port (``wsrep_sst_receive_address``).
        base: its directory (data directory, socket, log, config).
        proc: the running ``mariadbd`` (None: not started or stopped).
        starts: how many times it was started.
    """

    name: str
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    base: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log_offsets: list[int] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        """The node's data directory."""
        return self.base / "data"

    @property
    def log(self) -> Path:
        """The node's error log (``log-error``)."""
        return self.base / "mariadbd.log"

    @property
    def cnf(self) -> Path:
        """The node's option file (``--defaults-file``; the SST script reads it too)."""
        return self.base / "my.cnf"

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        """Whether its process is alive."""
        return self.proc is not None and self.proc.poll() is None


class GaleraCluster:
    """Three (or ``size``) MariaDB Galera nodes on loopback, with their own data directories.

    Args:
        base_dir: where each node's directory goes (created; made traversable
            for ``mysql``, see :func:`_grant_traverse`, and restored at :meth:`stop`).
        size: number of nodes (3: one can be lost with quorum kept).
        buffer_pool: ``innodb_buffer_pool_size`` of each node.

    Raises:
        GaleraUnavailable: a binary, the provider or the ``mysql`` user is missing.
    """

    def __init__(
        self, base_dir: str | os.PathLike[str], size: int = 3, buffer_pool: str = "64M"
    ) -> None:
        lacks = missing()
        if lacks:
            raise GaleraUnavailable(f"Galera profile needs: {', '.join(lacks)}")
        self._mariadbd = str(_find_binary(MARIADBD_CANDIDATES))
        self._install = str(_find_binary(INSTALL_DB_CANDIDATES))
        self._provider = next(p for p in PROVIDER_CANDIDATES if os.path.exists(p))
        self.base = Path(base_dir).resolve()
        self.cluster_name = f"chaos-{uuid.uuid4().hex[:8]}"
        self.buffer_pool = buffer_pool
        self.nodes = [
            GaleraNode(
                name=f"node{i + 1}",
                port=free_port(),
                gcomm_port=free_port(),
                ist_port=free_port(),
                sst_port=free_port(),
                base=self.base / f"node{i + 1}",
            )
            for i in range(size)
        ]
        self._modes: list[tuple[Path, int]] = []
        self.formed_seconds: float | None = None
        #: Set by :meth:`stop`: no node starts any more (a start in another thread aborts).
        self._closed = threading.Event()
        self._spawn = threading.Lock()

    # -- files --------------------------------------------------------------

    def _write_cnf(self, node: GaleraNode) -> None:
        peers = ",".join(f"127.0.0.1:{n.gcomm_port}" for n in self.nodes)
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port}",
                f"ist.recv_addr=127.0.0.1:{node.ist_port}",
                "gcache.size=256M",
            ]
        )
        lines = [
            "[mysqld]",
            f"datadir={node.datadir}",
            f"port={node.port}",
            f"socket={node.base / 'mariadb.sock'}",
            "bind-address=127.0.0.1",
            f"pid-file={node.base / 'mariadbd.pid'}",
            f"log-error={node.log}",
            f"user={NODE_USER}",
            "skip-grant-tables",
            "skip-name-resolve",
            f"innodb-buffer-pool-size={self.buffer_pool}",
            "innodb-log-file-size=32M",
            "innodb-flush-log-at-trx-commit=2",
            "max-connections=500",
            # what Galera requires: row events, InnoDB, interleaved auto-increment locks
            "binlog-format=ROW",
            "default-storage-engine=InnoDB",
            "innodb-autoinc-lock-mode=2",
            "wsrep-on=ON",
            f"wsrep-provider={self._provider}",
            f"wsrep-cluster-name={self.cluster_name}",
            f"wsrep-cluster-address=gcomm://{peers}",
            f"wsrep-node-name={node.name}",
            f"wsrep-node-address=127.0.0.1:{node.gcomm_port}",
            f"wsrep-node-incoming-address={node.address}",
            "wsrep-sst-method=rsync",
            f"wsrep-sst-receive-address=127.0.0.1:{node.sst_port}",
            f'wsrep-provider-options="{provider_options}"',
            "wsrep-slave-threads=2",
            "",
        ]
        node.cnf.write_text("\n".join(lines))

    def _prepare(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self._modes = _grant_traverse(self.base)
        user = pwd.getpwnam(NODE_USER)
        for node in self.nodes:
            node.datadir.mkdir(parents=True, exist_ok=True)
            self._write_cnf(node)
            for path in (node.base, node.datadir):
                os.chown(path, user.pw_uid, user.pw_gid)
        first = self.nodes[0]
        subprocess.run(
            [
                self._install,
                "--no-defaults",
                f"--datadir={first.datadir}",
                f"--user={NODE_USER}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 180.0) -> float:
        """Bootstrap the first node, then join the others one by one; returns seconds taken.

        Raises:
            RuntimeError: a node died or was not Synced within ``timeout`` seconds
                (its log's tail is in the message).
        """
        began = time.monotonic()
        self._prepare()
        for i, node in enumerate(self.nodes):
            left = timeout - (time.monotonic() - began)
            self.start_node(node, bootstrap=i == 0, timeout=max(10.0, left))
        self.formed_seconds = time.monotonic() - began
        return self.formed_seconds

    def start_node(
        self, node: GaleraNode, *, bootstrap: bool = False, timeout: float = 120.0
    ) -> float:
        """Start ``node`` (``--wsrep-new-cluster`` when ``bootstrap``) and wait until it is
        Synced in the Primary component; returns the seconds waited.

        Raises:
            RuntimeError: it exited, or was not Synced within ``timeout`` seconds.
        """
        if node.running():
            raise RuntimeError(f"{node.name} is already running")
        argv = [self._mariadbd, f"--defaults-file={node.cnf}"]
        if bootstrap:
            argv.append("--wsrep-new-cluster")
        elif node.starts:
            position = self.recover_position(node)
            if position is not None:
                argv.append(f"--wsrep-start-position={position}")
        node.log_offsets.append(node.log.stat().st_size if node.log.exists() else 0)
        with self._spawn:
            if self._closed.is_set():
                raise RuntimeError("the cluster was stopped")
            node.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
        node.starts += 1
        return self.wait_synced(node, timeout)

    def recover_position(self, node: GaleraNode, timeout: float = 120.0) -> str | None:
        """The last committed position (``uuid:seqno``) in ``node``'s data, for a restart.

        A node that crashed leaves ``seqno: -1`` in ``grastate.dat``; started so, it
        would ask for a full state transfer (SST). ``mariadbd --wsrep-recover`` reads
        the position InnoDB committed and exits (what Debian's ``galera_recovery`` does
        before a start), so the node can ask a donor for the missing write sets only
        (IST). None when it cannot tell (the start then falls back to SST).
        """
        log = node.base / "wsrep-recover.log"
        with contextlib.suppress(OSError):
            log.unlink()
        subprocess.run(
            [
                self._mariadbd,
                f"--defaults-file={node.cnf}",
                "--wsrep-recover",
                f"--log-error={log}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.findall(r"WSREP: Recovered position: ([0-9a-f-]{36}:-?\d+)", text)
        if not found or found[-1].endswith(":-1"):
            return None
        return str(found[-1])

    def kill(self, node: GaleraNode) -> None:
        """SIGKILL ``node`` (a crash: it recovers its position from InnoDB at the next start)."""
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()

    def stop(self, keep: bool = False) -> None:
        """Stop every node (SIGTERM, SIGKILL after 20 s), restore the directory modes
        changed at start and delete the nodes' files (unless ``keep``). Idempotent;
        a start running in another thread starts no further node."""
        with self._spawn:
            self._closed.set()
        for node in self.nodes:
            if node.running():
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(node)
        _restore_modes(self._modes)
        self._modes = []
        if not keep:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- state --------------------------------------------------------------

    def connect(
        self, node: GaleraNode, database: str | None = None, timeout: float = 3.0
    ) -> pymysql.Connection:
        """A new autocommit pymysql connection straight to ``node``."""
        return pymysql.connect(
            host="127.0.0.1",
            port=node.port,
            user="root",
            password="",
            database=database,
            autocommit=True,
            connect_timeout=int(max(1, timeout)),
            read_timeout=int(max(5, timeout)),
        )

    def status(self, node: GaleraNode) -> dict[str, str]:
        """``wsrep_%`` status variables of ``node`` (raises pymysql errors while it is down)."""
        conn = self.connect(node, timeout=2.0)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW GLOBAL STATUS LIKE 'wsrep\\_%'")
                return {str(k): str(v) for k, v in cur.fetchall()}
        finally:
            conn.close()

    def synced(self, node: GaleraNode) -> bool:
        """Synced (``wsrep_local_state = 4``), ready, and in the Primary component."""
        try:
            st = self.status(node)
        except pymysql.MySQLError:
            return False
        return (
            st.get("wsrep_local_state") == str(SYNCED)
            and st.get("wsrep_ready") == "ON"
            and st.get("wsrep_cluster_status") == "Primary"
        )

    def wait_synced(self, node: GaleraNode, timeout: float = 120.0) -> float:
        """Wait until ``node`` is :meth:`synced`; returns the seconds waited.

        Raises:
            RuntimeError: its process exited, or ``timeout`` passed.
        """
        began = time.monotonic()
        while not self.synced(node):
            if self._closed.is_set():
                raise RuntimeError("the cluster was stopped")
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.name} exited with {node.proc.returncode}:\n{self.log_tail(node)}"
                )
            if time.monotonic() - began > timeout:
                raise RuntimeError(
                    f"{node.name} not Synced after {timeout:.0f} s:\n{self.log_tail(node)}"
                )
            time.sleep(0.2)
        return time.monotonic() - began

    def cluster_size(self, node: GaleraNode) -> int:
        """``wsrep_cluster_size`` as ``node`` sees it (0 when it cannot be asked)."""
        try:
            return int(self.status(node).get("wsrep_cluster_size", "0"))
        except (pymysql.MySQLError, ValueError):
            return 0

    def wait_cluster_size(self, size: int, timeout: float = 60.0) -> float:
        """Wait until every running node sees a Primary component of ``size``; seconds waited.

        Raises:
            RuntimeError: not within ``timeout`` seconds.
        """
        began = time.monotonic()
        while True:
            live = [n for n in self.nodes if n.running()]
            if live and all(self.cluster_size(n) == size and self.synced(n) for n in live):
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                seen = {n.name: self.cluster_size(n) for n in live}
                raise RuntimeError(f"cluster size not {size} after {timeout:.0f} s: {seen}")
            time.sleep(0.2)

    def log_tail(self, node: GaleraNode, chars: int = 3000) -> str:
        """The end of ``node``'s error log."""
        if not node.log.exists():
            return ""
        return node.log.read_text(errors="replace")[-chars:]

    def rejoin_kind(self, node: GaleraNode) -> str:
        """How ``node``'s latest start got the cluster's state: ``IST``, ``SST`` or ``none``
        (the log of that start shows which transfer it received)."""
        if not node.log.exists() or not node.log_offsets:
            return "none"
        with node.log.open("rb") as f:
            f.seek(node.log_offsets[-1])
            text = f.read().decode(errors="replace")
        # the joiner always runs the SST script, which then says what it received (an
        # SST is followed by a short IST of what was committed meanwhile: SST first)
        if "rsync SST completed on joiner" in text:
            return "SST"
        if "IST received" in text:
            return "IST"
        return "none"

    def by_port(self, port: int) -> GaleraNode:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def url(self, node: GaleraNode, database: str, driver: str = "mysql+aiomysql") -> str:
        """SQLAlchemy URL of ``database`` straight on ``node`` (no proxy)."""
        return f"{driver}://root@{node.address}/{database}"

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (utf8mb4), replicated to every node."""
        conn = self.connect(self.nodes[0])
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()

    def counters(self) -> dict[str, dict[str, int]]:
        """Per running node: ``wsrep_local_cert_failures`` (its write sets that failed
        certification), ``wsrep_local_bf_aborts`` (its transactions aborted by a
        replicated one), ``wsrep_last_committed`` and ``wsrep_flow_control_paused_ns``."""
        out: dict[str, dict[str, int]] = {}
        names = (
            "wsrep_local_cert_failures",
            "wsrep_local_bf_aborts",
            "wsrep_last_committed",
            "wsrep_flow_control_paused_ns",
        )
        for node in self.nodes:
            if not node.running():
                continue
            with contextlib.suppress(pymysql.MySQLError):
                st = self.status(node)
                out[node.name] = {k: int(st.get(k, "0") or 0) for k in names}
        return out

    def checksums(self, database: str, tables: Iterable[str]) -> dict[str, dict[str, int | None]]:
        """``CHECKSUM TABLE`` of ``tables`` on every running node, read after the node
        has applied everything committed before (``wsrep_sync_wait = 1``):
        node → table → checksum (None: no such table). Equal maps = caught up."""
        names = list(tables)
        out: dict[str, dict[str, int | None]] = {}
        for node in self.nodes:
            if not node.running():
                continue
            conn = self.connect(node, database, timeout=10.0)
            try:
                with conn.cursor() as cur:
                    cur.execute("SET SESSION wsrep_sync_wait = 1")
                    cur.execute("CHECKSUM TABLE " + ", ".join(f"`{t}`" for t in names))
                    out[node.name] = {
                        str(t).split(".")[-1]: (None if c is None else int(c))
                        for t, c in cur.fetchall()
                    }
            finally:
                conn.close()
        return out
