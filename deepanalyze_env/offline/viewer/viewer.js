/* deepanalyze-rl view: the run page and the episode pages, from data elements in this file.
 *
 * Rule for everything below: text from the run (policy, data, judge, ids) reaches the page only
 * through textContent / createTextNode / new Option(text) — never innerHTML — so it is shown as
 * characters and can never become markup. The page fetches nothing (see the CSP in <head>).
 */
(function () {
  "use strict";
  var t0 = performance.now();
  var PAGE = 50;
  var meta = JSON.parse(document.getElementById("meta").textContent);
  var index = JSON.parse(document.getElementById("index").textContent);
  var rows = index.rows;
  var shared = index.shared;
  var C = {};
  index.columns.forEach(function (name, i) { C[name] = i; });
  var HL = meta.highlight_classes.map(function (c) { return c ? "hl-" + c : ""; });
  var TAG_CLASS = { Analyze: 1, Understand: 1, Code: 1, Answer: 1, Execute: 1 };
  var lowered = null; // search text per row, built on the first search (not on the way to first paint)
  var fullText = {}; // episode number -> lower-cased body JSON text, filled only for full-text search
  var state = { filters: {}, sortKey: null, sortDir: 1, page: 0, visible: [] };
  var timings = { parsed_ms: 0, first_render_ms: 0, last_filter_ms: 0, last_episode_ms: 0 };
  window.viewerTimings = timings;

  // ------------------------------------------------------------------ DOM helpers

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) if (arguments[i]) parent.appendChild(arguments[i]);
    return parent;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return "–";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits);
    return String(x);
  }
  function pct(n, d) { return d ? (100 * n / d).toFixed(1) + "%" : "–"; }
  function badge(status) {
    var known = { scored: 1, verifier_error: 1, environment_error: 1, unfinished: 1 };
    return el("span", "badge" + (known[status] ? " st-" + status : ""), status);
  }
  // the reward-hacking watch's reasons (docs/design.md §12): a high score that looks wrong
  function suspectBadge(reasons) {
    if (!reasons || !reasons.length) return null;
    var b = el("span", "badge suspect", "suspect");
    b.title = "reward-hacking watch: " + reasons.join(", ");
    return b;
  }
  function kv(pairs) {
    var dl = el("dl", "kv");
    pairs.forEach(function (p) {
      if (p[1] === undefined) return;
      add(dl, el("dt", null, p[0]), el("dd", null, typeof p[1] === "object" && p[1] !== null ? JSON.stringify(p[1]) : fmt(p[1])));
    });
    return dl;
  }
  function table(headers, data, numeric) {
    var t = el("table"), tr = el("tr");
    headers.forEach(function (h, i) { add(tr, el("th", numeric && numeric[i] ? "num" : null, h)); });
    add(t, add(el("thead"), tr));
    var tb = el("tbody");
    data.forEach(function (row) {
      var r = el("tr");
      row.forEach(function (cell, i) {
        if (cell instanceof Node) add(r, add(el("td", numeric && numeric[i] ? "num" : null), cell));
        else add(r, el("td", numeric && numeric[i] ? "num" : null, cell));
      });
      add(tb, r);
    });
    return add(t, tb);
  }
  function link(text, hash) { var a = el("a", null, text); a.href = hash; return a; }

  // ------------------------------------------------------------------ run page

  function renderSummary() {
    var box = document.getElementById("summary");
    var grid = el("div", "summary-grid");
    var p1 = add(el("div", "panel"), el("h3", null, "Summary"));
    add(p1, table(["metric", "value"], meta.summary.map(function (r) { return [r[0], r[1]]; })));
    var p2 = add(el("div", "panel"), el("h3", null, "Reward status"));
    var statusRows = Object.keys(meta.status_counts).map(function (k) {
      return [badge(k), fmt(meta.status_counts[k]), pct(meta.status_counts[k], meta.episodes)];
    });
    add(p2, table(["status", "episodes", "rate"], statusRows, [0, 1, 1]));
    add(p2, el("h3", null, "verifier_error by cause"));
    add(p2, table(["cause", "episodes", "rate"], Object.keys(meta.verifier_error_rates).map(function (k) {
      var r = meta.verifier_error_rates[k];
      return [k, fmt(Math.round(r * meta.episodes)), (100 * r).toFixed(1) + "%"];
    }), [0, 1, 1]));
    add(p2, el("h3", null, "Termination"));
    add(p2, table(["termination", "episodes", "rate"], Object.keys(meta.termination_counts).map(function (k) {
      return [k, fmt(meta.termination_counts[k]), pct(meta.termination_counts[k], meta.episodes)];
    }), [0, 1, 1]));
    var p3 = add(el("div", "panel"), el("h3", null, "Reward distribution (scored)"));
    var h = meta.histogram;
    if (h.counts.length) {
      var most = Math.max.apply(null, h.counts) || 1;
      var bars = el("div", "hist");
      h.counts.forEach(function (c, i) {
        var b = el("div");
        b.style.height = (100 * c / most) + "%"; // CSSOM, allowed by the CSP (no style attribute)
        b.title = c + " episodes in [" + h.edges[i].toFixed(3) + ", " + h.edges[i + 1].toFixed(3) + ")";
        add(bars, b);
      });
      add(p3, bars, add(el("div", "hist-axis"), el("span", null, h.edges[0].toFixed(2)), el("span", null, h.edges[h.edges.length - 1].toFixed(2))));
    } else add(p3, el("p", "note", "no scored episodes"));
    add(p3, el("h3", null, "Component means (scored)"));
    add(p3, table(["component", "n", "mean"], Object.keys(meta.components).map(function (k) {
      return [k, fmt(meta.components[k].n), fmt(meta.components[k].mean, 4)];
    }), [0, 1, 1]));
    add(box, add(grid, p1, p2, p3));
    if (meta.steps.length) add(box, renderSteps(meta.steps));
    if (meta.suspects) add(box, el("p", "note suspect-note", meta.suspects + " suspect episode" + (meta.suspects === 1 ? "" : "s") +
      " (high reward, anomalous answer or work: reward-hacking watch) listed first; filter with \"suspect\"."));
    if (meta.duplicates) add(box, el("p", "note", meta.duplicates + " repeated episode ids across the sources were shown once (first copy)."));
  }

  // The verifier_error rate by cause per training step (a GRPO folder's metrics.jsonl): one line
  // per cause, so a policy that learns to get itself excluded shows as a rising line.
  var CAUSE_COLORS = ["#dd8452", "#c44e52", "#8172b3", "#937860"];
  function renderSteps(steps) {
    var panel = add(el("div", "panel steps"), el("h3", null, "verifier_error rate by cause, per training step"));
    var causes = Object.keys(meta.verifier_error_rates);
    var multi = meta.sources.length > 1;
    var NS = "http://www.w3.org/2000/svg", W = 600, H = 120, pad = 4;
    var top = Math.max.apply(null, [0.05].concat(steps.map(function (s) {
      return Math.max.apply(null, causes.map(function (c) { return s.rates[c] || 0; }));
    })));
    var svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("class", "step-lines");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "verifier_error rate by cause per step, up to " + (100 * top).toFixed(1) + "%");
    meta.sources.forEach(function (_, si) {
      var mine = steps.filter(function (s) { return s.source === si; });
      if (!mine.length) return;
      var first = mine[0].step, last = mine[mine.length - 1].step, span = Math.max(1, last - first);
      causes.forEach(function (c, ci) {
        var line = document.createElementNS(NS, "polyline");
        line.setAttribute("fill", "none");
        line.setAttribute("stroke", CAUSE_COLORS[ci % CAUSE_COLORS.length]);
        line.setAttribute("stroke-width", "2");
        line.setAttribute("data-cause", c);
        line.setAttribute("points", mine.map(function (s) {
          var x = pad + (W - 2 * pad) * (s.step - first) / span;
          var y = H - pad - (H - 2 * pad) * (s.rates[c] || 0) / top;
          return x.toFixed(1) + "," + y.toFixed(1);
        }).join(" "));
        svg.appendChild(line);
      });
    });
    add(panel, svg);
    var legend = el("div", "step-legend");
    causes.forEach(function (c, ci) {
      var key = el("span", "step-key", "\u25A0 " + c);
      key.style.color = CAUSE_COLORS[ci % CAUSE_COLORS.length]; // CSSOM, allowed by the CSP
      add(legend, key);
    });
    add(panel, legend, el("p", "note", "0 to " + (100 * top).toFixed(1) + "% of each step's episodes"));
    var head = (multi ? ["source"] : []).concat(["step"], causes);
    var data = steps.map(function (s) {
      return (multi ? [meta.sources[s.source]] : []).concat([s.step], causes.map(function (c) {
        return (100 * (s.rates[c] || 0)).toFixed(1) + "%";
      }));
    });
    var t = table(head, data, head.map(function (h) { return h !== "source"; }));
    t.classList.add("step-table");
    add(panel, add(el("details"), el("summary", null, steps.length + " steps as numbers"), t));
    return panel;
  }

  function distinct(col) {
    var seen = {};
    rows.forEach(function (r) { seen[r[col]] = (seen[r[col]] || 0) + 1; });
    return Object.keys(seen).sort();
  }

  var FILTERS = [
    ["status", "reward status", C.status],
    ["termination", "termination", C.termination],
    ["method", "method", C.method],
    ["family", "family (workspace)", C.family],
    ["policy", "policy", C.policy],
    ["task", "task", C.task]
  ];

  function renderFilters() {
    var form = document.getElementById("filters");
    FILTERS.forEach(function (f) {
      var sel = el("select");
      sel.name = f[0];
      add(sel, new Option("any", ""));
      distinct(f[2]).forEach(function (v) { add(sel, new Option(v, v)); });
      add(form, add(el("label", null, f[1]), sel));
    });
    ["rmin", "rmax"].forEach(function (name) {
      var inp = el("input");
      inp.type = "number"; inp.step = "any"; inp.name = name;
      add(form, add(el("label", null, name === "rmin" ? "reward ≥" : "reward ≤"), inp));
    });
    var kept = el("select");
    kept.name = "kept";
    [["any", ""], ["kept", "yes"], ["not kept", "no"]].forEach(function (o) { add(kept, new Option(o[0], o[1])); });
    if (!rows.some(function (r) { return r[C.kept] !== null; })) kept.disabled = true;
    var suspect = el("select");
    suspect.name = "suspect";
    [["any", ""], ["suspect", "yes"], ["not suspect", "no"]].forEach(function (o) { add(suspect, new Option(o[0], o[1])); });
    if (!meta.suspects) suspect.disabled = true;
    add(form, add(el("label", null, "suspect"), suspect));
    var keptLabel = add(el("label", null, "kept"), kept);
    if (meta.kept_source) keptLabel.title = "kept = " + meta.kept_source;
    add(form, keptLabel);
    var q = el("input");
    q.type = "search"; q.name = "q"; q.placeholder = "id, task, policy, instruction, answer, error";
    add(form, add(el("label", null, "search"), q));
    var full = el("input");
    full.type = "checkbox"; full.name = "full";
    add(form, add(el("label", "inline"), full, document.createTextNode("search full episode text")));
    var reset = el("button", "btn", "reset");
    reset.type = "button";
    reset.addEventListener("click", function () { form.reset(); readFilters(); });
    add(form, reset);
    form.addEventListener("input", readFilters);
    form.addEventListener("change", readFilters);
    form.addEventListener("submit", function (e) { e.preventDefault(); });
  }

  function readFilters() {
    var form = document.getElementById("filters");
    var f = {};
    Array.prototype.forEach.call(form.elements, function (e) {
      if (!e.name) return;
      f[e.name] = e.type === "checkbox" ? e.checked : e.value;
    });
    // "change" follows "input" when a field loses focus: same filters, keep the rows (and the page)
    if (JSON.stringify(f) === JSON.stringify(state.filters)) return;
    state.filters = f;
    state.page = 0;
    applyFilters();
  }

  function bodyText(i) {
    if (!(i in fullText)) {
      var node = document.getElementById("b" + i);
      fullText[i] = node ? node.textContent.toLowerCase() : "";
    }
    return fullText[i];
  }

  function applyFilters() {
    var start = performance.now();
    var f = state.filters;
    var rmin = f.rmin === "" || f.rmin === undefined ? null : Number(f.rmin);
    var rmax = f.rmax === "" || f.rmax === undefined ? null : Number(f.rmax);
    var q = (f.q || "").trim().toLowerCase();
    // the bodies hold JSON text: search for the query as JSON would write it
    var qJson = q ? JSON.stringify(q).slice(1, -1).replace(/</g, "\\u003c") : "";
    if (q && lowered === null) {
      lowered = rows.map(function (r) {
        return [r[C.id], r[C.task], r[C.policy], r[C.text]].join(" ").toLowerCase();
      });
    }
    var out = [];
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var ok = true;
      for (var k = 0; k < FILTERS.length && ok; k++) {
        var v = f[FILTERS[k][0]];
        if (v && r[FILTERS[k][2]] !== v) ok = false;
      }
      if (!ok) continue;
      var reward = r[C.reward];
      if (rmin !== null && !(reward !== null && reward >= rmin)) continue;
      if (rmax !== null && !(reward !== null && reward <= rmax)) continue;
      if (f.kept === "yes" && r[C.kept] !== true) continue;
      if (f.kept === "no" && r[C.kept] !== false) continue;
      if (f.suspect === "yes" && !(r[C.suspect] && r[C.suspect].length)) continue;
      if (f.suspect === "no" && r[C.suspect] && r[C.suspect].length) continue;
      if (q && lowered[i].indexOf(q) < 0 && !(f.full && bodyText(i).indexOf(qJson) >= 0)) continue;
      out.push(i);
    }
    state.visible = sortRows(out);
    renderTable();
    timings.last_filter_ms = performance.now() - start;
  }

  var COLUMNS = [
    ["id", "episode", C.id],
    ["task", "task", C.task],
    ["method", "method", C.method],
    ["family", "family", C.family],
    ["policy", "policy", C.policy],
    ["status", "status", C.status],
    ["termination", "termination", C.termination],
    ["reward", "reward", C.reward, true],
    ["turns", "turns", C.turns, true],
    ["cells", "cells ok", C.cells, true],
    ["kept", "kept", C.kept]
  ];

  function sortRows(list) {
    if (state.sortKey === null) return list;
    var col = COLUMNS.filter(function (c) { return c[0] === state.sortKey; })[0][2];
    var dir = state.sortDir;
    return list.slice().sort(function (a, b) {
      var x = rows[a][col], y = rows[b][col];
      if (x === y) return a - b;
      if (x === null) return 1; // missing values last, whichever the direction
      if (y === null) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }

  function renderHead() {
    var tr = document.getElementById("episodes-head");
    COLUMNS.forEach(function (c) {
      var th = el("th", c[3] ? "num" : null);
      th.dataset.key = c[0];
      var b = el("button", null, c[1]);
      b.type = "button";
      b.addEventListener("click", function () {
        if (state.sortKey === c[0]) state.sortDir = -state.sortDir;
        else { state.sortKey = c[0]; state.sortDir = 1; }
        Array.prototype.forEach.call(tr.children, function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(state.sortDir > 0 ? "sorted-asc" : "sorted-desc");
        state.visible = sortRows(state.visible);
        state.page = 0;
        renderTable();
      });
      add(tr, add(th, b));
    });
  }

  function renderTable() {
    var tbody = document.getElementById("episodes-body");
    var frag = document.createDocumentFragment();
    var vis = state.visible;
    var pages = Math.max(1, Math.ceil(vis.length / PAGE));
    if (state.page >= pages) state.page = pages - 1;
    var from = state.page * PAGE;
    for (var j = from; j < Math.min(vis.length, from + PAGE); j++) {
      var i = vis[j], r = rows[i];
      var tr = el("tr");
      tr.dataset.episode = String(i);
      add(tr, add(el("td", "mono"), link(r[C.id], "#/e/" + i), suspectBadge(r[C.suspect])));
      add(tr, el("td", null, r[C.task]), el("td", null, r[C.method]), el("td", null, r[C.family]), el("td", null, r[C.policy]));
      add(tr, add(el("td"), badge(r[C.status])), el("td", null, r[C.termination]));
      add(tr, el("td", "num", fmt(r[C.reward])), el("td", "num", r[C.turns]));
      add(tr, el("td", "num", r[C.cells] ? (r[C.cells] - r[C.failed_cells]) + "/" + r[C.cells] : "–"));
      add(tr, el("td", null, r[C.kept] === null ? "–" : r[C.kept] ? "yes" : "no"));
      frag.appendChild(tr);
    }
    tbody.replaceChildren(frag);
    document.getElementById("count").textContent =
      vis.length + " of " + rows.length + " episodes" + (vis.length > PAGE ? " · rows " + (from + 1) + "–" + Math.min(vis.length, from + PAGE) : "");
    var pager = document.getElementById("pager");
    var prev = el("button", "btn", "‹ previous"), next = el("button", "btn", "next ›");
    prev.type = next.type = "button";
    prev.disabled = state.page === 0;
    next.disabled = state.page >= pages - 1;
    prev.addEventListener("click", function () { state.page--; renderTable(); });
    next.addEventListener("click", function () { state.page++; renderTable(); });
    pager.replaceChildren(prev, el("span", null, "page " + (state.page + 1) + " of " + pages), next);
  }

  // ------------------------------------------------------------------ episode page

  function whenParsed(fn) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn, { once: true });
    else fn();
  }

  function loadBody(i) {
    var node = document.getElementById("b" + i);
    return node ? JSON.parse(node.textContent) : null;
  }

  function codeBlock(text, runs) {
    var pre = el("pre", "code");
    if (!runs) { pre.textContent = trimmed(text); return pre; }
    var pos = 0, last = runs.length - 2;
    for (var k = 0; k < runs.length; k += 2) {
      var piece = text.slice(pos, pos + runs[k + 1]);
      pos += runs[k + 1];
      if (k === 0 && runs[k] === 0) piece = piece.replace(/^\n/, "");
      if (k === last && runs[k] === 0 && pos === text.length) piece = piece.replace(/\n$/, "");
      if (runs[k] === 0) pre.appendChild(document.createTextNode(piece));
      else add(pre, el("span", HL[runs[k]] || null, piece));
    }
    if (pos < text.length) pre.appendChild(document.createTextNode(text.slice(pos)));
    return pre;
  }

  function execLabel(x, cell) {
    if (!x) return "cell " + cell;
    return "cell " + cell + " · " + x.status + (x.elapsed_ms !== undefined && x.elapsed_ms !== null ? " · " + x.elapsed_ms.toFixed(0) + " ms" : "");
  }

  // the newline that follows an opening tag and precedes a closing one is layout, not content
  function trimmed(text) { return text.replace(/^\n/, "").replace(/\n$/, ""); }

  function renderSegment(seg, ctx) {
    if (!seg.t) return seg.s.trim() ? add(el("div", "seg"), el("pre", null, seg.s)) : null;
    var cls = TAG_CLASS[seg.t] ? "tag-" + seg.t : "tag-other";
    var box = el("div", "seg seg-tag " + cls);
    if (seg.t === "Execute") {
      var x = ctx.exec[ctx.cell];
      var det = el("details", "exec");
      var lines = trimmed(seg.s).split("\n").length;
      det.open = lines <= 25;
      var sum = el("summary");
      add(sum, el("span", "tagname", "Execute"), document.createTextNode(" " + execLabel(x, ctx.cell + 1) + " · " + lines + " lines "));
      if (x) sum.classList.add("ex-" + String(x.status).replace(/[^a-z_]/g, ""));
      if (x && x.truncated) add(sum, el("span", "truncated", "output truncated"));
      ctx.cell++;
      add(det, sum, el("pre", null, trimmed(seg.s)));
      add(box, det);
    } else {
      add(box, el("span", "tagname", seg.t));
      if (seg.o) add(box, el("span", "unclosed", "no closing </" + seg.t + ">"));
      add(box, seg.t === "Code" ? codeBlock(seg.s, seg.h) : el("pre", null, trimmed(seg.s)));
    }
    return box;
  }

  function renderMessages(body) {
    var wrap = el("div");
    var ctx = { exec: body.exec || [], cell: 0 };
    var perTurn = body.usage && body.usage.per_turn ? body.usage.per_turn : [];
    var turn = 0;
    body.messages.forEach(function (m, mi) {
      var box = el("div", "msg role-" + (m.role === "assistant" ? "assistant" : m.role === "user" ? "user" : "other"));
      var head = el("div", "msg-head");
      box.dataset.role = m.role;
      if (m.role === "assistant") {
        add(head, el("b", null, "assistant · turn " + (turn + 1)));
        var hasCode = m.segs.some(function (s) { return s.t === "Code"; });
        var next = body.messages[mi + 1];
        var executed = hasCode && next && next.segs.some(function (s) { return s.t === "Execute"; });
        if (executed) {
          var x = ctx.exec[ctx.cell];
          var span = el("span", x ? "ex-" + String(x.status).replace(/[^a-z_]/g, "") : null, "exec: " + execLabel(x, ctx.cell + 1));
          add(head, span);
          if (x && x.truncated) add(head, el("span", "truncated", "output truncated"));
        }
        var u = perTurn[turn];
        if (u) add(head, el("span", null, (u.completion_tokens || 0) + " tokens" + (u.finish_reason ? " · " + u.finish_reason : "")));
        turn++;
      } else add(head, el("b", null, mi === 0 ? m.role + " · prompt" : m.role));
      var bodyDiv = el("div", "msg-body");
      m.segs.forEach(function (s) { add(bodyDiv, renderSegment(s, ctx)); }); // add() skips nulls
      add(wrap, add(box, head, bodyDiv));
    });
    return wrap;
  }

  function renderReward(body) {
    var box = el("div", "reward");
    var comps = body.reward_components || {};
    var weights = body.weights || {};
    var names = Object.keys(comps);
    var total = 0;
    names.forEach(function (n) { if (weights[n] > 0) total += weights[n]; });
    var data = names.map(function (n) {
      var w = body.weights ? weights[n] : undefined;
      var share = w !== undefined && w > 0 && total > 0 ? (w * comps[n]) / total : null;
      return [n, fmt(comps[n], 4), w === undefined ? "–" : fmt(w), share === null ? "–" : fmt(share, 4)];
    });
    var t = table(["component", "value", "weight", "weighted share"], data, [0, 1, 1, 1]);
    t.classList.add("components");
    add(box, kv([
      ["reward", body.reward_status === "scored" ? body.reward : fmt(body.reward) + " (a placeholder: the episode was not scored)"],
      ["status", body.reward_status],
      ["error cause", body.reward_status === "verifier_error" ? body.reward_error_cause : undefined],
      ["format ok", body.format_ok],
      ["gate", body.gate],
      ["termination", body.termination],
      ["code pass", body.code_pass && body.code_pass.length ? body.code_pass.join(" ") : "–"]
    ]), t);
    var why = {
      plan: "weights from the reward plan this episode was scored with (fingerprint matches)",
      recomputed: "weights recomputed from reward_spec with this code: the plan fingerprint differs from the record's",
      unknown: "weights unknown (the record's method or profile is not known to this code)"
    };
    add(box, el("p", "note", why[body.weight_source] || ""));
    if (body.gate) add(box, el("p", "note", "the format gate failed (" + body.gate + "): the reward is the gate's penalty and no other component ran"));
    return box;
  }

  function renderJudge(body) {
    var box = el("div");
    if (!body.judge) { add(box, el("p", "note", "no judge calls")); return box; }
    var settings = body.judge.settings === null ? null : shared[body.judge.settings];
    if (settings) add(box, kv(Object.keys(settings).map(function (k) { return [k, settings[k]]; })));
    if (!body.judge.calls.length) add(box, el("p", "note", "no judge calls"));
    body.judge.calls.forEach(function (c) {
      var call = el("div", "judge-call");
      add(call, add(el("div"), el("b", null, c.rubric || "judge"), document.createTextNode(
        " · score " + (c.score === null || c.score === undefined ? "–" : typeof c.score === "object" ? JSON.stringify(c.score) : c.score) +
        (c.cached ? " · cached" : "") +
        (c.latency_ms !== undefined && c.latency_ms !== null ? " · " + Number(c.latency_ms).toFixed(0) + " ms" : "") +
        (c.attempts ? " · attempts " + c.attempts : "") + (c.sample ? " · sample " + c.sample : ""))));
      if (c.parse_error) add(call, el("div", "neg", "parse error: " + c.parse_error));
      if (c.error) add(call, el("div", "neg", "error: " + c.error));
      add(call, el("pre", "judge-reply", c.reply === null || c.reply === undefined ? "(no reply)" : c.reply));
      add(box, call);
    });
    return box;
  }

  function renderVersions(body) {
    var v = body.versions === null ? null : shared[body.versions];
    if (!v) return el("p", "note", "no versions manifest");
    var box = el("div");
    add(box, kv(Object.keys(v).filter(function (k) { return k !== "kernel" && k !== "judge_prompts"; }).map(function (k) { return [k, v[k]]; })));
    if (v.judge_prompts && Object.keys(v.judge_prompts).length) {
      add(box, el("h3", null, "judge prompt hashes"), kv(Object.keys(v.judge_prompts).map(function (k) { return [k, v.judge_prompts[k]]; })));
    }
    if (v.kernel) add(box, el("h3", null, "kernel"), kv(Object.keys(v.kernel).map(function (k) { return [k, v.kernel[k]]; })));
    return box;
  }

  function renderEpisode(i, compact) {
    var r = rows[i], body = loadBody(i);
    var box = el("article", "episode");
    box.dataset.episode = String(i);
    var head = el("div", "ep-head");
    add(head, el("h2", "mono", r[C.id]), badge(r[C.status]), suspectBadge(r[C.suspect]), el("span", null, "reward " + fmt(r[C.reward])),
      el("span", null, "task " + r[C.task]), el("span", null, "policy " + r[C.policy]), el("span", null, "source " + meta.sources[r[C.source]]));
    add(box, head);
    if (!body) { add(box, el("p", "error-box", "episode body missing")); return box; }
    if (body.suspect && body.suspect.length) {
      add(box, add(el("div", "error-box suspect-box"), el("b", null, "reward-hacking watch: "),
        document.createTextNode(body.suspect.join(", ") + " — a high score with an anomalous answer or no working cell; read it before trusting the reward")));
    }
    if (body.error || body.reward_status !== "scored") {
      var err = add(el("div", "error-box"), el("b", null, body.reward_status !== "scored" ? "not scored: " + body.reward_status +
        (body.reward_error_cause ? " (" + body.reward_error_cause + ")" : "") : "error"));
      if (body.error) add(err, el("pre", "episode-error", body.error));
      add(box, err);
    }
    add(box, el("h3", null, "Task"), kv([
      ["method", body.reward_spec ? body.reward_spec.method : undefined],
      ["ground truth", body.reward_spec ? body.reward_spec.ground_truth : undefined],
      ["reward spec", body.reward_spec],
      ["data", (body.data || "") + "/" + (body.workspace_id || "")],
      ["task hash", body.task_hash]
    ]));
    add(box, el("h3", null, "Reward"), renderReward(body));
    add(box, el("h3", null, "Turns (" + r[C.turns] + ")"), renderMessages(body));
    add(box, el("h3", null, "Judge"), renderJudge(body));
    if (body.agent) add(box, el("h3", null, "Agent (black box)"), renderAgent(body.agent));
    if (!compact) {
      add(box, el("h3", null, "Versions"), renderVersions(body));
      var extra = [];
      if (body.timings) Object.keys(body.timings).forEach(function (k) { extra.push([k, fmt(body.timings[k], 1)]); });
      if (body.usage) Object.keys(body.usage).forEach(function (k) { if (k !== "per_turn") extra.push(["usage " + k, body.usage[k]]); });
      add(box, el("h3", null, "Timings and usage"), kv(extra));
    }
    return box;
  }

  function renderAgent(agent) {
    var box = add(el("div", "agent"), kv([
      ["command", agent.command], ["exit code", agent.exit_code === null ? "killed (time limit)" : agent.exit_code],
      ["seconds", fmt(agent.seconds, 1)], ["model calls", agent.model_calls.length]
    ]));
    if (agent.model_calls.length) {
      add(box, table(["#", "status", "latency ms", "finish", "the model said"], agent.model_calls.map(function (c, i) {
        return [i + 1, c.status, fmt(c.latency_ms, 0), c.finish_reason, c.said];
      }), [true, true, true, false, false]));
    }
    if (agent.stderr_tail) add(box, el("pre", "agent-output", agent.stderr_tail));
    return box;
  }

  function siblings(i) {
    var task = rows[i][C.task], out = [];
    for (var j = 0; j < rows.length; j++) if (rows[j][C.task] === task) out.push(j);
    return out.sort(function (a, b) {
      var x = rows[a][C.reward], y = rows[b][C.reward];
      if (x === y) return a - b;
      if (x === null) return 1;
      if (y === null) return -1;
      return y - x;
    });
  }

  function groupPanel(i, pair) {
    var sib = siblings(i);
    var box = el("div", "panel group");
    add(box, el("h3", null, "Same task: " + sib.length + " episode" + (sib.length === 1 ? "" : "s") + " (best first)"));
    if (sib.length > 1) {
      var best = sib[0], worst = sib[sib.length - 1];
      add(box, add(el("div", "ep-nav"), link("best vs worst side by side", "#/c/" + best + "," + worst)));
    }
    add(box, table(["episode", "policy", "status", "reward", ""], sib.map(function (j) {
      var a = link(rows[j][C.id], "#/e/" + j);
      if (j === i || (pair && pair.indexOf(j) >= 0)) a.className = "current";
      var other = j === i ? el("span", "note", "this one") : link("compare with this", "#/c/" + i + "," + j);
      return [a, rows[j][C.policy], badge(rows[j][C.status]), fmt(rows[j][C.reward]), other];
    }), [0, 0, 0, 1, 0]));
    return box;
  }

  function showEpisode(i) {
    var start = performance.now();
    var view = document.getElementById("episode-view");
    var nav = el("div", "ep-nav");
    var pos = state.visible.indexOf(i);
    add(nav, link("← all episodes", "#/"));
    if (pos > 0) add(nav, link("‹ previous", "#/e/" + state.visible[pos - 1]));
    if (pos >= 0 && pos < state.visible.length - 1) add(nav, link("next ›", "#/e/" + state.visible[pos + 1]));
    view.replaceChildren(nav, groupPanel(i), renderEpisode(i, false));
    timings.last_episode_ms = performance.now() - start;
  }

  function showCompare(a, b) {
    var start = performance.now();
    var view = document.getElementById("episode-view");
    var nav = add(el("div", "ep-nav"), link("← all episodes", "#/"), link("open " + rows[a][C.id], "#/e/" + a), link("open " + rows[b][C.id], "#/e/" + b));
    var grid = add(el("div", "compare"), add(el("div"), renderEpisode(a, true)), add(el("div"), renderEpisode(b, true)));
    view.replaceChildren(nav, groupPanel(a, [a, b]), grid);
    timings.last_episode_ms = performance.now() - start;
  }

  function route() {
    var hash = location.hash || "#/";
    var runView = document.getElementById("run-view"), epView = document.getElementById("episode-view");
    var m = /^#\/e\/(\d+)$/.exec(hash), c = /^#\/c\/(\d+),(\d+)$/.exec(hash);
    var valid = function (n) { return n >= 0 && n < rows.length; };
    if (m && valid(+m[1])) {
      whenParsed(function () { showEpisode(+m[1]); runView.hidden = true; epView.hidden = false; window.scrollTo(0, 0); });
    } else if (c && valid(+c[1]) && valid(+c[2])) {
      whenParsed(function () { showCompare(+c[1], +c[2]); runView.hidden = true; epView.hidden = false; window.scrollTo(0, 0); });
    } else {
      epView.hidden = true;
      runView.hidden = false;
    }
  }

  // ------------------------------------------------------------------ start

  timings.parsed_ms = performance.now() - t0;
  document.getElementById("title").textContent = meta.title;
  document.getElementById("generated").textContent = meta.episodes + " episodes · generated " + meta.generated;
  document.title = "episodes: " + meta.title;
  renderSummary();
  renderFilters();
  renderHead();
  state.visible = rows.map(function (_, i) { return i; });
  renderTable();
  timings.first_render_ms = performance.now() - t0;
  timings.ready_at_ms = performance.now(); // since navigation start: what "the page opened" means
  document.body.dataset.ready = "1";
  window.addEventListener("hashchange", route);
  route();
})();
