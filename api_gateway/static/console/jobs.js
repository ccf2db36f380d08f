// The job list: filters (status, type, user, creation time), counts per state, pages.
import { api, query } from "./api.js";
import { esc, localToUtc, pill, utcToLocal, when } from "./format.js";

export const STATES = ["pending", "locked", "running", "succeeded", "failed", "cancelled"];
const FILTERS = ["status", "jobType", "userId", "createdFrom", "createdTo", "pageSize"];
const PAGE_SIZES = ["10", "25", "50", "100"];
let jobTypes = null;

/** The registered job types, as the API document lists them for the jobType filter. */
export async function loadJobTypes() {
  if (jobTypes) return jobTypes;
  try {
    const doc = await (await fetch("/openapi.json")).json();
    const param = doc.paths["/admin/ai/jobs"].get.parameters.find((p) => p.name === "jobType");
    // the enumeration is a named schema (components.schemas.JobType), referenced by $ref
    const named = (s) => (s && s.$ref ? doc.components.schemas[s.$ref.split("/").pop()] : s);
    const schema = param.schema.anyOf
      ? param.schema.anyOf.map(named).find((s) => s && s.enum)
      : named(param.schema);
    jobTypes = schema.enum || [];
  } catch (e) {
    jobTypes = [];
  }
  return jobTypes;
}

function options(values, selected, any) {
  return `<option value="">${any}</option>` + values.map((v) =>
    `<option value="${esc(v)}"${v === selected ? " selected" : ""}>${esc(v)}</option>`).join("");
}

function go(filters) {
  location.hash = "#/jobs" + query(filters);
}

