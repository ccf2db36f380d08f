"""A sixth job type is one spec entry, an output model, a result table and a prompt
template (docs/job-types.md): registered in a fresh interpreter
(``tests/fixtures/jobtype/run_glossary_job.py``), it runs end to end through the
public REST API, the worker, the model stand-in and job_service's result validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "jobtype" / "run_glossary_job.py"

pytestmark = pytest.mark.e2e


def test_a_registered_job_type_runs_end_to_end() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    job, result = out["job"], out["result"]
    assert job["jobType"] == "glossary_extraction", job
    assert job["status"] == "succeeded", job
    assert job["promptVersion"] == "glossary_extraction.v1"
    assert out["resultStatus"] == 200, result
    assert result["jobType"] == "glossary_extraction"
    terms = result["items"]
    assert [t["term"] for t in terms] == ["Photosynthesis", "Chlorophyll"]
    assert all(len(t["termId"]) == 32 and t["sourceBlockIds"] for t in terms)
