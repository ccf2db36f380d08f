"""Settings of credential_service, read from the environment (reference §7, §9.4).

Secrets (``CREDENTIAL_ENCRYPTION_KEYS``, ``DEEPSEEK_API_KEY``, the other providers'
platform keys) are :class:`pydantic.SecretStr`, so neither a ``repr`` nor a
validation error ever prints them. :meth:`CredentialSettings.validate_for_serve`
refuses to start, naming the variable, when the token or the master keys are
missing or malformed; a malformed ``MODEL_PROVIDERS`` is refused when read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field, SecretStr

from airuntime_common.egress import EgressSettings
from airuntime_common.model_providers import (
    DEFAULT_API_KEY_ENV,
    STANDIN_PLATFORM_KEY,
    ModelProvidersSettings,
)
from airuntime_common.settings import (
    DEFAULT_CREDENTIAL_DB,
    CommonSettings,
    DatabaseUrl,
    ListenAddress,
    MissingSetting,
    require,
)

#: The literal platform key used only when ``ALLOW_PLATFORM_KEY_STANDIN=1`` and no
#: ``DEEPSEEK_API_KEY`` is configured (dev launcher, demo, tests; reference §5).


class CredentialSettings(EgressSettings, ModelProvidersSettings, CommonSettings):
    """Environment of credential_service.

    ``USER_BASE_URLS``, ``USER_BASE_URL_PORTS`` and ``EGRESS_ALLOW_CIDRS`` (users' own
    base URLs, reference §10.5) are :class:`~airuntime_common.egress.EgressSettings`'s;
    the worker reads the same three and must be given the same values.

    Attributes:
        CREDENTIAL_DATABASE_URL: SQLAlchemy async URL of this service's database.
        CREDENTIAL_ENCRYPTION_KEYS: ``kid:base64key[,kid:base64key…]``; the first is current;
            each key decodes to 32 bytes (AES-256).
        DEEPSEEK_API_KEY: the default provider's platform key; unset means its
            platform-key jobs are refused, unless ``ALLOW_PLATFORM_KEY_STANDIN`` is on.
        DEEPSEEK_BASE_URL: the default provider's endpoint (when ``MODEL_PROVIDERS``
            is unset), returned with every key it resolves.
        MODEL_PROVIDERS: the providers, in order of preference
            (:mod:`airuntime_common.model_providers`); each one's platform key is read
            from its ``apiKeyEnv`` at start (:meth:`platform_keys`).
        ALLOW_PLATFORM_KEY_STANDIN: dev/demo/test only: a provider with no platform key
            resolves platform-key jobs to :data:`STANDIN_PLATFORM_KEY`.
        CREDENTIAL_SERVICE_LISTEN: gRPC listen address; port 0 picks a free port.
        CREDENTIAL_SERVICE_METRICS_PORT: Prometheus port; 0 turns metrics off.
        VERIFY_LEASE_TIMEOUT_SECONDS: deadline of the ``JobService.VerifyLease`` call (seconds).
        ROTATE_BATCH_SIZE: default batch of ``rotate-keys`` and of ``RotateKeys(batch_size=0)``.
    """

    CREDENTIAL_DATABASE_URL: DatabaseUrl = DEFAULT_CREDENTIAL_DB
    CREDENTIAL_ENCRYPTION_KEYS: SecretStr = SecretStr("")
    DEEPSEEK_API_KEY: SecretStr | None = None
    ALLOW_PLATFORM_KEY_STANDIN: bool = False
    CREDENTIAL_SERVICE_LISTEN: ListenAddress = "[::]:50052"
    CREDENTIAL_SERVICE_METRICS_PORT: int = Field(default=9102, ge=0, le=65535)
    VERIFY_LEASE_TIMEOUT_SECONDS: float = 5.0
    ROTATE_BATCH_SIZE: int = 100

    def platform_keys(self, env: Mapping[str, str] | None = None) -> dict[str, SecretStr]:
        """Each provider's platform key, read from its ``apiKeyEnv`` (reference §9.4).

        Args:
            env: the environment (default ``os.environ``); ``DEEPSEEK_API_KEY`` is
                this settings' value whatever ``env`` says.

        Returns:
            ``{provider name: key}`` for the providers whose variable is set and not
            blank (stripped); a provider missing here has no platform key. The
            stand-in key is never in it (see :meth:`platform_key`).
        """
        source = dict(os.environ if env is None else env)
        if self.DEEPSEEK_API_KEY is not None:
            source[DEFAULT_API_KEY_ENV] = self.DEEPSEEK_API_KEY.get_secret_value()
        else:
            source.pop(DEFAULT_API_KEY_ENV, None)
        keys: dict[str, SecretStr] = {}
        for provider in self.providers():
            value = source.get(provider.apiKeyEnv or "", "").strip()
            if provider.apiKeyEnv and value:
                keys[provider.name] = SecretStr(value)
        return keys

    def platform_key(
        self, provider: str | None = None, keys: Mapping[str, SecretStr] | None = None
    ) -> str | None:
        """The key a provider's platform-key jobs use: its own, else the stand-in if
        allowed.

        Args:
            provider: a provider's name; None means the first configured one.
            keys: :meth:`platform_keys` as read at start (default: read now).

        Returns:
            The key, or None when the provider has no platform key (reference §5: never a
            fake model in production).
        """
        name = provider if provider is not None else self.providers().first.name
        key = (self.platform_keys() if keys is None else keys).get(name)
        if key is not None:
            return key.get_secret_value()
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