/** The list view for the filters in `params` (URLSearchParams of the hash). */
export function jobsView(params) {
  const filters = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  const pageSize = filters.pageSize || "25";
  const tokens = []; // page tokens of the pages before this one
  let pageToken = "";
  let el = null;

  async function mount(root) {
    el = root;
    const types = await loadJobTypes();
    root.innerHTML = `
      <section id="filtersPanel">
        <h2>Jobs</h2>
        <form class="filters" id="filters">
          <label>status<select name="status" id="fStatus">${options(STATES, filters.status, "any status")}</select></label>
          <label>job type<select name="jobType" id="fType">${options(types, filters.jobType, "any type")}</select></label>
          <label>user id<input name="userId" id="fUser" value="${esc(filters.userId)}" placeholder="any user" size="24"></label>
          <label>created from (UTC)<input type="datetime-local" step="1" name="createdFrom" id="fFrom" value="${esc(utcToLocal(filters.createdFrom))}"></label>
          <label>created before (UTC)<input type="datetime-local" step="1" name="createdTo" id="fTo" value="${esc(utcToLocal(filters.createdTo))}"></label>
          <label>per page<select name="pageSize" id="fPageSize">${PAGE_SIZES.concat(PAGE_SIZES.includes(pageSize) ? [] : [pageSize]).map((n) =>
            `<option${n === pageSize ? " selected" : ""}>${esc(n)}</option>`).join("")}</select></label>
          <button type="submit" class="primary" id="apply">Apply</button>
          <button type="button" id="lastHour">Last hour</button>
          <button type="button" id="lastDay">Last 24 h</button>
          <button type="button" id="clear">Clear</button>
        </form>
        <div class="counts" id="counts"></div>
        <p class="err" id="listError"></p>
      </section>
      <section id="jobsPanel">
        <div id="jobs"><p class="dim">…</p></div>
        <div class="pager">
          <button id="prev" disabled>← Newer</button>
          <button id="next" disabled>Older →</button>
          <span class="dim" id="pageInfo"></span>
        </div>
      </section>`;
    const form = root.querySelector("#filters");
    form.onsubmit = (e) => {
      e.preventDefault();
      const data = new FormData(form);
      go({
        status: data.get("status"), jobType: data.get("jobType"), userId: data.get("userId").trim(),
        createdFrom: localToUtc(data.get("createdFrom")), createdTo: localToUtc(data.get("createdTo")),
        pageSize: data.get("pageSize") === "25" ? "" : data.get("pageSize"),
      });
    };
    const since = (ms) => go({ ...filters, createdFrom: new Date(Date.now() - ms).toISOString().slice(0, 19) + "Z", createdTo: "" });
    root.querySelector("#lastHour").onclick = () => since(3600e3);
    root.querySelector("#lastDay").onclick = () => since(86400e3);
    root.querySelector("#clear").onclick = () => go({});
    root.querySelector("#next").onclick = () => { tokens.push(pageToken); pageToken = nextToken; refresh(); };
    root.querySelector("#prev").onclick = () => { pageToken = tokens.pop() || ""; refresh(); };
    await refresh();
  }

  let nextToken = null;
  async function refresh(auto = false) {
    if (auto && tokens.length) return; // only the first page follows new jobs
    let page;
    try {
      page = await api("/admin/ai/jobs" + query({ ...filters, includeCounts: true, pageSize, pageToken }));
    } catch (e) {
      el.querySelector("#listError").textContent = "The filter was refused: " + ((e.body && e.body.message) || e.message);
      el.querySelector("#jobs").innerHTML = "";
      throw e;
    }
    el.querySelector("#listError").textContent = "";
    renderCounts(page.counts);
    renderRows(page.jobs);
    nextToken = page.nextPageToken;
    el.querySelector("#next").disabled = !nextToken;
    el.querySelector("#prev").disabled = !tokens.length;
    el.querySelector("#pageInfo").textContent = `page ${tokens.length + 1}`;
  }

  function renderCounts(counts) {
    const total = STATES.reduce((a, s) => a + (counts[s] || 0), 0);
    el.querySelector("#counts").innerHTML =
      `<div class="count${filters.status ? "" : " selected"}" data-state=""><b id="countTotal">${total}</b><span>all states</span></div>` +
      STATES.map((s) => `<div class="count${filters.status === s ? " selected" : ""}" data-state="${s}"><b class="${s}">${counts[s] || 0}</b><span>${s}</span></div>`).join("");
    el.querySelectorAll(".count").forEach((c) => { c.onclick = () => go({ ...filters, status: c.dataset.state }); });
  }

  function renderRows(jobs) {
    if (!jobs.length) { el.querySelector("#jobs").innerHTML = '<p class="dim" id="noJobs">No jobs match.</p>'; return; }
    el.querySelector("#jobs").innerHTML = `<table id="jobTable"><thead><tr><th>job</th><th>type</th><th>user</th><th>status</th>
      <th class="num">attempt</th><th>error</th><th>created</th><th>finished</th></tr></thead><tbody>` +
      jobs.map((j) => `<tr class="clickable" data-job="${esc(j.jobId)}"><td class="mono"><a href="#/job/${encodeURIComponent(j.jobId)}">${esc(j.jobId)}</a></td>
        <td>${esc(j.jobType)}${j.batch ? ` <span class="chip batch">batch ${esc(j.batch.succeeded)}/${esc(j.batch.total)}</span>` : ""}</td><td class="mono">${esc(j.userId)}</td><td>${pill(j.status)}${j.cancelRequested ? ' <span class="warn">cancel requested</span>' : ""}</td>
        <td class="num">${esc(j.attemptNo)}</td><td class="mono failed">${esc(j.errorCode || "")}</td>
        <td class="nowrap">${when(j.createdAt)}</td><td class="nowrap">${when(j.finishedAt)}</td></tr>`).join("") + "</tbody></table>";
    el.querySelectorAll("tr[data-job]").forEach((r) => { r.onclick = (e) => { if (e.target.tagName !== "A") location.hash = "#/job/" + encodeURIComponent(r.dataset.job); }; });
  }

  return { mount, refresh: () => refresh(true), interval: 5000 };
}
