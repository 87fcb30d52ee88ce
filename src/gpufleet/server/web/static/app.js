/* gpufleet dashboard: live regions (htmx), charts (uPlot), log follow, confirmations.
   No inline code and no eval: the page's Content-Security-Policy allows scripts from our own files only. */
(function () {
  "use strict";

  // Okabe-Ito colours (distinguishable with colour-vision deficiencies), each series also dashed differently,
  // so colour is never the only thing telling the lines apart.
  var COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];
  var DASHES = [[], [8, 4], [2, 3], [10, 3, 2, 3], [4, 4], [1, 2], [12, 6], [6, 2, 2, 2]];

  function readJson(id) {
    var node = document.getElementById(id);
    if (!node) return null;
    try { return JSON.parse(node.textContent); } catch (e) { return null; }
  }

  function width(el) { return Math.max(280, Math.min(el.clientWidth || 640, 1100)); }

  function series(label, i, extra) {
    var s = { label: label, stroke: COLOURS[i % COLOURS.length], dash: DASHES[i % DASHES.length], width: 2, spanGaps: false };
    for (var k in extra || {}) s[k] = extra[k];
    return s;
  }

  function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

  // ---------------------------------------------------------------------------------------- overview
  var fleetChart = null;
  var FLEET = [["allocated", "Allocated"], ["used", "Used"], ["reserved_idle", "Reserved but idle"], ["free", "Free"]];

  function fleetData(s) { return [s.t].concat(FLEET.map(function (f) { return s[f[0]]; })); }

  function fleetTable(s) {
    var holder = document.getElementById("fleet-table");
    if (!holder) return;
    var rows = s.t.slice(-20).map(function (t, j) {
      var i = s.t.length - Math.min(20, s.t.length) + j;
      return "<tr><th scope=\"row\">" + clock(t) + "</th>" + FLEET.map(function (f) {
        return "<td class=\"num\">" + Number(s[f[0]][i]).toFixed(2) + "</td>";
      }).join("") + "</tr>";
    });
    holder.innerHTML = "<table><caption>Last " + rows.length + " samples (GPUs)</caption><thead><tr><th scope=\"col\">Time</th>" +
      FLEET.map(function (f) { return "<th scope=\"col\" class=\"num\">" + f[1] + "</th>"; }).join("") + "</tr></thead><tbody>" +
      rows.join("") + "</tbody></table>";
  }

  function drawFleet() {
    var el = document.getElementById("fleet-chart");
    var s = readJson("fleet-series");
    if (!el || !s || typeof uPlot === "undefined") return;
    fleetTable(s);
    if (fleetChart) { fleetChart.setData(fleetData(s)); return; }
    if (!s.t.length) { el.textContent = "No samples yet: the chart starts with the first telemetry tick."; return; }
    el.textContent = "";
    fleetChart = new uPlot({
      width: width(el), height: 260,
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [{}, { label: "GPUs" }],
      series: [{ label: "time" }].concat(FLEET.map(function (f, i) { return series(f[1], i); }))
    }, fleetData(s), el);
  }

  // ---------------------------------------------------------------------------------------- job page
  var gpuChart = null;

  function drawGpus() {
    var el = document.getElementById("gpu-chart");
    var s = readJson("gpu-series");
    if (!el || !s || typeof uPlot === "undefined") return;
    var data = [s.t].concat(s.series.map(function (g) { return g.values; }));
    if (gpuChart && gpuChart.series.length === s.series.length + 1) { gpuChart.setData(data); return; }
    if (gpuChart) { gpuChart.destroy(); gpuChart = null; }
    if (!s.t.length) { el.textContent = "No utilisation samples of this job's GPUs in the last hour."; return; }
    el.textContent = "";
    gpuChart = new uPlot({
      width: width(el), height: 220,
      scales: { x: { time: true }, y: { range: [0, 100] } },
      axes: [{}, { label: "utilisation %" }],
      series: [{ label: "time" }].concat(s.series.map(function (g, i) { return series(g.label, i); }))
    }, data, el);
  }

  function setupLog() {
    var box = document.getElementById("log");
    var text = document.getElementById("log-text");
    if (!box || !text) return;
    var worker = document.getElementById("log-worker");
    var attempt = document.getElementById("log-attempt");
    var follow = document.getElementById("log-follow");
    var status = document.getElementById("log-status");
    var offset = Number(box.dataset.offset || 0);
    var busy = false;

    function atBottom() { return text.scrollHeight - text.scrollTop - text.clientHeight < 40; }

    function load(fromTail) {
      if (busy) return;
      busy = true;
      var params = new URLSearchParams({ worker: worker.value });
      if (attempt.value) params.set("attempt", attempt.value);
      if (!fromTail) params.set("offset", String(offset));
      fetch(box.dataset.url + "?" + params.toString(), { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : { error: "the log could not be read (HTTP " + r.status + ")" }; })
        .then(function (chunk) {
          if (chunk.error) { status.textContent = chunk.error + (chunk.fix ? "; " + chunk.fix : ""); return; }
          var stick = atBottom();
          if (fromTail) text.textContent = chunk.text; else if (chunk.text) text.textContent += chunk.text;
          offset = chunk.next_offset;
          status.textContent = "attempt " + chunk.attempt + ", worker " + chunk.worker + (chunk.complete ? " (complete)" : follow.checked ? " (following)" : "");
          if (stick || fromTail) text.scrollTop = text.scrollHeight;
        })
        .catch(function () { status.textContent = "the log could not be read; retrying"; })
        .finally(function () { busy = false; });
    }

    worker.addEventListener("change", function () { load(true); });
    attempt.addEventListener("change", function () { load(true); });
    text.scrollTop = text.scrollHeight;
    window.setInterval(function () { if (follow.checked && !document.hidden) load(false); }, 1000);
  }

  // ---------------------------------------------------------------------------------------- simulator
  function empty(el, why) {
    el.textContent = why;
    el.removeAttribute("role");
    el.removeAttribute("aria-label");
    el.classList.add("no-plot");
  }

  function lines(el, title, xLabel, yLabel, curves, opts) {
    var xs = [];
    curves.forEach(function (c) { c.x.forEach(function (v) { xs.push(v); }); });
    xs = Array.from(new Set(xs)).sort(function (a, b) { return a - b; });
    var index = new Map(xs.map(function (v, i) { return [v, i]; }));
    var data = [xs].concat(curves.map(function (c) {
      var ys = new Array(xs.length).fill(null);
      c.x.forEach(function (v, i) { ys[index.get(v)] = c.y[i]; });
      return ys;
    }));
    new uPlot({
      title: title, width: width(el), height: 300,
      scales: { x: { time: false, distr: opts.log ? 3 : 1 }, y: { range: opts.yRange || null } },
      axes: [{ label: xLabel }, { label: yLabel }],
      series: [{ label: xLabel }].concat(curves.map(function (c, i) {
        return series(c.label, c.style === undefined ? i : c.style, { spanGaps: true, paths: opts.steps ? uPlot.paths.stepped({ align: 1 }) : undefined, dash: c.dash || DASHES[i % DASHES.length] });
      }))
    }, data, el);
  }

  function bars(el, title, queues, values, policies) {
    var n = policies.length, slot = 0.8 / n, xs = [];
    queues.forEach(function (q, i) { policies.forEach(function (p, k) { xs.push(i + (k - (n - 1) / 2) * slot); }); });
    var data = [xs].concat(policies.map(function (p, k) {
      return xs.map(function (x, j) { return j % n === k ? values[p][Math.floor(j / n)] : null; });
    }));
    new uPlot({
      title: title, width: width(el), height: 300,
      scales: { x: { time: false, range: [-0.6, queues.length - 0.4] }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [{ splits: function () { return queues.map(function (q, i) { return i; }); }, values: function () { return queues; } }, { label: "mean queueing delay (s)" }],
      series: [{ label: "queue" }].concat(policies.map(function (p, i) {
        return series(p, i, { fill: COLOURS[i % COLOURS.length] + "99", paths: uPlot.paths.bars({ size: [0.95, 80] }), points: { show: false } });
      }))
    }, data, el);
  }

  function drawSimulator() {
    var all = readJson("sim-plots");
    if (!all || typeof uPlot === "undefined") return;
    all.forEach(function (e, ex) {
      var jct = document.getElementById("plot-" + ex + "-jct");
      var cdf = Object.keys(e.jct_cdf);
      if (cdf.length) lines(jct, "JCT CDF - " + e.workload, "job completion time (s, log scale)", "fraction of finished jobs",
        cdf.map(function (p) { return { label: p, x: e.jct_cdf[p].jct_s.map(function (v) { return Math.max(v, 1e-3); }), y: e.jct_cdf[p].fraction, style: e.policies.indexOf(p) }; }), { log: true, steps: true, yRange: [0, 1] });
      else empty(jct, "No JCT CDF: no finished job, or the file has no curves.");

      var alloc = document.getElementById("plot-" + ex + "-alloc");
      var al = Object.keys(e.gpu_allocation);
      if (al.length) lines(alloc, "GPU allocation over time - " + e.workload, "simulated time (hours)", "GPU allocation (% of capacity)",
        al.map(function (p) { return { label: p, x: e.gpu_allocation[p].hours, y: e.gpu_allocation[p].pct, style: e.policies.indexOf(p) }; }), { steps: true, yRange: [0, 105] });
      else empty(alloc, e.fgd_steps && Object.keys(e.fgd_steps).length ? "FGD protocol: see allocation against arrived load." : "No allocation over time in this file.");

      var queue = document.getElementById("plot-" + ex + "-queue");
      if (e.queue_time && e.queue_time.queues) bars(queue, "Queueing delay per queue - " + e.workload, e.queue_time.queues, e.queue_time.values, e.policies);
      else empty(queue, "No queueing delay per queue (FGD protocol: pods never wait in a queue).");

      var fgd = document.getElementById("plot-" + ex + "-fgd");
      var steps = Object.keys(e.fgd_steps || {}).filter(function (p) { return e.fgd_steps[p].length; });
      if (steps.length) {
        var curves = steps.map(function (p) {
          return { label: p, x: e.fgd_steps[p].map(function (s) { return s.arrived_pct; }), y: e.fgd_steps[p].map(function (s) { return s.gpu_alloc_pct; }), style: e.policies.indexOf(p) };
        });
        var published = e.fgd_published || {};
        Object.keys(published).forEach(function (name, j) {
          curves.push({ label: name + " (published)", x: published[name].arrived_pct, y: published[name].gpu_alloc_pct, style: steps.length + j, dash: [3, 3] });
        });
        lines(fgd, "FGD protocol - " + e.workload, "arrived GPU request (% of capacity)", "GPU allocation (% of capacity)", curves, {});
      } else empty(fgd, "Not an FGD-protocol run.");
    });
  }

  // ---------------------------------------------------------------------------------------- wiring
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  }, true);

  document.addEventListener("htmx:beforeRequest", function (event) {
    // Polls pause while the tab is hidden; the next visible tick catches up.
    if (document.hidden && event.detail.elt && event.detail.elt.id === "live") event.preventDefault();
  });

  document.addEventListener("htmx:afterSettle", function () { drawFleet(); drawGpus(); });

  document.addEventListener("DOMContentLoaded", function () {
    drawFleet();
    drawGpus();
    setupLog();
    drawSimulator();
  });
})();
