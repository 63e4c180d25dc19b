// The gateway's operator dashboard: one page, three views chosen by the URL
// hash (#/ overview, #/jobs/{id} a job, #/models the served models), drawn
// from the JSON API and kept live by the /v1/events stream. Plain JS and
// SVG, no external assets: it works offline and needs no build step.
"use strict";

//===------------------------------------------------------------------===//
// API access (the token lives in this tab's sessionStorage only)
//===------------------------------------------------------------------===//

const TOKEN_KEY = "pcp.token";
// ?token= still works (older links) and is moved into sessionStorage.
(function tokenFromQuery() {
  const t = new URLSearchParams(location.search).get("token");
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
})();

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function authHeaders() {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}

class ApiError extends Error {
  constructor(path, status, message) {
    super(message);
    this.path = path;
    this.status = status;
  }
}

// The gateway's error bodies carry {"error": {"message": ...}}.
async function errorOf(path, r) {
  let message = r.status + " " + r.statusText;
  try {
    const body = await r.json();
    if (body && body.error && body.error.message) {
      message = r.status + ": " + body.error.message;
    }
  } catch (e) { /* not JSON: the status line says enough */ }
  if (r.status === 401) {
    message = "401 Unauthorized: the API needs a token; enter it in " +
      "\"API token\" above (" + message + ")";
  } else if (r.status === 403) {
    message = "403 Forbidden: this token lacks the scope (" + message + ")";
  }
  return new ApiError(path, r.status, message);
}

async function api(path, options) {
  const init = Object.assign({ headers: authHeaders() }, options || {});
  const r = await fetch(path, init);
  if (!r.ok) throw await errorOf(path, r);
  return r.json();
}

function setStatus(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text || "";
  s.className = isError ? "error" : "";
}

//===------------------------------------------------------------------===//
// Formatting
//===------------------------------------------------------------------===//

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) {
    if (k === "class") e.className = attrs[k];
    else if (k === "text") e.textContent = attrs[k];
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), attrs[k]);
    else e.setAttribute(k, attrs[k]);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
  if (seconds < 1) return (seconds * 1000).toFixed(0) + " ms";
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  return h ? h + " h " + m + " min" : m + " min " + r + " s";
}

function fmtTime(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  const today = new Date();
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === today.toDateString()
    ? time : d.toLocaleDateString() + " " + time;
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < units.length - 1) { b /= 1024; ++i; }
  return (i ? b.toFixed(b < 10 ? 2 : 1) : String(b)) + " " + units[i];
}

function fmtNumber(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  return v.toFixed(digits === undefined ? (a >= 100 ? 0 : 3) : digits);
}

// Worker ids spell out site, namespace, node, pod, backend, target and
// device; the defaults ("local", "default", "unknown-node", "unknown-pod")
// say nothing, so the short name keeps only what tells workers apart.
function workerShortName(w) {
  const id = w.worker_id || "";
  const mark = "-" + w.backend + "-";
  const at = id.lastIndexOf(mark);
  if (at < 0) return id;
  let head = id.slice(0, at);
  for (const d of ["local-", "default-"]) {
    if (head.startsWith(d)) head = head.slice(d.length);
  }
  head = head.replace(/(^|-)unknown-node(?=-|$)/, "")
    .replace(/(^|-)unknown-pod(?=-|$)/, "").replace(/^-+|-+$/g, "");
  const target = w.target && w.target !== "default" ? ":" + w.target : "";
  const device = "dev " + (id.slice(id.lastIndexOf("-device-") + 8) || w.device_id);
  return (head ? head + " " : "") + w.backend + target + " " + device;
}

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function jobName(j) {
  const e = j.spec && j.spec.experiment;
  if (e && typeof e.name === "string" && e.name) return e.name;
  if (j.spec && typeof j.spec.name === "string" && j.spec.name) return j.spec.name;
  return j.job_id;
}

// Fraction done (0..1) or null when the job kind has no notion of it.
function jobProgress(j) {
  if (j.state === "succeeded") return 1;
  const t = j.training || (j.spec && j.spec.training);
  if (t && t.outer_loop_steps > 0) {
    return Math.min(1, (t.outer_step || 0) / t.outer_loop_steps);
  }
  const r = j.rl;
  if (r && r.num_iterations > 0) {
    return Math.min(1, (r.iteration || 0) / r.num_iterations);
  }
  return null;
}

function jobDuration(j) {
  const end = TERMINAL.has(j.state) ? j.updated_at_ms : Date.now();
  return (end - j.created_at_ms) / 1000;
}

//===------------------------------------------------------------------===//
// Charts (SVG): axes with ticks, drag or wheel to zoom, double-click to
// reset, optional log scale. Each series is drawn as one polyline holding
// every point inside the visible x range (so a test can count them).
//===------------------------------------------------------------------===//

