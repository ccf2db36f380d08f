"""ORM model of ``ai_model_credentials`` (reference §6). There is never a plaintext column.

One row per user (``user_id`` UNIQUE: one active key per user; the only provider is
``deepseek``). Replacing a key deletes the row and inserts a new one with a new
``credential_id``, so jobs that recorded the old id no longer resolve.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, Dialect, Index, MetaData, String, Text
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from airuntime_common.db import collate_binary_on_create
from airuntime_common.egress import MAX_URL_CHARS as MAX_BASE_URL_CHARS

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUS_VALID = "valid"
STATUS_INVALID = "invalid"
#: ``invalid_reason`` of a row whose ciphertext failed authentication during rotation.
REASON_UNDECRYPTABLE = "undecryptable"

#: DATETIME(6) on MySQL/MariaDB, plain DATETIME elsewhere; values are naive UTC.
Timestamp6 = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


class Base64Bytes(TypeDecorator[bytes]):
    """Bytes stored as base64 text (ASCII).

    Why not a BLOB: aiomysql 0.3.x cannot bind ``bytes`` parameters with PyMySQL ≥ 1.2
    (it imports a helper PyMySQL removed), so binary columns would break on MariaDB.
    Text binds work with every driver; the ORM attribute is still ``bytes``.
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        """Case-sensitive ASCII on MySQL/MariaDB, so equality guards compare exactly."""
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.TEXT(charset="ascii", collation="ascii_bin"))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return base64.b64encode(bytes(value)).decode("ascii")

    def process_result_value(self, value: Any, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        return base64.b64decode(value)


class CredentialBase(DeclarativeBase):
    """Declarative base of credential_service's tables (its own metadata and migrations)."""

    metadata = MetaData(naming_convention=NAMING)


#: Binary, no-pad collation on MySQL/MariaDB when created from the models (user ids
#: are compared exactly; migration 0002 does the same to migrated schemas).
collate_binary_on_create(CredentialBase.metadata)


class ModelCredential(CredentialBase):
    """A user's model key, sealed with AES-256-GCM (see :mod:`credential_service.vault`).

    Attributes:
        credential_id: opaque id, new on every put.
        user_id: owner; unique.
        provider: ``deepseek``.
        key_id: id of the master key that sealed ``ciphertext``.
        nonce: the 12-byte GCM nonce (stored as base64 text, see :class:`Base64Bytes`).
        ciphertext: ciphertext and 16-byte tag (base64 text).
        masked_key: ``sk-****abcd``, computed at write time.
        status: ``valid`` | ``invalid``.
        invalid_reason: why it was marked invalid (model rejected it, undecryptable…).
        base_url: the user's own endpoint for this key (reference §10.5), normalized,
            checked when stored; bound into the ciphertext's associated data, so a
            row whose URL is changed in the database no longer opens. None: the
            provider's configured endpoint.
        created_at, updated_at: naive UTC.
    """

    __tablename__ = "ai_model_credentials"
    __table_args__ = (
        CheckConstraint("status IN ('valid', 'invalid')", name="status"),
        Index("ix_ai_model_credentials_key_id", "key_id"),
    )

    credential_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False, unique=True)
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)
    nonce: Mapped[bytes] = mapped_column(Base64Bytes(), nullable=False)
    ciphertext: Mapped[bytes] = mapped_column(Base64Bytes(), nullable=False)
    masked_key: Mapped[str] = mapped_column(String(32), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default=STATUS_VALID)
    invalid_reason: Mapped[str | None] = mapped_column(String(500), nullable=True)
    base_url: Mapped[str | None] = mapped_column(String(MAX_BASE_URL_CHARS), nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp6, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp6, nullable=False)
