// The dashboard: polls /api/overview and redraws. Every value is set as text, never as markup.
"use strict";

const POLL_MS = 2000;
const ROUNDS_PER_PAGE = 20;
const SVG = "http://www.w3.org/2000/svg";
const MAX_MARKED = 50;  // points of a curve marked with a dot: one round's point shows, many stay a line

let shown = null;  // the overview on the page, redrawn as the rounds' pager moves
let roundsPage = 0;  // pages of rounds back from the newest
let allRounds = false;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function number(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function ago(at, now) {
  if (at === null || at === undefined) return "never";
  const s = Math.max(0, now - at);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

function hardware(profile) {
  const parts = [];
  if (profile.cpu_count) parts.push(`${profile.cpu_count} CPU`);
  if (profile.cpu_freq_mhz) parts.push(`${(profile.cpu_freq_mhz / 1000).toFixed(1)} GHz`);
  if (profile.ram_available_mb) parts.push(`${(profile.ram_available_mb / 1000).toFixed(1)} GB free`);
  if (profile.cpu_gflops) parts.push(`${profile.cpu_gflops.toFixed(1)} GFLOP/s`);
  if (profile.seconds_per_sample) parts.push(`${(profile.seconds_per_sample * 1000).toFixed(1)} ms/clip`);
  if (profile.rtt_ms) parts.push(`RTT ${profile.rtt_ms.toFixed(0)} ms`);
  return parts.join(", ") || "not measured";
}

function counts(train, test) {
  const labels = Array.from(new Set([...Object.keys(train), ...Object.keys(test)])).sort();
  return labels.map((label) => `${label} ${train[label] || 0}/${test[label] || 0}`).join(", ") || "–";
}

function row(cells, attributes) {
  const tr = el("tr");
  for (const [name, value] of Object.entries(attributes || {})) tr.dataset[name] = value;
  for (const cell of cells) tr.append(cell);
  return tr;
}

function deviceRow(d, now) {
  const update = d.last_update;
  const updateCell = update
    ? el("td", update.accepted ? `round ${update.round}: accepted` : `round ${update.round}: rejected, ${update.reason}`,
      update.accepted ? "" : "rejected")
    : el("td", "none yet");
  const error = d.last_error;
  const errorCell = error ? el("td", `round ${error.round}: ${error.reason}`, "last-error failed")
    : el("td", "none", "last-error");
  return row([
    el("td", d.device_id, "device-id"),
    el("td", d.online ? (d.state === "online" ? "online" : `online, ${d.state}`)
      : d.registered ? "offline" : "enrolled, not registered",
      d.online ? "online state" : "offline state"),
    el("td", number(d.score, 2), "number score"),
    el("td", hardware(d.profile)),
    el("td", ago(d.last_seen, now)),
    el("td", d.rounds_joined, "number rounds-joined"),
    updateCell,
    errorCell,
    reportCell(d.last_report),
    el("td", counts(d.train_counts, d.test_counts)),
    missingCell(d.missing_labels),
  ], { device: d.device_id });
}

function missingCell(labels) {
  if (labels === null || labels === undefined) return el("td", "–", "missing");
  return labels.length ? el("td", labels.join(", "), "missing flagged") : el("td", "none", "missing");
}

function reportCell(report) {
  if (!report) return el("td", "none");
  const text = `round ${report.round}: ${number(report.accuracy, 4)} of ${report.clips} clips`;
  if (report.others_median === null) return el("td", text, "number");
  return el("td", `${text}, far from the others' (median ${number(report.others_median, 4)})`, "flagged");
}

function roundRow(r) {
  return row([
    el("td", r.round === 0 ? "0 (first model)" : r.round, "number"),
    el("td", r.devices, "number"), el("td", r.results, "number"),
    el("td", r.withdrawn, "number"), el("td", r.stragglers, "number"),
    el("td", `${r.wall_s.toFixed(1)} s`, "number"), el("td", bytes(r.bytes_up), "number"),
    el("td", bytes(r.bytes_down), "number"), el("td", number(r.accuracy, 4), "number accuracy"),
    el("td", number(r.loss, 4), "number"), el("td", number(r.federated_accuracy, 4), "number"),
    el("td", number(r.federated_loss, 4), "number"),
    el("td", r.federated_accuracy === null ? "" : `${r.evaluation_reports} devices, ${r.evaluation_clips} clips`),
  ], { round: r.round });
}

function svgEl(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// A step of 1, 2 or 5 times a power of ten giving about `count` ticks up to max, and the axis's end: the
// first tick at or past max.
function ticks(max, count, integers) {
  const rough = max / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  let step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough * 0.999);
  if (integers) step = Math.max(1, Math.round(step));
  const end = Math.ceil(max / step - 1e-9) * step;
  const values = [];
  for (let i = 0; i * step <= end + step * 1e-9; i += 1) values.push(i * step);
  return { values, end, digits: Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) };
}

// A chart of the series that have data, with a grid, ticks and units on both axes, and a legend entry for
// each series drawn.
function chart(svg, legend, rounds, series, yTitle, yEnd) {
  svg.replaceChildren();
  const drawn = series.filter((s) => rounds.some((r) => r[s.key] !== null));
  legend.replaceChildren(...drawn.map((s) => el("span", s.label, `key ${s.className}`)));
  const [w, h, left, bottom, top, right] = [480, 240, 52, 40, 10, 14];
  if (!drawn.length) {
    svg.append(svgEl("text", { x: w / 2, y: h / 2, "text-anchor": "middle" }, "no evaluation yet"));
    return;
  }
  const values = drawn.flatMap((s) => rounds.filter((r) => r[s.key] !== null).map((r) => r[s.key]));
  const xTicks = ticks(Math.max(1, ...rounds.map((r) => r.round)), 6, true);
  const yTicks = ticks(yEnd || Math.max(...values) * 1.05 || 1, 5, false);
  const x = (round) => left + (round / xTicks.end) * (w - left - right);
  const y = (v) => h - bottom - (v / yTicks.end) * (h - bottom - top);
  for (const v of xTicks.values) {
    svg.append(svgEl("line", { x1: x(v), x2: x(v), y1: top, y2: h - bottom, class: "grid" }));
    svg.append(svgEl("text", { x: x(v), y: h - bottom + 16, "text-anchor": "middle", class: "tick x" }, String(v)));
  }
  for (const v of yTicks.values) {
    svg.append(svgEl("line", { x1: left, x2: w - right, y1: y(v), y2: y(v), class: "grid" }));
    svg.append(svgEl("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick y" }, v.toFixed(yTicks.digits)));
  }
  svg.append(svgEl("path", { d: `M${left},${top} V${h - bottom} H${w - right}`, class: "axis" }));
  svg.append(svgEl("text", { x: left + (w - left - right) / 2, y: h - 6, "text-anchor": "middle", class: "axis-title x" }, "round"));
  const middle = top + (h - top - bottom) / 2;
  svg.append(svgEl("text", { x: 12, y: middle, transform: `rotate(-90 12 ${middle})`, "text-anchor": "middle", class: "axis-title y" }, yTitle));
  for (const s of drawn) {
    const known = rounds.filter((r) => r[s.key] !== null);
    svg.append(svgEl("polyline", { points: known.map((r) => `${x(r.round)},${y(r[s.key])}`).join(" "), class: s.className }));
    if (known.length <= MAX_MARKED) {
      for (const r of known) svg.append(svgEl("circle", { cx: x(r.round), cy: y(r[s.key]), r: 2.5, class: s.className }));
    }
  }
}

