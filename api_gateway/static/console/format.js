// Text helpers: escaping, times, money, durations.
const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ENTITIES[c]);
}

export function shortTime(iso) {
  return iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "Z") : "—";
}

/** An RFC 3339 time with "(… ago)". */
export function when(iso) {
  if (!iso) return '<span class="dim">—</span>';
  const d = new Date(iso);
  if (isNaN(d)) return esc(iso);
  const secs = Math.round((Date.now() - d.getTime()) / 1000);
  const ago = secs < 60 ? secs + " s ago" : secs < 3600 ? Math.round(secs / 60) + " min ago"
    : secs < 86400 ? Math.round(secs / 3600) + " h ago" : Math.round(secs / 86400) + " d ago";
  return `<span title="${esc(iso)}">${esc(shortTime(iso))} <span class="dim">(${ago})</span></span>`;
}

export function usd(v) {
  const a = Math.abs(v || 0);
  return "$" + (v || 0).toFixed(a === 0 ? 2 : a >= 1 ? 2 : a >= 0.01 ? 4 : 6);
}

export function duration(ms) {
  if (ms === null || ms === undefined || isNaN(ms)) return "—";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}

export function between(a, b) {
  return a && b ? duration(new Date(b) - new Date(a)) : "—";
}

export function pct(rate) {
  return rate === null || rate === undefined ? "—" : (rate * 100).toFixed(1) + "%";
}

export function pill(state, id) {
  return `<span class="pill ${esc(state)}"${id ? ` id="${id}"` : ""}>${esc(state ?? "—")}</span>`;
}

/** datetime-local value (taken as UTC) → RFC 3339; RFC 3339 → datetime-local value. */
export function localToUtc(value) {
  if (!value) return "";
  return (value.length === 16 ? value + ":00" : value) + "Z";
}
export function utcToLocal(iso) {
  return iso ? iso.replace(/(\.\d+)?Z$/, "").slice(0, 19) : "";
}
