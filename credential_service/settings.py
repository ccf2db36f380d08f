"""Settings of credential_service, read from the environment (SPEC §7).

Secrets (``CREDENTIAL_ENCRYPTION_KEYS``, ``DEEPSEEK_API_KEY``) are
:class:`pydantic.SecretStr`, so neither a ``repr`` nor a validation error ever
prints them. :meth:`CredentialSettings.validate_for_serve` refuses to start,
naming the variable, when the token or the master keys are missing or malformed.
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from airuntime_common.settings import (
    DEFAULT_CREDENTIAL_DB,
    CommonSettings,
    DatabaseUrl,
    HttpBaseUrl,
    ListenAddress,
    MissingSetting,
    require,
)

#: The literal platform key used only when ``ALLOW_PLATFORM_KEY_STANDIN=1`` and no
#: ``DEEPSEEK_API_KEY`` is configured (dev launcher, demo, tests; SPEC §5).
STANDIN_PLATFORM_KEY = "sk-standin-local"


class CredentialSettings(CommonSettings):
    """Environment of credential_service.

    Attributes:
        CREDENTIAL_DATABASE_URL: SQLAlchemy async URL of this service's database.
        CREDENTIAL_ENCRYPTION_KEYS: ``kid:base64key[,kid:base64key…]``; the first is current;
            each key decodes to 32 bytes (AES-256).
        DEEPSEEK_API_KEY: the platform key; unset means platform-key jobs are refused,
            unless ``ALLOW_PLATFORM_KEY_STANDIN`` is on.
        DEEPSEEK_BASE_URL: endpoint returned with every resolved key.
        ALLOW_PLATFORM_KEY_STANDIN: dev/demo/test only: with no platform key, resolve
            platform-key jobs to :data:`STANDIN_PLATFORM_KEY`.
        CREDENTIAL_SERVICE_LISTEN: gRPC listen address; port 0 picks a free port.
        CREDENTIAL_SERVICE_METRICS_PORT: Prometheus port; 0 turns metrics off.
        VERIFY_LEASE_TIMEOUT_SECONDS: deadline of the ``JobService.VerifyLease`` call (seconds).
        ROTATE_BATCH_SIZE: default batch of ``rotate-keys`` and of ``RotateKeys(batch_size=0)``.
    """

    CREDENTIAL_DATABASE_URL: DatabaseUrl = DEFAULT_CREDENTIAL_DB
    CREDENTIAL_ENCRYPTION_KEYS: SecretStr = SecretStr("")
    DEEPSEEK_API_KEY: SecretStr | None = None
    DEEPSEEK_BASE_URL: HttpBaseUrl = "https://api.deepseek.com"
    ALLOW_PLATFORM_KEY_STANDIN: bool = False
    CREDENTIAL_SERVICE_LISTEN: ListenAddress = "[::]:50052"
    CREDENTIAL_SERVICE_METRICS_PORT: int = Field(default=9102, ge=0, le=65535)
    VERIFY_LEASE_TIMEOUT_SECONDS: float = 5.0
    ROTATE_BATCH_SIZE: int = 100

    def platform_key(self) -> str | None:
        """The key platform-key jobs use: ``DEEPSEEK_API_KEY``, else the stand-in if allowed.

        Returns:
            The key, or None when production has no platform key (SPEC §5: never a fake model).
        """
        configured = (
            self.DEEPSEEK_API_KEY.get_secret_value().strip() if self.DEEPSEEK_API_KEY else ""
        )
        if configured:
            return configured
        if self.ALLOW_PLATFORM_KEY_STANDIN:
            return STANDIN_PLATFORM_KEY
        return None

    def validate_for_serve(self) -> None:
        """Refuse to serve without the token or with missing/malformed master keys.

        Raises:
            MissingSetting: with a message naming the variable and no key material.
        """
        require(self, "RUNTIME_SERVICE_TOKEN")
        self.validate_keys()

    def validate_keys(self) -> None:
        """Check ``CREDENTIAL_ENCRYPTION_KEYS`` parses (used by serve and ``rotate-keys``).

        Raises:
            MissingSetting: naming ``CREDENTIAL_ENCRYPTION_KEYS``; never echoes key material.
        """
        from credential_service.vault import KeyringError, parse_keys

        try:
            parse_keys(self.CREDENTIAL_ENCRYPTION_KEYS.get_secret_value())
        except KeyringError as exc:
            raise MissingSetting(f"refusing to start: {exc}") from None