// The latest model's figures: federated, on the devices' own speakers, and central beside it, of the same
// round where it has both.
function accuracyNow(rounds) {
  const federated = rounds.filter((r) => r.federated_accuracy !== null).pop();
  const central = rounds.filter((r) => r.accuracy !== null).pop();
  const round = federated || central;
  if (!round) return null;
  const parts = [];
  if (federated) {
    parts.push(`${number(federated.federated_accuracy, 4)} federated, on held-out clips of the devices' own speakers `
      + `(${federated.evaluation_reports} devices, ${federated.evaluation_clips} clips)`);
  }
  const held = "central, on the coordinator's held-out set";
  if (round.accuracy !== null) parts.push(`${number(round.accuracy, 4)} ${held}`);
  else if (central) parts.push(`${number(central.accuracy, 4)} ${held} (round ${central.round}'s model)`);
  else parts.push("no central held-out set");
  return `Accuracy of round ${round.round}'s model: ${parts.join("; ")}.`;
}

function renderRounds(rounds) {
  const pages = Math.max(1, Math.ceil(rounds.length / ROUNDS_PER_PAGE));
  roundsPage = Math.min(roundsPage, pages - 1);
  const newestFirst = rounds.slice().reverse();
  const page = allRounds ? newestFirst
    : newestFirst.slice(roundsPage * ROUNDS_PER_PAGE, (roundsPage + 1) * ROUNDS_PER_PAGE);
  document.querySelector("#rounds tbody").replaceChildren(...page.map(roundRow));
  document.getElementById("rounds-pager").hidden = rounds.length <= ROUNDS_PER_PAGE;
  document.getElementById("rounds-shown").textContent = page.length
    ? `rounds ${page[page.length - 1].round} to ${page[0].round} of ${rounds.length}` : "";
  document.getElementById("rounds-newer").disabled = allRounds || roundsPage === 0;
  document.getElementById("rounds-older").disabled = allRounds || roundsPage === pages - 1;
  document.getElementById("rounds-all").textContent = allRounds ? `Show ${ROUNDS_PER_PAGE} at a time` : "Show all";
  document.getElementById("rounds-earlier").hidden = !rounds.length || rounds[0].round === 0;
}

