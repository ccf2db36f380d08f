// One job type's prompts (reference §10.4): its versions, the routing (split, guard,
// rollback) and each version's stats; upload a version, change the split, roll back.
import { api } from "./api.js";
import { duration, esc, pct, usd, when } from "./format.js";
import { loadJobTypes } from "./jobs.js";

const HOURS = [1, 6, 24, 72, 168];

function fmt(v, digits = 0) {
  return v === null || v === undefined ? "—" : Number(v).toFixed(digits);
}

function refusal(e) {
  const b = e.body || {};
  return `${b.code || e.message}${b.message ? ": " + b.message : ""}`;
}

/** The page of `jobType`'s prompts. */
export function promptsView(jobType, params) {
  let hours = Number(params.get("hours")) || 24;
  let el = null, data = null;

  const share = (variants, v) => {
    const total = variants.reduce((a, x) => a + x.weight, 0);
    return total ? v.weight / total : 0;
  };

  function routingPanel(r) {
    const rows = r.variants.map((v, i) => `<tr data-variant="${esc(v.version)}">
        <td class="mono">${esc(v.version)}${i === 0 ? ' <span class="dim">(control)</span>' : ""}</td>
        <td class="num">${esc(v.weight)}</td><td class="num share">${pct(share(r.variants, v))}</td></tr>`).join("");
    const rolled = r.rolledBackAt ? `<div class="errorbox" id="rollback"><b>rolled back</b> ${when(r.rolledBackAt)}
        <div id="rollbackReason">${esc(r.rollbackReason || "")}</div></div>` : "";
    return `${rolled}<table id="split"><thead><tr><th>version</th><th class="num">weight</th><th class="num">share</th></tr></thead>
        <tbody>${rows}</tbody></table>
      <p class="dim">guard: roll a variant back once it has <b id="guardMin">${esc(r.guard.minAttempts)}</b> attempts and its
        invalid-schema rate exceeds the control's by more than <b id="guardMax">${pct(r.guard.maxInvalidSchemaIncrease)}</b>
        · in force since ${when(r.startedAt)}</p>`;
  }

  function statsTable(stats, routing) {
    const weights = Object.fromEntries(routing.variants.map((v) => [v.version, v]));
    return `<table id="stats"><thead><tr><th>version</th><th class="num">share</th><th class="num">attempts</th>
      <th class="num">succeeded</th><th class="num">invalid schema</th><th class="num">prompt tok</th><th class="num">completion tok</th>
      <th class="num">p50</th><th class="num">p95</th><th class="num">cost / success</th><th class="num">feedback + / −</th></tr></thead><tbody>` +
      stats.map((s) => `<tr data-stats="${esc(s.version)}"><td class="mono">${esc(s.version)}</td>
        <td class="num">${weights[s.version] ? pct(share(routing.variants, weights[s.version])) : "—"}</td>
        <td class="num attempts">${esc(s.attempts)}</td><td class="num">${esc(s.succeeded)}</td>
        <td class="num invalidRate ${s.invalidSchemaRate ? "failed" : ""}">${pct(s.invalidSchemaRate)}</td>
        <td class="num">${fmt(s.meanPromptTokens)}</td><td class="num">${fmt(s.meanCompletionTokens)}</td>
        <td class="num">${s.p50LatencyMs === null ? "—" : duration(s.p50LatencyMs)}</td>
        <td class="num">${s.p95LatencyMs === null ? "—" : duration(s.p95LatencyMs)}</td>
        <td class="num">${s.costPerSucceededUsd === null ? "—" : usd(s.costPerSucceededUsd)}</td>
        <td class="num feedback">${esc(s.feedback.positive)} / ${esc(s.feedback.negative)}</td></tr>`).join("") +
      "</tbody></table>";
  }

  function versionsTable(versions) {
    return `<table id="versions"><thead><tr><th>version</th><th>description</th><th>uploaded</th><th></th></tr></thead><tbody>` +
      versions.map((v) => `<tr data-version="${esc(v.version)}"><td class="mono">${esc(v.version)}${v.builtin ? ' <span class="chip">shipped</span>' : ""}</td>
        <td>${esc(v.description || "")}</td><td class="nowrap">${v.createdAt ? when(v.createdAt) : '<span class="dim">with the code</span>'}</td>
        <td class="nowrap"><button class="show" data-version="${esc(v.version)}">Template</button>
        <button class="startFrom" data-version="${esc(v.version)}">Start a version from it</button></td></tr>`).join("") +
      "</tbody></table>";
  }

  function editorRows(variants) {
    const names = data.versions.map((v) => v.version);
    return variants.map((v) => `<div class="variantRow"><select class="vVersion">${names.map((n) =>
      `<option${n === v.version ? " selected" : ""}>${esc(n)}</option>`).join("")}</select>
      <input class="vWeight" type="number" min="0" step="any" value="${esc(v.weight)}"></div>`).join("");
  }

  async function showTemplate(version, into) {
    const v = await api(`/admin/ai/prompts/${encodeURIComponent(jobType)}/versions/${encodeURIComponent(version)}`);
    if (into) {
      el.querySelector("#newTemplate").value = v.template;
      el.querySelector("#newVersion").focus();
      return;
    }
    el.querySelector("#templateTitle").textContent = `${jobType}.${v.version}`;
    el.querySelector("#template").textContent = v.template;
  }

  async function upload() {
    const msg = el.querySelector("#uploadMsg");
    const body = {
      version: el.querySelector("#newVersion").value.trim(),
      template: el.querySelector("#newTemplate").value,
    };
    const description = el.querySelector("#newDescription").value.trim();
    if (description) body.description = description;
    try {
      const v = await api(`/admin/ai/prompts/${encodeURIComponent(jobType)}/versions`, { method: "POST", body: JSON.stringify(body) });
      msg.className = "ok";
      msg.textContent = `Uploaded ${v.version}.`;
      await refresh();
    } catch (e) {
      msg.className = "err";
      msg.textContent = "Refused: " + refusal(e);
    }
  }

  async function putRouting(variants, guard) {
    const msg = el.querySelector("#routingMsg");
    try {
      await api(`/admin/ai/prompts/${encodeURIComponent(jobType)}/routing`, {
        method: "PUT", body: JSON.stringify(guard ? { variants, guard } : { variants }),
      });
      msg.className = "ok";
      msg.textContent = "Routing saved: new jobs follow it.";
      delete el.querySelector("#variantRows").dataset.touched;
      await refresh();
    } catch (e) {
      msg.className = "err";
      msg.textContent = "Refused: " + refusal(e);
    }
  }

  function saveRouting() {
    const variants = [...el.querySelectorAll(".variantRow")].map((row) => ({
      version: row.querySelector(".vVersion").value,
      weight: Number(row.querySelector(".vWeight").value),
    }));
    const guard = {};
    const min = el.querySelector("#minAttempts").value, max = el.querySelector("#maxIncrease").value;
    if (min) guard.minAttempts = Number(min);
    if (max) guard.maxInvalidSchemaIncrease = Number(max) / 100;
    return putRouting(variants, Object.keys(guard).length ? guard : null);
  }

  function wire() {
    el.querySelector("#jobTypePick").onchange = (e) => { location.hash = `#/prompts/${e.target.value}?hours=${hours}`; };
    el.querySelector("#hours").onchange = (e) => { location.hash = `#/prompts/${jobType}?hours=${e.target.value}`; };
    el.querySelector("#upload").onclick = upload;
    el.querySelector("#addVariant").onclick = () => {
      const rows = el.querySelector("#variantRows");
      rows.dataset.touched = "1";
      rows.insertAdjacentHTML("beforeend", editorRows([{ version: data.versions[0].version, weight: 0 }]));
    };
    el.querySelector("#saveRouting").onclick = saveRouting;
    el.querySelector("#rollBack").onclick = () => putRouting([{ version: data.routing.variants[0].version, weight: 1 }], data.routing.guard);
    const rows = el.querySelector("#variantRows");
    for (const kind of ["input", "change"]) rows.addEventListener(kind, () => { rows.dataset.touched = "1"; });
  }

  async function refresh() {
    data = await api(`/admin/ai/prompts/${encodeURIComponent(jobType)}?hours=${hours}`);
    el.querySelector("#routing").innerHTML = routingPanel(data.routing);
    el.querySelector("#statsPanel").innerHTML = statsTable(data.stats, data.routing);
    el.querySelector("#versionsPanel").innerHTML = versionsTable(data.versions);
    el.querySelectorAll("button.show").forEach((b) => { b.onclick = () => showTemplate(b.dataset.version, false); });
    el.querySelectorAll("button.startFrom").forEach((b) => { b.onclick = () => showTemplate(b.dataset.version, true); });
    const editing = el.querySelector("#variantRows");
    if (!editing.dataset.touched) editing.innerHTML = editorRows(data.routing.variants);
    el.querySelector("#rollBack").disabled = data.routing.variants.length < 2;
  }

  async function mount(root) {
    el = root;
    const types = await loadJobTypes();
    root.innerHTML = `
      <section id="promptsHead" data-job-type="${esc(jobType)}"><h2>Prompts of
        <select id="jobTypePick">${types.map((t) => `<option${t === jobType ? " selected" : ""}>${esc(t)}</option>`).join("")}</select>
        · stats over the last <select id="hours">${HOURS.map((h) => `<option value="${h}"${h === hours ? " selected" : ""}>${h} h</option>`).join("")}</select></h2>
        <p class="dim">Each user sticks to one variant of a routing; a job keeps its version for all its attempts.</p></section>
      <div class="grid2">
        <section><h2>Stats per version</h2><div id="statsPanel">…</div></section>
        <section><h2>Routing</h2><div id="routing">…</div>
          <h3>Change the split</h3><div id="variantRows"></div>
          <p><button id="addVariant">Add a variant</button></p>
          <p class="filters"><label>min attempts <input id="minAttempts" type="number" min="1" placeholder="50"></label>
            <label>max increase (%) <input id="maxIncrease" type="number" min="0" max="100" step="any" placeholder="10"></label></p>
          <div class="actions"><button id="saveRouting" class="primary">Save routing</button>
            <button id="rollBack" class="danger">Roll back to the control</button></div>
          <p id="routingMsg"></p></section>
      </div>
      <section><h2>Versions</h2><div id="versionsPanel">…</div>
        <h3 id="templateTitle"></h3><pre id="template" class="template"></pre></section>
      <section id="uploadPanel"><h2>Upload a version</h2>
        <p class="filters"><label>version <input id="newVersion" placeholder="v2" maxlength="64"></label>
          <label>description <input id="newDescription" maxlength="1000"></label></p>
        <textarea id="newTemplate" rows="14" spellcheck="false" placeholder="{% block system %}…{% endblock %}{% block user %}…{% endblock %}"></textarea>
        <div class="actions"><button id="upload" class="primary">Upload</button></div>
        <p id="uploadMsg"></p></section>`;
    wire();
    await refresh();
  }

  return { mount, refresh, interval: 5000 };
}
