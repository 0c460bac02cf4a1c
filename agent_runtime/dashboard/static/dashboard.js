/* Draws every <div class="charts" data-src="..."> with uPlot from our own JSON endpoints.
 *
 * An endpoint answers {"charts": [{title, x_label, y_label, x, series: [{label, values}], marks, y_range, note,
 * bands: [{upper, lower}]}]} (see agent_runtime/dashboard/reads.py: Chart). A mark is a vertical line with its
 * label, coloured by its status (OPCD cycles) or kind (lesson_set, adapter); a band shades between two series. data-refresh="N" refetches every N seconds and redraws in
 * place, so a page left open follows a running loop. No inline script and no eval: the page's
 * Content-Security-Policy is default-src 'self'. Text reaches the DOM only through textContent. */
(function () {
  "use strict";
  var PALETTE = ["#2f6fdd", "#e8590c", "#1a7f37", "#9c36b5", "#c2255c", "#0b7285", "#5c940d", "#495057"];
  var MARK_COLORS = { promoted: "#1a7f37", rolled_back: "#b42318", failed: "#b42318",
                      lesson_set: "#9c36b5", adapter: "#0b7285" };
  var SOLID_KINDS = { adapter: true };
  var BAND_FILL = "rgba(47, 111, 221, 0.15)";

  function marksPlugin(marks) {
    return {
      hooks: {
        draw: [function (u) {
          var ctx = u.ctx;
          ctx.save();
          ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.font = (10 * devicePixelRatio) + "px system-ui, sans-serif";
          ctx.textAlign = "left";  // uPlot leaves the context right-aligned after drawing its axes
          ctx.textBaseline = "alphabetic";
          marks.forEach(function (m, i) {
            var x = Math.round(u.valToPos(m.x, "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            ctx.strokeStyle = ctx.fillStyle = MARK_COLORS[m.status] || MARK_COLORS[m.kind] || "#868e96";
            ctx.setLineDash(SOLID_KINDS[m.kind] ? [] : [5 * devicePixelRatio, 4 * devicePixelRatio]);
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            // labels of neighbouring marks take turns on three rows so that they do not overprint
            ctx.fillText(m.label, x + 3 * devicePixelRatio, u.bbox.top + (10 + 12 * (i % 3)) * devicePixelRatio);
          });
          ctx.restore();
        }]
      }
    };
  }

  function options(chart, width) {
    var series = [{ label: chart.x_label }];
    var index = {};
    var edges = {};
    (chart.bands || []).forEach(function (b) { edges[b.upper] = edges[b.lower] = true; });
    var color = 0;
    chart.series.forEach(function (s, i) {
      index[s.label] = i + 1;
      if (edges[s.label]) {
        series.push({ label: s.label, stroke: "rgba(47, 111, 221, 0.45)", width: 1, spanGaps: true, points: { show: false } });
        return;
      }
      series.push({ label: s.label, stroke: PALETTE[color++ % PALETTE.length], width: 2, spanGaps: true, points: { show: chart.x.length < 60 } });
    });
    var bands = (chart.bands || []).filter(function (b) { return index[b.upper] && index[b.lower]; })
      .map(function (b) { return { series: [index[b.upper], index[b.lower]], fill: BAND_FILL }; });
    var y = { auto: true };
    if (chart.y_range) y = { auto: false, range: chart.y_range };
    return {
      title: chart.title, width: width, height: 240,
      scales: { x: { time: false }, y: y },
      axes: [{ label: chart.x_label }, { label: chart.y_label }],
      series: series,
      bands: bands,
      plugins: [marksPlugin(chart.marks || [])]
    };
  }

  function dataOf(chart) {
    return [chart.x].concat(chart.series.map(function (s) { return s.values; }));
  }

  function shapeOf(chart) {
    return chart.title + "|" + chart.series.map(function (s) { return s.label; }).join("|") + "|" + JSON.stringify(chart.marks || []);
  }

  function render(container, payload) {
    var charts = payload.charts || [];
    var slots = container.querySelectorAll(":scope > .chart");
    if (!charts.length) {
      container.textContent = "";
      var empty = document.createElement("p");
      empty.className = "empty";
      empty.textContent = "nothing to plot yet";
      container.appendChild(empty);
      return;
    }
    if (slots.length !== charts.length) {
      container.textContent = "";
      charts.forEach(function () {
        var div = document.createElement("div");
        div.className = "chart";
        container.appendChild(div);
      });
      slots = container.querySelectorAll(":scope > .chart");
    }
    charts.forEach(function (chart, i) {
      var slot = slots[i];
      if (!chart.x.length) {
        if (slot._plot) { slot._plot.destroy(); slot._plot = null; }
        slot.textContent = "";
        var note = document.createElement("p");
        note.className = "note";
        note.textContent = chart.title + ": " + (chart.note || "no data");
        slot.appendChild(note);
        return;
      }
      if (slot._plot && slot._shape === shapeOf(chart)) {
        slot._plot.setData(dataOf(chart));
        return;
      }
      if (slot._plot) slot._plot.destroy();
      slot.textContent = "";
      slot._shape = shapeOf(chart);
      slot._plot = new uPlot(options(chart, Math.max(320, slot.clientWidth || 520)), dataOf(chart), slot);
    });
  }

  function load(container) {
    return fetch(container.dataset.src, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(r.status + " " + r.statusText);
        return r.json();
      })
      .then(function (payload) { render(container, payload); container.dataset.state = "drawn"; })
      .catch(function (err) {
        container.dataset.state = "failed";
        container.textContent = "";
        var p = document.createElement("p");
        p.className = "problem";
        p.textContent = "could not load the chart: " + err.message;
        container.appendChild(p);
      });
  }

  function init(root) {
    root.querySelectorAll(".charts[data-src]").forEach(function (container) {
      if (container._started) return;
      container._started = true;
      load(container);
      var every = parseFloat(container.dataset.refresh || "0");
      if (every > 0) {
        container._timer = setInterval(function () {
          if (!document.body.contains(container)) { clearInterval(container._timer); return; }
          if (!document.hidden) load(container);
        }, every * 1000);
      }
    });
  }

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      document.querySelectorAll(".chart").forEach(function (slot) {
        if (slot._plot) slot._plot.setSize({ width: Math.max(320, slot.clientWidth), height: 240 });
      });
    }, 150);
  });
  document.addEventListener("DOMContentLoaded", function () { init(document); });
  document.addEventListener("htmx:afterSettle", function (evt) { init(evt.target); });
})();