const SVG = "http://www.w3.org/2000/svg";
function svg(name, attrs) {
  const e = document.createElementNS(SVG, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}

// About |count| round ticks covering [lo, hi].
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

function logTicks(lo, hi) {
  const out = [];
  const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
  const mults = b - a <= 1 ? [1, 2, 3, 5, 7] : b - a <= 3 ? [1, 2, 5] : [1];
  for (let e = a; e <= b; ++e) {
    for (const m of mults) {
      const v = m * Math.pow(10, e);
      if (v >= lo && v <= hi) out.push(v);
    }
  }
  // A range inside one decade (a loss from 3.4 to 4.0) has too few of
  // those: round linear ticks, still placed on the log scale.
  return out.length >= 3 ? out : niceTicks(lo, hi, 4).filter((v) => v > 0);
}

class Chart {
  // opts: title, xLabel, yLabel, xFormat, yFormat, logToggle, id
  // A series is {name, xs, ys, dots?, band?}; band {name, lo, hi} (arrays
  // like ys) is drawn as a shaded area under the line (a mean +- std).
  constructor(opts) {
    this.opts = opts;
    this.series = [];
    this.view = null;  // [x0, x1] when zoomed
    this.log = false;
    this.root = el("div", { class: "chart", id: opts.id });
    const head = el("div", { class: "chart-head" }, el("b", { text: opts.title }));
    if (opts.logToggle) {
      const box = el("input", { type: "checkbox", class: "log-toggle" });
      box.addEventListener("change", () => { this.log = box.checked; this.draw(); });
      head.append(el("label", {}, box, " log scale"));
    }
    const reset = el("button", { type: "button", class: "zoom-reset", text: "reset zoom" });
    reset.addEventListener("click", () => { this.view = null; this.draw(); });
    head.append(reset);
    this.root.append(head);
    this.svg = svg("svg", { role: "img", "aria-label": opts.title });
    this.root.append(this.svg);
    this.bindZoom();
  }

  setSeries(series) { this.series = series; this.draw(); }

  extent() {
    let x0 = Infinity, x1 = -Infinity;
    for (const s of this.series) {
      for (let i = 0; i < s.xs.length; ++i) {
        if (s.ys[i] === null || s.ys[i] === undefined) continue;
        x0 = Math.min(x0, s.xs[i]); x1 = Math.max(x1, s.xs[i]);
      }
    }
    return x0 <= x1 ? [x0, x1] : null;
  }

  draw() {
    const W = 640, H = 260, L = 64, R = 14, T = 22, B = 40;
    this.geom = { W, H, L, R, T, B };
    const g = this.svg;
    g.setAttribute("viewBox", "0 0 " + W + " " + H);
    g.replaceChildren();
    g.append(svg("rect", { class: "plot-bg", x: L, y: T, width: W - L - R,
      height: H - T - B }));
    const full = this.extent();
    if (!full) {
      const t = svg("text", { class: "no-data", x: L + 10, y: T + 24 });
      t.textContent = "no data yet";
      g.append(t);
      this.scale = null;
      return;
    }
    let [x0, x1] = this.view || full;
    if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
    // y range of what is visible.
    const canLog = this.series.every((s) => s.ys.every((y) => y === null || y > 0));
    const log = this.log && canLog;
    let y0 = Infinity, y1 = -Infinity;
    for (const s of this.series) {
      for (let i = 0; i < s.xs.length; ++i) {
        const y = s.ys[i];
        if (y === null || y === undefined || s.xs[i] < x0 || s.xs[i] > x1) continue;
        y0 = Math.min(y0, y); y1 = Math.max(y1, y);
        if (s.band && s.band.lo[i] !== null && s.band.hi[i] !== null) {
          y0 = Math.min(y0, s.band.lo[i]); y1 = Math.max(y1, s.band.hi[i]);
        }
      }
    }
    if (!(y0 <= y1)) { y0 = 0; y1 = 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 0.5; y0 -= d; y1 += d; }
    if (!log) {
      const pad = (y1 - y0) * 0.05;
      y0 = y0 >= 0 && y0 - pad < 0 ? 0 : y0 - pad; y1 += pad;
    }
    const ty = log ? Math.log10 : (v) => v;
    const yy0 = ty(y0), yy1 = ty(y1);
    const px = (x) => L + (W - L - R) * (x - x0) / (x1 - x0);
    const py = (y) => H - B - (H - T - B) * (ty(y) - yy0) / (yy1 - yy0);
    this.scale = { x0, x1, px };
    // Axes, grid and ticks.
    const grid = svg("g", { class: "grid" });
    const ticks = svg("g", { class: "ticks" });
    const xf = this.opts.xFormat || ((v) => fmtNumber(v, Number.isInteger(v) ? 0 : 2));
    const yf = this.opts.yFormat || ((v) => fmtNumber(v));
    for (const v of niceTicks(x0, x1, 6)) {
      const x = px(v);
      grid.append(svg("line", { x1: x, x2: x, y1: T, y2: H - B }));
      const t = svg("g", { class: "tick x" });
      t.append(svg("line", { x1: x, x2: x, y1: H - B, y2: H - B + 4 }));
      const label = svg("text", { x: x, y: H - B + 15, "text-anchor": "middle" });
      label.textContent = xf(v);
      t.append(label);
      ticks.append(t);
    }
    const yts = log ? logTicks(y0, y1) : niceTicks(y0, y1, 5);
    for (const v of yts) {
      const y = py(v);
      grid.append(svg("line", { x1: L, x2: W - R, y1: y, y2: y }));
      const t = svg("g", { class: "tick y" });
      t.append(svg("line", { x1: L - 4, x2: L, y1: y, y2: y }));
      const label = svg("text", { x: L - 6, y: y + 3, "text-anchor": "end" });
      label.textContent = yf(v);
      t.append(label);
      ticks.append(t);
    }
    g.append(grid, ticks);
    const xl = svg("text", { class: "axis-label", x: (L + W - R) / 2, y: H - 6,
      "text-anchor": "middle" });
    xl.textContent = this.opts.xLabel;
    const yl = svg("text", { class: "axis-label y-label", x: 12, y: (T + H - B) / 2,
      "text-anchor": "middle", transform: "rotate(-90 12 " + (T + H - B) / 2 + ")" });
    yl.textContent = this.opts.yLabel + (log ? " (log)" : "");
    g.append(xl, yl);
    // Series, clipped to the plot.
    const clipId = "clip-" + this.opts.id;
    const defs = svg("defs", {});
    const clip = svg("clipPath", { id: clipId });
    clip.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B }));
    defs.append(clip);
    g.append(defs);
    const plot = svg("g", { "clip-path": "url(#" + clipId + ")" });
    let lx = L + 8;
    this.series.forEach((s, k) => {
      if (s.band) {
        const up = [], down = [];
        for (let i = 0; i < s.xs.length; ++i) {
          const lo = s.band.lo[i], hi = s.band.hi[i];
          if (lo === null || lo === undefined || hi === null || hi === undefined ||
              s.xs[i] < x0 || s.xs[i] > x1) continue;
          up.push(px(s.xs[i]).toFixed(1) + "," + py(hi).toFixed(1));
          down.unshift(px(s.xs[i]).toFixed(1) + "," + py(lo).toFixed(1));
        }
        plot.append(svg("polygon", { class: "band s" + k,
          points: up.concat(down).join(" "), "data-series": s.band.name,
          "data-points": up.length }));
      }
      const pts = [];
      for (let i = 0; i < s.xs.length; ++i) {
        const y = s.ys[i];
        if (y === null || y === undefined || s.xs[i] < x0 || s.xs[i] > x1) continue;
        pts.push(px(s.xs[i]).toFixed(1) + "," + py(y).toFixed(1));
      }
      const line = svg("polyline", { class: "series s" + k, points: pts.join(" "),
        "data-series": s.name, "data-points": pts.length });
      plot.append(line);
      if (s.dots) {
        for (const p of pts) {
          const [cx, cy] = p.split(",");
          plot.append(svg("circle", { class: "s" + k, cx, cy, r: 2.5 }));
        }
      }
      const legend = svg("text", { class: "legend s" + k, x: lx, y: T - 7 });
      legend.textContent = "\u25a0 " + s.name;
      legend.setAttribute("fill", k ? "#c2410c" : "#1b4fa3");
      g.append(legend);
      lx += 12 + 7 * (s.name.length + 2);
    });
    g.append(plot);
  }

  // x in data units under a client x, or null outside the plot.
  dataX(clientX) {
    if (!this.scale) return null;
    const r = this.svg.getBoundingClientRect();
    const { W, L, R } = this.geom;
    const sx = (clientX - r.left) * W / r.width;
    const f = (sx - L) / (W - L - R);
    return this.scale.x0 + Math.max(0, Math.min(1, f)) * (this.scale.x1 - this.scale.x0);
  }

  bindZoom() {
    let start = null, box = null;
    this.svg.addEventListener("mousedown", (e) => {
      start = this.dataX(e.clientX);
      if (start === null) return;
      box = svg("rect", { class: "zoom-box", x: 0, y: this.geom.T, width: 0,
        height: this.geom.H - this.geom.T - this.geom.B });
      this.svg.append(box);
      e.preventDefault();
    });
    this.svg.addEventListener("mousemove", (e) => {
      if (start === null || !box) return;
      const a = this.scale.px(start), b = this.scale.px(this.dataX(e.clientX));
      box.setAttribute("x", Math.min(a, b));
      box.setAttribute("width", Math.abs(b - a));
    });
    const end = (e) => {
      if (start === null) return;
      const stop = this.dataX(e.clientX);
      const a = Math.min(start, stop), b = Math.max(start, stop);
      start = null;
      if (box) box.remove();
      box = null;
      const span = this.scale.x1 - this.scale.x0;
      if (b - a > span * 0.01) { this.view = [a, b]; this.draw(); }
    };
    this.svg.addEventListener("mouseup", end);
    this.svg.addEventListener("mouseleave", (e) => { if (start !== null) end(e); });
    this.svg.addEventListener("dblclick", () => { this.view = null; this.draw(); });
    this.svg.addEventListener("wheel", (e) => {
      const full = this.extent();
      const at = this.dataX(e.clientX);
      if (!full || at === null) return;
      e.preventDefault();
      const [x0, x1] = this.view || full;
      const k = e.deltaY < 0 ? 0.8 : 1.25;
      let a = at - (at - x0) * k, b = at + (x1 - at) * k;
      a = Math.max(full[0], a); b = Math.min(full[1], b);
      this.view = b - a >= (full[1] - full[0]) * 0.999 || b <= a ? null : [a, b];
      this.draw();
    }, { passive: false });
  }
}

