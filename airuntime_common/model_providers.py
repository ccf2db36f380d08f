"""The configured model providers, ``MODEL_PROVIDERS`` (reference §9.4), parsed and
validated once for every service that needs them.

``MODEL_PROVIDERS`` is a JSON list, in order of preference::

    [{"name": "deepseek", "baseUrl": "https://api.deepseek.com",
      "apiKeyEnv": "DEEPSEEK_API_KEY", "models": {}},
     {"name": "backup", "baseUrl": "https://llm.example.com/v1",
      "apiKeyEnv": "BACKUP_API_KEY", "models": {"deepseek-chat": "deepseek-v3"}}]

* ``name``: the provider's name (``modelProvider`` of jobs, invocation logs and user
  keys): 1..32 characters of ``a-z 0-9 . _ -``, starting with a letter or digit;
  unique in the list.
* ``baseUrl``: its OpenAI-compatible endpoint (``POST {baseUrl}/chat/completions``),
  an ``http(s)`` URL with a host.
* ``apiKeyEnv``: the environment variable holding its platform key, read by
  credential_service only. A provider whose variable is unset or empty (or that
  names none: ``null``) has no platform key: it serves user keys only.
* ``models``: ``{jobModelName: providerModelName}``: the name the provider is sent for
  a job's ``modelName``. Empty (the default) means the provider takes the job's
  model name as it is; otherwise it serves exactly the job models listed.
* ``limits``: ``{"requestsPerMinute", "tokensPerMinute", "maxConcurrent"}``, each
  optional and > 0: what the platform-key attempts of every worker together may
  take of the provider (:class:`ProviderLimits`, reference §10.2).

Unset or empty, ``MODEL_PROVIDERS`` is one ``deepseek`` entry made of
``DEEPSEEK_BASE_URL`` and ``DEEPSEEK_API_KEY`` (:func:`default_providers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

from airuntime_common.settings import HttpBaseUrl

#: ``DEEPSEEK_BASE_URL``'s default (reference §7).
DEFAULT_DEEPSEEK_BASE_URL = "https://api.deepseek.com"
#: The provider of the default entry, and of jobs that name none (reference §2.2).
DEFAULT_PROVIDER = "deepseek"
#: The variable of the default entry's platform key (reference §7).
DEFAULT_API_KEY_ENV = "DEEPSEEK_API_KEY"

#: A provider's name: fits job_service's ``model_provider`` column (32) and a URL query.
ProviderName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,31}$")]
#: An environment variable's name.
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
#: A model name (job's or provider's): printable ASCII without spaces, 1..64 characters
#: (job_service's ``model_name`` column).
ModelName = Annotated[str, Field(pattern=r"^[!-~]{1,64}$")]


class ProviderLimits(BaseModel):
    """A provider's rate limits (reference §10.2), each optional and > 0: over every
    60-second window, the platform-key attempts leased to it (``requestsPerMinute``)
    and their token estimates (``tokensPerMinute``); the attempts holding a lease at
    once (``maxConcurrent``). Shared by every worker and job_service replica."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    requestsPerMinute: int | None = Field(default=None, gt=0, le=10_000_000)
    tokensPerMinute: int | None = Field(default=None, gt=0, le=10_000_000_000)
    maxConcurrent: int | None = Field(default=None, gt=0, le=1_000_000)

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        limits = (self.requestsPerMinute, self.tokensPerMinute, self.maxConcurrent)
        return any(v is not None for v in limits)


