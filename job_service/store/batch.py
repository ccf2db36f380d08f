"""Statement batches: the statements of one transaction, queued, then run together.

Every operation of the job service writes through a batch, on both databases,
so each operation has one body:

* on MySQL/MariaDB (:class:`~job_service.store.mysql_batch.MultiStatementBatch`)
  the whole batch goes to the server as one multi-statement query: one round
  trip, however many statements (the module doc there says why that matters);
* on SQLite (:class:`SequentialBatch`) the statements run one at a time in the
  caller's transaction: SQLite runs in process, there is no round trip to save.

Both executors keep the same guards:

* :meth:`StatementBatch.fence` stops the batch unless the statement just before
  it matched exactly one row, or the number it was given (a fencing check: the
  lease, or every lease of a group's UPDATE, is still held), and
  :meth:`StatementBatch.run` raises :class:`FenceBroken`; nothing after the
  fence runs, and the caller's transaction rolls back. MySQL evaluates the
  fence on the server; the sequential executor checks the row count itself.
* A statement built to run only when the one before it matched exactly one row
  (an event row after its transition's UPDATE:
  :func:`job_service.store.transitions.event_if_matched`) carries that
  condition in its own SQL (``ROW_COUNT() = 1`` on MySQL, ``changes() = 1`` on
  SQLite), so both servers judge it.
* An error stops the batch at that statement and is raised as SQLAlchemy's
  :class:`~sqlalchemy.exc.DBAPIError` family, so deadlock retries and
  integrity errors behave as for a statement sent alone.

:meth:`StatementBatch.commit` ends a MySQL batch with its COMMIT (only for a
transaction that converges when run again after a lost answer); on SQLite the
transaction's own block commits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from job_service.store.cache import Sql
from job_service.store.engine import DbExec, dialect_name


@dataclass(frozen=True)
class Outcome:
    """One statement's result: ``rowcount`` (rows matched, or rows returned) and ``rows``.

    ``rows`` are plain tuples in the order of the statement's selected columns,
    with each column type's result processing applied (e.g. JSON decoded); empty
    for statements returning no rows.
    """

    rowcount: int
    rows: list[tuple[Any, ...]]


class FenceBroken(Exception):
    """A fenced statement matched another number of rows than its fence expects (one,
    unless it was given another); the batch stopped at its fence.

    Nothing after the fence ran and nothing was committed; the transaction is
    still open and the caller's ``begin()`` block rolls it back.

    Attributes:
        label: what :meth:`StatementBatch.fence` was given (e.g. ``"succeed"``).
    """

    def __init__(self, label: str, rows: int = 1) -> None:
        super().__init__(f"fenced statement {label!r} did not match exactly {rows} row(s)")
        self.label = label


@dataclass(frozen=True)
class Queued:
    """One queued entry: a statement, a fence (``fence`` = its label, ``fence_rows`` the
    row count it expects) or the COMMIT; ``merge``: a single-row INSERT that may join
    others of its shape (:meth:`StatementBatch.add`)."""

    sql: Sql | None = None
    fence: str | None = None
    fence_rows: int = 1
    commit: bool = False
    merge: bool = False


class StatementBatch(ABC):
    """Statements of one transaction, run together by :meth:`run`.

    Usage::

        batch = new_batch(conn)
        i = batch.add(succeed_update)
        batch.fence("succeed")          # stop here unless the UPDATE matched one row
        batch.add(event_row)
        batch.commit()
        outcomes = await batch.run()    # outcomes[i].rowcount == 1

    Args:
        db: a session or connection inside a transaction.
    """

    def __init__(self, db: DbExec) -> None:
        self._db = db
        self._queue: list[Queued] = []
        self._statements = 0

    def add(self, sql: Sql, *, merge: bool = False) -> int:
        """Queue one statement; returns its index in :meth:`run`'s outcomes.

        Args:
            merge: ``sql`` is a single-row ``INSERT`` whose place in the batch and own
                row count do not matter, only that it runs before the COMMIT (a
                result's business row, its model-call log, its result row). On
                MySQL/MariaDB the batch's merged INSERTs of one shape run as one
                multi-row INSERT, at the first one's place, and each of them is
                answered with that statement's outcome (its row count is the sum);
                on SQLite each runs where it was queued. One whose next entry reads
                its row count (a fence, a statement using ``ROW_COUNT()``) is never
                merged.
        """
        self._queue.append(Queued(sql=sql, merge=merge))
        self._statements += 1
        return self._statements - 1

    def fence(self, label: str, rows: int = 1) -> None:
        """Stop the batch unless the statement just queued matched exactly ``rows`` rows.

        Args:
            label: names the fenced statement in :class:`FenceBroken`.
            rows: the row count the statement must have matched (≥ 1): a
                transition of several jobs in one UPDATE, each under its lease,
                matches them all or the lease of one was lost.

        Raises:
            ValueError: ``rows`` < 1 (a programming error).
        """
        if rows < 1:
            raise ValueError("a fence expects at least one row")
        self._queue.append(Queued(fence=label, fence_rows=rows))

    def commit(self) -> None:
        """End the batch with the transaction's COMMIT (MySQL/MariaDB; see the module doc)."""
        self._queue.append(Queued(commit=True))

    def __len__(self) -> int:
        return self._statements

    async def run(self) -> list[Outcome]:
        """Run every queued entry; one :class:`Outcome` per :meth:`add`, in order.

        Raises:
            FenceBroken: a fence found its statement matched no row or several.
            sqlalchemy.exc.DBAPIError: any other error of a statement (nothing
                after it ran), or a lost connection (``connection_invalidated``).
        """
        if not self._queue:
            return []
        queue, self._queue, self._statements = self._queue, [], 0
        return await self._execute(queue)

    @abstractmethod
    async def _execute(self, queue: list[Queued]) -> list[Outcome]:
        """Run ``queue``; one outcome per statement entry."""


class SequentialBatch(StatementBatch):
    """A batch run one statement at a time in the caller's transaction (SQLite).

    A fence is checked here, from the row count of the statement before it;
    the COMMIT entry is left to the transaction's block.
    """

    async def _execute(self, queue: list[Queued]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        last = -1
        for entry in queue:
            if entry.fence is not None:
                if last != entry.fence_rows:
                    raise FenceBroken(entry.fence, entry.fence_rows)
                continue
            if entry.sql is None:  # COMMIT: the caller's block commits
                continue
            result: Any = await self._db.execute(entry.sql.statement(), dict(entry.sql.params))
            if result.returns_rows:
                rows = [tuple(r) for r in result.all()]
                outcome = Outcome(len(rows), rows)
            else:
                outcome = Outcome(int(result.rowcount), [])
            outcomes.append(outcome)
            last = outcome.rowcount
        return outcomes


def new_batch(db: DbExec) -> StatementBatch:
    """A batch for ``db``'s database: one round trip on MySQL/MariaDB, sequential elsewhere."""
    if dialect_name(db) in ("mysql", "mariadb"):
        from job_service.store.mysql_batch import MultiStatementBatch

        return MultiStatementBatch(db)
    return SequentialBatch(db)


async def run_one(db: DbExec, sql: Sql, *, commit: bool = False) -> Outcome:
    """Run one statement as a batch of one (on MySQL/MariaDB past SQLAlchemy's
    execution layer, about a quarter of a millisecond of CPU less per statement).

    Args:
        commit: end the batch with the COMMIT (a read-only transaction's, say).
    """
    batch = new_batch(db)
    batch.add(sql)
    if commit:
        batch.commit()
    return (await batch.run())[0]
