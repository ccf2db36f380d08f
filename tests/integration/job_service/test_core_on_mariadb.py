"""Core domain tests again on MariaDB: DATETIME(6) leases, found-rows guards, the reaper.

Skipped without TEST_MYSQL_URL. Each test gets its own database.
"""

from __future__ import annotations

import pytest

from tests.unit.job_service.test_claim_with_start import *  # noqa: F403
from tests.unit.job_service.test_lifecycle import *  # noqa: F403
from tests.unit.job_service.test_reaper import (  # noqa: F401
    test_departed_workers_are_purged_unless_they_hold_a_lease,
    test_expiry_with_cancel_requested_ends_cancelled,
    test_job_timeout_from_started_at,
    test_l2_l3_paused_worker_loses_to_the_next,
    test_l5_hard_kill_batch_returns_to_pending,
    test_l7_worker_clock_skew_does_not_matter,
    test_retry_is_timed_from_its_own_start_not_the_last_attempts,
)
from tests.unit.job_service.test_retry_cancel import (  # noqa: F401
    test_c1_cancel_running_job,
    test_jittered_backoffs_share_one_compiled_statement,
    test_repeat_fail_answers_current_state,
    test_retry_after_wins_when_longer,
)

pytestmark = pytest.mark.mysql
