"""Platform failover end to end (reference §9.4): 200 platform-key jobs on two job_service
replicas and one MariaDB database while the primary provider answers 503 and comes
back; the backup, a second stand-in provider with its own key and model name, takes
the attempts meanwhile (:mod:`chaos.failover`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.failover import FAILOVER_JOBS
from chaos.runner import Options, run_on, scenario_system
from tests.chaos.conftest import assert_clean, mysql_server_url, profile

pytestmark = [pytest.mark.e2e, pytest.mark.mysql]


async def test_the_primary_down_fails_over_and_comes_back(tmp_path: Path) -> None:
    url = mysql_server_url()
    prof = profile()
    async with scenario_system(
        "provider_failover", prof, Options(), mysql_url=url, work_dir=tmp_path
    ) as (system, _):
        assert len(system.specs("job_service")) == 2
        assert set(system.standin_urls) == {"primary", "backup"}
        result = await run_on("provider_failover", system, prof, Options())
    assert_clean(result)  # nothing lost, stuck or written twice; the checks below passed
    if prof.name == "short":
        assert result.audit.jobs == FAILOVER_JOBS
    assert result.audit.by_status["succeeded"] == result.audit.jobs
    assert not result.load.refused  # the backup admitted every create
    grants = result.notes["leaseGrants"]
    assert grants["backup"]["beforeBack"] > 0 and grants["primary"]["afterBack"] > 0
    assert result.recovery_seconds is not None
