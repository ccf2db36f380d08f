"""Fixtures of the runtime_worker tests (helpers live in ``rw_helpers``)."""

from tests.unit.runtime_worker.rw_helpers import backend, raw_http

__all__ = ["backend", "raw_http"]
