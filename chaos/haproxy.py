"""HAProxy in front of the harness's Galera cluster (reference §9.6): one writer.

:class:`HAProxy` puts one TCP listener in front of the nodes: one writer and
the other two as ``backup`` servers, health-checked by
:data:`CHECK_SCRIPT` through ``external-check`` (see there for why not
``mysql-check``). Pooled connections live long, so two options keep a single
writer: ``on-marked-down shutdown-sessions`` (a node that leaves the Primary
component loses its client connections at once instead of failing every
write with 1047) and ``on-marked-up shutdown-backup-sessions`` (when the first
server is back and Synced, the connections still open on a backup are cut
as new ones go to it; without this the pool would write to two nodes for as
long as those connections live). A one-entry stick table (``stick on dst``)
would avoid that fail-back, but HAProxy 2.6 does not move the entry when its
server goes down (it is used again as soon as that server is back, with the
backup's sessions left open), so the harness does not use one. Its runtime API
(a UNIX socket, ``level admin``) disables, enables and shuts down sessions of
a server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

from chaos.galera import GaleraCluster, GaleraNode
from launcher.plan import free_port

#: The health check HAProxy runs for each server (``external-check``), with
#: arguments ``<proxy address> <proxy port> <server address> <server port>``.
#:
#: ``option mysql-check`` only completes a handshake: a node that lost quorum
#: (non-Primary: it refuses every query with 1047 ``WSREP has not yet prepared
#: node for application use``), a joiner still receiving its state, or an rsync
#: SST donor (frozen by ``FLUSH TABLES WITH READ LOCK``) all pass it. This
#: script passes a node only when it is Synced (``wsrep_local_state = 4``),
#: ready (``wsrep_ready = ON``), in the Primary component and writable
#: (``read_only = OFF``); it costs one short-lived ``mariadb`` client per check.
CHECK_SCRIPT = r"""#!/bin/sh
# HAProxy external-check: exit 0 only for a Synced, ready, Primary, writable Galera node.
out=$(mariadb --no-defaults --protocol=tcp -h "$3" -P "$4" -u root --connect-timeout=2 \
  -N -B -e "SELECT CONCAT_WS(' ',
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
       WHERE VARIABLE_NAME = 'wsrep_local_state'),
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
       WHERE VARIABLE_NAME = 'wsrep_ready'),
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
       WHERE VARIABLE_NAME = 'wsrep_cluster_status'),
     @@global.read_only)" 2>/dev/null) || exit 1
case "$out" in
  "4 ON Primary 0" | "4 ON Primary OFF") exit 0 ;;
