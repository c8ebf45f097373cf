// The explain report's drawing: plain SVG DOM, no library, no network.
// The data is the JSON in #report-data (src/explain/json_export.cpp writes
// it): tokens, and per layer weights[h][i][j] (head h, query i, key j) and
// the head average[i][j]. Every text from the data goes in through
// textContent, never as markup.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  // Tableau 10 (also d3.schemeTableau10); more heads get evenly spaced hues.
  const TABLEAU = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                   "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"];
  const MIN_DRAWN = 0.005;  // lines lighter than this would be invisible
  const ROW = 22, FONT_W = 7.9;  // px per row, px per character (13px monospace)

  const state = {layer: 0, on: [], hover: null, pinned: null};

  function colour(h, H) {
    return H <= TABLEAU.length ? TABLEAU[h] : "hsl(" + Math.round(360 * h / H) + ",62%,48%)";
  }
  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function layer() { return data.layers[state.layer]; }
  function focus() { return state.hover || state.pinned; }
  function pct(w) { return (100 * w).toFixed(1) + "%"; }

  // ---- controls -------------------------------------------------------------
  function buildControls() {
    const select = document.getElementById("layer-select");
    data.layers.forEach(function (l, n) {
      const o = document.createElement("option");
      o.value = String(n);
      o.textContent = l.name || "layer " + (n + 1);
      select.appendChild(o);
    });
    select.disabled = data.layers.length < 2;
    document.getElementById("layer-count").textContent =
        data.layers.length === 1 ? "(this model has one layer)" : "(" + data.layers.length + " layers)";
    select.addEventListener("change", function () { setLayer(Number(select.value)); });
    document.getElementById("all-heads").addEventListener("click", function () {
      state.on = state.on.map(function () { return true; });
      draw();
    });
    document.getElementById("no-heads").addEventListener("click", function () {
      state.on = state.on.map(function () { return false; });
      draw();
    });
  }

  function buildHeadToggles() {
    const box = document.getElementById("head-toggles");
    box.textContent = "";
    const H = layer().heads;
    for (let h = 0; h < H; h++) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "head-toggle";
      b.dataset.head = String(h);
      b.textContent = String(h + 1);
      b.title = "head " + (h + 1) + ": click to switch off or on, double-click to show it alone";
      b.style.background = colour(h, H);
      b.style.borderColor = colour(h, H);
      b.addEventListener("click", function () { state.on[h] = !state.on[h]; draw(); });
      b.addEventListener("dblclick", function () {
        state.on = state.on.map(function (_, k) { return k === h; });
        draw();
      });
      box.appendChild(b);
    }
  }

  function setLayer(n) {
    state.layer = n;
    state.on = new Array(layer().heads).fill(true);
    state.hover = null;
    buildHeadToggles();
    buildHeadView();
    buildMaps();
    draw();
  }

  // ---- head view ------------------------------------------------------------
  function labelWidth(tokens) {
    let n = 1;
    tokens.forEach(function (t) { n = Math.max(n, Array.from(t).length); });
    return Math.ceil(n * FONT_W) + 12;
  }

  function setFocus(side, index, pinned) {
    if (pinned) {
      const same = state.pinned && state.pinned.side === side && state.pinned.index === index;
      state.pinned = same ? null : {side: side, index: index};
    } else {
      state.hover = side === null ? null : {side: side, index: index};
    }
    draw();
  }

  // The SVG's frame and tokens, once per layer. Focus and head changes only
  // redraw the lines and restyle the tokens (drawHeadView): a token under the
  // pointer is never replaced, so hovering cannot flicker.
  const view = {wq: 0, gap: 220, queryTokens: [], keyTokens: [], lines: null};
  function rowY(n) { return 30 + ROW * n + ROW / 2; }

  function buildHeadView() {
    const svg = document.getElementById("head-view");
    svg.textContent = "";
    const l = layer(), L = l.queries, S = l.keys;
    const wq = labelWidth(data.query_tokens), wk = labelWidth(data.key_tokens), gap = view.gap;
    const width = wq + gap + wk, height = ROW * Math.max(L, S) + 30;
    view.wq = wq;
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    el("text", {x: wq - 6, y: 14, "text-anchor": "end", class: "column-title"}, svg).textContent = "queries";
    el("text", {x: wq + gap + 6, y: 14, class: "column-title"}, svg).textContent = "keys";
    view.lines = el("g", {id: "attn-lines"}, svg);  // first, so the tokens sit on top
    const tokens = function (side, list, x, anchor) {
      const g = el("g", {class: side + "-tokens"}, svg), made = [];
      list.forEach(function (t, n) {
        const item = el("g", {class: "token-item", "data-side": side, "data-index": n}, g);
        const w = Math.ceil(Array.from(t).length * FONT_W) + 8;
        const box = el("rect", {class: "token-box", x: anchor === "end" ? x - w + 3 : x - 4, y: rowY(n) - ROW / 2 + 2,
                                width: w, height: ROW - 4, rx: 3, "pointer-events": "all"}, item);
        const text = el("text", {class: "token " + side + "-token", x: x, y: rowY(n) + 4, "text-anchor": anchor,
                                 "data-index": n, tabindex: 0}, item);
        text.textContent = t;
        item.addEventListener("mouseenter", function () { setFocus(side, n, false); });
        item.addEventListener("mouseleave", function () { setFocus(null, 0, false); });
        item.addEventListener("click", function () { setFocus(side, n, true); });
        text.addEventListener("keydown", function (e) {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); setFocus(side, n, true); }
        });
        made.push({box: box, text: text});
      });
      return made;
    };
    view.queryTokens = tokens("query", data.query_tokens, wq - 6, "end");
    view.keyTokens = tokens("key", data.key_tokens, wq + gap + 6, "start");
  }

  function drawHeadView() {
    const l = layer(), H = l.heads, L = l.queries, S = l.keys, wq = view.wq, gap = view.gap;
    const f = focus();
    const lines = view.lines;
    lines.textContent = "";
    for (let h = 0; h < H; h++) {
      if (!state.on[h]) continue;
      for (let i = 0; i < L; i++) {
        if (f && f.side === "query" && f.index !== i) continue;
        for (let j = 0; j < S; j++) {
          if (f && f.side === "key" && f.index !== j) continue;
          const w = l.weights[h][i][j];
          if (w < MIN_DRAWN) continue;
          el("line", {class: "attn-line", x1: wq + 2, y1: rowY(i), x2: wq + gap - 2, y2: rowY(j),
                      stroke: colour(h, H), "stroke-opacity": w.toFixed(4), "stroke-width": 2.2,
                      "data-head": h, "data-query": i, "data-key": j}, lines);
        }
      }
    }

    // How strongly each token takes part under the current focus (for dimming).
    const weightOn = function (side, n) {
      if (!f) return 1;
      if (f.side === side) return f.index === n ? 1 : 0;
      let best = 0;
      for (let h = 0; h < H; h++) {
        if (!state.on[h]) continue;
        best = Math.max(best, side === "key" ? l.weights[h][f.index][n] : l.weights[h][n][f.index]);
      }
      return best;
    };
    const restyle = function (side, made) {
      made.forEach(function (t, n) {
        t.box.classList.toggle("focused", Boolean(f && f.side === side && f.index === n));
        t.text.classList.toggle("dim", weightOn(side, n) < MIN_DRAWN);
      });
    };
    restyle("query", view.queryTokens);
    restyle("key", view.keyTokens);

    const status = document.getElementById("focus-status");
    if (!f) {
      status.textContent = "All query tokens shown. Hover over or click a token to focus it.";
    } else if (f.side === "query") {
      status.textContent = "Query " + f.index + " \u201c" + data.query_tokens[f.index] + "\u201d: where it attends" +
                           (state.pinned ? " (click it again to release)" : "") + ".";
    } else {
      status.textContent = "Key " + f.index + " \u201c" + data.key_tokens[f.index] + "\u201d: who attends to it" +
                           (state.pinned ? " (click it again to release)" : "") + ".";
    }
    document.querySelectorAll("button.head-toggle").forEach(function (b) {
      b.classList.toggle("off", !state.on[Number(b.dataset.head)]);
      b.setAttribute("aria-pressed", state.on[Number(b.dataset.head)] ? "true" : "false");
    });
  }

  // ---- heatmaps -------------------------------------------------------------
  function heatmap(title, matrix, fill, id) {
    const l = layer(), L = l.queries, S = l.keys, cell = 14;
    const left = Math.ceil(Math.max.apply(null, data.query_tokens.map(function (t) { return Array.from(t).length; })) * 6.1) + 6;
    const top = Math.ceil(Math.max.apply(null, data.key_tokens.map(function (t) { return Array.from(t).length; })) * 6.1) + 6;
    const fig = document.createElement("figure");
    fig.className = "map";
    fig.id = id;
    const cap = document.createElement("figcaption");
    cap.textContent = title;
    cap.style.color = fill;
    fig.appendChild(cap);
    const svg = el("svg", {class: "heatmap", width: left + cell * S + 2, height: top + cell * L + 2}, null);
    fig.appendChild(svg);
    data.key_tokens.forEach(function (t, j) {
      const x = left + cell * j + cell / 2 + 3, yy = top - 4;
      el("text", {x: x, y: yy, transform: "rotate(-90 " + x + " " + yy + ")", class: "key-label"}, svg).textContent = t;
    });
    data.query_tokens.forEach(function (t, i) {
      el("text", {x: left - 4, y: top + cell * i + cell - 3, "text-anchor": "end", class: "query-label"}, svg).textContent = t;
    });
    for (let i = 0; i < L; i++) {
      for (let j = 0; j < S; j++) {
        const w = matrix[i][j];
        const r = el("rect", {class: "cell", x: left + cell * j, y: top + cell * i, width: cell, height: cell,
                              fill: fill, "fill-opacity": w.toFixed(4), "data-query": i, "data-key": j}, svg);
        el("title", {}, r).textContent = data.query_tokens[i] + " \u2192 " + data.key_tokens[j] + ": " + pct(w);
      }
    }
    el("rect", {class: "row-focus", x: left, y: top, width: cell * S, height: cell, visibility: "hidden"}, svg);
    svg.dataset.top = String(top);
    svg.dataset.cell = String(cell);
    return fig;
  }

  function buildMaps() {
    const l = layer(), box = document.getElementById("head-maps"), avg = document.getElementById("average-map");
    box.textContent = "";
    avg.textContent = "";
    for (let h = 0; h < l.heads; h++) box.appendChild(heatmap("head " + (h + 1), l.weights[h], colour(h, l.heads), "map-head-" + h));
    avg.appendChild(heatmap("average over the " + l.heads + " heads", l.average, "#333333", "map-average"));
  }

  function drawMaps() {
    const f = focus();
    document.querySelectorAll("svg.heatmap").forEach(function (svg) {
      const mark = svg.querySelector("rect.row-focus");
      if (f && f.side === "query") {
        mark.setAttribute("y", Number(svg.dataset.top) + Number(svg.dataset.cell) * f.index);
        mark.setAttribute("visibility", "visible");
      } else {
        mark.setAttribute("visibility", "hidden");
      }
    });
    document.querySelectorAll("figure.map[id^='map-head-']").forEach(function (fig) {
      fig.style.opacity = state.on[Number(fig.id.slice(9))] ? "1" : "0.35";
    });
  }

  // ---- answer and measures ----------------------------------------------------
  function buildExtras() {
    if (data.answer) {
      document.getElementById("answer-section").hidden = false;
      let text = data.answer.question + " " + data.answer.answer;
      if (data.answer.confidence !== null) text += " (probability " + pct(data.answer.confidence) + ")";
      document.getElementById("answer").textContent = text;
    }
    if (data.measures.length) {
      document.getElementById("measures-section").hidden = false;
      const box = document.getElementById("measures");
      data.measures.forEach(function (m) {
        const p = document.createElement("p");
        p.textContent = m.name + " (" + (data.layers[m.layer].name || "layer " + (m.layer + 1)) + "): " + m.description;
        box.appendChild(p);
        const table = document.createElement("table");
        table.className = "measure";
        const head = table.insertRow(), row = table.insertRow();
        head.appendChild(document.createElement("th")).textContent = "head";
        row.appendChild(document.createElement("th")).textContent = "value";
        m.per_head.forEach(function (v, h) {
          head.appendChild(document.createElement("th")).textContent = String(h + 1);
          const td = row.insertCell();
          td.textContent = v.toFixed(3);
          if (m.picked === h) td.className = "picked";
        });
        box.appendChild(table);
      });
    }
  }

  function draw() {
    drawHeadView();
    drawMaps();
  }

  document.getElementById("title").textContent = data.title;
  document.getElementById("source").textContent = data.source;
  buildControls();
  buildExtras();
  if (data.focus >= 0) state.pinned = {side: "query", index: data.focus};
  setLayer(0);
  document.body.dataset.ready = "true";
})();
