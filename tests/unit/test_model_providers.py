"""``MODEL_PROVIDERS`` (reference §9.4): parsed and validated once, in airuntime_common."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from airuntime_common.model_providers import (
    ModelProviders,
    ModelProvidersSettings,
    default_providers,
    parse_model_providers,
)
from airuntime_common.settings import CommonSettings, InvalidSetting, load

TWO = [
    {
        "name": "deepseek",
        "baseUrl": "https://api.deepseek.com",
        "apiKeyEnv": "DEEPSEEK_API_KEY",
        "models": {},
    },
    {
        "name": "backup",
        "baseUrl": "http://10.0.0.7:8000/v1",
        "apiKeyEnv": "BACKUP_API_KEY",
        "models": {"deepseek-chat": "deepseek-v3", "deepseek-reasoner": "deepseek-r1"},
    },
]


class Settings(ModelProvidersSettings, CommonSettings):
    """A service's settings with MODEL_PROVIDERS (as credential_service's and job_service's)."""


def test_the_default_is_one_deepseek_entry_of_the_deepseek_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MODEL_PROVIDERS", raising=False)
    monkeypatch.setenv("DEEPSEEK_BASE_URL", "http://127.0.0.1:8600")
    providers = load(Settings, "svc").providers()
    assert providers.names == ["deepseek"]
    only = providers.first
    assert (only.baseUrl, only.apiKeyEnv, only.models) == (
        "http://127.0.0.1:8600",
        "DEEPSEEK_API_KEY",
        {},
    )
    assert only.model_for("deepseek-reasoner") == "deepseek-reasoner"  # any name, as it is
    monkeypatch.setenv("MODEL_PROVIDERS", "  ")
    assert load(Settings, "svc").providers() == default_providers("http://127.0.0.1:8600")


def test_a_list_keeps_its_order_and_maps_model_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_PROVIDERS", json.dumps(TWO))
    providers = load(Settings, "svc").providers()
    assert providers.names == ["deepseek", "backup"]
    backup = providers.get("backup")
    assert backup is not None and providers.get("nobody") is None
    assert backup.model_for("deepseek-chat") == "deepseek-v3"
    assert backup.model_for("gpt-4o") is None and not backup.serves("gpt-4o")
    assert [p.name for p in providers.serving("deepseek-chat")] == ["deepseek", "backup"]
    assert [p.name for p in providers.serving("gpt-4o")] == ["deepseek"]


def test_a_provider_may_name_no_key_variable() -> None:
    providers = parse_model_providers('[{"name": "local", "baseUrl": "http://localhost:9"}]')
    assert providers.first.apiKeyEnv is None and providers.first.models == {}


def entry(**fields: Any) -> list[dict[str, Any]]:
    return [{**TWO[0], **fields}]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("not json", "JSON list"),
        ("[]", "at least 1"),
        ("{}", "list"),
        (json.dumps([TWO[0], TWO[0]]), "unique"),
        (json.dumps(entry(name="")), "name"),
        (json.dumps(entry(name="Deep Seek")), "name"),
        (json.dumps(entry(name="x" * 33)), "name"),
        (json.dumps(entry(baseUrl="ftp://api.deepseek.com")), "baseUrl"),
        (json.dumps(entry(baseUrl="https://")), "baseUrl"),
        (json.dumps(entry(baseUrl="api.deepseek.com")), "baseUrl"),
        (json.dumps(entry(baseUrl="http://host:99999")), "baseUrl"),
        (json.dumps(entry(apiKeyEnv="1BAD")), "apiKeyEnv"),
        (json.dumps(entry(apiKeyEnv="A-KEY")), "apiKeyEnv"),
        (json.dumps(entry(models={"deepseek-chat": ""})), "models"),
        (json.dumps(entry(models={"deepseek chat": "x"})), "models"),
        (json.dumps(entry(models={"deepseek-chat": 3})), "models"),
        (json.dumps(entry(models=["deepseek-chat"])), "models"),
        (json.dumps(entry(key="sk-should-not-be-here")), "key"),
        (json.dumps([{"baseUrl": "https://x"}]), "name"),
    ],
)
def test_a_bad_list_refuses_the_start_naming_the_rule(
    monkeypatch: pytest.MonkeyPatch, value: str, needle: str
) -> None:
    monkeypatch.setenv("MODEL_PROVIDERS", value)
    with pytest.raises(InvalidSetting) as info:
        load(Settings, "svc")
    message = str(info.value)
    assert message.startswith("svc: refusing to start: MODEL_PROVIDERS")
    assert needle in message
    assert "sk-should-not-be-here" not in message  # values are never echoed


def test_parse_refuses_what_load_refuses() -> None:
    with pytest.raises(ValidationError):
        parse_model_providers(json.dumps([TWO[1], TWO[1]]))
    assert isinstance(parse_model_providers(json.dumps(TWO)), ModelProviders)
    assert parse_model_providers(None).names == ["deepseek"]
