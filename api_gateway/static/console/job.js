// One job explained: params, snapshot, attempts with their event timeline and model
// calls, the error, and cancel / re-run; a batch's parent with its counts and children.
import { api, query } from "./api.js";
import { between, duration, esc, pill, shortTime, usd, when } from "./format.js";

const LIVE = new Set(["pending", "locked", "running"]);

function kv(pairs) {
  return '<dl class="kv">' + pairs.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${v}</dd>`).join("") + "</dl>";
}

function timeline(events, origin, parent = false) {
  if (!events.length) return '<p class="dim">No events.</p>';
  const same = parent ? '<span class="dim">(children counted)</span>' : '<span class="warn">(cancel requested)</span>';
  return '<ol class="timeline">' + events.map((e) => `<li class="${esc(e.toStatus)}" data-to="${esc(e.toStatus)}">
      <span class="mono">${esc(shortTime(e.at))}</span> <span class="dim">+${between(origin, e.at)}</span>
      · ${e.fromStatus ? esc(e.fromStatus) + " → " : "created → "}<b class="${esc(e.toStatus)}">${esc(e.toStatus)}</b>
      ${e.fromStatus && e.fromStatus === e.toStatus ? same : ""}
      ${e.errorCode ? `<span class="mono failed">${esc(e.errorCode)}</span>` : ""}
      <span class="dim">by ${esc(e.actor)}</span></li>`).join("") + "</ol>";
}

function calls(invocations) {
  if (!invocations.length) return '<p class="dim">No model call recorded.</p>';
  return `<table class="calls"><thead><tr><th>time</th><th>provider</th><th>model</th><th>key</th>
    <th class="num">prompt</th><th class="num">completion</th><th class="num">cache hit</th>
    <th class="num">latency</th><th class="num">cost</th><th>outcome</th><th>error</th><th>request id</th></tr></thead><tbody>` +
    invocations.map((i) => `<tr data-invocation="${esc(i.id)}"><td class="nowrap mono">${esc(shortTime(i.createdAt))}</td>
      <td class="provider">${esc(i.modelProvider)}</td><td>${esc(i.modelName)}</td><td>${esc(i.apiKeyMode)}</td>
      <td class="num">${esc(i.promptTokens)}</td><td class="num">${esc(i.completionTokens)}</td><td class="num">${esc(i.cacheHitTokens)}</td>
      <td class="num">${duration(i.latencyMs)}</td><td class="num">${usd(i.costUsd)}</td>
      <td class="${esc(i.outcome)}">${esc(i.outcome)}</td><td class="mono failed callError">${esc(i.errorCode || "")}</td>
      <td class="mono dim">${esc(i.providerRequestId || "")}</td></tr>`).join("") + "</tbody></table>";
}

function attemptCard(a, origin) {
  return `<div class="attempt" id="attempt-${a.attemptNo}" data-attempt="${a.attemptNo}">
    <header><b>Attempt ${esc(a.attemptNo)}</b>
      ${a.outcome ? pill(a.outcome) : '<span class="pill running">in progress</span>'}
      ${a.errorCode ? `<span class="mono failed attemptError">${esc(a.errorCode)}</span>` : ""}
      <span class="dim">on <span class="mono">${esc(a.runtimeInstanceId || "—")}</span>
      · ${between(a.startedAt, a.endedAt)} · ${a.invocations.length} model call(s) · ${duration(a.latencyMs)} in the model · ${usd(a.costUsd)}</span>
    </header>
    ${timeline(a.events, origin)}
    ${calls(a.invocations)}
  </div>`;
}

function snapshotPanel(s, parent = false) {
  if (!s && parent) return '<p class="dim">None: a parent has no input of its own (each child has its snapshot).</p>';
  if (!s) return '<p class="dim">No snapshot (none built, or deleted with its material).</p>';
  const stats = s.stats || {};
  return kv([
    ["snapshot", `<span class="mono">${esc(s.snapshotId)}</span>`],
    ["schema", esc(s.schemaVersion)],
    ["target", `${esc(s.targetType)} <span class="mono">${esc(s.targetId)}</span>`],
    ["payload", `${esc(s.payloadBytes)} bytes · ${esc(s.materialCount)} material(s) · ${esc(s.blockCount)} block(s) · ${esc(s.knowledgePointCount)} knowledge point(s)`],
    ["content hash", `<span class="mono">${esc(String(s.contentHash).slice(0, 16))}…</span>`],
  ]) + (Object.keys(stats).length ? `<h3>stats</h3><pre>${esc(JSON.stringify(stats, null, 2))}</pre>` : "");
}

const BATCH_STATES = ["pending", "running", "succeeded", "failed", "cancelled"];

/** A batch's parent: its counts by state and its children, in the order of its targets. */
function batchPanel(job, kids) {
  const b = job.batch;
  const counts = `<div class="counts" id="batchCounts">
      <div class="count" data-batch="total"><b>${esc(b.total)}</b><span>children</span></div>` +
    BATCH_STATES.map((s) => `<div class="count" data-batch="${s}"><b class="${s}">${esc(b[s])}</b><span>${s}</span></div>`).join("") +
    `<div class="count" data-batch="ratio"><b>${esc(b.minSuccessRatio)}</b><span>min success ratio</span></div></div>`;
  const rows = kids.map((k) => `<tr class="clickable" data-child="${esc(k.jobId)}"><td class="mono"><a href="#/job/${encodeURIComponent(k.jobId)}">${esc(k.jobId)}</a></td>
      <td>${esc(k.targetType)} <span class="mono">${esc(k.targetId)}</span></td><td>${pill(k.status)}${k.cancelRequested ? ' <span class="warn">cancel requested</span>' : ""}</td>
      <td class="num">${esc(k.attemptNo)}</td><td class="mono failed">${esc(k.errorCode || "")}</td><td class="nowrap">${when(k.finishedAt)}</td></tr>`).join("");
  return `<section id="batchPanel"><h2>Batch</h2>${counts}
    <table id="childTable"><thead><tr><th>child</th><th>target</th><th>status</th><th class="num">attempt</th><th>error</th><th>finished</th></tr></thead>
    <tbody>${rows}</tbody></table></section>`;
}

/** Every child of the batch `jobId` (pages of 100), oldest first. */
async function childrenOf(jobId) {
  const out = [];
  let pageToken = "";
  do {
    const page = await api("/admin/ai/jobs" + query({ parentJobId: jobId, pageSize: 100, pageToken }));
    out.push(...page.jobs);
    pageToken = page.nextPageToken || "";
  } while (pageToken);
  return out.reverse();
}

/** The page of job `jobId`. */
export function jobView(jobId) {
  let el = null, job = null;

  async function act(kind) {
    const msg = el.querySelector("#actionMsg");
    const path = `/admin/ai/jobs/${encodeURIComponent(jobId)}/${kind}`;
    el.querySelectorAll(".actions button").forEach((b) => { b.disabled = true; });
    try {
      const out = await api(path, { method: "POST", body: kind === "rerun" ? JSON.stringify({ rebuildSnapshot: false }) : undefined });
      if (kind === "rerun") { location.hash = "#/job/" + encodeURIComponent(out.jobId); return; }
      msg.textContent = out.status === "cancelled" ? "Cancelled." : "Cancel requested: the worker stops at its next heartbeat.";
    } catch (e) {
      msg.textContent = `${kind} refused: ${(e.body && e.body.code) || e.message}${e.body && e.body.message ? " — " + e.body.message : ""}`;
    }
    await refresh();
  }

  async function mount(root) {
    el = root;
    root.innerHTML = '<section><p class="dim">Loading job…</p></section>';
    await refresh();
  }

  async function refresh() {
    let kids = [];
    try {
      job = await api("/admin/ai/jobs/" + encodeURIComponent(jobId));
      if (job.batch) kids = await childrenOf(jobId);
    } catch (e) {
      el.innerHTML = `<section><p class="err" id="jobError">${esc(e.status === 404 ? "No job " + jobId : e.message)}</p><p><a href="#/jobs">← jobs</a></p></section>`;
      return;
    }
    const before = job.events.filter((e) => e.attemptNo === 0);
    const origin = job.createdAt;
    const cost = job.invocations.reduce((a, i) => a + i.costUsd, 0);
    const msg = el.querySelector("#actionMsg");
    el.innerHTML = `
      <section id="jobHead">
        <h2><a href="#/jobs">Jobs</a> / job</h2>
        <div class="actions">
          <span class="big mono" id="jobId">${esc(job.jobId)}</span> ${pill(job.status, "jobStatus")}
          ${job.cancelRequested ? '<span class="warn">cancel requested</span>' : ""}
          <span class="grow"></span>
          <button id="cancel" class="danger"${LIVE.has(job.status) && !job.cancelRequested ? "" : " disabled"}>Cancel</button>
          <button id="rerun" class="primary"${job.status === "failed" ? "" : " disabled"}>Re-run</button>
        </div>
        <p id="actionMsg" class="warn">${msg ? esc(msg.textContent) : ""}</p>
        ${job.errorCode ? `<div class="errorbox" id="jobErrorBox"><b id="jobErrorCode">${esc(job.errorCode)}</b> ${esc(job.errorMessage || "")}</div>` : ""}
      </section>
      <div class="grid2">
        <section id="jobFields"><h2>Job</h2>${kv([
          ["type", esc(job.jobType)],
          ["user", `<a class="mono" href="#/jobs?userId=${encodeURIComponent(job.userId)}">${esc(job.userId)}</a>`],
          ["target", `${esc(job.targetType)} <span class="mono">${esc(job.targetId)}</span>`],
          ["key", `${esc(job.apiKeyMode)} ${job.credentialId ? `<span class="mono dim">${esc(job.credentialId)}</span>` : ""}`],
          ["model", `${esc(job.modelProvider)} / ${esc(job.modelName)}`],
          ["prompt / schema", `${esc(job.promptVersion || "—")} / ${esc(job.outputSchemaVersion || "—")}`],
          ["attempts", `${esc(job.attemptNo)} · retries ${esc(job.retryCount)}/${esc(job.maxRetryCount)} · timeout ${esc(job.timeoutSeconds)} s · priority ${esc(job.priority)}`],
          LIVE.has(job.status) && job.lockUntil
            ? ["lease", `<span class="mono">${esc(job.lockedBy)}</span> until ${when(job.lockUntil)}`]
            : ["last lease", job.lockedBy ? `<span class="mono">${esc(job.lockedBy)}</span>` : "—"],
          ["created", when(job.createdAt)], ["started", when(job.startedAt)], ["finished", when(job.finishedAt)],
          ["run time", between(job.startedAt, job.finishedAt)],
          ["model calls", `${job.invocations.length} · ${usd(cost)}`],
          ["re-run of", job.retriedFromJobId ? `<a class="mono" id="retriedFrom" href="#/job/${encodeURIComponent(job.retriedFromJobId)}">${esc(job.retriedFromJobId)}</a>` : "—"],
          ["batch", job.parentJobId ? `<a class="mono" id="parentJob" href="#/job/${encodeURIComponent(job.parentJobId)}">${esc(job.parentJobId)}</a>`
            : job.batch ? "this job is a batch's parent" : "—"],
        ])}</section>
        <section><h2>Params</h2><pre id="params">${esc(JSON.stringify(job.params, null, 2))}</pre>
          <h2 class="spaced">Snapshot</h2><div id="snapshot">${snapshotPanel(job.snapshot, !!job.batch)}</div></section>
      </div>
      ${job.batch ? batchPanel(job, kids) : ""}
      <section id="attemptsPanel"><h2>${job.batch ? "Events" : "Attempts and events"}</h2>
        <h3>${job.batch ? "The parent's changes" : "Before the first attempt"}</h3>${timeline(before, origin, !!job.batch)}
        <div id="attempts">${job.attempts.length ? job.attempts.map((a) => attemptCard(a, origin)).join("")
          : job.batch ? '<p class="dim">A parent is never claimed: its children run.</p>' : '<p class="dim">Not claimed yet.</p>'}</div>
      </section>`;
    el.querySelectorAll("tr[data-child]").forEach((r) => { r.onclick = (e) => { if (e.target.tagName !== "A") location.hash = "#/job/" + encodeURIComponent(r.dataset.child); }; });
    el.querySelector("#cancel").onclick = () => act("cancel");
    el.querySelector("#rerun").onclick = () => act("rerun");
  }

  return { mount, refresh: () => (job && !LIVE.has(job.status) ? Promise.resolve() : refresh()), interval: 1500 };
}
