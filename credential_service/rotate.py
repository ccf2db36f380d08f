"""``python -m credential_service rotate-keys``: move every row to the current master key.

Runs the same batch logic as ``RotateKeys`` directly on the database until nothing is
left on an older configured key, printing counts. Safe while the service is serving
(each row's update is guarded by the ciphertext it read). After it reports
``remaining 0``, the older key ids can be removed from ``CREDENTIAL_ENCRYPTION_KEYS``.
"""

from __future__ import annotations

from collections.abc import Callable

from airuntime_common.db import make_engine, make_sessionmaker
from credential_service import repository
from credential_service.domain import CredentialStore, RotationResult
from credential_service.settings import CredentialSettings
from credential_service.vault import Keyring


async def rotate_all(
    store: CredentialStore,
    batch_size: int = 100,
    progress: Callable[[RotationResult], None] | None = None,
) -> tuple[int, RotationResult]:
    """Run rotation batches until none is left or no batch can make progress.

    Args:
        store: the domain object.
        batch_size: rows per batch.
        progress: called after every batch.

    Returns:
        ``(total rotated, last batch result)``; ``last.remaining > 0`` means rows are
        sealed by key ids that are not configured (see ``last.unknown_key_ids``).
    """
    total = 0
    while True:
        result = await store.rotate_batch(batch_size)
        total += result.rotated
        if progress is not None:
            progress(result)
        if result.remaining == 0 or result.examined == 0:
            return total, result


async def run(settings: CredentialSettings, batch_size: int, echo: Callable[[str], None]) -> int:
    """The ``rotate-keys`` command; returns the process exit code (0 done, 1 rows left).

    Raises:
        MissingSetting: missing or malformed ``CREDENTIAL_ENCRYPTION_KEYS``.
    """
    settings.validate_keys()
    keyring = Keyring.from_env_value(settings.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value())
    engine = make_engine(settings.CREDENTIAL_DATABASE_URL, pool_size=2)
    try:
        store = CredentialStore(make_sessionmaker(engine), keyring, settings)
        echo(f"current key id: {keyring.current_kid}")
        total, last = await rotate_all(
            store,
            batch_size,
            lambda r: echo(
                f"batch: rotated {r.rotated}, undecryptable {r.undecryptable}, "
                f"remaining {r.remaining}"
            ),
        )
        async with make_sessionmaker(engine)() as session:
            counts = await repository.key_id_counts(session)
        echo(f"rotated {total}, remaining {last.remaining}")
        echo("rows per key id: " + ", ".join(f"{k}={n}" for k, n in sorted(counts.items())))
        if last.remaining:
            echo(
                "rows remain on key ids that are not configured: " + ", ".join(last.unknown_key_ids)
            )
            return 1
        return 0
    finally:
        await engine.dispose()