function pager() {
  const turn = (change) => () => { change(); if (shown) renderRounds(shown.rounds); };
  document.getElementById("rounds-newer").addEventListener("click", turn(() => { roundsPage -= 1; }));
  document.getElementById("rounds-older").addEventListener("click", turn(() => { roundsPage += 1; }));
  document.getElementById("rounds-all").addEventListener("click", turn(() => { allRounds = !allRounds; roundsPage = 0; }));
}

function render(o) {
  const now = o.at;
  const round = o.completed_round === null ? "no round yet" : `round ${o.completed_round} of ${o.target_rounds}`;
  const open = o.open_round === null ? (o.finished ? "finished" : o.waiting || "no round open") : `round ${o.open_round} training`;
  const online = `${o.devices_online} of ${o.devices.length} devices online`;
  const totals = Object.entries(o.fleet_counts).map(([label, n]) => `${label} ${n}`).join(", ");
  const summed = totals ? `; clips per label, summed securely over the last round's devices: ${totals}` : "";
  document.getElementById("summary").textContent = `${o.task}, ${o.strategy}, ${o.privacy}: ${round}, ${open}, ${online}${summed}`;

  const model = document.getElementById("model");
  if (o.model) {
    const m = o.model;
    const depth = m.depth === null ? "" : `, depth ${m.depth}`;
    model.replaceChildren(el("span", `Round ${m.round}: ${m.architecture}${depth}, ${bytes(m.weights_bytes)} of weights`
      + (m.onnx_bytes ? `, ${bytes(m.onnx_bytes)} ONNX ` : " ")));
    if (m.onnx_url) {
      const link = el("a", "download model.onnx");
      link.href = m.onnx_url;
      link.setAttribute("download", `fedspeech-round-${m.round}.onnx`);
      link.id = "model-download";
      model.append(link);
    }
    if (m.threshold_from) {
      const threshold = m.threshold === null ? "" : `detection threshold ${m.threshold.toFixed(3)}, `;
      model.append(el("div", threshold + m.threshold_from));
    }
  }
  const figures = accuracyNow(o.rounds);
  document.getElementById("accuracy-now").textContent = figures || "";
  document.getElementById("accuracy-now").hidden = !figures;
  document.getElementById("accuracy-note").hidden = !o.rounds.some((r) => r.federated_accuracy !== null);
  const first = document.getElementById("first-model");
  first.textContent = "Round 0 is the first model, before any device trained: "
    + (o.first_model || "how it was made is not recorded in this coordinator's state") + ".";
  first.hidden = !o.rounds.length || o.rounds[0].round !== 0;

  document.querySelector("#devices tbody").replaceChildren(...o.devices.map((d) => deviceRow(d, now)));
  shown = o;
  renderRounds(o.rounds);
  const central = "central (coordinator's held-out set)";
  const federated = "federated (devices' own speakers' held-out clips)";
  chart(document.getElementById("accuracy-chart"), document.getElementById("accuracy-legend"), o.rounds, [
    { key: "accuracy", className: "central", label: central },
    { key: "federated_accuracy", className: "federated", label: federated },
  ], "accuracy (0 to 1)", 1);
  chart(document.getElementById("loss-chart"), document.getElementById("loss-legend"), o.rounds, [
    { key: "loss", className: "central", label: central },
    { key: "federated_loss", className: "federated", label: federated },
  ], "loss (cross-entropy)");
  document.body.dataset.completedRound = o.completed_round === null ? "" : String(o.completed_round);
}

async function poll() {
  const problem = document.getElementById("problem");
  try {
    const reply = await fetch("/api/overview", { cache: "no-store" });
    if (!reply.ok) throw new Error(reply.status === 401 ? "the admin token is needed" : `HTTP ${reply.status}`);
    render(await reply.json());
    problem.hidden = true;
  } catch (error) {
    problem.textContent = `Cannot read the coordinator: ${error.message}. Retrying.`;
    problem.hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

pager();
poll();
