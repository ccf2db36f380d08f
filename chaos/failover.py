"""The provider failover scenario (reference §9.4): two stand-in providers, the primary down
and back, two job_service replicas on one MariaDB database.

``MODEL_PROVIDERS`` lists ``primary`` then ``backup`` (which calls the job's model
``backup-chat``), each with its own platform key, held by credential_service only.
Under a steady load of platform-key jobs the primary answers every call 503 until its
breaker has been open for a while, then recovers. Checked, besides the common audit:

* every job succeeds, none is refused (the backup admits creates while the primary's
  breaker is open), none is written twice;
* the primary's breaker opens and closes again, the backup's never leaves closed;
* each model call's invocation log names the provider its attempt's lease grant
  chose (the ``pending → locked`` event) and that provider's model name;
* attempts ran on the backup while the primary was down, and on the primary again
  once it was back;
* each provider saw only its own platform key (``/_standin/seen``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx

from chaos.scenario_run import Profile, Run, ScenarioResult, wait_in_flight
from chaos.system import System
from model_standin import key_fingerprint

PRIMARY_KEY = "sk-chaos-primary-00000000000000001"
BACKUP_KEY = "sk-chaos-backup-000000000000000002"
#: The job model and the name each provider is sent for it.
PROVIDER_MODELS = {"primary": "deepseek-chat", "backup": "backup-chat"}
#: Jobs of the short profile (every create a platform-key job).
FAILOVER_JOBS = 200


def system_kwargs() -> dict[str, Any]:
    """The system of the scenario: 2 replicas every client dials both of, 2 workers,
    two providers with their platform keys in credential_service only (the launcher
    points ``MODEL_PROVIDERS`` at one stand-in port each)."""
    providers = [
        {"name": "primary", "baseUrl": "http://127.0.0.1:1", "apiKeyEnv": "PRIMARY_API_KEY"},
        {
            "name": "backup",
            "baseUrl": "http://127.0.0.1:1",
            "apiKeyEnv": "BACKUP_API_KEY",
            "models": {"deepseek-chat": "backup-chat"},
        },
    ]
    return {
        "workers": 2,
        "replicas": 2,
        "spread": True,
        "extra_env": {"MODEL_PROVIDERS": json.dumps(providers)},
        "service_env": {
            "credential_service": {"PRIMARY_API_KEY": PRIMARY_KEY, "BACKUP_API_KEY": BACKUP_KEY}
        },
    }


class _Breakers:
    """Watches ``GET /admin/ai/circuit-breaker``: each provider's states in order."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.states: dict[str, list[tuple[float, str]]] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def seen(self, provider: str) -> list[str]:
        return [s for _, s in self.states.get(provider, [])]

    def now(self, provider: str) -> str | None:
        seen = self.seen(provider)
        return seen[-1] if seen else None

    async def _watch(self) -> None:
        async with httpx.AsyncClient(
            base_url=self.run.system.gateway_url,
            headers=self.run.admin_headers(),
            trust_env=False,
            timeout=5,
        ) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                    reply = await c.get("/admin/ai/circuit-breaker")
                    for p in reply.json()["providers"]:
                        mine = self.states.setdefault(str(p["name"]), [])
                        if not mine or mine[-1][1] != p["state"]:
                            mine.append((time.monotonic(), str(p["state"])))
                await asyncio.sleep(0.1)

    async def wait(self, provider: str, state: str, limit_s: float) -> bool:
        """Whether ``provider``'s breaker was seen in ``state`` within ``limit_s``."""
        began = time.monotonic()
        while time.monotonic() - began < limit_s:
            if self.now(provider) == state:
                return True
            await asyncio.sleep(0.1)
        return False


async def _standin(url: str, method: str, path: str, body: Any = None) -> Any:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=5) as c:
        reply = await c.request(method, f"/_standin/{path}", json=body)
        reply.raise_for_status()
        return reply.json()


def _seen_keys(seen: dict[str, Any]) -> set[str]:
    return {str(k["sha256"]) for k in seen.get("keys", [])}


