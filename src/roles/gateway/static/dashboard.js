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
  } catch (e) {
    document.getElementById("status").textContent = "error: " + e.message;
  }
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