//===------------------------------------------------------------------===//
// Views
//===------------------------------------------------------------------===//

let current = null;  // the view shown: {name, refresh(), onEvent(ev)}

function table(headers, rows, emptyText) {
  const head = el("tr", {}, ...headers.map((h) =>
    el("th", { class: h.num ? "num" : "", text: h.text || h })));
  const body = el("tbody", {});
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { class: "empty", colspan: headers.length,
      text: emptyText })));
  }
  for (const r of rows) body.append(r);
  return el("table", {}, el("thead", {}, head), body);
}

function td(text, cls, title) {
  const c = el("td", { class: cls || "" });
  if (text instanceof Node) c.append(text); else c.textContent = text === undefined || text === null ? "" : String(text);
  if (title) c.title = title;
  return c;
}

// The newest |max| jobs, newest first. The list API pages in creation
// order, oldest first; the first call walks every page once, later calls
// start after the job just before the newest |max| seen (jobs are never
// reordered), so a refresh costs one request however many jobs exist.
let jobsTailAfter = null;
async function jobsNewest(max) {
  let all = [];
  let after = jobsTailAfter;
  for (let page = 0; page < 100; ++page) {
    const q = "/v1/jobs?limit=1000" + (after ? "&after=" + encodeURIComponent(after) : "");
    let r;
    try {
      r = await api(q);
    } catch (e) {
      if (e.status === 404 && jobsTailAfter) {  // the cursor job is gone
        jobsTailAfter = null;
        return jobsNewest(max);
      }
      throw e;
    }
    all = all.concat(r.jobs);
    if (all.length > max) {
      jobsTailAfter = all[all.length - max - 1].job_id;
      all = all.slice(-max);
    }
    if (r.jobs.length < 1000) break;
    after = r.jobs[r.jobs.length - 1].job_id;
  }
  return all.reverse();
}