async def provider_failover(system: System, profile: Profile) -> ScenarioResult:
    """Run the scenario (module docstring); the recovery is from the primary's return
    until its breaker is closed again."""
    run = Run(system, profile, "provider_failover")
    urls = system.standin_urls
    primary, backup = urls["primary"], urls["backup"]
    for url in (primary, backup):
        await _standin(url, "POST", "faults", {"delayMs": 50})
    cooldown = float(system.env.get("BREAKER_COOLDOWN_SECONDS", "2"))
    breakers = _Breakers(run)
    breakers.start()
    run.start_sampler()
    jobs = FAILOVER_JOBS if profile.name == "short" else profile.race_jobs
    # long enough for the outage, two cool-downs and a stretch on the primary again
    rate = jobs / max(20.0, 12.0 + 4 * cooldown)
    loader = asyncio.create_task(run.load.run(jobs, rate))
    # the outage begins once the load runs (one job in flight; at most 5 s in), whatever
    # the machine's speed: at 50 ms a call a fast machine rarely has several in flight
    await wait_in_flight(run, 1, limit_s=5.0)
    t_down = time.monotonic()
    run.fault_window(t_down)
    await _standin(primary, "POST", "faults", [{"kind": "status", "status": 503, "count": 10**6}])
    if not await breakers.wait("primary", "open", 20.0):
        run.checks.append(f"the primary's breaker never opened ({breakers.seen('primary')})")
    await asyncio.sleep(max(3.0, 1.5 * cooldown))  # a failed half-open probe or two
    seen_before = await _standin(primary, "GET", "seen")
    await _standin(primary, "POST", "reset")  # back: healthy again
    await _standin(primary, "POST", "faults", {"delayMs": 50})
    t_back = time.monotonic()
    db_back = (await run.sql("SELECT NOW(6)"))[0][0]
    run.close_window()
    run.notes["downSeconds"] = round(t_back - t_down, 2)
    closed = await breakers.wait("primary", "closed", 10.0 + 3 * cooldown)
    recovery = time.monotonic() - t_back if closed else None
    await loader
    result = await run.finish(recovery)
    await breakers.stop()
    primary_seen = _seen_keys(seen_before) | _seen_keys(await _standin(primary, "GET", "seen"))
    backup_seen = _seen_keys(await _standin(backup, "GET", "seen"))
    result.notes["breakerStates"] = {p: breakers.seen(p) for p in ("primary", "backup")}
    result.checks.extend(
        _checks(breakers, primary_seen, backup_seen) + await _attempt_checks(run, result, db_back)
    )
    return result


def _checks(breakers: _Breakers, primary_seen: set[str], backup_seen: set[str]) -> list[str]:
    out: list[str] = []
    seen = breakers.seen("primary")
    if "open" not in seen or not seen or seen[-1] != "closed":
        out.append(f"the primary's breaker did not open and close again ({seen})")
    if set(breakers.seen("backup")) != {"closed"}:
        out.append(f"the backup's breaker left closed ({breakers.seen('backup')})")
    if primary_seen != {key_fingerprint(PRIMARY_KEY)}:
        out.append(f"the primary was sent keys other than its own ({len(primary_seen)} keys)")
    if backup_seen != {key_fingerprint(BACKUP_KEY)}:
        out.append(f"the backup was sent keys other than its own ({len(backup_seen)} keys)")
    return out


async def _attempt_checks(run: Run, result: ScenarioResult, db_back: Any) -> list[str]:
    """Every created job succeeded and nothing was refused; every model call of the
    scenario logged its attempt's provider (the lease grant's) and that provider's
    model name; the backup served during the outage, the primary after it."""
    out: list[str] = []
    if result.load.refused:
        out.append(f"creates refused: {dict(result.load.refused)}")
    if result.audit.by_status.get("succeeded", 0) != result.audit.jobs:
        out.append(f"not every job succeeded: {dict(result.audit.by_status)}")
    rows = await run.sql(
        "SELECT i.job_id, i.attempt_no, i.model_provider, i.model_name, i.outcome,"
        " i.error_code, e.model_provider FROM ai_runtime_invocation_logs i"
        " JOIN ai_runtime_jobs j ON j.job_id = i.job_id"
        " LEFT JOIN ai_runtime_job_events e ON e.job_id = i.job_id"
        " AND e.attempt_no = i.attempt_no AND e.to_status = 'locked'"
        " WHERE j.user_id LIKE %s",
        (run.user_like,),
    )
    wrong = [r for r in rows if r[2] != r[6] or PROVIDER_MODELS.get(r[2]) != r[3]]
    if wrong:
        out.append(f"{len(wrong)} model calls logged another provider or model, e.g. {wrong[0]}")
    failed = {(r[2], r[5]) for r in rows if r[4] != "succeeded"}
    if not failed <= {("primary", "TEMPORARY_PROVIDER_ERROR")}:
        out.append(f"model calls failed other than the primary's 503s: {sorted(failed)}")
    grants = await run.sql(
        "SELECT e.model_provider, SUM(e.at < %s), SUM(e.at >= %s) FROM ai_runtime_job_events e"
        " JOIN ai_runtime_jobs j ON j.job_id = e.job_id"
        " WHERE j.user_id LIKE %s AND e.to_status = 'locked' GROUP BY e.model_provider",
        (db_back, db_back, run.user_like),
    )
    by = {str(g[0]): (int(g[1] or 0), int(g[2] or 0)) for g in grants}
    run.notes["leaseGrants"] = {p: {"beforeBack": b, "afterBack": a} for p, (b, a) in by.items()}
    run.notes["modelCalls"] = len(rows)
    if by.get("backup", (0, 0))[0] == 0:
        out.append(f"no attempt ran on the backup while the primary was down ({by})")
    if by.get("primary", (0, 0))[1] == 0:
        out.append(f"no attempt went back to the primary once it was up ({by})")
    return out