class ProviderConfig(BaseModel):
    """One entry of ``MODEL_PROVIDERS`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: ProviderName
    baseUrl: HttpBaseUrl
    apiKeyEnv: EnvName | None = None
    models: dict[ModelName, ModelName] = Field(default_factory=dict)
    limits: ProviderLimits = Field(default_factory=ProviderLimits)

    def model_for(self, job_model: str) -> str | None:
        """The name this provider is sent for a job's ``modelName``.

        Returns:
            ``models[job_model]``; the job's name itself when ``models`` is empty;
            None when the provider serves no such model.
        """
        if not self.models:
            return job_model
        return self.models.get(job_model)

    def serves(self, job_model: str) -> bool:
        """Whether a job asking for ``job_model`` can run on this provider."""
        return self.model_for(job_model) is not None


class ModelProviders(RootModel[list[ProviderConfig]]):
    """The providers in order of preference: at least one, names unique.

    Raises:
        pydantic.ValidationError: on a malformed list or entry (at validation).
    """

    root: list[ProviderConfig] = Field(min_length=1, max_length=32)

    @field_validator("root", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        # the variable's text, as when a settings class is given it in code
        if not isinstance(value, str | bytes):
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"must be a JSON list of providers ({exc})") from None

    @model_validator(mode="after")
    def _unique_names(self) -> ModelProviders:
        seen: set[str] = set()
        for p in self.root:
            if p.name in seen:
                raise ValueError(f"provider names must be unique: {p.name!r} is listed twice")
            seen.add(p.name)
        return self

    def __iter__(self) -> Iterator[ProviderConfig]:  # type: ignore[override]
        return iter(self.root)

    def __len__(self) -> int:
        return len(self.root)

    @property
    def names(self) -> list[str]:
        """The providers' names, in order of preference."""
        return [p.name for p in self.root]

    @property
    def first(self) -> ProviderConfig:
        """The preferred provider (the default of a user key stored without one)."""
        return self.root[0]

    def get(self, name: str) -> ProviderConfig | None:
        """The provider called ``name``, or None."""
        return next((p for p in self.root if p.name == name), None)

    def serving(self, job_model: str) -> list[ProviderConfig]:
        """The providers that can run a job asking for ``job_model``, in order of
        preference (where a platform-key attempt's provider is chosen from)."""
        return [p for p in self.root if p.serves(job_model)]


def default_providers(deepseek_base_url: str = DEFAULT_DEEPSEEK_BASE_URL) -> ModelProviders:
    """``MODEL_PROVIDERS`` when it is unset: one ``deepseek`` entry of
    ``DEEPSEEK_BASE_URL`` and ``DEEPSEEK_API_KEY``, serving any model name."""
    return ModelProviders(
        [
            ProviderConfig(
                name=DEFAULT_PROVIDER,
                baseUrl=deepseek_base_url,
                apiKeyEnv=DEFAULT_API_KEY_ENV,
            )
        ]
    )


def parse_model_providers(
    raw: str | None, *, deepseek_base_url: str = DEFAULT_DEEPSEEK_BASE_URL
) -> ModelProviders:
    """``MODEL_PROVIDERS``'s text as the provider list.

    Args:
        raw: the variable's value; None or blank means the default.
        deepseek_base_url: ``DEEPSEEK_BASE_URL``, used by the default entry only.

    Raises:
        pydantic.ValidationError: not a JSON list of valid entries with unique names.
    """
    if raw is None or not raw.strip():
        return default_providers(deepseek_base_url)
    return ModelProviders.model_validate_json(raw)


#: The key platform-key attempts use against the local stand-in (dev, demo, tests only:
#: ``ALLOW_PLATFORM_KEY_STANDIN``); never a real provider's key.
STANDIN_PLATFORM_KEY = "sk-standin-local"


def platform_keys_from(providers: ModelProviders, env: Mapping[str, str]) -> dict[str, str]:
    """Each provider's platform key as ``env`` holds it (its ``apiKeyEnv``, stripped);
    a provider whose variable is unset or blank is left out: it has none (reference §9.4)."""
    keys: dict[str, str] = {}
    for provider in providers:
        value = env.get(provider.apiKeyEnv or "", "").strip()
        if provider.apiKeyEnv and value:
            keys[provider.name] = value
    return keys


class ModelProvidersSettings(BaseModel):
    """The settings of a service that reads ``MODEL_PROVIDERS`` (mixed into its
    pydantic-settings class, which reads them from the environment).

    Attributes:
        DEEPSEEK_BASE_URL: the default entry's endpoint (reference §7).
        MODEL_PROVIDERS: the list; None (unset) means :func:`default_providers`.
    """

    DEEPSEEK_BASE_URL: HttpBaseUrl = DEFAULT_DEEPSEEK_BASE_URL
    MODEL_PROVIDERS: ModelProviders | None = None

    @field_validator("MODEL_PROVIDERS", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    def providers(self) -> ModelProviders:
        """The configured providers (``MODEL_PROVIDERS``, else the ``deepseek`` default)."""
        return self.MODEL_PROVIDERS or default_providers(self.DEEPSEEK_BASE_URL)


__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_DEEPSEEK_BASE_URL",
    "DEFAULT_PROVIDER",
    "STANDIN_PLATFORM_KEY",
    "ModelProviders",
    "ModelProvidersSettings",
    "ProviderConfig",
    "default_providers",
    "parse_model_providers",
    "platform_keys_from",
]
