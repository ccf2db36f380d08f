// Inline SVG charts drawn from the admin API's numbers (no library).
import { esc, pct, usd } from "./format.js";

const OUTCOMES = ["succeeded", "failed", "cancelled"];
const COLOURS = { succeeded: "#3fb950", failed: "#f85149", cancelled: "#6e7681" };
const GRID = "#2a333d";

function minuteKey(ms) { return new Date(ms).toISOString().slice(0, 16); }

function axis(W, H, left, right, top, bottom, max, label) {
  let out = "";
  for (const f of [0, 0.5, 1]) {
    const y = top + (1 - f) * (H - top - bottom);
    out += `<line x1="${left}" y1="${y}" x2="${W - right}" y2="${y}" stroke="${GRID}"${f ? ' stroke-dasharray="3 4"' : ""}/>`;
    out += `<text x="${left - 6}" y="${y + 4}" text-anchor="end">${esc(label(max * f))}</text>`;
  }
  return out;
}

/**
 * Jobs ended per minute (stacked by outcome) over the answer's window, and the
 * failure rate per bucket as a line. `data` is GET /admin/ai/throughput.
 */
export function throughputChart(data) {
  const from = Date.parse(data.from), to = Date.parse(data.to);
  const span = Math.max(1, Math.ceil((to - from) / 60000));
  const per = span > 360 ? Math.ceil(span / 360) : 1; // minutes per bar
  const start = Math.floor(from / 60000) * 60000;
  const bars = Math.ceil((to - start) / 60000 / per);
  const counts = Array.from({ length: bars }, () => ({ succeeded: 0, failed: 0, cancelled: 0 }));
  for (const m of data.minutes) {
    const i = Math.floor((Date.parse(m.minute) - start) / 60000 / per);
    if (i >= 0 && i < bars) for (const o of OUTCOMES) counts[i][o] += m[o];
  }
  const max = Math.max(1, ...counts.map((c) => c.succeeded + c.failed + c.cancelled));
  const W = 1200, H = 220, left = 44, right = 44, top = 14, bottom = 24;
  const plotH = H - top - bottom, bw = (W - left - right) / bars;
  let svg = axis(W, H, left, right, top, bottom, max, (v) => (Number.isInteger(v) ? v : v.toFixed(1)));
  counts.forEach((c, i) => {
    let y = H - bottom;
    for (const o of OUTCOMES) {
      if (!c[o]) continue;
      const h = (c[o] / max) * plotH;
      y -= h;
      const at = minuteKey(start + i * per * 60000);
      svg += `<rect class="bar bar-${o}" data-minute="${at}" data-outcome="${o}" data-count="${c[o]}" x="${(left + i * bw).toFixed(2)}" y="${y.toFixed(2)}" width="${Math.max(1, bw - (bw > 3 ? 1 : 0)).toFixed(2)}" height="${h.toFixed(2)}" fill="${COLOURS[o]}"><title>${at}Z · ${c[o]} ${o}</title></rect>`;
    }
  });
  // failure rate per hour (per 10 minutes for windows up to 2 h): failed / (succeeded + failed)
  const group = span <= 120 ? 10 : 60;
  const step = Math.max(1, Math.round(group / per));
  let points = [];
  for (let i = 0; i < bars; i += step) {
    let ok = 0, bad = 0;
    for (let j = i; j < Math.min(bars, i + step); j++) { ok += counts[j].succeeded; bad += counts[j].failed; }
    if (ok + bad) points.push([left + (i + step / 2) * bw, top + (1 - bad / (ok + bad)) * plotH, bad / (ok + bad)]);
  }
  if (points.length) {
    svg += `<polyline class="rate" fill="none" stroke="#d29922" stroke-width="1.5" points="${points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ")}"/>`;
    svg += points.map((p) => `<circle cx="${p[0].toFixed(1)}" cy="${p[1].toFixed(1)}" r="2.5" fill="#d29922"><title>failure rate ${pct(p[2])}</title></circle>`).join("");
  }
  for (const f of [0, 1]) svg += `<text x="${W - right + 6}" y="${top + (1 - f) * plotH + 4}">${f * 100}%</text>`;
  const tick = span <= 60 ? 10 : span <= 360 ? 60 : 180;
  for (let t = Math.ceil(start / (tick * 60000)) * tick * 60000; t <= to; t += tick * 60000) {
    const x = left + ((t - start) / 60000 / per) * bw;
    svg += `<line x1="${x}" y1="${H - bottom}" x2="${x}" y2="${H - bottom + 4}" stroke="${GRID}"/><text x="${x}" y="${H - 6}" text-anchor="middle">${new Date(t).toISOString().slice(11, 16)}</text>`;
  }
  const unit = per === 1 ? "per minute" : `per ${per} minutes`;
  return `<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="jobs ended ${unit}">${svg}</svg>
    <p class="legend dim">${OUTCOMES.map((o) => `<span><i class="sw-${o}"></i>${o}</span>`).join("")}<span>jobs ${unit} (UTC) · line: failure rate (right axis)</span></p>`;
}

/** Cost per UTC day: `days` (YYYY-MM-DD, oldest first) and GET /admin/ai/costs?groupBy=day rows. */
export function costChart(days, rows) {
  const byDay = Object.fromEntries(rows.map((r) => [r.key, r]));
  const values = days.map((d) => (byDay[d] ? byDay[d].costUsd : 0));
  const max = Math.max(0.0001, ...values);
  const W = 1200, H = 190, left = 80, right = 10, top = 22, bottom = 26;
  const bw = (W - left - right) / days.length;
  let svg = axis(W, H, left, right, top, bottom, max, usd);
  days.forEach((d, i) => {
    const h = (values[i] / max) * (H - top - bottom);
    const x = left + i * bw + 4, y = H - bottom - h;
    const calls = byDay[d] ? byDay[d].calls : 0;
    svg += `<rect class="bar" data-day="${d}" data-cost="${values[i]}" x="${x}" y="${y}" width="${bw - 8}" height="${h}" rx="2" fill="#58a6ff"><title>${d}: ${usd(values[i])} · ${calls} calls</title></rect>`;
    if (values[i] > 0) svg += `<text class="val" x="${x + (bw - 8) / 2}" y="${y - 5}" text-anchor="middle">${usd(values[i])} · ${calls} calls</text>`;
    svg += `<text x="${x + (bw - 8) / 2}" y="${H - bottom + 16}" text-anchor="middle">${d.slice(5)}</text>`;
  });
  return `<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="cost per day">${svg}</svg>`;
}
