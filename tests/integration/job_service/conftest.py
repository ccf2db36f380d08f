"""job_service core on MariaDB: the core fixtures with ``db_url`` pointing at a fresh database."""

from __future__ import annotations

import pytest

from tests.unit.job_service.conftest import domain, make_domain, make_server, server  # noqa: F401


@pytest.fixture
def db_url(mysql_url: str) -> str:
    return mysql_url
