"""job_service domain: state machine, scheduling, reaper, guards, results, learning data."""
