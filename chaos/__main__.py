"""``python -m chaos`` — run the fault table (or one fault) and print it.

Options:

* ``--fault NAME`` (repeatable): one of :data:`chaos.runner.ALL_SCENARIOS`
  (default: every fault and the race; with ``--profile soak``: the soak);
* ``--profile short|long|soak`` (``CHAOS_PROFILE``, default short);
* ``--jobs N``: jobs per fault scenario (and in the race);
* ``--soak-seconds S``, ``--soak-rate R``, ``--fault-rate P`` (soak);
* ``--mysql-url URL`` (``CHAOS_MYSQL_URL`` / ``TEST_MYSQL_URL``): the MariaDB
  server to create databases on; without one a private ``mariadbd`` is used;
* ``--galera``: run the scenarios (but ``mariadb_restart``) on a private 3-node
  MariaDB Galera cluster behind HAProxy (the ``galera_*`` faults always do);
  with ``--galera`` and no ``--fault``: the three ``galera_*`` faults;
* ``--direct-writes``: ``galera_multi_writer`` lets its replicas write to their
  nodes (``GALERA_ALLOW_DIRECT_NODE=true``) and measures what happens, instead of
  expecting them to refuse at start; ``--replicas-via-proxy``: its control, both
  replicas through HAProxy (so on one node) with the same load;
* ``--skew-method auto|faketime|python``, ``--seed N``, ``--keep``;
* ``--time-scale X|auto`` (``CHAOS_TIME_SCALE``): multiply leases and timeouts;
* ``--json PATH``: also write every row with its details as JSON.

Exit status 0 when every row is clean, 1 otherwise. SIGTERM stops the run like
Ctrl-C: every server and service it started is stopped first.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from chaos.runner import (
    ALL_SCENARIOS,
    FAULTS,
    GALERA_FAULTS,
    Options,
    format_table,
    run_scenarios,
)
from chaos.scenario_run import PROFILES, ScenarioResult
from chaos.system import time_scale


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    p.add_argument("--fault", action="append", choices=ALL_SCENARIOS, dest="faults")
    p.add_argument(
        "--profile", choices=sorted(PROFILES), default=os.environ.get("CHAOS_PROFILE", "short")
    )
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--soak-seconds", type=float, default=None)
    p.add_argument("--soak-rate", type=float, default=None)
    p.add_argument("--fault-rate", type=float, default=0.05)
    p.add_argument(
        "--mysql-url",
        default=os.environ.get("CHAOS_MYSQL_URL") or os.environ.get("TEST_MYSQL_URL") or None,
    )
    p.add_argument("--skew-method", choices=("auto", "faketime", "python"), default="auto")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--time-scale",
        default=os.environ.get("CHAOS_TIME_SCALE", "1"),
        help="multiply every lease/timeout by this (or 'auto': load average per CPU, 1..4)",
    )
    p.add_argument("--keep", action="store_true")
    p.add_argument(
        "--direct-writes",
        action="store_true",
        help="galera_multi_writer: let the replicas write to their nodes (GALERA_ALLOW_DIRECT_NODE)"
        " and measure what happens, instead of expecting them to refuse",
    )
    p.add_argument(
        "--replicas-via-proxy",
        action="store_true",
        help="galera_multi_writer's control: both replicas through HAProxy (one node)",
    )
    p.add_argument(
        "--galera",
        action="store_true",
        help="run on a private 3-node Galera cluster behind HAProxy (default faults: galera_*)",
    )
    p.add_argument("--work-dir", default=None)
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    return p.parse_args(argv)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM: unwind like Ctrl-C, so the runner stops what it started."""
    raise KeyboardInterrupt


def _database(args: argparse.Namespace, names: list[str]) -> str:
    if args.galera or all(n in GALERA_FAULTS for n in names):
        return "private Galera cluster (3 nodes) behind HAProxy"
    if any(n in GALERA_FAULTS for n in names):
        return "private Galera cluster for galera_*, else " + (args.mysql_url or "private mariadbd")
    return "private mariadbd" if not args.mysql_url else str(args.mysql_url)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parse(argv)
    os.environ["CHAOS_TIME_SCALE"] = str(args.time_scale)
    profile = PROFILES[args.profile]
    if args.jobs:
        profile = dataclasses.replace(profile, jobs=args.jobs, race_jobs=args.jobs)
    default = list(GALERA_FAULTS) if args.galera else list(FAULTS)
    names = args.faults or (["soak"] if args.profile == "soak" else default)
    options = Options(
        soak_seconds=args.soak_seconds,
        soak_rate=args.soak_rate,
        soak_fault_rate=args.fault_rate,
        seed=args.seed,
        keep=args.keep,
        skew_method=args.skew_method,
        galera=args.galera,
        direct_writes=args.direct_writes,
        replicas_via_proxy=args.replicas_via_proxy,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    print(
        f"chaos: profile {profile.name}, scenarios {', '.join(names)}, database"
        f" {_database(args, names)},"
        f" time scale {time_scale():g} (lease {3 * time_scale():g} s)",
        flush=True,
    )

    def on_result(r: ScenarioResult) -> None:
        print(
            f"  {r.name}: {'ok' if r.ok else 'PROBLEMS'} in {r.duration_seconds:.1f} s", flush=True
        )
        for line in [*r.checks, *r.audit.problems[:10]]:
            print(f"    - {line}", flush=True)

    results = asyncio.run(
        run_scenarios(
            names,
            profile,
            options,
            mysql_url=args.mysql_url,
            work_dir=args.work_dir,
            on_result=on_result,
        )
    )
    print()
    print(format_table(results))
    print(f"\n{len(results)} scenario(s) in {time.monotonic() - began:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps([r.as_dict() for r in results], indent=2, default=str)
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
