// The board's web page: data.json every refresh, drawn with textContent (never as HTML).
"use strict";
const COLUMNS = [
  ["gpu", "GPU", ""], ["model", "model", "wide"], ["memory", "memory", "wide"],
  ["util", "util", "wide"], ["state", "state", ""], ["holder", "holder", ""],
  ["held", "held", "wide"], ["left", "left", ""], ["job", "job", ""], ["note", "note", ""],
];
let refreshMs = 2000;
let lastOk = 0;

function cell(tag, text, cls) {
  const el = document.createElement(tag);
  el.textContent = text == null ? "" : String(text);
  if (cls) el.className = cls;
  return el;
}

function nodeSection(node) {
  const section = document.createElement("section");
  section.className = "node" + (node.up ? "" : " down");
  section.dataset.node = node.name;
  section.appendChild(cell("h2", node.up ? node.name : node.name + " — " + (node.error || "unreachable")));
  const table = document.createElement("table");
  const head = document.createElement("tr");
  for (const [, label, cls] of COLUMNS) head.appendChild(cell("th", label, cls));
  table.appendChild(document.createElement("thead")).appendChild(head);
  const body = table.appendChild(document.createElement("tbody"));
  for (const gpu of node.gpus) {
    const row = document.createElement("tr");
    row.className = gpu.state + (gpu.mine ? " mine" : "");
    for (const [key, , cls] of COLUMNS) {
      row.appendChild(cell("td", key === "state" ? gpu.state : gpu[key], [key, cls].join(" ").trim()));
    }
    body.appendChild(row);
  }
  section.appendChild(table);
  return section;
}

function draw(data) {
  document.getElementById("cluster").textContent = data.cluster || "gpuclaim";
  document.title = (data.cluster || "gpuclaim") + " · gpuclaim board";
  document.getElementById("summary").textContent = data.summary || "";
  document.getElementById("nodes").replaceChildren(...(data.nodes || []).map(nodeSection));
  const services = data.services || [];
  document.getElementById("services-section").hidden = services.length === 0;
  document.querySelector("#services tbody").replaceChildren(...services.map((s) => {
    const row = document.createElement("tr");
    const up = s.up_s == null ? "" : Math.round(s.up_s / 60) + " min";
    for (const [text, cls] of [[s.name], [s.user], [s.node], [s.url], [s.health, s.health], [up], [s.restarts]]) {
      row.appendChild(cell("td", text, cls));
    }
    return row;
  }));
  if (data.refresh_s) refreshMs = Math.max(200, data.refresh_s * 1000);
}

async function tick() {
  const fresh = document.getElementById("freshness");
  try {
    const answer = await fetch("data.json", { cache: "no-store" });
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    const data = await answer.json();
    draw(data);
    lastOk = Date.now();
    fresh.textContent = data.error ? "⚠ " + data.error : "● live · " + new Date().toLocaleTimeString();
    fresh.className = data.error ? "stale" : "";
  } catch (err) {
    const ago = lastOk ? Math.round((Date.now() - lastOk) / 1000) + " s ago" : "never";
    fresh.textContent = "⚠ no answer from gpuclaim (last " + ago + ")";
    fresh.className = "stale";
  }
  setTimeout(tick, refreshMs);
}

tick();