esac
exit 1
"""


def _sock_path(base: Path) -> Path:
    # a UNIX socket path must fit in 108 bytes; fall back to /tmp for deep temp dirs
    path = base / "haproxy.sock"
    if len(str(path)) < 100:
        return path
    return Path("/tmp") / f"haproxy-{uuid.uuid4().hex[:12]}.sock"


class HAProxy:
    """One ``haproxy`` process: a TCP listener in front of the cluster's nodes.

    The first node is the writer, the others ``backup`` (used, one at a time, only
    while no server before them is up). Checks every ``inter`` seconds with
    :data:`CHECK_SCRIPT`; ``fall`` failures mark a server down, ``rise`` successes up.

    Args:
        cluster: the nodes to proxy (their order: writer first).
        base_dir: configuration, check script, runtime socket and log.
        inter: check interval (seconds).
        fall: failed checks that mark a server down.
        rise: passed checks that mark it up again.
    """

    def __init__(
        self,
        cluster: GaleraCluster,
        base_dir: str | os.PathLike[str],
        *,
        inter: float = 1.0,
        fall: int = 2,
        rise: int = 2,
    ) -> None:
        self.cluster = cluster
        self.base = Path(base_dir).resolve()
        self.port = free_port()
        self.inter = inter
        self.fall = fall
        self.rise = rise
        self.cfg = self.base / "haproxy.cfg"
        self.check = self.base / "galera-check.sh"
        self.log = self.base / "haproxy.log"
        self.sock = _sock_path(self.base)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: object | None = None
        self._closed = threading.Event()
        self._spawn = threading.Lock()

    def url(self, database: str, driver: str = "mysql+aiomysql") -> str:
        """SQLAlchemy URL of ``database`` through the proxy."""
        return f"{driver}://root@127.0.0.1:{self.port}/{database}"

    def _config(self) -> str:
        ms = int(self.inter * 1000)
        servers = []
        for i, node in enumerate(self.cluster.nodes):
            backup = " backup" if i > 0 else ""
            servers.append(f"    server {node.name} {node.address} check{backup}")
        return "\n".join(
            [
                "global",
                "    maxconn 4000",
                f"    stats socket {self.sock} mode 600 level admin",
                "    external-check",
                "    insecure-fork-wanted",
                "    log stderr format raw local0 notice",
                "",
                "defaults",
                "    mode tcp",
                "    log global",
                "    timeout connect 2s",
                # pooled connections sit idle between transactions: never cut them for it
                "    timeout client 1h",
                "    timeout server 1h",
                "    timeout check 3s",
                "",
                "listen galera",
                f"    bind 127.0.0.1:{self.port}",
                "    balance first",
                "    option external-check",
                f"    external-check command {self.check}",
                '    external-check path "/usr/bin:/bin"',
                # one writer: the first server UP takes every connection (the backups
                # one at a time, in order, only while it is down); its connections are
                # cut when it goes down, the backups' when it is back
                "    option redispatch",
                "    retries 3",
                f"    default-server inter {ms} fastinter {ms} downinter {ms}"
                f" fall {self.fall} rise {self.rise}"
                " on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions",
                *servers,
                "",
            ]
        )

    def start(self, timeout: float = 30.0) -> float:
        """Write the files, start ``haproxy`` and wait until the writer is UP; seconds taken.

        Raises:
            RuntimeError: it exited or no server came up within ``timeout`` seconds.
        """
        began = time.monotonic()
        self.base.mkdir(parents=True, exist_ok=True)
        self.check.write_text(CHECK_SCRIPT)
        self.check.chmod(0o755)
        self.cfg.write_text(self._config())
        haproxy = shutil.which("haproxy") or "haproxy"
        subprocess.run([haproxy, "-c", "-q", "-f", str(self.cfg)], check=True)
        with self._spawn:
            if self._closed.is_set():
                raise RuntimeError("the proxy was stopped")
            log = self.log.open("ab")
            self._log_file = log
            self.proc = subprocess.Popen(
                [haproxy, "-db", "-f", str(self.cfg)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        while True:
            if self._closed.is_set():
                raise RuntimeError("the proxy was stopped")
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {self.log_text()}")
            with contextlib.suppress(OSError):
                if self.writer() is not None:
                    return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"haproxy: no server UP after {timeout:.0f} s: {self.states()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop ``haproxy`` (SIGTERM, SIGKILL after 10 s) and remove its runtime socket;
        idempotent (a start running in another thread then starts nothing)."""
        with self._spawn:
            self._closed.set()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None
        with contextlib.suppress(OSError):
            self.sock.unlink()

    def log_text(self, chars: int = 3000) -> str:
        """The end of the proxy's log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    # -- runtime API --------------------------------------------------------

    def command(self, line: str, timeout: float = 5.0) -> str:
        """Send one runtime API command (``show servers state``, ``disable server …``);
        returns the answer.

        Raises:
            OSError: the socket cannot be reached.
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.sock))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def states(self) -> dict[str, str]:
        """Server name → ``UP`` / ``DOWN`` / ``MAINT`` / ``NOLB`` …, from ``show stat``."""
        out: dict[str, str] = {}
        for line in self.command("show stat").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            cols = line.split(",")
            if len(cols) > 17 and cols[0] == "galera" and cols[1] not in ("FRONTEND", "BACKEND"):
                out[cols[1]] = cols[17]
        return out

    def sessions(self) -> dict[str, int]:
        """Server name → current sessions (``scur``)."""
        out: dict[str, int] = {}
        for line in self.command("show stat").splitlines():
            cols = line.split(",")
            if len(cols) > 4 and cols[0] == "galera" and cols[1] not in ("FRONTEND", "BACKEND"):
                with contextlib.suppress(ValueError):
                    out[cols[1]] = int(cols[4] or 0)
        return out

    def writer(self) -> GaleraNode | None:
        """The node new connections go to: the first UP server in order (the writer,
        else the first backup that is UP); None when no server is UP."""
        states = self.states()
        for node in self.cluster.nodes:
            if states.get(node.name, "").startswith("UP"):
                return node
        return None

    def disable(self, node: GaleraNode) -> str:
        """``disable server galera/<node>`` (maintenance: no new connections)."""
        return self.command(f"disable server galera/{node.name}")

    def enable(self, node: GaleraNode) -> str:
        """``enable server galera/<node>``."""
        return self.command(f"enable server galera/{node.name}")

    def shutdown_sessions(self, node: GaleraNode) -> str:
        """``shutdown sessions server galera/<node>``: cut every client connection to it."""
        return self.command(f"shutdown sessions server galera/{node.name}")

    def wait_writer(
        self,
        not_node: GaleraNode | None = None,
        timeout: float = 30.0,
        *,
        node: GaleraNode | None = None,
    ) -> GaleraNode:
        """Wait until the writer is UP (and is not ``not_node``, and is ``node`` when
        given); returns it.

        Raises:
            RuntimeError: not within ``timeout`` seconds.
        """
        began = time.monotonic()
        while True:
            with contextlib.suppress(OSError):
                now = self.writer()
                if now is not None and now is not not_node and node in (None, now):
                    return now
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"no writer after {timeout:.0f} s: {self.states()}")
            time.sleep(0.1)
