"""Alembic migrations of credential_service (run by ``python -m credential_service migrate``)."""
