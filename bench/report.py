"""The printed table: one row per figure, with unit, parameters and target (2-core machine)."""

from __future__ import annotations

from typing import Any

Row = tuple[str, str, str, str, str]


def _f(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _check(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISSED")


def rows(doc: dict[str, Any]) -> list[Row]:
    """(figure, value, unit, params, target check) rows from a result document."""
    r = doc["results"]
    out = _throughput_rows(r.get("throughput", {}), r.get("floor", {}))
    out.extend(_peer_rows(r.get("peer", {})))
    out.extend(_floor_rows(r.get("floor", {})))
    out.extend(_pickup_rows(r.get("pickup", {})))
    out.extend(_poll_scale_rows(r.get("poll_scale", {})))
    out.extend(_idle_rows(r.get("idle", {})))
    out.extend(_gateway_rows(r.get("gateway", {})))
    out.extend(_worker500_rows(r.get("worker500", {})))
    out.extend(_waiting_rows(r.get("waiting", {})))
    out.extend(_tenants_rows(r.get("tenants", {})))
    out.extend(_batch_rows(r.get("batches", {})))
    for name, res in r.items():
        if "error" in res:
            out.append((f"{name} FAILED", res["error"][:60], "", "", "MISSED"))
    return out


def _throughput_rows(tp: dict[str, Any], fl: dict[str, Any]) -> list[Row]:
    """Jobs per second at each slot count, with its CPU, the worker's calls per job
    and its ratio to the database floor."""
    out: list[Row] = []
    replicas = int(tp.get("params", {}).get("job_services") or 1)
    for slots, run in tp.get("runs", {}).items():
        jps = run.get("jobs_per_s")
        params = f"N={run['jobs']}, 1 worker, {slots} slots"
        if replicas > 1:
            params += f", {replicas} job_service replicas"
        target = f"≥500 {_check(jps is not None and jps >= 500)}" if slots == "16" else ""
        out.append((f"throughput @{slots} slots", _f(jps), "jobs/s", params, target))
        out.extend(_cpu_rows(slots, run.get("cpu_ms_per_job") or {}))
        out.extend(_worker_call_rows(slots, run.get("rpc_per_job") or {}))
        floor_run = fl.get("runs", {}).get(slots)
        if floor_run and jps:
            ratio = jps / floor_run["jobs_per_s"]
            out.append(
                (
                    f"  ratio to DB floor @{slots}",
                    f"{ratio:.0%}",
                    "",
                    f"floor {floor_run['jobs_per_s']:,.0f} jobs/s",
                    f"≥40% {_check(ratio >= 0.4)}",
                )
            )
    return out


def _cpu_rows(slots: str, cpu: dict[str, float]) -> list[Row]:
    if not cpu:
        return []
    shown = ", ".join(f"{k.split(' ')[0]} {v:.1f}" for k, v in cpu.items())
    return [
        (
            f"  CPU per job @{slots}",
            _f(round(sum(v for k, v in cpu.items() if not k.startswith("mariadb")), 2)),
            "ms",
            shown,
            "excl. MariaDB",
        )
    ]


def _worker_call_rows(slots: str, rpc_per_job: dict[str, Any]) -> list[Row]:
    """The worker's view of each job: its calls (count per job × mean wall ms)."""
    worker_rpcs = rpc_per_job.get("runtime_worker") or {}
    model = rpc_per_job.get("model_call") or {}
    if not worker_rpcs:
        return []
    parts = [
        f"{m} {v['calls_per_job']:.2g}×{v['mean_ms']:.1f}"
        for m, v in worker_rpcs.items()
        if v["calls_per_job"] >= 0.05
    ]
    total = sum(v["calls_per_job"] * v["mean_ms"] for v in worker_rpcs.values())
    calls = sum(v["calls_per_job"] * v["mean_ms"] for v in model.values())
    if calls:
        parts.append(f"model {calls:.1f}")
    return [
        (
            f"  worker's calls per job @{slots}",
            _f(round(total + calls, 2)),
            "ms",
            ", ".join(parts),
            "calls × mean ms",
        )
    ]


def _floor_rows(fl: dict[str, Any]) -> list[Row]:
    """The database floor: the hot path's statements alone, batched and not."""
    out: list[Row] = []
    for slots, run in fl.get("runs", {}).items():
        out.append(
            (
                f"DB floor @{slots} conns",
                _f(run["jobs_per_s"]),
                "jobs/s",
                f"{fl['statements_per_job']} stmts in {fl.get('round_trips_per_job', '?')}"
                f" round trips/job, errors {run['errors']},"
                f" deadlocks retried {run.get('deadlocks_retried', 0)}",
                "",
            )
        )
    single = fl.get("one_statement_per_round_trip")
    if single:
        out.append(
            (
                f"DB floor @{single['concurrency']} conns, unbatched",
                _f(single["jobs_per_s"]),
                "jobs/s",
                f"the same {fl['statements_per_job']} stmts, one per round trip",
                "",
            )
        )
    return out


def _pickup_rows(pk: dict[str, Any]) -> list[Row]:
    """Pickup latency, idle and under load."""
    out: list[Row] = []
    for phase in ("idle", "under_load"):
        s = pk.get(phase)
        if s and "error" in s:
            out.append((f"pickup ({phase}) FAILED", str(s["error"])[:60], "", "", "MISSED"))
        elif s:
            prm = ", ".join(f"{k}={v}" for k, v in s["params"].items())
            t50 = f"≤50 {_check(s['p50_ms'] <= 50)}" if phase == "idle" else ""
            t99 = f"≤250 {_check(s['p99_ms'] <= 250)}" if phase == "idle" else ""
            out.append((f"pickup p50 ({phase})", _f(s["p50_ms"]), "ms", prm, t50))
            out.append((f"pickup p99 ({phase})", _f(s["p99_ms"]), "ms", prm, t99))
    return out


def _poll_scale_rows(ps: dict[str, Any]) -> list[Row]:
    """Poll, create and claim latency over small and big tables."""
    out: list[Row] = []
    for key, s in ps.items():
        if isinstance(s, dict) and "finished_rows" in s:
            prm = f"{s['finished_rows']:,} finished rows, waitMs=0"
            out.append(
                (
                    f"poll p50/p99 @{key}",
                    f"{s['poll']['p50_ms']}/{s['poll']['p99_ms']}",
                    "ms",
                    prm,
                    "",
                )
            )
            if "create" in s:
                out.append(
                    (
                        f"create p50/p99 @{key}",
                        f"{s['create']['p50_ms']}/{s['create']['p99_ms']}",
                        "ms",
                        f"{s['calls_logged_today']:,} platform calls logged today, one by one",
                        "",
                    )
                )
            out.append(
                (
                    f"claim p50/p99 @{key}",
                    f"{s['claim']['p50_ms']}/{s['claim']['p99_ms']}",
                    "ms",
                    prm,
                    f"key={s['explain_claim'][0].get('key') if s['explain_claim'] else '?'}",
                )
            )
    settle = ps.get("params", {}).get("innodb_settle")
    if settle:
        out.append(
            (
                "InnoDB settle before timing",
                _f(settle["settle_s"]),
                "s",
                f"dirty pages {settle['dirty_pages']}/{settle['pool_pages']}, "
                f"undo history {settle['history_list_length']}",
                ""  # a run from before the flag was recorded
                if "settled" not in settle
                else "settled ok"
                if settle["settled"]
                else "NOT settled: figures disturbed",
            )
        )
    if "claim_p99_ratio_big_to_small" in ps:
        for what in ("poll", "claim"):
            ratio = ps[f"{what}_p99_ratio_big_to_small"]
            out.append(
                (f"{what} p99 big/small", _f(ratio), "×", "", f"≤1.5 {_check(ratio <= 1.5)}")
            )
    if "create_p99_ratio_big_to_small" in ps:
        ratio = ps["create_p99_ratio_big_to_small"]
        out.append(("create p99 big/small", _f(ratio), "×", "", ""))
    return out


def _idle_rows(idle: dict[str, Any]) -> list[Row]:
    """Queries of idle workers."""
    out: list[Row] = []
    if "db_statements_per_s_per_worker" in idle:
        v = idle["db_statements_per_s_per_worker"]
        prm = f"{idle['params']['workers']} idle workers, {idle['params']['seconds']} s"
        out.append(("idle queries per worker", _f(v), "queries/s", prm, f"≤2 {_check(v <= 2)}"))
        out.append(("idle queries total", _f(idle["db_statements_per_s"]), "queries/s", prm, ""))
        out.append(
            (
                "  server Questions with/without",
                f"{idle['global_questions_per_s_with_system']}/"
                f"{idle['global_questions_per_s_without_system']}",
                "queries/s",
                "whole server (shared)",
                "",
            )
        )
    return out


def _gateway_rows(gw: dict[str, Any]) -> list[Row]:
    """The gateway's create throughput and latency."""
    out: list[Row] = []
    if "requests_per_s" in gw:
        prm = f"{gw['params']['requests']} POSTs, {gw['params']['concurrency']} conns"
        out.append(("gateway POST /v1/ai/jobs", _f(gw["requests_per_s"]), "requests/s", prm, ""))
        out.append(
            (
                "gateway p50/p99",
                f"{gw['latency']['p50_ms']}/{gw['latency']['p99_ms']}",
                "ms",
                f"statuses {gw['status_counts']}",
                "",
            )
        )
    return out


def _worker500_rows(w: dict[str, Any]) -> list[Row]:
    """One worker with 500 slots: throughput, lost leases, memory."""
    out: list[Row] = []
    if "sustained_jobs_per_s" in w:
        prm = f"1 worker x500 slots, stand-in 2 s, {w['params']['seconds']} s"
        v = w["sustained_jobs_per_s"]
        out.append(("500-slot worker", _f(v), "jobs/s", prm, f"≥150 {_check(v >= 150)}"))
        out.append(
            (
                "  lost leases",
                _f(w["lost_leases"]),
                "leases",
                prm,
                f"=0 {_check(w['lost_leases'] == 0)}",
            )
        )
        out.append(
            (
                "  peak RSS",
                _f(w["peak_rss_mb"]),
                "MB",
                prm,
                f"≤250 {_check(w['peak_rss_mb'] <= 250)}",
            )
        )
    return out


def _batch_rows(b: dict[str, Any]) -> list[Row]:
    """The ``batches`` scenario's rows (reference §10.3)."""
    if "create_batch_200" not in b:
        return []
    c, race = b["create_batch_200"], b["two_at_once"]
    prm = f"{b['params']['batches']} batches of {b['params']['children']}"
    rprm = f"{race['pairs']} pairs, {race['lanes']} lanes, {race['replicas']} replicas"
    wrong = race["count_mismatches"] + race["final_mismatches"]
    return [
        (
            "create a batch of 200 p50/p95",
            f"{c['p50_ms']}/{c['p95_ms']}",
            "ms",
            prm,
            f"p95<1000 {_check(c['p95_ms'] < 1000)}",
        ),
        (
            "two children ending at once: counts wrong",
            _f(wrong),
            "pairs",
            rprm,
            f"=0 {_check(wrong == 0)}",
        ),
        (
            "  pair ended p50/p99",
            f"{race['pair_end_ms']['p50_ms']}/{race['pair_end_ms']['p99_ms']}",
            "ms",
            rprm,
            "",
        ),
    ]


def _waiting_rows(wt: dict[str, Any]) -> list[Row]:
    """The ``waiting`` scenario's rows (reference §9.1)."""
    if "delivery" not in wt:
        return []
    d = wt["delivery"]
    prm = f"{wt['commits']} commits, 2 replicas"
    p99 = d["p99_ms"]
    rows_: list[Row] = [
        (
            "commit → event p50/p99",
            f"{d['p50_ms']}/{p99}",
            "ms",
            prm,
            f"p99≤250 {_check(p99 <= 250)}",
        )
    ]
    if "create_with_streams" in wt:
        without, with_ = wt["create_without_streams"], wt["create_with_streams"]
        rss = wt["gateway_rss_mb"]
        sprm = f"{wt['streams']} streams, {wt['users']} users"
        rows_ += [
            (
                "  create p99 without/with streams",
                f"{without['latency']['p99_ms']}/{with_['latency']['p99_ms']}",
                "ms",
                sprm,
                "",
            ),
            (
                "  gateway CPU per create without/with",
                f"{without.get('gateway_cpu_ms_per_request')}/"
                f"{with_.get('gateway_cpu_ms_per_request')}",
                "ms",
                sprm,
                "",
            ),
            (
                "  gateway RSS before/with streams",
                f"{rss['before_streams']}/{rss['streams_open_after_load']}",
                "MB",
                sprm,
                "",
            ),
        ]
    return rows_


def _tenants_rows(tn: dict[str, Any]) -> list[Row]:
    """The ``tenants`` scenario's rows (reference §10.1)."""
    if "scale" not in tn:
        return []
    sc, prm = tn["scale"], tn["params"]
    size = f"{sc['fair']['rows']:,} rows, {sc['fair']['users_waiting']:,} users waiting"
    ratio = sc["fair_to_fifo_claims_per_s"]
    backed = all(sc["index_backed"].values())
    out: list[Row] = [
        (
            "claims/s fair / fifo",
            f"{_f(sc['fair']['claims_per_s'])} / {_f(sc['fifo']['claims_per_s'])}",
            "claims/s",
            f"{size}, {prm['claimers']} claimers",
            f"fair ≥ 0.9 × fifo {_check(ratio >= 0.9)}",
        ),
        (
            "  statements index-backed",
            ", ".join(k for k, ok in sc["index_backed"].items() if ok) or "-",
            "",
            size,
            f"all {_check(backed)}",
        ),
        (
            "  users in the first claims fair / fifo",
            f"{sc['fair']['users_in_first_claims']} / {sc['fifo']['users_in_first_claims']}",
            "users",
            f"first {sc['fair']['first_claims']} claims",
            "",
        ),
    ]
    lone = tn.get("lone", {})
    if "fair" in lone and "fifo" in lone:
        fair, fifo = lone["fair"]["create_to_start_s"], lone["fifo"]["create_to_start_s"]
        out.append(
            (
                "  lone user create → start max fair / fifo",
                f"{_f(fair['max'])} / {_f(fifo['max'])}",
                "s",
                f"backlog ≥ {prm['backlog']:,}, {prm['lone_slots']} slots, {prm['lone_model_ms']} ms model",
                f"fair ≤ 3 s {_check(fair['max'] is not None and fair['max'] <= 3.0)}",
            )
        )
    return out


def _peer_rows(pr: dict[str, Any]) -> list[Row]:
    if "skipped" in pr:
        return [("peer skipped", str(pr["skipped"]), "", "", "")]
    queue = pr.get("params", {}).get("queue", "peer")
    out: list[Row] = []
    for slots, run in pr.get("runs", {}).items():
        params = f"{queue}, N={run['jobs']}, 1 worker, concurrency {slots}"
        out.append((f"peer @{slots} slots", _f(run.get("jobs_per_s")), "jobs/s", params, ""))
        cpu = run.get("cpu_ms_per_job") or {}
        if cpu:
            shown = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            out.append(
                (
                    f"  peer CPU per job @{slots}",
                    _f(cpu.get(PEER_WORKER)),
                    "ms",
                    shown,
                    "excl. PostgreSQL",
                )
            )
    return out


#: CPU groups of the peer (:mod:`bench.peer`): its worker, and PostgreSQL's processes.
PEER_WORKER = "peer_worker"
PEER_DB = ("postgres backends", "postgres (shared)")


def _ours_cpu(cpu: dict[str, float]) -> tuple[float | None, float | None]:
    """(our services' CPU ms per job, MariaDB's): the model stand-in is left out, as the
    peer has no model; None when not measured."""
    if not cpu:
        return None, None
    services = sum(v for k, v in cpu.items() if not k.startswith("mariadb") and k != "standin")
    db = next((v for k, v in cpu.items() if k.startswith("mariadb")), None)
    return round(services, 2), db


def side_by_side(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per slot count the ``peer`` scenario ran: ours and the peer's jobs/s,
    their ratio (ours / peer), our DB floor at that concurrency and the CPU ms per job
    of each side (None where a figure is missing); [] unless both ``throughput`` and
    ``peer`` have runs.

    CPU: ``ours_cpu_ms_per_job`` sums our services but the model stand-in,
    ``ours_db_cpu_ms_per_job`` is the whole MariaDB server (shared);
    ``peer_cpu_ms_per_job`` is the peer's worker process, ``peer_db_cpu_ms_per_job``
    the bench database's PostgreSQL backends plus the server's background processes.
    A slot count one side has no run for (it failed) has None for its figures.
    """
    r = doc.get("results", {})
    peer_runs = r.get("peer", {}).get("runs", {})
    ours_runs = r.get("throughput", {}).get("runs", {})
    floor_runs = r.get("floor", {}).get("runs", {})
    out: list[dict[str, Any]] = []
    if not (peer_runs and ours_runs):
        return out
    for slots, theirs in peer_runs.items():
        ours = ours_runs.get(slots, {})
        ours_jps, peer_jps = ours.get("jobs_per_s"), theirs.get("jobs_per_s")
        ours_cpu, ours_db = _ours_cpu(ours.get("cpu_ms_per_job") or {})
        peer_cpu = theirs.get("cpu_ms_per_job") or {}
        peer_db = [peer_cpu[k] for k in PEER_DB if k in peer_cpu]
        out.append(
            {
                "slots": int(slots),
                "ours_jobs_per_s": ours_jps,
                "peer_jobs_per_s": peer_jps,
                "ratio_ours_to_peer": round(ours_jps / peer_jps, 3)
                if ours_jps and peer_jps
                else None,
                "db_floor_jobs_per_s": floor_runs.get(slots, {}).get("jobs_per_s"),
                "ours_cpu_ms_per_job": ours_cpu,
                "peer_cpu_ms_per_job": peer_cpu.get(PEER_WORKER),
                "ours_db_cpu_ms_per_job": ours_db,
                "peer_db_cpu_ms_per_job": round(sum(peer_db), 2) if peer_db else None,
            }
        )
    return out


#: Columns of :func:`side_by_side_table`: header → key of a :func:`side_by_side` row.
SIDE_BY_SIDE_COLUMNS = (
    ("slots", "slots"),
    ("ours jobs/s", "ours_jobs_per_s"),
    ("peer jobs/s", "peer_jobs_per_s"),
    ("ours/peer", "ratio_ours_to_peer"),
    ("our DB floor jobs/s", "db_floor_jobs_per_s"),
    ("ours CPU ms/job", "ours_cpu_ms_per_job"),
    ("peer CPU ms/job", "peer_cpu_ms_per_job"),
    ("MariaDB ms/job", "ours_db_cpu_ms_per_job"),
    ("PostgreSQL ms/job", "peer_db_cpu_ms_per_job"),
)


def side_by_side_table(compared: list[dict[str, Any]]) -> str:
    """A fixed-width table of :func:`side_by_side` rows, with a legend."""
    header = [h for h, _ in SIDE_BY_SIDE_COLUMNS]
    body = [header]
    for row in compared:
        cells = []
        for _, key in SIDE_BY_SIDE_COLUMNS:
            v = row.get(key)
            cells.append(f"{v:.0%}" if key.startswith("ratio") and v is not None else _f(v))
        body.append(cells)
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    lines = ["  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(0, "ours (full path, MariaDB) vs peer (procrastinate, PostgreSQL), interleaved:")
    lines.append(
        "ours CPU: job_service + credential_service + runtime_worker (not the model stand-in);"
        " peer CPU: its worker process;"
    )
    lines.append(
        "MariaDB: the whole server (shared); PostgreSQL: the bench database's backends"
        " + the server's background processes; '-': not measured."
    )
    return "\n".join(lines)


def table(doc: dict[str, Any]) -> str:
    """A fixed-width text table of :func:`rows`."""
    header: Row = ("figure", "value", "unit", "parameters", "target")
    body = [header, *rows(doc)]
    widths = [max(len(r[i]) for r in body) for i in range(5)]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
