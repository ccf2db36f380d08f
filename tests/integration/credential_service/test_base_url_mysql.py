"""Users' own base URLs on MariaDB/MySQL (``TEST_MYSQL_URL``; skipped when unset):
migration 0003's column, a refused URL storing nothing, the URL resolved with its key
only, and a URL changed in the database leaving the key unusable (reference §10.5)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airuntime_common.errors import ErrorCode
from tests.unit.credential_service import conftest as unit
from tests.unit.credential_service.conftest import INSTANCE, Lease, StartFn
from tests.unit.credential_service.test_base_url import KEY, fake_resolver, put
from tests.unit.credential_service.test_servicer import refused, resolve

pytestmark = pytest.mark.mysql

start_env = unit.start_env
_clean_env = unit._clean_env


async def test_base_url_on_mysql(start_env: StartFn, mysql_url: str) -> None:
    env = await start_env(CREDENTIAL_DATABASE_URL=mysql_url, USER_BASE_URLS=True)
    env.handle.store.resolver = fake_resolver
    async with env.handle.engine.connect() as conn:
        column = await conn.execute(
            text(
                "select data_type, character_maximum_length, is_nullable, collation_name "
                "from information_schema.columns where table_schema = database() "
                "and table_name = 'ai_model_credentials' and column_name = 'base_url'"
            )
        )
        kind, length, nullable, collation = column.one()
    assert (kind, length, nullable) == ("varchar", 2048, "YES")
    assert collation.endswith("_bin")  # the table's binary collation (0002)

    err = await refused(put(env, "https://dual.example.com/v1"))
    assert (err.code, err.details["rule"]) == (ErrorCode.INVALID_BASE_URL, "address")
    async with env.handle.engine.connect() as conn:
        assert (await conn.execute(text("select count(*) from ai_model_credentials"))).scalar() == 0

    cred = (await put(env, "https://LLM.example.com/v1/")).credential
    assert cred.base_url == "https://llm.example.com/v1"
    env.fake.hold("job-u", INSTANCE, 1, Lease(user_id="u1"))
    got = await resolve(env, "job-u", 1)
    assert (got.api_key, got.base_url, got.user_base_url) == (KEY, cred.base_url, True)

    async with env.handle.engine.begin() as conn:
        await conn.execute(
            text("update ai_model_credentials set base_url = 'https://attacker.example/v1'")
        )
    err = await refused(resolve(env, "job-u", 1))
    assert (err.code, err.details["reason"]) == (
        ErrorCode.INVALID_CREDENTIAL,
        "authentication_failed",
    )
