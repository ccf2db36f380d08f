"""Learning data, snapshots, results and business tables of job_service (reference §5).

All tables live on :class:`job_service.store.base.Base`. Ids are opaque strings
(uuid4 hex). Time columns hold naive UTC and are ``DATETIME(6)`` on
MySQL/MariaDB. Only job_service writes any of these tables.

* ``materials`` / ``material_blocks``: a material split into ordered blocks.
* ``knowledge_points`` / ``knowledge_point_blocks``: a knowledge point and the
  blocks (of its one material) it is linked to.
* ``learning_events``: reading and quiz-attempt events, idempotent per user by
  the client's ``event_id`` (UNIQUE(user_id, event_id)).
* ``ai_snapshots``: immutable snapshot payloads, stored once per
  (user, content hash) and reused.
* ``ai_results``: accepted results, idempotency key ``jobId:attemptNo:outputHash``.
* five business tables, each deduplicated per user by the item's content hash
  (UNIQUE(user_id, content_hash)), with ``ordinal`` = the item's position in
  the job's output.
* ``ai_question_generation_plans`` / ``ai_flashcard_generation_plans``.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import Mapped, mapped_column

from airuntime_common import jobtypes
from job_service.store.base import Base

#: ``DATETIME(6)`` on MySQL/MariaDB, DATETIME on SQLite; naive UTC.
Micro = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: Auto-increment BIGINT (INTEGER on SQLite so it aliases the rowid).
Seq = BigInteger().with_variant(Integer(), "sqlite")
Id = String(64)
UserId = String(128)
Hash = String(64)


class Material(Base):
    """``materials``: a study material owned by one user."""

    __tablename__ = "materials"
    __table_args__ = (Index("ix_materials_user_created", "user_id", "created_at"),)

    material_id: Mapped[str] = mapped_column(Id, primary_key=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    title: Mapped[str] = mapped_column(String(500), nullable=False)
    content_hash: Mapped[str] = mapped_column(Hash, nullable=False)
    block_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class MaterialBlock(Base):
    """``material_blocks``: one ordered block of a material (``ordinal`` from 0)."""

    __tablename__ = "material_blocks"
    __table_args__ = (
        UniqueConstraint("material_id", "ordinal", name="uq_material_blocks_material_ordinal"),
        Index("ix_material_blocks_user", "user_id"),
    )

    block_id: Mapped[str] = mapped_column(Id, primary_key=True)
    material_id: Mapped[str] = mapped_column(
        Id, ForeignKey("materials.material_id", ondelete="CASCADE"), nullable=False
    )
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    char_count: Mapped[int] = mapped_column(Integer, nullable=False)


class KnowledgePoint(Base):
    """``knowledge_points``: a named knowledge point over blocks of one material."""

    __tablename__ = "knowledge_points"
    __table_args__ = (
        Index("ix_knowledge_points_user", "user_id", "created_at"),
        Index("ix_knowledge_points_material", "material_id"),
    )

    knowledge_point_id: Mapped[str] = mapped_column(Id, primary_key=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    material_id: Mapped[str] = mapped_column(
        Id, ForeignKey("materials.material_id", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(500), nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class KnowledgePointBlock(Base):
    """``knowledge_point_blocks``: link of a knowledge point to one of its blocks."""

    __tablename__ = "knowledge_point_blocks"
    __table_args__ = (
        PrimaryKeyConstraint("knowledge_point_id", "block_id"),
        Index("ix_knowledge_point_blocks_block", "block_id"),
    )

    knowledge_point_id: Mapped[str] = mapped_column(
        Id, ForeignKey("knowledge_points.knowledge_point_id", ondelete="CASCADE")
    )
    block_id: Mapped[str] = mapped_column(
        Id, ForeignKey("material_blocks.block_id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class LearningEvent(Base):
    """``learning_events``: one reading or quiz-attempt event; ``event_id`` unique per user."""

    __tablename__ = "learning_events"
    __table_args__ = (
        UniqueConstraint("user_id", "event_id", name="uq_learning_events_user_event"),
        Index("ix_learning_events_user_occurred", "user_id", "occurred_at"),
    )

    id: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    event_id: Mapped[str] = mapped_column(String(128), nullable=False)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    material_id: Mapped[str | None] = mapped_column(Id)
    block_id: Mapped[str | None] = mapped_column(Id)
    knowledge_point_id: Mapped[str | None] = mapped_column(Id)
    dwell_seconds: Mapped[float | None] = mapped_column(Double)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    occurred_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class LearningBlockStat(Base):
    """``learning_block_stats``: a user's reading of one block, summed over their events.

    Kept by event ingestion (:func:`job_service.learning.events.record_learning_events`,
    in its transaction: the batch's new events are added to the rows with upserts that
    add under the row lock, so racing batches lose nothing) so that a snapshot reads one
    row per block read in its scope instead of the user's whole reading history.
    """

    __tablename__ = "learning_block_stats"
    __table_args__ = (
        PrimaryKeyConstraint("user_id", "material_id", "block_id", name="pk_learning_block_stats"),
    )

    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    material_id: Mapped[str] = mapped_column(Id, nullable=False)
    block_id: Mapped[str] = mapped_column(Id, nullable=False)
    #: Seconds, the SUM of the events' ``dwell_seconds``.
    dwell_seconds: Mapped[float] = mapped_column(Double, nullable=False)
    last_read_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class LearningKnowledgePointStat(Base):
    """``learning_kp_stats``: a user's quiz attempts on one knowledge point, counted over
    their events; kept like :class:`LearningBlockStat`."""

    __tablename__ = "learning_kp_stats"
    __table_args__ = (
        PrimaryKeyConstraint("user_id", "knowledge_point_id", name="pk_learning_kp_stats"),
    )

    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    knowledge_point_id: Mapped[str] = mapped_column(Id, nullable=False)
    attempts: Mapped[int] = mapped_column(BigInteger, nullable=False)
    correct: Mapped[int] = mapped_column(BigInteger, nullable=False)
    last_attempt_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class AiSnapshot(Base):
    """``ai_snapshots``: an immutable snapshot payload, stored once per (user, hash)."""

    __tablename__ = "ai_snapshots"
    __table_args__ = (
        UniqueConstraint("user_id", "content_hash", name="uq_ai_snapshots_user_hash"),
    )

    snapshot_id: Mapped[str] = mapped_column(Id, primary_key=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    job_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_id: Mapped[str] = mapped_column(String(128), nullable=False)
    schema_version: Mapped[str] = mapped_column(String(16), nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    content_hash: Mapped[str] = mapped_column(Hash, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class AiResult(Base):
    """``ai_results``: one accepted result; ``idempotency_key`` = ``jobId:attemptNo:outputHash``."""

    __tablename__ = "ai_results"
    __table_args__ = (
        UniqueConstraint("idempotency_key", name="uq_ai_results_idempotency_key"),
        Index("ix_ai_results_job", "job_id"),
    )

    result_id: Mapped[str] = mapped_column(Id, primary_key=True)
    job_id: Mapped[str] = mapped_column(Id, nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False)
    output_hash: Mapped[str] = mapped_column(Hash, nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(200), nullable=False)
    #: as the runtime reported it (``<jobType>.<version>``, reference §10.4)
    prompt_version: Mapped[str | None] = mapped_column(String(128))
    output_schema_version: Mapped[str] = mapped_column(String(16), nullable=False)
    output: Mapped[Any] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


class _BusinessRow:
    """Columns shared by the five business tables."""

    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    job_id: Mapped[str] = mapped_column(Id, nullable=False, index=True)
    ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    content_hash: Mapped[str] = mapped_column(Hash, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)


def _business_args(table: str) -> tuple[Any, ...]:
    return (
        UniqueConstraint("user_id", "content_hash", name=f"uq_{table}_user_hash"),
        Index(f"ix_{table}_user_created", "user_id", "created_at", "id"),
    )


class AiLearningAnalysis(_BusinessRow, Base):
    """``ai_learning_analyses``: one ``AiLearningAnalysis`` (reference §5)."""

    __tablename__ = "ai_learning_analyses"
    __table_args__ = _business_args("ai_learning_analyses")

    id: Mapped[str] = mapped_column(Id, primary_key=True)
    summary: Mapped[str] = mapped_column(Text, nullable=False)
    mastery_level: Mapped[float] = mapped_column(Double, nullable=False)
    strengths: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    risks: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)


class AiWeakPointCandidate(_BusinessRow, Base):
    """``ai_weak_point_candidates``: one ``WeakPointCandidate`` (reference §5)."""

    __tablename__ = "ai_weak_point_candidates"
    __table_args__ = _business_args("ai_weak_point_candidates")

    id: Mapped[str] = mapped_column(Id, primary_key=True)
    #: NULL once the knowledge point is deleted (the item keeps its text, reference §9.2).
    knowledge_point_id: Mapped[str | None] = mapped_column(Id)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    severity: Mapped[float] = mapped_column(Double, nullable=False)
    evidence_block_ids: Mapped[list[str]] = mapped_column(JSON, nullable=False)


class AiNextActionRecommendation(_BusinessRow, Base):
    """``ai_next_action_recommendations``: one ``NextActionRecommendation`` (reference §5)."""

    __tablename__ = "ai_next_action_recommendations"
    __table_args__ = _business_args("ai_next_action_recommendations")

    id: Mapped[str] = mapped_column(Id, primary_key=True)
    action_type: Mapped[str] = mapped_column(String(16), nullable=False)
    target_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_id: Mapped[str] = mapped_column(String(128), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)


class AiQuizQuestion(_BusinessRow, Base):
    """``ai_quiz_questions``: one ``QuizQuestion`` (reference §5)."""

    __tablename__ = "ai_quiz_questions"
    __table_args__ = _business_args("ai_quiz_questions")

    id: Mapped[str] = mapped_column(Id, primary_key=True)
    question_type: Mapped[str] = mapped_column(String(32), nullable=False)
    stem: Mapped[str] = mapped_column(Text, nullable=False)
    options: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    answer: Mapped[Any] = mapped_column(JSON, nullable=False)
    explanation: Mapped[str] = mapped_column(Text, nullable=False)
    difficulty: Mapped[str] = mapped_column(String(16), nullable=False)
    knowledge_point_id: Mapped[str | None] = mapped_column(Id)
    source_block_ids: Mapped[list[str]] = mapped_column(JSON, nullable=False)


class AiFlashcard(_BusinessRow, Base):
    """``ai_flashcards``: one ``Flashcard`` (reference §5)."""

    __tablename__ = "ai_flashcards"
    __table_args__ = _business_args("ai_flashcards")

    id: Mapped[str] = mapped_column(Id, primary_key=True)
    front: Mapped[str] = mapped_column(Text, nullable=False)
    back: Mapped[str] = mapped_column(Text, nullable=False)
    knowledge_point_id: Mapped[str | None] = mapped_column(Id)
    source_block_ids: Mapped[list[str]] = mapped_column(JSON, nullable=False)


class AiQuestionGenerationPlan(Base):
    """``ai_question_generation_plans``: a quiz job's plan and outcome counts (reference §5)."""

    __tablename__ = "ai_question_generation_plans"
    __table_args__ = (Index("ix_ai_question_generation_plans_user", "user_id", "created_at"),)

    job_id: Mapped[str] = mapped_column(Id, primary_key=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    target_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_id: Mapped[str] = mapped_column(String(128), nullable=False)
    requested_count: Mapped[int] = mapped_column(Integer, nullable=False)
    difficulty: Mapped[str] = mapped_column(String(16), nullable=False)
    question_types: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    generated: Mapped[int | None] = mapped_column(Integer)
    written: Mapped[int | None] = mapped_column(Integer)
    skipped_duplicates: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    completed_at: Mapped[datetime | None] = mapped_column(Micro)


class AiFlashcardGenerationPlan(Base):
    """``ai_flashcard_generation_plans``: a flashcard job's plan and outcome counts (reference §5)."""

    __tablename__ = "ai_flashcard_generation_plans"
    __table_args__ = (Index("ix_ai_flashcard_generation_plans_user", "user_id", "created_at"),)

    job_id: Mapped[str] = mapped_column(Id, primary_key=True)
    user_id: Mapped[str] = mapped_column(UserId, nullable=False)
    target_type: Mapped[str] = mapped_column(String(32), nullable=False)
    target_id: Mapped[str] = mapped_column(String(128), nullable=False)
    requested_count: Mapped[int] = mapped_column(Integer, nullable=False)
    generated: Mapped[int | None] = mapped_column(Integer)
    written: Mapped[int | None] = mapped_column(Integer)
    skipped_duplicates: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Micro, nullable=False)
    completed_at: Mapped[datetime | None] = mapped_column(Micro)


@cache
def model_of(table_name: str) -> type[Any]:
    """The ORM model mapped to ``table_name``: how the job-type registry's
    ``result_table`` / ``plan_table`` names (:mod:`airuntime_common.jobtypes`)
    become tables here.

    Cached: the models are all declared once this module is imported.

    Raises:
        LookupError: no model of this metadata maps that table.
    """
    for mapper in Base.registry.mappers:
        if isinstance(mapper.local_table, Table) and mapper.local_table.name == table_name:
            return mapper.class_
    raise LookupError(f"no table {table_name!r} in job_service's models")


def business_model(job_type: str) -> tuple[type[Any], str]:
    """The business table model of ``job_type``'s items, and the JSON key of an item's id.

    Raises:
        AppError: ``INVALID_ARGUMENT`` for an unknown job type.
    """
    spec = jobtypes.get(job_type)
    return model_of(spec.result_table), spec.item_id_key


def business_kinds() -> dict[str, tuple[type[Any], str]]:
    """Result kind (``ListResultItems``) → (its business model, the JSON key of an item's id)."""
    return {s.result_kind: (model_of(s.result_table), s.item_id_key) for s in jobtypes.specs()}
