"""The multi-process race: 2 job_service replicas + N worker processes on one MariaDB database,
random worker SIGKILLs part way (short profile: 200 jobs, 4 workers, 2 kills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.runner import Options, run_on, scenario_system
from tests.chaos.conftest import assert_clean, mysql_server_url, profile

pytestmark = [pytest.mark.e2e, pytest.mark.mysql]


async def test_two_replicas_many_workers_random_kills(tmp_path: Path) -> None:
    url = mysql_server_url()
    prof = profile()
    async with scenario_system("race", prof, Options(), mysql_url=url, work_dir=tmp_path) as (
        system,
        _,
    ):
        assert len(system.specs("job_service")) == 2
        result = await run_on("race", system, prof, Options(seed=7))
    assert_clean(result)
    assert result.audit.jobs == prof.race_jobs
    assert sum(result.audit.by_status.values()) == prof.race_jobs
    assert len(result.notes["kills"]) == prof.race_kills
    # both replicas served workers: jobs were finished through each of them
    assert len(result.audit.actors) >= 2
