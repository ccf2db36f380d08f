"""Declarative base shared by every job_service table (one metadata, one migration history)."""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

from airuntime_common.db import collate_binary_on_create

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Base class of job_service's ORM models."""

    metadata = MetaData(naming_convention=NAMING)


#: Binary, no-pad collation on MySQL/MariaDB when created from the models (ids are
#: compared exactly; migration 0006 does the same to migrated schemas).
collate_binary_on_create(Base.metadata)
