"""The prompt registry's tables (reference §10.4), on :class:`job_service.store.base.Base`.

* ``ai_prompt_versions``: the uploaded versions of each job type's prompt,
  immutable (a row is never updated or deleted); the shipped ``v1`` of each
  type is not stored here but read from the code.
* ``ai_prompt_routings``: the routing of each job type that has one; no row =
  every new job gets ``v1``.
* ``ai_result_feedback``: a learner's rating of one of their generated items,
  with the item's job's type and prompt version (the stats count it there).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Index,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import Mapped, mapped_column

from job_service.store.base import Base

#: ``DATETIME(6)`` on MySQL/MariaDB, DATETIME on SQLite; naive UTC from the database.
Micro = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: A template's source: up to 16 MiB on MySQL/MariaDB (``MEDIUMTEXT``).
Source = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
#: A job's ``promptVersion``: ``<jobType>.<version>`` (32 + 1 + 64 characters at most).
FullVersion = String(128)


class PromptVersion(Base):
    """``ai_prompt_versions``: one uploaded template version of a job type."""

    __tablename__ = "ai_prompt_versions"

    job_type: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: the bare version (``v2``), 1..64 of ``[A-Za-z0-9._-]``
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    template: Mapped[str] = mapped_column(Source, nullable=False)
    #: sha256 hex of the template's UTF-8 bytes (an upload of the same text answers 200)
    template_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    description: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    created_by: Mapped[str] = mapped_column(String(160), nullable=False)


class PromptRouting(Base):
    """``ai_prompt_routings``: which versions new jobs of a type get (reference §10.4).

    ``revision`` goes up by one with every change of the row (an admin's routing,
    a rollback), so a change made on the strength of what was read is one
    conditional UPDATE (``WHERE revision = :read``) on every replica.
    """

    __tablename__ = "ai_prompt_routings"

    job_type: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: new with every routing an admin sets: the salt of the users' sticky hash
    routing_id: Mapped[str] = mapped_column(String(64), nullable=False)
    #: ``[{"version": "v1", "weight": 50}, …]``; the first is the control
    variants: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    #: ``{"maxInvalidSchemaIncrease": 0.1, "minAttempts": 50}``
    guard: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    #: when the admin's routing came into force (the guard counts attempts from here)
    started_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    updated_by: Mapped[str] = mapped_column(String(160), nullable=False)
    rolled_back_at: Mapped[datetime | None] = mapped_column(Micro)
    rollback_reason: Mapped[str | None] = mapped_column(Text)
    #: the bare version the guard rolled back
    rolled_back_version: Mapped[str | None] = mapped_column(String(64))


class ResultFeedback(Base):
    """``ai_result_feedback``: a learner's rating (+1 / -1) of one generated item;
    a second rating of the item replaces the first."""

    __tablename__ = "ai_result_feedback"

    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    #: the item's kind (``questions``, ``flashcards`` …)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    item_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), nullable=False)
    job_type: Mapped[str] = mapped_column(String(32), nullable=False)
    #: the item's job's ``promptVersion`` (``quiz_generation.v2``)
    prompt_version: Mapped[str | None] = mapped_column(FullVersion)
    rating: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Micro, nullable=False)

    __table_args__ = (
        CheckConstraint("rating IN (1, -1)", name="rating_is_one"),
        Index("ix_result_feedback_type_updated", "job_type", "updated_at"),
    )


prompt_versions = cast(Table, PromptVersion.__table__)
prompt_routings = cast(Table, PromptRouting.__table__)
result_feedback = cast(Table, ResultFeedback.__table__)
