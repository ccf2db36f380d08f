"""The job database: tables, named statements, transitions as SQL, records, transactions,
the clock, the statement cache and statement batches. SQL only: the services decide."""
