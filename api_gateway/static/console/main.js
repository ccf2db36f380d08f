// The console's shell: the token, the router (#/jobs, #/job/<id>, #/overview,
// #/prompts/<jobType>), refreshes.
import { TOKEN_KEY, token, whenRefused } from "./api.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { overviewView } from "./overview.js";
import { promptsView } from "./prompts.js";

const $ = (id) => document.getElementById(id);
let current = null, timer = null, generation = 0;

function route() {
  const hash = location.hash || "#/jobs";
  const [path, q] = hash.slice(1).split("?");
  const params = new URLSearchParams(q || "");
  if (path.startsWith("/job/")) return { name: "job", view: jobView(decodeURIComponent(path.slice(5))) };
  if (path === "/overview") return { name: "overview", view: overviewView(params) };
  if (path.startsWith("/prompts")) {
    const jobType = decodeURIComponent(path.slice(9)) || "quiz_generation";
    return { name: "prompts", view: promptsView(jobType, params) };
  }
  return { name: "jobs", view: jobsView(params) };
}

function status(text) { $("status").textContent = text; }

async function run(fn) {
  try {
    await fn();
    status("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (e && (e.status === 401 || e.status === 403)) return;
    status("refresh failed: " + (e && e.message));
  }
}

async function show() {
  if (!token()) return;
  const mine = ++generation;
  clearInterval(timer);
  const { name, view } = route();
  current = view;
  $("navJobs").classList.toggle("active", name === "jobs" || name === "job");
  $("navOverview").classList.toggle("active", name === "overview");
  $("navPrompts").classList.toggle("active", name === "prompts");
  // each view renders into its own element: a late answer of the previous one lands
  // in a detached element, never over this one
  const root = document.createElement("div");
  root.className = "view";
  $("view").replaceChildren(root);
  await run(() => view.mount(root));
  if (mine !== generation) return;
  timer = setInterval(() => { if (current === view) run(() => view.refresh()); }, view.interval);
}

function start() {
  $("login").classList.add("hidden");
  $("app").classList.remove("hidden");
  show();
}

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(timer);
  generation++;
  current = null;
  $("app").classList.add("hidden");
  $("login").classList.remove("hidden");
  $("loginError").textContent = message || "";
}

whenRefused(logout);
$("save").onclick = () => {
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  $("token").value = "";
  start();
};
$("token").addEventListener("keydown", (e) => { if (e.key === "Enter") $("save").click(); });
$("refresh").onclick = () => current && run(() => current.refresh());
$("logout").onclick = () => logout("");
window.addEventListener("hashchange", show);
if (token()) start(); else logout("");
