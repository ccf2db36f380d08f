"""Which endpoints count as a Galera node written to directly (reference §9.6;
:func:`airuntime_common.db.check_single_writer`), without a cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from airuntime_common.db import (
    GALERA_ALLOW_DIRECT_NODE,
    DatabaseUnavailable,
    UnsafeDatabaseTopology,
    check_single_writer,
    opening_database,
    parse_addresses,
)


class _Result:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def first(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def __iter__(self) -> Any:
        return iter(self._rows)


class _Node:
    """A sync ``Connection`` stand-in answering the queries :func:`check_single_writer` asks."""

    def __init__(self, url: str, *, wsrep: str = "ON", size: int = 3, addresses: str = "") -> None:
        self.dialect = SimpleNamespace(name="mysql")
        self.engine = SimpleNamespace(url=make_url(url))
        self._wsrep = wsrep
        self._status = [
            ("wsrep_cluster_size", str(size)),
            ("wsrep_incoming_addresses", addresses),
        ]

    def execute(self, statement: Any, *_: Any) -> _Result:
        sql = str(statement)
        if "wsrep_on" in sql:
            return _Result([("wsrep_on", self._wsrep)] if self._wsrep else [])
        if "SHOW STATUS" in sql:
            return _Result(self._status)
        if "wsrep_node_name" in sql:
            return _Result([("node2",)])
        raise AssertionError(sql)


NODES = "127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313"


def test_incoming_addresses_are_parsed_with_ipv6_and_auto_entries() -> None:
    assert parse_addresses("10.0.0.1:3306,[fd00::2]:3307,AUTO,,host:x") == {
        ("10.0.0.1", 3306),
        ("fd00::2", 3307),
    }


def test_a_node_written_to_directly_is_refused_with_its_name_and_the_way_out() -> None:
    node = _Node("mysql+aiomysql://root@127.0.0.1:3312/app", addresses=NODES)
    with pytest.raises(UnsafeDatabaseTopology) as err:
        check_single_writer(node, env={})
    message = str(err.value)
    assert "Galera node 'node2' of a 3-node cluster" in message
    assert "single-writer proxy" in message and GALERA_ALLOW_DIRECT_NODE in message
    # a host name that resolves to the node is the node too
    check = _Node("mysql+aiomysql://root@localhost:3312/app", addresses=NODES)
    with pytest.raises(UnsafeDatabaseTopology):
        check_single_writer(check, env={})


@pytest.mark.parametrize(
    ("url", "size", "wsrep", "env"),
    [
        ("mysql+aiomysql://root@127.0.0.1:6033/app", 3, "ON", {}),  # the proxy's port
        ("mysql+aiomysql://root@127.0.0.1:3312/app", 1, "ON", {}),  # a cluster of one
        ("mysql+aiomysql://root@127.0.0.1:3312/app", 3, "OFF", {}),  # plain MariaDB
        ("mysql+aiomysql://root@127.0.0.1:3312/app", 3, "", {}),  # MySQL: no wsrep_on
        ("mysql+aiomysql://root@127.0.0.1:3312/app", 3, "ON", {GALERA_ALLOW_DIRECT_NODE: "true"}),
    ],
)
def test_proxies_single_nodes_other_servers_and_the_opt_in_pass(
    url: str, size: int, wsrep: str, env: dict[str, str]
) -> None:
    check_single_writer(_Node(url, wsrep=wsrep, size=size, addresses=NODES), env=env)


def test_a_local_socket_of_a_node_counts_as_direct() -> None:
    node = _Node("mysql+aiomysql://root@/app?unix_socket=/run/mysqld/mysqld.sock", addresses=NODES)
    with pytest.raises(UnsafeDatabaseTopology):
        check_single_writer(node, env={})


async def test_the_refusal_stops_a_service_with_one_line_naming_its_variable() -> None:
    node = _Node("mysql+aiomysql://root@127.0.0.1:3311/app", addresses=NODES)
    with pytest.raises(DatabaseUnavailable) as stopped:
        async with opening_database("job_service", "DATABASE_URL"):
            check_single_writer(node, env={})
    assert str(stopped.value).startswith(
        "job_service: refusing to start: DATABASE_URL points straight at Galera node 'node2'"
    )