function cancelButton(job) {
  const b = el("button", { type: "button", class: "cancel", text: "cancel",
    "data-job": job.job_id });
  let armed = null;
  b.addEventListener("click", async () => {
    if (!armed) {
      // Two clicks: a stray one cannot end a training run.
      b.textContent = "confirm cancel";
      b.classList.add("confirm");
      armed = setTimeout(() => {
        armed = null; b.textContent = "cancel"; b.classList.remove("confirm");
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    b.disabled = true;
    b.textContent = "cancelling";
    try {
      await api("/v1/jobs/" + encodeURIComponent(job.job_id) + "/cancel",
        { method: "POST", headers: authHeaders() });
      setStatus("cancel requested for " + job.job_id);
    } catch (e) {
      setStatus("cancel " + job.job_id + ": " + e.message, true);
      b.disabled = false;
      b.textContent = "cancel";
      b.classList.remove("confirm");
      return;
    }
    refreshSoon();
  });
  return b;
}

function jobsTable(jobs) {
  const rows = jobs.map((j) => {
    const p = jobProgress(j);
    const t = j.training || (j.spec && j.spec.training);
    const r = j.rl;
    const progress = p === null ? el("span", { class: "muted", text: "-" })
      : el("span", {}, el("span", { class: "bar" }, el("span", { style: "width:" +
        (100 * p).toFixed(1) + "%" })), t && t.outer_loop_steps
        ? (j.state === "succeeded" && !t.outer_step ? t.outer_loop_steps : t.outer_step || 0) +
          "/" + t.outer_loop_steps
        : r && r.num_iterations ? (r.iteration || 0) + "/" + r.num_iterations
        : (100 * p).toFixed(0) + "%");
    const name = el("a", { href: "#/jobs/" + encodeURIComponent(j.job_id),
      text: jobName(j), title: j.job_id });
    return el("tr", { "data-job": j.job_id }, td(name), td(j.kind),
      td(j.state, j.state), td(progress), td(fmtTime(j.created_at_ms)),
      td(fmtDuration(jobDuration(j)), "num"), td(j.error || "", "muted"),
      td(TERMINAL.has(j.state) || j.state === "cancelling" ? "" : cancelButton(j)));
  });
  return table(["name", "kind", "state", "progress", "started",
    { text: "duration", num: true }, "error", ""], rows, "no jobs yet");
}

function workersTable(workers) {
  const groups = new Map();
  for (const w of workers) {
    const key = w.backend + " / " + (w.target || "default");
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(w);
  }
  const rows = [];
  for (const [key, list] of [...groups.entries()].sort()) {
    const up = list.filter((w) => w.state === "connected").length;
    rows.push(el("tr", { class: "group" }, el("td", { colspan: 8,
      text: key + " \u2014 " + up + "/" + list.length + " connected" })));
    for (const w of list) {
      const task = w.current_task
        ? w.current_task.function + " #" + w.current_task.task_id : "idle";
      const age = w.heartbeat_age_seconds;
      rows.push(el("tr", { class: "worker", "data-worker": w.worker_id },
        td(workerShortName(w), "", w.worker_id), td(w.state, w.state),
        td(task, w.current_task ? "running" : "muted"),
        td(w.in_flight, "num"), td(w.tasks_done, "num"),
        td(age === null || age === undefined ? "lost" : fmtDuration(age) + " ago", "num"),
        td(fmtBytes(w.bytes_to_worker), "num"), td(fmtBytes(w.bytes_from_worker), "num")));
    }
  }
  return table(["worker", "state", "current task", { text: "in flight", num: true },
    { text: "tasks done", num: true }, { text: "last heartbeat", num: true },
    { text: "bytes to", num: true }, { text: "bytes from", num: true }],
    rows, "no worker has joined");
}

function modelsTable(models, full) {
  const rows = models.map((m) => {
    const s = m.stats || {};
    const cells = [td(m.id), td(m.status, m.status), td("v" + m.version, "num"),
      td(m.job_id ? el("a", { href: "#/jobs/" + encodeURIComponent(m.job_id),
        text: m.job_id + (m.outer_step !== null ? " @" + m.outer_step : "") }) : "-"),
      td(s.requests, "num"),
      td(s.ttft_seconds_mean === null || s.ttft_seconds_mean === undefined ? "-"
        : fmtDuration(s.ttft_seconds_mean), "num"),
      td(s.tokens_per_second === null || s.tokens_per_second === undefined ? "-"
        : s.tokens_per_second.toFixed(1), "num")];
    if (full) {
      cells.push(td(m.architecture), td(m.max_model_len, "num"),
        td(s.generated_tokens, "num"), td(s.failed_requests, "num"),
        td(m.reload_error || m.error || "", "failed"));
    }
    return el("tr", { class: "model", "data-model": m.id }, ...cells);
  });
  const h = ["model", "status", { text: "version", num: true }, "from job",
    { text: "requests", num: true }, { text: "mean TTFT", num: true },
    { text: "tokens/s", num: true }];
  if (full) {
    h.push("architecture", { text: "context", num: true },
      { text: "tokens out", num: true }, { text: "failed", num: true }, "error");
  }
  return table(h, rows, "no model is served");
}

async function overviewView(root) {
  const workers = el("section", { id: "workers-section" }, el("h2", { text: "Workers" }),
    el("p", { id: "worker-counts", class: "muted" }), el("div", { id: "workers" }));
  const jobs = el("section", { id: "jobs-section" }, el("h2", { text: "Jobs" }),
    el("div", { id: "jobs" }));
  const models = el("section", { id: "models-section" }, el("h2", {},
    "Served models ", el("a", { href: "#/models", text: "(details)" })),
    el("div", { id: "models" }));
  root.replaceChildren(workers, jobs, models);
  return {
    name: "overview",
    async refresh() {
      const [c, w, j, m] = await Promise.all([api("/v1/controller"),
        api("/v1/workers"), jobsNewest(50), api("/v1/models")]);
      document.getElementById("gateway-id").textContent = c.gateway_id;
      const n = w.counts;
      document.getElementById("worker-counts").textContent = "connected: " +
        n.connected + ", draining: " + n.draining + ", lost: " + n.lost +
        (w.truncated ? " (list cut at " + w.workers.length + ")" : "");
      document.getElementById("workers").replaceChildren(workersTable(w.workers));
      document.getElementById("jobs").replaceChildren(jobsTable(j));
      document.getElementById("models").replaceChildren(modelsTable(m.data, false));
    },
    onEvent() { refreshSoon(); },
  };
}

async function modelsView(root) {
  root.replaceChildren(el("section", { id: "models-section" },
    el("h2", { text: "Served models" }),
    el("p", { class: "muted", text: "Requests, mean time to first token and " +
      "generated tokens per second of a request (arrival to end), counted " +
      "since the gateway started; readiness probes excluded." }),
    el("div", { id: "models" })));
  return {
    name: "models",
    async refresh() {
      const m = await api("/v1/models");
      document.getElementById("models").replaceChildren(modelsTable(m.data, true));
    },
    onEvent() {},
  };
}

// The experiment as key / value rows (nested keys dotted).
function configRows(obj, prefix, rows) {
  for (const k of Object.keys(obj || {})) {
    const v = obj[k];
    const key = prefix ? prefix + "." + k : k;
    if (v && typeof v === "object" && !Array.isArray(v)) configRows(v, key, rows);
    else rows.push(el("tr", {}, td(key), td(Array.isArray(v) ? JSON.stringify(v) : String(v))));
  }
  return rows;
}

// One readable line per event.
function eventText(ev) {
  const p = ev.payload || {};
  if (ev.type === "state") {
    return (ev.from ? ev.from + " \u2192 " : "") + ev.to +
      (p.attempt > 1 ? " (attempt " + p.attempt + ")" : "") +
      (p.error ? ": " + p.error : "");
  }
  if (ev.type === "training.step") {
    return "outer step " + p.outer_step + (p.outer_loop_steps ? "/" + p.outer_loop_steps : "") +
      "  loss " + fmtNumber(p.loss, 4) +
      (p.evaluated ? "  val_loss " + fmtNumber(p.val_loss, 4) : "") +
      "  " + fmtNumber(p.tokens_per_second, 0) + " tok/s" +
      "  " + fmtBytes(p.step_wire_bytes) + " on the wire" +
      (p.seconds !== undefined ? "  in " + fmtDuration(p.seconds) : "");
  }
  if (ev.type === "rl.iteration") {
    return "iteration " + p.iteration + (p.num_iterations ? "/" + p.num_iterations : "") +
      "  reward " + fmtNumber(p.reward_mean, 3) + " \u00b1 " + fmtNumber(p.reward_std, 3) +
      "  KL " + fmtNumber(p.kl, 4) + "  clip " + fmtNumber(p.clip_fraction, 3) +
      "  " + fmtNumber(p.tokens_per_second, 0) + " tok/s" +
      (p.eval_reward_mean !== null && p.eval_reward_mean !== undefined
        ? "  eval " + fmtNumber(p.eval_reward_mean, 3) : "") +
      (p.policy_version !== undefined ? "  policy v" + p.policy_version : "");
  }
  if (ev.type === "training.accepted") {
    return "accepted: " + p.outer_loop_steps + " outer steps of tau " + p.tau +
      ", " + fmtNumber(p.parameter_count, 0) + " parameters";
  }
  if (ev.type === "step") return "step " + p.step + " committed";
  const parts = [];
  for (const k of Object.keys(p)) {
    const v = p[k];
    if (v === null || typeof v === "object") continue;
    parts.push(k + " " + (typeof v === "number" ? fmtNumber(v) : v));
    if (parts.length >= 8) break;
  }
  return parts.join(", ");
}

const TIMELINE_STEPS = 40;

function timeline(events, startMs) {
  const list = el("ol", { class: "timeline", id: "timeline" });
  // Training's outer steps and RL's iterations: the newest ones listed.
  const steps = events.filter((e) => e.type === "training.step" || e.type === "rl.iteration");
  const hidden = Math.max(0, steps.length - TIMELINE_STEPS);
  const hide = new Set(steps.slice(0, hidden));
  let prev = startMs, noted = false;
  for (const ev of events) {
    if (hide.has(ev)) {
      if (!noted) {
        list.append(el("li", { class: "muted" }, el("span", {}), el("span", {}),
          el("span", {}), el("span", { text: hidden + (ev.type === "rl.iteration"
            ? " earlier iterations" : " earlier outer steps") +
            " (all of them are in the charts above)" })));
        noted = true;
      }
      prev = ev.created_at_ms;
      continue;
    }
    const d = (ev.created_at_ms - prev) / 1000;
    prev = ev.created_at_ms;
    list.append(el("li", { class: "event", "data-type": ev.type },
      el("span", { class: "t", text: fmtTime(ev.created_at_ms),
        title: new Date(ev.created_at_ms).toISOString() }),
      el("span", { class: "d", text: "+" + fmtDuration(Math.max(0, d)),
        title: "since the previous event" }),
      el("span", { class: "k " + (ev.to || ""), text: ev.type === "state" ? "state" : ev.type }),
      el("span", { text: eventText(ev) })));
  }
  if (!events.length) list.append(el("li", { class: "empty", text: "no events" }));
  return list;
}

// The job's events with an id above |after|, page after page (the route
// answers up to 1,000 per call), at most 50 pages per call.
async function jobEvents(id, after) {
  let all = [];
  for (let page = 0; page < 50; ++page) {
    const r = await api("/v1/jobs/" + encodeURIComponent(id) + "/events?after=" + after);
    all = all.concat(r.events);
    if (!r.more || !r.events.length) break;
    after = r.events[r.events.length - 1].event_id;
  }
  return all;
}

// An RL job's facts (job.rl: docs/rl.md, "Running an RL job"): the last
// iteration's reward, KL and clip fraction as small readouts.
function rlFacts(r, state) {
  const n = r.num_iterations || 0, i = r.iteration || 0;
  const pct = n ? " (" + (100 * Math.min(1, (state === "succeeded" ? n : i) / n)).toFixed(0) + "%)" : "";
  const rows = [["progress", i + " / " + (n || "?") + " iterations" + pct],
    ["reward mean", r.reward_mean === undefined || r.reward_mean === null ? "" :
      fmtNumber(r.reward_mean, 4) + " \u00b1 " + fmtNumber(r.reward_std, 4)],
    ["eval reward mean", fmtNumber(r.eval_reward_mean, 4)],
    ["KL", fmtNumber(r.kl, 5)], ["clip fraction", fmtNumber(r.clip_fraction, 4)],
    ["rollout tokens/s", fmtNumber(r.tokens_per_second, 0)],
    ["policy version", r.policy_version === undefined ? "" : r.policy_version]];
  if (r.served_model) rows.push(["served model", r.served_model]);
  rows.push(["stale rollouts dropped", r.stale_dropped === undefined ? "" : r.stale_dropped]);
  if (r.weight_refresh_seconds !== undefined && r.weight_refresh_seconds !== null) {
    rows.push(["weight refresh", fmtDuration(r.weight_refresh_seconds) + " for " +
      fmtBytes(r.weight_refresh_bytes)]);
  }
  return rows;
}

// The RL curves from job.rl.history: reward mean with a +-std band and the
// held-out eval reward as points; KL and clip fraction per iteration.
function rlCharts() {
  const reward = new Chart({ id: "chart-reward", title: "Reward",
    xLabel: "iteration", yLabel: "reward" });
  const kl = new Chart({ id: "chart-kl", title: "KL to the reference",
    xLabel: "iteration", yLabel: "KL",
    // KL is often 1e-4..1e-2: three decimals would print equal ticks.
    yFormat: (v) => (v === 0 ? "0" : Math.abs(v) < 0.01 ? v.toExponential(1) : fmtNumber(v)) });
  const clip = new Chart({ id: "chart-clip", title: "Clip fraction",
    xLabel: "iteration", yLabel: "fraction clipped" });
  return {
    roots: [reward.root, kl.root, clip.root],
    draw(history) {
      const h = Array.isArray(history) ? history : [];
      const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);
      const xs = h.map((p) => p.iteration);
      const mean = h.map((p) => num(p.reward_mean));
      const std = h.map((p) => num(p.reward_std));
      reward.setSeries([
        { name: "reward_mean", xs, ys: mean, band: { name: "reward_std",
          lo: mean.map((m, i) => (m === null || std[i] === null ? null : m - std[i])),
          hi: mean.map((m, i) => (m === null || std[i] === null ? null : m + std[i])) } },
        { name: "eval_reward_mean", xs, ys: h.map((p) => num(p.eval_reward_mean)),
          dots: true }]);
      kl.setSeries([{ name: "kl", xs, ys: h.map((p) => num(p.kl)) }]);
      clip.setSeries([{ name: "clip_fraction", xs, ys: h.map((p) => num(p.clip_fraction)) }]);
      return h.length;
    },
  };
}

async function jobView(root, id) {
  const facts = el("dl", { class: "facts", id: "job-facts" });
  const charts = el("div", { class: "charts" });
  const loss = new Chart({ id: "chart-loss", title: "Loss", xLabel: "outer step",
    yLabel: "loss", logToggle: true });
  const tps = new Chart({ id: "chart-tokens", title: "Tokens per second",
    xLabel: "time since the first step", yLabel: "tokens/s",
    xFormat: (v) => fmtDuration(v), yFormat: (v) => fmtNumber(v, 0) });
  const wire = new Chart({ id: "chart-wire", title: "Bytes on the wire",
    xLabel: "time since the first step", yLabel: "bytes (cumulative)",
    xFormat: (v) => fmtDuration(v), yFormat: (v) => fmtBytes(v) });
  charts.append(loss.root, tps.root, wire.root);
  const config = el("div", { id: "job-config" });
  const events = el("div", { id: "job-events" });
  const title = el("h2", { id: "job-title", text: id });
  const actions = el("span", { id: "job-actions" });
  root.replaceChildren(
    el("section", {}, el("div", { class: "chart-head" }, title, actions), facts),
    el("section", { id: "charts-section" }, el("h2", { text: "Training curves" }),
      el("p", { class: "muted", text: "Drag across a chart or use the wheel to " +
        "zoom; double-click or \"reset zoom\" to see everything." }), charts),
    el("section", {}, el("h2", { text: "Events" }), events),
    el("section", {}, el("h2", { text: "Configuration" }), config));
  let drawnConfig = false;
  let rlView = null;  // the RL charts, made when the job turns out to be one
  // Events seen so far: a refresh asks only for newer ones.
  let seen = [];
  let terminal = false;
  return {
    name: "job",
    async refresh() {
      const job = await api("/v1/jobs/" + encodeURIComponent(id));
      const training = job.kind === "training";
      // The events (up to 1,000 per page, ~400 KB for a 1,000-step job) come
      // after the charts: the curves need only the compact history.
      const eventsLoaded = jobEvents(id, seen.length ? seen[seen.length - 1].event_id : 0);
      eventsLoaded.catch(() => {});  // awaited below; no unhandled rejection
      const [detail, history] = await Promise.all([
        training ? api("/v1/training/jobs/" + encodeURIComponent(id)) : job,
        training ? api("/v1/training/jobs/" + encodeURIComponent(id) + "/history") : null]);
      title.textContent = jobName(detail) + " (" + detail.kind + ")";
      const t = detail.training || {};
      const p = jobProgress(detail);
      const rows = [["job id", detail.job_id], ["state", detail.state],
        ["started", fmtTime(detail.created_at_ms)],
        ["duration", fmtDuration(jobDuration(detail))],
        ["attempt", detail.attempt]];
      if (training) {
        rows.push(["progress", (history ? history.points : t.outer_step || 0) + " / " +
          t.outer_loop_steps + " outer steps" + (p !== null ? " (" + (100 * p).toFixed(0) + "%)" : "")],
          ["last loss", fmtNumber(t.loss, 4)], ["last val_loss", fmtNumber(t.val_loss, 4)],
          ["parameters", fmtNumber(t.parameter_count, 0)],
          ["bytes on the wire", fmtBytes(t.wire_bytes)]);
      }
      if (detail.kind === "rl") rows.push(...rlFacts(detail.rl || {}, detail.state));
      if (detail.error) rows.push(["error", detail.error]);
      facts.replaceChildren(...rows.flatMap(([k, v]) =>
        [el("dt", { text: k }), el("dd", { class: k === "state" ? String(v) : "", text: v })]));
      actions.replaceChildren(TERMINAL.has(detail.state) || detail.state === "cancelling"
        ? "" : cancelButton(detail));
      if (detail.kind === "rl") {
        if (!rlView) {
          rlView = rlCharts();
          charts.replaceChildren(...rlView.roots);
          document.querySelector("#charts-section h2").textContent = "RL curves";
        }
        charts.setAttribute("data-points", rlView.draw(detail.rl && detail.rl.history));
      } else if (history) {
        const t0 = history.time_ms.length ? history.time_ms[0] : 0;
        const secs = history.time_ms.map((m) => (m - t0) / 1000);
        loss.setSeries([{ name: "loss", xs: history.outer_step, ys: history.loss },
          { name: "val_loss", xs: history.outer_step, ys: history.val_loss, dots: true }]);
        tps.setSeries([{ name: "tokens/s", xs: secs, ys: history.tokens_per_second }]);
        wire.setSeries([{ name: "wire bytes", xs: secs, ys: history.wire_bytes }]);
        charts.setAttribute("data-points", history.points);
      } else {
        charts.replaceChildren(el("p", { class: "muted",
          text: "A " + detail.kind + " job has no training curves." }));
      }
      // The charts are drawn: the first time, once painted, that is the
      // page's render time (bench/dashboard reads the mark).
      if (!performance.getEntriesByName("pcp-job-rendered").length) {
        requestAnimationFrame(() => setTimeout(() => {
          if (!performance.getEntriesByName("pcp-job-rendered").length) {
            performance.mark("pcp-job-rendered");
          }
        }, 0));
      }
      const fresh = await eventsLoaded;
      if (fresh.length || !events.firstChild) {
        seen = seen.concat(fresh);
        events.replaceChildren(timeline(seen, detail.created_at_ms));
      }
      terminal = TERMINAL.has(detail.state);
      if (!drawnConfig) {
        const exp = detail.spec && (detail.spec.experiment || detail.spec);
        const shown = training || detail.kind === "rl" ? exp
          : { kind: detail.kind, placement: JSON.stringify(detail.placement) };
        config.replaceChildren(el("table", { class: "config" },
          el("tbody", {}, ...configRows(shown, "", []))));
        drawnConfig = true;
      }
      document.body.setAttribute("data-rendered", "job:" + id);
    },
    onEvent(ev) { if (ev.job_id === id) refreshSoon(); },
    // A finished job changes no more: no polling (an event still refreshes).
    polls() { return !terminal; },
  };
}

//===------------------------------------------------------------------===//
// Routing, refresh and the event stream
//===------------------------------------------------------------------===//

let refreshTimer = null;
let refreshing = false;
let pending = false;

async function refreshNow() {
  if (!current) return;
  if (refreshing) { pending = true; return; }
  refreshing = true;
  const view = current;
  try {
    await view.refresh();
    if (view === current) {
      setStatus("updated " + new Date().toLocaleTimeString([], { hour12: false }));
      document.body.setAttribute("data-view", view.name);
    }
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    refreshing = false;
    if (pending) { pending = false; refreshSoon(); }
  }
}

// Coalesces bursts (an outer step writes several events) into one refresh.
function refreshSoon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; refreshNow(); }, 300);
}

