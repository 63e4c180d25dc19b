// The gateway dashboard: polls workers and jobs, streams events over SSE.
// A token, when the API has one, comes from ?token= (kept in this page only).
"use strict";
const token = new URLSearchParams(location.search).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
}

async function getJson(path) {
  const r = await fetch(path, { headers });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

async function refresh() {
  try {
    const c = await getJson("/v1/controller");
    document.getElementById("gateway-id").textContent = c.gateway_id;
    document.getElementById("status").textContent = c.status;
    const w = await getJson("/v1/workers");
    const counts = w.counts;
    document.getElementById("worker-counts").textContent =
      "connected: " + counts.connected + ", draining: " + counts.draining +
      ", lost: " + counts.lost;
    const wb = document.querySelector("#workers tbody");
    wb.replaceChildren();
    for (const x of w.workers) {
      const tr = document.createElement("tr");
      cell(tr, x.worker_id); cell(tr, x.state); cell(tr, x.backend);
      cell(tr, x.target); cell(tr, x.in_flight);
      wb.appendChild(tr);
    }
    const j = await getJson("/v1/jobs?limit=50");
    const jb = document.querySelector("#jobs tbody");
    jb.replaceChildren();
    for (const x of j.jobs) {
      const tr = document.createElement("tr");
      cell(tr, x.job_id); cell(tr, x.state, x.state); cell(tr, x.attempt);
      cell(tr, x.error);
      jb.appendChild(tr);
    }
    await refreshTraining();
  } catch (e) {
    document.getElementById("status").textContent = "error: " + e.message;
  }
}

// Loss curves of training jobs, from their training.step events (the last
// event per outer step wins: a resumed job repeats the steps after its
// checkpoint).
const SVG = "http://www.w3.org/2000/svg";

function svgElement(name, attrs) {
  const e = document.createElementNS(SVG, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}

// Train loss per outer step (a polyline) and, as a second series, the
// held-out val_loss of the evaluations (dashed, with dots); one y scale.
function lossCurve(job, steps, vals) {
  const div = document.createElement("div");
  div.className = "curve";
  div.id = "curve-" + job.job_id;
  const xs = Object.keys(steps).map(Number).sort((a, b) => a - b);
  const losses = xs.map((x) => steps[x]);
  const vx = Object.keys(vals).map(Number).sort((a, b) => a - b);
  const vl = vx.map((x) => vals[x]);
  const last = xs.length ? xs[xs.length - 1] : 0;
  const caption = document.createElement("p");
  caption.className = "caption";
  caption.textContent = job.job_id + " (" + job.state + "): outer step " +
    last + (xs.length ? ", loss " + losses[losses.length - 1].toFixed(3) : "") +
    (vx.length ? ", val_loss " + vl[vl.length - 1].toFixed(3) : "");
  div.appendChild(caption);
  const w = 480, h = 160, pad = 30;
  const svg = svgElement("svg", { width: w, height: h, role: "img",
    "aria-label": "loss curve of " + job.job_id });
  if (xs.length) {
    const all = losses.concat(vl);
    const lo = Math.min(...all), hi = Math.max(...all);
    const span = hi > lo ? hi - lo : 1;
    const maxX = Math.max(last, ...vx, 1);
    const px = (x) => (pad + (w - 2 * pad) * x / maxX).toFixed(1);
    const py = (y) => (h - pad - (h - 2 * pad) * (y - lo) / span).toFixed(1);
    const points = xs.map((x, i) => px(x) + "," + py(losses[i]));
    svg.appendChild(svgElement("polyline", { points: points.join(" "),
      class: "train" }));
    if (vx.length) {
      const vp = vx.map((x, i) => px(x) + "," + py(vl[i]));
      svg.appendChild(svgElement("polyline", { points: vp.join(" "),
        class: "val" }));
      vx.forEach((x, i) => svg.appendChild(svgElement("circle",
        { cx: px(x), cy: py(vl[i]), r: 2.5, class: "val" })));
    }
    const top = svgElement("text", { x: 2, y: pad, class: "axis" });
    top.textContent = hi.toFixed(2);
    const bottom = svgElement("text", { x: 2, y: h - pad, class: "axis" });
    bottom.textContent = lo.toFixed(2);
    const right = svgElement("text", { x: w - pad, y: h - 8, class: "axis" });
    right.textContent = String(last);
    const legend = svgElement("text", { x: w - 150, y: 14, class: "axis" });
    legend.textContent = "-- train  - - val";
    svg.append(top, bottom, right, legend);
  }
  div.appendChild(svg);
  return div;
}

async function refreshTraining() {
  const j = await getJson("/v1/jobs?kind=training&limit=20");
  const box = document.getElementById("training");
  const curves = [];
  for (const job of j.jobs) {
    const e = await getJson("/v1/jobs/" + job.job_id + "/events");
    const steps = {};
    const vals = {};
    for (const ev of e.events) {
      if (ev.type === "training.step" && ev.payload &&
          typeof ev.payload.loss === "number") {
        steps[ev.payload.outer_step] = ev.payload.loss;
        if (ev.payload.evaluated && typeof ev.payload.val_loss === "number") {
          vals[ev.payload.outer_step] = ev.payload.val_loss;
        }
      }
    }
    curves.push(lossCurve(job, steps, vals));
  }
  box.replaceChildren(...curves);
}

function addEvent(kind, text) {
  const li = document.createElement("li");
  li.textContent = kind + " " + text;
  const list = document.getElementById("events");
  list.appendChild(li);
  while (list.children.length > 200) list.removeChild(list.firstChild);
}

// EventSource cannot send headers; with a token the stream is read by fetch.
async function streamEvents() {
  const r = await fetch("/v1/events?after=0", { headers });
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      let kind = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) { addEvent(kind, data); refresh(); }
    }
  }
}

refresh();
setInterval(refresh, 2000);
streamEvents().catch((e) => addEvent("error", e.message));
