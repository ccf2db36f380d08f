"""MODEL_PRICES is checked at start: a misspelt key would silently price tokens at 0."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from job_service.settings import JobServiceSettings


def test_default_prices_have_the_three_keys() -> None:
    settings = JobServiceSettings(RUNTIME_SERVICE_TOKEN="t")
    for prices in settings.MODEL_PRICES.values():
        assert set(prices) == {"cacheHitInput", "cacheMissInput", "output"}


@pytest.mark.parametrize(
    "value",
    [
        '{"deepseek-chat":{"cacheHit":0.07,"cacheMiss":0.27,"output":1.1}}',
        '{"deepseek-chat":{"cacheHitInput":0.07,"cacheMissInput":0.27}}',
        '{"deepseek-chat":{"cacheHitInput":-1,"cacheMissInput":0.27,"output":1.1}}',
    ],
)
def test_bad_price_tables_refuse_to_start(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MODEL_PRICES", value)
    with pytest.raises(ValidationError, match="MODEL_PRICES"):
        JobServiceSettings(RUNTIME_SERVICE_TOKEN="t")