async function route() {
  const hash = location.hash || "#/";
  const root = document.getElementById("view");
  document.body.removeAttribute("data-view");
  document.body.removeAttribute("data-rendered");
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.getAttribute("href") === hash);
  }
  const m = hash.match(/^#\/jobs\/(.+)$/);
  if (m) current = await jobView(root, decodeURIComponent(m[1]));
  else if (hash === "#/models") current = await modelsView(root);
  else current = await overviewView(root);
  await refreshNow();
}

// EventSource cannot send a token header: the stream is read with fetch.
// On any end it reconnects (backoff up to 10 s) from the last event id.
let lastEventId = null;
async function streamEvents() {
  const live = document.getElementById("live");
  let delay = 500;
  for (;;) {
    try {
      const headers = authHeaders();
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      const r = await fetch("/v1/events", { headers });
      if (!r.ok) throw await errorOf("/v1/events", r);
      live.className = "live on";
      live.textContent = "live";
      delay = 500;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let at;
        while ((at = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          let kind = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trimStart();
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (id !== null) lastEventId = id;
          if (!data) continue;
          let ev = null;
          try { ev = JSON.parse(data); } catch (e) { continue; }
          if (current) current.onEvent(Object.assign({ kind }, ev));
        }
      }
    } catch (e) {
      live.title = "event stream: " + e.message;
    }
    live.className = "live off";
    live.textContent = "reconnecting";
    await new Promise((done) => setTimeout(done, delay));
    delay = Math.min(10000, delay * 2);
  }
}

function tokenFormInit() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  input.value = token();
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
    else sessionStorage.removeItem(TOKEN_KEY);
    refreshNow();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    input.value = "";
    refreshNow();
  });
}

tokenFormInit();
window.addEventListener("hashchange", route);
route();
// Heartbeat ages and durations move without events: a slow poll too.
setInterval(() => {
  if (!document.hidden && current && (!current.polls || current.polls())) {
    refreshNow();
  }
}, 3000);
streamEvents();
