"""The harness's database when it runs on Galera (reference §9.6): a 3-node cluster
(:mod:`chaos.galera`), HAProxy in front (:mod:`chaos.haproxy`), and the services'
and the commit probe's databases on it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pymysql

from chaos.galera import GaleraCluster
from chaos.haproxy import HAProxy

#: How many times :meth:`GaleraBackend.start` begins again on fresh ports.
PORT_RETRIES = 2
#: What a node's log, its rsync SST script or HAProxy say when a port was taken.
PORT_TAKEN_MESSAGES = (
    "Address already in use",
    "has been taken by another program",
    "Bind on TCP/IP port",
    "cannot bind socket",
)


class GaleraBackend:
    """A cluster, its proxy, and the services' database on it.

    Nothing runs until :meth:`start`; register :meth:`stop` first, so a start
    that fails or is interrupted half-way still stops what it had started.

    Args:
        base_dir: the nodes' and the proxy's directories go here.
        database: the services' database (job_service and credential_service).
    """

    def __init__(self, base_dir: str | os.PathLike[str], database: str = "chaos") -> None:
        self._base = Path(base_dir)
        self.cluster = GaleraCluster(self._base / "galera")
        self.proxy = HAProxy(self.cluster, self._base / "haproxy")
        self.database = database
        #: How long the cluster took to form (3 nodes Synced), seconds.
        self.formed_seconds = 0.0
        #: Starts begun again on fresh ports because a port was taken meanwhile.
        self.port_retries = 0
        self._stopped = threading.Event()

    def start(self) -> None:
        """Form the 3-node cluster, start HAProxy in front, create the services' and
        the commit probe's databases.

        The dozen ports are free when chosen, but on a busy machine another process
        (an outgoing connection's ephemeral port, for one) can take one before the
        node binds it, and that node, its SST script or HAProxy then exits. Such a
        start is stopped and begun again on fresh ports, at most
        :data:`PORT_RETRIES` times; any other failure is raised at once.

        Raises:
            GaleraUnavailable: binaries, provider or the ``mysql`` user missing.
            RuntimeError: the cluster or the proxy did not come up (or :meth:`stop`
                was called meanwhile).
        """
        while True:
            try:
                self.formed_seconds = self.cluster.start()
                self.proxy.start()
                break
            except RuntimeError as exc:
                taken = self._port_taken(str(exc))
                if self._stopped.is_set() or not taken or self.port_retries >= PORT_RETRIES:
                    raise
            self.proxy.stop()
            self.cluster.stop()
            self.port_retries += 1
            attempt = self._base / f"retry-{self.port_retries}"
            self.cluster = GaleraCluster(attempt / "galera")
            self.proxy = HAProxy(self.cluster, attempt / "haproxy")
            if self._stopped.is_set():  # stopped while the old one was being cleared
                raise RuntimeError("the cluster was stopped")
        self.cluster.create_database(self.database)
        self.cluster.create_database("chaos_probe")

    def _port_taken(self, message: str) -> bool:
        logs = [message, self.proxy.log_text()]
        logs += [self.cluster.log_tail(n, 20000) for n in self.cluster.nodes]
        return any(p in text for text in logs for p in PORT_TAKEN_MESSAGES)

    def stop(self, keep: bool = False) -> None:
        """Stop the proxy, then every node (files deleted unless ``keep``); idempotent."""
        self._stopped.set()
        try:
            self.proxy.stop()
        finally:
            self.cluster.stop(keep=keep)

    @property
    def url(self) -> str:
        """The services' database through the proxy."""
        return self.proxy.url(self.database)

    def node_url(self, index: int) -> str:
        """The services' database straight on node ``index`` (0-based)."""
        return self.cluster.url(self.cluster.nodes[index], self.database)

    def probe_connector(self) -> Callable[[], pymysql.Connection]:
        """Opens an autocommit connection to the probe database through the proxy."""

        def connect() -> pymysql.Connection:
            return pymysql.connect(
                host="127.0.0.1",
                port=self.proxy.port,
                user="root",
                password="",
                database="chaos_probe",
                autocommit=True,
                connect_timeout=2,
                read_timeout=15,
                write_timeout=15,
            )

        return connect
