// The admin API as the console calls it: the admin token from sessionStorage, JSON in and out.
export const TOKEN_KEY = "airuntime.adminToken";

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.code) || String(status));
    this.status = status;
    this.body = body;
  }
}

let onRefused = () => {};
/** Called with a message when the API refuses the token (401/403). */
export function whenRefused(fn) { onRefused = fn; }

export function token() { return sessionStorage.getItem(TOKEN_KEY); }

/** `fetch` of an admin path; JSON answer, or ApiError (status, error body). */
export async function api(path, opts = {}) {
  const headers = { Authorization: "Bearer " + token() };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { ...opts, headers });
  const body = res.status === 204 ? null : await res.json().catch(() => null);
  if (res.status === 401 || res.status === 403) {
    onRefused(`Token refused (${res.status}${body && body.code ? " " + body.code : ""}).`);
  }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

/** A query string of the non-empty values of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? "?" + s : "";
}
