"""Contract tests of JobService over gRPC reuse the job_service core fixtures."""

from tests.unit.job_service.conftest import db_url, make_server, server  # noqa: F401
