"""Fixtures of the deployment tests."""

from __future__ import annotations

import pytest

from tests.deploy import promql


@pytest.fixture(scope="session")
def known_metrics() -> dict[str, promql.Series]:
    """Every series the services define, plus those asked of job_service (``AWAITED``)."""
    return {**promql.defined_metrics(), **promql.awaited_series()}
