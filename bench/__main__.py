"""``python -m bench [--scenario NAME ...] [--quick] [--jobs N] [--out DIR]``.

Runs the scenarios against MariaDB (``BENCH_MYSQL_URL`` or ``TEST_MYSQL_URL``;
a fresh database per scenario), writes ``<out>/<UTC timestamp>.json`` (default
``bench-results/``) and prints a table. Each figure carries its unit; the JSON
has every scenario's parameters and raw figures (EXPLAIN output, statement lists).
The ``peer`` scenario runs on PostgreSQL instead (:mod:`bench.peer`); with
``throughput`` it runs interleaved, and a side-by-side table (``side_by_side`` in
the JSON) compares the two at each slot count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import mysql_base_url
from bench.report import side_by_side, side_by_side_table, table
from bench.scenarios import SCENARIOS, Params, throughput_and_peer

#: Scenarios that run interleaved, one slot count at a time, when both are selected.
INTERLEAVED = ("throughput", "peer")

EPILOG = """terms in the table:
  DB floor        one job's SQL, captured from MariaDB's general log and replayed
                  with plain aiomysql connections, no services: the most jobs/s
                  the database allows for this SQL
  ratio to floor  full-path jobs/s / floor jobs/s at the same concurrency
  round trips     the floor keeps the service's round trips (hot-path statements
                  go as multi-statement batches); "unbatched" sends the same
                  statements one per round trip, at the highest concurrency
  errors          replayed statements that failed (a deadlock is retried with
                  its whole transaction, as the services do, and not counted)
  CPU per job     user+system CPU of the services (MariaDB shown, not summed)
  peer            the throughput backlog drained by procrastinate on PostgreSQL
                  (BENCH_PG_URL, TEST_PG_URL or postgresql://postgres@127.0.0.1:5432);
                  with throughput selected too, the two run interleaved per slot
                  count and a side-by-side table follows
targets assume the 2-core machine the project is measured on."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see module doc)."""
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="run only this scenario (repeatable); default: all",
    )
    p.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    p.add_argument("--jobs", type=int, help="jobs per throughput/floor/peer run")
    p.add_argument("--slots", help="comma-separated worker slot counts, e.g. 1,4,16")
    p.add_argument(
        "--job-services",
        type=int,
        help="job_service replicas in the throughput scenario (default 1)",
    )
    p.add_argument("--out", default="bench-results", help="directory for the JSON file")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected scenarios; a failing scenario is recorded, the rest still run."""
    names = args.scenario or list(SCENARIOS)
    base = "" if set(names) <= {"peer"} else mysql_base_url()  # the peer needs no MariaDB
    params = Params.quick(base) if args.quick else Params(base_url=base)
    if args.jobs:
        params = replace(params, jobs=args.jobs)
    if args.job_services:
        params = replace(params, job_services=args.job_services)
    if args.slots:
        params = replace(params, slots=tuple(int(s) for s in args.slots.split(",")))
    started = datetime.now(UTC)
    results: dict[str, Any] = {}
    p = {k: v for k, v in asdict(params).items() if k not in {"base_url", "peer_url"}}
    doc = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "quick": bool(args.quick),
        "params": p,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_at_start": os.getloadavg(),
        },
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    path = out / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc["path"] = str(path)
    # with both selected, the pair runs interleaved where the first of them is listed
    both = set(INTERLEAVED) <= set(names)
    paired = next((n for n in names if n in INTERLEAVED), None) if both else None
    for name in names:
        if paired and name in INTERLEAVED and name != paired:
            continue
        label = " + ".join(INTERLEAVED) + " interleaved" if name == paired else name
        print(f"[bench] {label} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            if name == paired:
                got = await throughput_and_peer(params)
            else:
                got = {name: await SCENARIOS[name](params)}
        except Exception as exc:  # keep the other scenarios' figures
            traceback.print_exc()
            got = {n: {"error": repr(exc)} for n in (INTERLEAVED if name == paired else (name,))}
        for key, res in got.items():
            res.setdefault("scenario_seconds", round(time.perf_counter() - t0, 1))
            res["loadavg_after"] = os.getloadavg()
            results[key] = res
        print(
            f"[bench] {label} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True
        )
        path.write_text(json.dumps(doc, indent=2, default=str))  # partial results survive
    compared = side_by_side(doc)
    if compared:
        doc["side_by_side"] = compared
    return doc


def main(argv: list[str] | None = None) -> int:
    """Run, write the JSON, print the table; exit 1 when a scenario failed."""
    args = parse_args(argv)
    doc = asyncio.run(run(args))
    path = Path(doc["path"])
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(table(doc))
    if doc.get("side_by_side"):
        print()
        print(side_by_side_table(doc["side_by_side"]))
    print(f"\nwritten: {path}")
    return 1 if any("error" in r for r in doc["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
