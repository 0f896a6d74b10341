// The dashboard: polls /api/overview and redraws. Every value is set as text, never as markup.
"use strict";

const POLL_MS = 2000;
const ROUNDS_SHOWN = 20;
const SVG = "http://www.w3.org/2000/svg";

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
  const errorCell = error ? el("td", `round ${error.round}: ${error.reason}`, "failed") : el("td", "none");
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
  ], { device: d.device_id });
}

function reportCell(report) {
  if (!report) return el("td", "none");
  const text = `round ${report.round}: ${number(report.accuracy, 4)} of ${report.clips} clips`;
  if (report.others_median === null) return el("td", text, "number");
  return el("td", `${text}, far from the others' (median ${number(report.others_median, 4)})`, "flagged");
}

function roundRow(r) {
  return row([
    el("td", r.round, "number"), el("td", r.devices, "number"), el("td", r.results, "number"),
    el("td", r.withdrawn, "number"), el("td", r.stragglers, "number"),
    el("td", `${r.wall_s.toFixed(1)} s`, "number"), el("td", bytes(r.bytes_up), "number"),
    el("td", bytes(r.bytes_down), "number"), el("td", number(r.accuracy, 4), "number accuracy"),
    el("td", number(r.loss, 4), "number"), el("td", number(r.federated_accuracy, 4), "number"),
    el("td", number(r.federated_loss, 4), "number"),
    el("td", r.federated_accuracy === null ? "" : `${r.evaluation_reports} devices, ${r.evaluation_clips} clips`),
  ], { round: r.round });
}

function chart(svg, rounds, series, fixedMax) {
  svg.replaceChildren();
  const [w, h, left, bottom, top, right] = [480, 220, 44, 24, 10, 10];
  const points = series.flatMap((s) => rounds.filter((r) => r[s.key] !== null).map((r) => r[s.key]));
  if (!points.length) {
    const empty = document.createElementNS(SVG, "text");
    empty.setAttribute("x", w / 2 - 60); empty.setAttribute("y", h / 2);
    empty.textContent = "no evaluation yet";
    svg.append(empty);
    return;
  }
  const xMax = Math.max(1, ...rounds.map((r) => r.round));
  const yMax = fixedMax || Math.max(...points) * 1.05 || 1;
  const x = (round) => left + (round / xMax) * (w - left - right);
  const y = (v) => h - bottom - (v / yMax) * (h - bottom - top);
  const axes = document.createElementNS(SVG, "path");
  axes.setAttribute("d", `M${left},${top} V${h - bottom} H${w - right}`);
  axes.setAttribute("class", "axis");
  svg.append(axes);
  for (const [text, tx, ty] of [[yMax.toFixed(2), 2, top + 10], ["0", 30, h - bottom], [`round ${xMax}`, w - 70, h - 6]]) {
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", tx); label.setAttribute("y", ty); label.textContent = text;
    svg.append(label);
  }
  for (const s of series) {
    const known = rounds.filter((r) => r[s.key] !== null);
    if (known.length) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", known.map((r) => `${x(r.round)},${y(r[s.key])}`).join(" "));
      line.setAttribute("class", s.className);
      svg.append(line);
    }
  }
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
  document.querySelector("#devices tbody").replaceChildren(...o.devices.map((d) => deviceRow(d, now)));
  document.querySelector("#rounds tbody").replaceChildren(...o.rounds.slice(-ROUNDS_SHOWN).reverse().map(roundRow));
  chart(document.getElementById("accuracy-chart"), o.rounds, [
    { key: "accuracy", className: "central" },
    { key: "federated_accuracy", className: "federated" },
  ], 1);
  chart(document.getElementById("loss-chart"), o.rounds, [
    { key: "loss", className: "central" },
    { key: "federated_loss", className: "federated" },
  ]);
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

poll();
