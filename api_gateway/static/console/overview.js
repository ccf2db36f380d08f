// The runtime at a glance: jobs per minute and failure rate, the breakers, the providers'
// limits and pauses, the workers, cost.
import { api } from "./api.js";
import { costChart, throughputChart } from "./charts.js";
import { esc, pct, pill, usd, when } from "./format.js";

const HOURS = [1, 6, 24, 72];

function day(offset) {
  return new Date(Date.now() - offset * 86400000).toISOString().slice(0, 10);
}

export function overviewView(params) {
  let hours = Number(params.get("hours")) || 6;
  let el = null;

  async function loadThroughput() {
    const data = await api(`/admin/ai/throughput?hours=${hours}`);
    el.querySelector("#throughputChart").innerHTML = throughputChart(data);
    el.querySelector("#throughputTotals").innerHTML = `
      <span class="big" id="endedTotal">${data.succeeded + data.failed + data.cancelled}</span> ended in ${hours} h:
      <b class="succeeded" id="tSucceeded">${data.succeeded}</b> succeeded ·
      <b class="failed" id="tFailed">${data.failed}</b> failed ·
      <b class="cancelled" id="tCancelled">${data.cancelled}</b> cancelled ·
      failure rate <b class="big ${data.failureRate ? "failed" : "ok"}" id="failureRate">${pct(data.failureRate)}</b>`;
  }

  function breakerRow(b, name) {
    return `<tr data-provider="${esc(name || "")}"><td>${esc(name || "platform")}</td><td>${pill(b.state)}</td>
      <td class="num">${esc(b.consecutiveFailures)}</td><td>${when(b.openedAt)}</td><td>${when(b.halfOpenAt)}</td>
      <td><button class="reset" data-provider="${esc(name || "")}"${b.state === "closed" ? " disabled" : ""}>Reset</button></td></tr>`;
  }

  async function loadBreaker() {
    const b = await api("/admin/ai/circuit-breaker");
    const rows = Array.isArray(b.providers) && b.providers.length
      ? b.providers.map((p) => breakerRow(p, p.name)).join("") : breakerRow(b, null);
    el.querySelector("#breakers").innerHTML = `<p>platform key: ${pill(b.state, "breakerState")}
      <span class="dim">${b.state === "open" ? "new platform-key jobs are refused (PLATFORM_CIRCUIT_OPEN)" : b.state === "half_open" ? "a few probe calls may pass" : "platform-key jobs are accepted"}</span></p>
      <table><thead><tr><th>provider</th><th>state</th><th class="num">failures</th><th>opened</th><th>half-open at</th><th></th></tr></thead><tbody>${rows}</tbody></table>`;
    el.querySelectorAll("button.reset").forEach((btn) => {
      btn.onclick = async () => {
        const q = btn.dataset.provider ? "?provider=" + encodeURIComponent(btn.dataset.provider) : "";
        await api("/admin/ai/circuit-breaker/reset" + q, { method: "POST" });
        await loadBreaker();
      };
    });
  }

  function limitCell(used, limit) {
    return limit == null ? `${esc(used)} <span class="dim">/ —</span>`
      : `<span class="${used >= limit ? "warn" : ""}">${esc(used)}</span> <span class="dim">/ ${esc(limit)}</span>`;
  }

  async function loadProviders() {
    const data = await api("/admin/ai/providers");
    const rows = data.providers.map((p) => `<tr data-provider="${esc(p.name)}"><td>${esc(p.name)}</td>
      <td class="num">${limitCell(p.usage.requestsLastMinute, p.limits.requestsPerMinute)}</td>
      <td class="num">${limitCell(p.usage.tokensLastMinute, p.limits.tokensPerMinute)}</td>
      <td class="num">${limitCell(p.usage.inFlight, p.limits.maxConcurrent)}</td>
      <td class="nowrap">${p.pausedUntil ? '<span class="warn">paused until ' + when(p.pausedUntil) + "</span>" : '<span class="ok">—</span>'}</td>
      <td>${pill(p.breaker.state)}</td></tr>`).join("");
    el.querySelector("#providers").innerHTML = `<p class="dim">platform-key attempts of the last minute against each provider's limits (used / limit)</p>
      <table><thead><tr><th>provider</th><th class="num">requests/min</th><th class="num">tokens/min</th><th class="num">in flight</th><th>429 pause</th><th>breaker</th></tr></thead><tbody>${rows}</tbody></table>`;
  }

  async function loadWorkers() {
    const rt = await api("/admin/ai/runtime");
    const rows = rt.workers.map((w) => {
      const live = w.live;
      return `<tr data-worker="${esc(w.instanceId)}"><td class="mono">${esc(w.instanceId)}</td><td class="${esc(w.status)}">${esc(w.status)}</td>
        <td>${w.capabilities.map((c) => `<span class="chip">${esc(c)}</span>`).join("")}</td><td class="num">${esc(w.inFlight)}</td>
        <td class="nowrap">${when(w.lastSeenAt)}</td><td class="mono">${esc(w.statusAddress || "—")}</td>
        <td>${live ? (live.draining ? '<span class="warn">draining</span>' : "ok") + " · v" + esc(live.version) + " · " + esc(live.inFlight.length) + "/" + esc(live.concurrency) + " slots" : '<span class="dim">' + esc(w.liveError || "—") + "</span>"}</td></tr>`;
    }).join("");
    const extra = rt.configuredWorkers.map((c) => `<tr><td class="mono">${esc(c.live ? c.live.instanceId : "?")}</td><td class="dim">configured</td>
        <td>${esc(c.live ? c.live.capabilities.join(", ") : "")}</td><td class="num">${esc(c.live ? c.live.inFlight.length : "")}</td><td></td>
        <td class="mono">${esc(c.statusAddress)}</td><td>${c.live ? "ok" : '<span class="err">' + esc(c.liveError) + "</span>"}</td></tr>`).join("");
    el.querySelector("#workers").innerHTML = `<p>runtime health: ${pill(rt.status, "runtimeStatus")} <span class="dim">· ${rt.workers.length} worker(s) seen</span></p>` +
      (rows || extra ? `<table><thead><tr><th>instance</th><th>state</th><th>capabilities</th><th class="num">in flight</th><th>last seen</th><th>status address</th><th>live</th></tr></thead><tbody>${rows}${extra}</tbody></table>` : '<p class="dim">No workers seen.</p>');
  }

  async function loadCosts() {
    const days = []; for (let i = 13; i >= 0; i--) days.push(day(i));
    const data = await api(`/admin/ai/costs?from=${days[0]}&to=${days[13]}&groupBy=day`);
    const total = data.rows.reduce((a, r) => a + r.costUsd, 0);
    const calls = data.rows.reduce((a, r) => a + r.calls, 0);
    el.querySelector("#costs").innerHTML = costChart(days, data.rows) +
      `<p class="dim" id="costTotal">14-day total: <b class="ok">${usd(total)}</b> over ${calls} model calls</p>`;
  }

  async function refresh() {
    const results = await Promise.allSettled([loadThroughput(), loadBreaker(), loadProviders(), loadWorkers(), loadCosts()]);
    const failed = results.filter((r) => r.status === "rejected");
    if (failed.length) throw failed[0].reason;
  }

  async function mount(root) {
    el = root;
    root.innerHTML = `
      <section id="throughput"><h2>Jobs ended per minute, last
        <select id="hours">${HOURS.map((h) => `<option value="${h}"${h === hours ? " selected" : ""}>${h} h</option>`).join("")}</select></h2>
        <p id="throughputTotals" class="dim">…</p><div id="throughputChart"></div></section>
      <div class="grid2">
        <section id="workersPanel"><h2>Runtime workers</h2><div id="workers">…</div></section>
        <section id="breakerPanel"><h2>Circuit breakers</h2><div id="breakers">…</div></section>
      </div>
      <section id="providersPanel"><h2>Model providers</h2><div id="providers">…</div></section>
      <section id="costsPanel"><h2>Cost per day (USD, last 14 days, UTC)</h2><div id="costs">…</div></section>`;
    root.querySelector("#hours").onchange = (e) => { location.hash = "#/overview?hours=" + e.target.value; };
    await refresh();
  }

  return { mount, refresh, interval: 5000 };
}
