// conductor view: the page's script.  It reads the data block the page carries, draws
// the overview, a list of samples that renders only the rows in view (a run of 100,000
// samples stays quick), one sample's details, the comparison of two runs and the charts.
// A sample's details and the text the search looks in are in the page's companion
// directory (view/companion.py), a script file per chunk of samples, loaded from disk
// the first time they are needed.
// The state of the filters lives in the URL's hash (#verdict=wrong&q=tokyo), so a view
// can be linked to and reloaded as it was.  The filters always win: a sample is shown
// only while they let it through, and the page says so when a link names one they hide.
// Rounds are numbered from 1 and steps from 0, as `conductor trace` and the graphs do.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("view-data").textContent);
  const RUNS = DATA.runs;
  const NAMES = DATA.names;
  const ROWS = DATA.rows;
  const DETAILS = DATA.details;
  // Row fields (see view/page.py's _row).
  const RUN = 0, KEY = 1, SID = 2, EPOCH = 3, Q = 4, VERDICT = 5, ANSWER = 6,
    WORKERS = 7, STEPS = 8, KIND = 9, COST = 10, DISAGREE = 11;
  for (const r of ROWS) r[VERDICT] = NAMES[r[VERDICT]]; // a verdict is held as a name's number
  const ROW_H = 28;
  const FAILED = new Set(["run_failed", "grader_error", "time_limit"]);
  const WRONG = new Set(["incorrect", "no_answer"]);

  // ------------------------------------------------------------------ the companion
  // Each file calls the callback with the page's token, its kind ("d" details, "s"
  // search), its number and its payload; a file another page left there is refused.
  const CHUNKS = new Map();
  window[DETAILS.callback] = (token, kind, n, payload) => {
    const waiting = CHUNKS.get(kind + n);
    if (!waiting) return;
    if (token === DETAILS.token) waiting.resolve(payload);
    else waiting.reject(new Error(`${decodeURIComponent(DETAILS.dir)} holds the details of another page (written over since?)`));
  };
  function chunk(kind, n) {
    let c = CHUNKS.get(kind + n);
    if (!c) {
      c = {};
      c.promise = new Promise((resolve, reject) => { c.resolve = resolve; c.reject = reject; });
      CHUNKS.set(kind + n, c);
      const name = `${kind}-${String(n).padStart(5, "0")}.js`;
      const missing = () => c.reject(new Error(`${decodeURIComponent(DETAILS.dir)}/${name} beside this page could not be read`));
      const script = el("script", {src: `${DETAILS.dir}/${name}`});
      script.onerror = missing;
      script.onload = () => { script.remove(); missing(); }; // a no-op once the file called back
      document.head.append(script);
    }
    return c.promise;
  }
  // The text search looks in, lowercased (view/companion.py), read at the first search.
  let SEARCH = null, searching = null, searchError = null;
  function loadSearch() {
    if (searching === null) {
      const parts = [];
      for (let n = 0; n * DETAILS.chunk < ROWS.length; n++) parts.push(chunk("s", n));
      searching = Promise.all(parts).then(
        all => { SEARCH = all.flat(); },
        e => { searchError = e.message; });
    }
    return searching;
  }

  const $ = id => document.getElementById(id);
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  const pct = x => (x === null || x === undefined) ? "—" : (100 * x).toFixed(1) + "%";
  const num = (x, d) => (x === null || x === undefined) ? "—" : x.toFixed(d);
  const usd = x => (x === null || x === undefined) ? "—" : x === 0 ? "$0" : "$" + (x < 0.01 ? x.toPrecision(2) : x.toFixed(4));
  const secs = x => (x === null || x === undefined) ? "—" : x.toFixed(2) + " s";

  // ------------------------------------------------------------------ overview
  function drawOverview() {
    const body = $("runs").tBodies[0];
    RUNS.forEach((run, i) => {
      const o = run.o;
      const acc = o.accuracy === null ? "—" :
        `${pct(o.accuracy)} (${pct(o.acc_lo)}–${pct(o.acc_hi)})`;
      const cost = o.cost === null ? "—" :
        `${o.cost_is_lower_bound ? "≥ " : ""}${usd(o.cost)} (${usd(o.cost_lo)}–${usd(o.cost_hi)})`;
      body.append(el("tr", {"class": "run-row", "data-run": i},
        el("td", {}, i), el("td", {title: run.path}, run.label), el("td", {}, run.benchmark),
        el("td", {}, run.strategy), el("td", {}, run.pool), el("td", {}, run.conductor),
        el("td", {"class": "num"}, o.samples), el("td", {"class": "num"}, acc),
        el("td", {"class": "num"}, cost), el("td", {"class": "num"}, num(o.tokens, 0)),
        el("td", {"class": "num"}, num(o.calls, 1)),
        el("td", {"class": "num"}, `${secs(o.latency_p50)} / ${secs(o.latency_p95)}`),
        el("td", {"class": "num"}, secs(o.queue_p50)),
        el("td", {"class": "num"}, pct(o.parse_failure_rate))));
    });
  }

  // ------------------------------------------------------------------ filters
  const state = {q: "", verdict: "", run: "", worker: "", steps: "", kind: "", disagree: false, sample: null};
  let matches = [];
  // What the sample pane says when no sample is shown because a link named one the
  // filters hide, or one this page does not hold (an element, or null).
  let notice = null;

  function fillSelect(id, values, label) {
    const sel = $(id);
    for (const [value, text] of values) sel.append(el("option", {value: value}, label ? label(text) : text));
  }
  function setupFilters() {
    fillSelect("f-run", RUNS.map((r, i) => [String(i), `${i}: ${r.label}`]));
    const workers = new Set(), steps = new Set(), kinds = new Set();
    for (const r of ROWS) {
      r[WORKERS].forEach(w => workers.add(w));
      steps.add(r[STEPS]);
      kinds.add(r[KIND]);
    }
    fillSelect("f-worker", [...workers].map(w => [String(w), NAMES[w]]).sort((a, b) => a[1].localeCompare(b[1])));
    fillSelect("f-steps", [...steps].sort((a, b) => a - b).map(n => [String(n), `${n} step${n === 1 ? "" : "s"}`]));
    fillSelect("f-kind", [...kinds].map(k => [String(k), NAMES[k]]).sort((a, b) => a[1].localeCompare(b[1])));
    const inputs = ["f-q", "f-verdict", "f-run", "f-worker", "f-steps", "f-kind", "f-disagree"];
    for (const id of inputs) $(id).addEventListener("input", () => {
      readForm();
      notice = null; // it spoke of the filters before this change
      applyFilters(true);
      if (state.sample === null) showSample(null);
    });
    $("filters").addEventListener("submit", e => e.preventDefault());
  }
  function readForm() {
    state.q = $("f-q").value;
    state.verdict = $("f-verdict").value;
    state.run = $("f-run").value;
    state.worker = $("f-worker").value;
    state.steps = $("f-steps").value;
    state.kind = $("f-kind").value;
    state.disagree = $("f-disagree").checked;
  }
  function byName(values, name) {
    // A hash may name a worker or topology by its text; the form holds its number.
    const i = NAMES.indexOf(name);
    return i >= 0 && values.has(i) ? String(i) : "";
  }
  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    notice = null;
    state.q = p.get("q") || "";
    state.verdict = p.get("verdict") || p.get("filter") || "";
    state.run = p.get("run") || "";
    const workers = new Set(ROWS.flatMap(r => r[WORKERS])), kinds = new Set(ROWS.map(r => r[KIND]));
    state.worker = p.has("worker") ? byName(workers, p.get("worker")) : "";
    state.steps = p.get("steps") || "";
    state.kind = p.has("kind") ? byName(kinds, p.get("kind")) : "";
    state.disagree = p.get("disagree") === "1";
    // A sample's number, or the link's text where it is none (said so in the pane).
    const sample = p.get("sample");
    state.sample = sample === null ? null : /^\d+$/.test(sample) ? Number(sample) : sample;
    $("f-q").value = state.q;
    $("f-verdict").value = state.verdict;
    $("f-run").value = state.run;
    $("f-worker").value = state.worker;
    $("f-steps").value = state.steps;
    $("f-kind").value = state.kind;
    $("f-disagree").checked = state.disagree;
    readForm(); // a value no control offers (run=99) filters nothing, as the form shows
    if (p.has("a") && p.has("b")) { $("cmp-a").value = p.get("a"); $("cmp-b").value = p.get("b"); }
  }
  function writeHash() {
    const p = new URLSearchParams();
    if (state.q) p.set("q", state.q);
    if (state.verdict) p.set("verdict", state.verdict);
    if (state.run) p.set("run", state.run);
    if (state.worker) p.set("worker", NAMES[Number(state.worker)]);
    if (state.steps) p.set("steps", state.steps);
    if (state.kind) p.set("kind", NAMES[Number(state.kind)]);
    if (state.disagree) p.set("disagree", "1");
    if (state.sample !== null) p.set("sample", String(state.sample));
    history.replaceState(null, "", "#" + p.toString());
  }
  function verdictOk(v) {
    switch (state.verdict) {
      case "right": return v === "correct";
      case "wrong": return WRONG.has(v);
      case "failed": return FAILED.has(v);
      default: return true;
    }
  }
  // The filters the form shows, in its words ("wrong, run 0: …, “tokyo”").
  function describeFilters() {
    const parts = [];
    if (state.q.trim()) parts.push(`“${state.q.trim()}”`);
    for (const id of ["f-verdict", "f-run", "f-worker", "f-steps", "f-kind"]) {
      const sel = $(id);
      if (sel.value !== "") parts.push(sel.selectedOptions[0].textContent);
    }
    if (state.disagree) parts.push("runs disagree");
    return parts.join(", ");
  }
  function clearFilters() {
    Object.assign(state, {q: "", verdict: "", run: "", worker: "", steps: "", kind: "", disagree: false});
    for (const id of ["f-q", "f-verdict", "f-run", "f-worker", "f-steps", "f-kind"]) $(id).value = "";
    $("f-disagree").checked = false;
    applyFilters(true);
  }
  // The open sample, unless the filters hide it or the page holds no such sample: then
  // it is closed and the pane says why (a hidden one with a button that clears the
  // filters and opens it).  Returns whether one was closed.
  function dropHiddenSample() {
    const i = state.sample;
    if (i === null) return false;
    if (typeof i === "number" && i < ROWS.length && matches.includes(i)) return false;
    state.sample = null;
    if (typeof i !== "number" || i >= ROWS.length) {
      const held = ROWS.length ? `it holds samples 0 to ${ROWS.length - 1}` : "it holds none";
      notice = el("p", {id: "sample-notice", "data-reason": "unknown"},
        `The link names sample ${String(i).slice(0, 40)}, which this page does not hold (${held}).`);
    } else {
      const r = ROWS[i];
      const open = el("button", {type: "button", id: "sample-notice-open"}, "Clear the filters and open it");
      open.addEventListener("click", () => { clearFilters(); showSample(i); revealRow(i); writeHash(); });
      notice = el("p", {id: "sample-notice", "data-reason": "hidden", "data-index": i},
        `Sample ${r[SID]} of run ${r[RUN]} is not shown: the filters (${describeFilters()}) hide it. `, open);
    }
    return true;
  }
  function applyFilters(fromForm) {
    const q = state.q.trim().toLowerCase();
    const waiting = q && SEARCH === null && searchError === null;
    // Filtered again once the search text is read; until then nothing matches, and a
    // linked sample is not taken for one the filters hide.
    if (waiting) loadSearch().then(() => applyFilters(fromForm));
    const run = state.run === "" ? -1 : Number(state.run);
    const worker = state.worker === "" ? -1 : Number(state.worker);
    const steps = state.steps === "" ? -1 : Number(state.steps);
    const kind = state.kind === "" ? -1 : Number(state.kind);
    matches = [];
    for (let i = 0; i < ROWS.length; i++) {
      const r = ROWS[i];
      if (run >= 0 && r[RUN] !== run) continue;
      if (!verdictOk(r[VERDICT])) continue;
      if (worker >= 0 && !r[WORKERS].includes(worker)) continue;
      if (steps >= 0 && r[STEPS] !== steps) continue;
      if (kind >= 0 && r[KIND] !== kind) continue;
      if (state.disagree && !r[DISAGREE]) continue;
      if (q && (SEARCH === null || !SEARCH[i].includes(q))) continue;
      matches.push(i);
    }
    const count = $("match-count");
    count.dataset.count = matches.length;
    count.dataset.searching = waiting ? "1" : "0";
    count.textContent = waiting ? "searching…" : q && searchError ? `search unavailable: ${searchError}` :
      `${matches.length} of ${ROWS.length} samples`;
    $("list-spacer").style.height = (matches.length * ROW_H) + "px";
    $("list").scrollTop = 0;
    drawRows();
    if (waiting) return;
    const dropped = dropHiddenSample();
    if (dropped) showSample(null);
    if (fromForm || dropped) writeHash(); // the address says what the page shows
  }
  // Scroll the list so that sample i's row is in view (a sample opened from a link).
  function revealRow(i) {
    const m = matches.indexOf(i), list = $("list");
    if (m < 0) return;
    const top = m * ROW_H;
    if (top < list.scrollTop || top + ROW_H > list.scrollTop + list.clientHeight) {
      list.scrollTop = Math.max(0, top - list.clientHeight / 2);
      drawRows();
    }
  }

  // ------------------------------------------------------------------ the list
  function verdictBadge(v) {
    const cls = v === "correct" ? "right" : WRONG.has(v) ? "wrong" : FAILED.has(v) ? "failed" : "other";
    return el("span", {"class": "badge " + cls}, v.replace("_", " "));
  }
  function drawRows() {
    const list = $("list");
    const first = Math.max(0, Math.floor(list.scrollTop / ROW_H) - 5);
    const last = Math.min(matches.length, first + Math.ceil(list.clientHeight / ROW_H) + 10);
    const box = $("list-rows");
    box.style.transform = `translateY(${first * ROW_H}px)`;
    const rows = [];
    for (let m = first; m < last; m++) {
      const i = matches[m], r = ROWS[i];
      // #: the row's place in the list as filtered (the last row's is the count).
      const row = el("div", {"class": "row sample-row" + (state.sample === i ? " chosen" : ""), "data-index": i, "data-key": r[KEY], "data-verdict": r[VERDICT], "data-row": m + 1},
        el("span", {"class": "num"}, m + 1), el("span", {"class": "num", title: RUNS[r[RUN]].label}, r[RUN]),
        el("span", {title: r[SID]}, r[SID] + (r[EPOCH] ? ` (epoch ${r[EPOCH]})` : "")),
        verdictBadge(r[VERDICT]), el("span", {}, r[STEPS]), el("span", {}, NAMES[r[KIND]]),
        el("span", {}, r[WORKERS].map(w => NAMES[w]).join(", ")),
        el("span", {title: r[Q]}, r[Q]), el("span", {}, r[ANSWER].slice(0, 80)));
      rows.push(row);
    }
    box.replaceChildren(...rows);
  }

  // ------------------------------------------------------------------ one sample
  function pre(text, cls) { return el("pre", {"class": cls || ""}, text); }
  async function showSample(i) {
    const box = $("sample");
    if (i === null || !(typeof i === "number" && i >= 0 && i < ROWS.length)) {
      state.sample = null;
      box.replaceChildren(...(notice ? [notice] : []));
      return;
    }
    state.sample = i;
    notice = null;
    const r = ROWS[i];
    let D;
    try {
      D = await chunk("d", Math.floor(i / DETAILS.chunk));
    } catch (e) {
      if (state.sample === i) box.replaceChildren(el("p", {"class": "error", id: "details-missing"}, `The details of sample ${r[SID]} are not shown: ${e.message}.`));
      return;
    }
    if (state.sample !== i) return; // another sample was chosen meanwhile
    // The places of view/companion.py's detail_item.
    const [svg, replies, parseErrors, steps, why, error, prompt, question, answer, gold, subtasks] = D.items[i % DETAILS.chunk];
    const T = D.texts;
    const graph = el("div", {"class": "graph"});
    graph.innerHTML = svg; // drawn by view/graph.py, whose text is escaped
    const parts = [
      el("h3", {}, `${RUNS[r[RUN]].label} · ${r[SID]}` + (r[EPOCH] ? ` · epoch ${r[EPOCH]}` : "")),
      el("h4", {}, "Question"), pre(question),
      ...(prompt ? [el("details", {"class": "prompt"}, el("summary", {}, "The prompt it was given (the benchmark's template filled in)"), pre(prompt))] : []),
      el("h4", {}, "Grade"),
      el("dl", {"class": "grade"},
        el("dt", {}, "verdict"), el("dd", {}, verdictBadge(r[VERDICT])),
        el("dt", {}, "answer"), el("dd", {}, pre(answer)),
        el("dt", {}, "gold"), el("dd", {}, pre(gold)),
        el("dt", {}, "why"), el("dd", {}, why || "—"),
        el("dt", {}, "cost"), el("dd", {}, usd(r[COST]))),
      el("h4", {}, "Workflow"), graph,
    ];
    if (error) parts.push(el("p", {"class": "error"}, "run failed: " + error));
    replies.forEach(([rnd, t], n) => parts.push(el("details", {"class": "reply", open: n === replies.length - 1, "data-round": rnd},
      el("summary", {}, `Round ${rnd}: the Conductor's reply`), pre(T[t]))));
    if (parseErrors.length) parts.push(el("details", {}, el("summary", {}, `${parseErrors.length} parse error(s)`), pre(parseErrors.join("\n"))));
    steps.forEach(([rnd, index, worker, status, sees, messages, response, err], n) => {
      const body = [];
      body.push(el("p", {"class": "sees"}, sees.length ? `sees steps ${sees.join(", ")}` : "sees no earlier step"));
      for (const [role, t] of messages) body.push(el("div", {"class": "msg"}, el("b", {}, role), pre(T[t])));
      body.push(el("div", {"class": "msg response"}, el("b", {}, "response"), pre(T[response])));
      if (err) body.push(el("p", {"class": "error"}, err));
      parts.push(el("details", {"class": "step " + status, "data-step": `${rnd}.${index}`},
        el("summary", {}, `Round ${rnd} · step ${index} · ${T[worker]} · ${status}: ${subtasks[n] || ""}`.slice(0, 300)),
        ...body));
    });
    box.replaceChildren(...parts);
    for (const node of document.querySelectorAll(".sample-row.chosen")) node.classList.remove("chosen");
    const row = document.querySelector(`.sample-row[data-index="${i}"]`);
    if (row) row.classList.add("chosen");
    document.documentElement.dataset.shown = String(Math.round(performance.now()));
  }

  // ------------------------------------------------------------------ compare
  function setupCompare() {
    const a = $("cmp-a"), b = $("cmp-b");
    RUNS.forEach((r, i) => { a.append(el("option", {value: i}, `${i}: ${r.label}`)); b.append(el("option", {value: i}, `${i}: ${r.label}`)); });
    if (RUNS.length > 1) b.value = "1";
    a.addEventListener("input", drawCompare);
    b.addEventListener("input", drawCompare);
  }
  function drawCompare() {
    const a = Number($("cmp-a").value), b = Number($("cmp-b").value);
    const box = $("cmp-result");
    let c = DATA.compare.find(x => x.a === a && x.b === b);
    if (!c) {
      const r = DATA.compare.find(x => x.a === b && x.b === a);
      if (r) c = {a: a, b: b, n: r.n, both_right: r.both_right, only_a: r.only_b, only_b: r.only_a,
        both_wrong: r.both_wrong, p_value: r.p_value, diff: -r.diff, diff_lo: -r.diff_hi, diff_hi: -r.diff_lo};
    }
    if (a === b || !c) {
      box.replaceChildren(el("p", {"id": "cmp-none"}, a === b ? "Pick two different runs." : "These runs share no graded question."));
      return;
    }
    const cell = (id, v) => el("td", {id: id, "class": "num", "data-value": v}, v);
    box.replaceChildren(
      el("table", {"class": "cmp"},
        el("tr", {}, el("th", {}, `${c.n} shared questions`), el("th", {}, "B right"), el("th", {}, "B wrong")),
        el("tr", {}, el("th", {}, "A right"), cell("cmp-both", c.both_right), cell("cmp-only-a", c.only_a)),
        el("tr", {}, el("th", {}, "A wrong"), cell("cmp-only-b", c.only_b), cell("cmp-neither", c.both_wrong))),
      el("p", {}, "McNemar's exact test: p = ", el("span", {id: "cmp-p", "data-value": c.p_value}, c.p_value.toPrecision(3))),
      el("p", {}, "accuracy(A) − accuracy(B): ",
        el("span", {id: "cmp-diff", "data-value": c.diff}, `${(100 * c.diff).toFixed(1)} points`),
        ` (95% paired bootstrap interval ${(100 * c.diff_lo).toFixed(1)} to ${(100 * c.diff_hi).toFixed(1)})`));
  }

  // ------------------------------------------------------------------ charts
  function drawCharts() {
    const ac = $("chart-accuracy-cost");
    if (DATA.accuracy_cost_svg) ac.innerHTML = DATA.accuracy_cost_svg; // drawn by view/plots.py
    else ac.append(el("p", {}, "No run has both an accuracy and a known cost."));
    const usage = $("chart-usage");
    RUNS.forEach((run, i) => {
      const u = run.o.worker_usage;
      const workers = run.o.worker_order.length ? run.o.worker_order : Object.keys(u);
      if (!workers.length) return;
      let maxPos = 0, maxN = 1;
      for (const w of workers) for (const [p, n] of Object.entries(u[w] || {})) { maxPos = Math.max(maxPos, Number(p)); maxN = Math.max(maxN, n); }
      const head = el("tr", {}, el("th", {}, "worker \\ step"));
      for (let p = 0; p <= maxPos; p++) head.append(el("th", {"class": "num"}, p));
      const table = el("table", {"class": "usage", "data-run": i}, el("caption", {}, `${i}: ${run.label}`), head);
      for (const w of workers) {
        const tr = el("tr", {}, el("th", {}, w));
        for (let p = 0; p <= maxPos; p++) {
          const n = (u[w] || {})[String(p)] || 0;
          tr.append(el("td", {"class": "num", style: `background: rgba(37, 99, 235, ${(0.85 * n / maxN).toFixed(3)})`}, n || ""));
        }
        table.append(tr);
      }
      usage.append(table);
    });
    const shapes = $("chart-shapes");
    RUNS.forEach((run, i) => {
      const counts = Object.entries(run.o.topology_counts);
      const total = counts.reduce((s, [, n]) => s + n, 0) || 1;
      const box = el("div", {"class": "shapes", "data-run": i}, el("h4", {}, `${i}: ${run.label}`));
      for (const [kind, n] of counts) {
        box.append(el("div", {"class": "bar"}, el("span", {"class": "bar-label"}, kind),
          el("span", {"class": "bar-fill", style: `width: ${(60 * n / total).toFixed(1)}%`}),
          el("span", {"class": "bar-n"}, `${n} (${(100 * n / total).toFixed(0)}%)`)));
      }
      shapes.append(box);
    });
  }

  // ------------------------------------------------------------------ start
  drawOverview();
  setupFilters();
  setupCompare();
  readHash();
  applyFilters(false);
  let pending = false;
  $("list").addEventListener("scroll", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; drawRows(); });
  });
  $("list-rows").addEventListener("click", e => {
    const row = e.target.closest(".sample-row");
    if (!row) return;
    showSample(Number(row.dataset.index));
    writeHash();
  });
  for (const a of document.querySelectorAll("nav a")) {
    a.addEventListener("click", () => $(a.dataset.tab).scrollIntoView({behavior: "smooth"}));
  }
  window.addEventListener("hashchange", () => {
    readHash(); applyFilters(false); showSample(state.sample); revealRow(state.sample); drawCompare();
  });
  function ready() {
    // The list is usable now (a linked search's text read); the rest is drawn after it.
    document.documentElement.dataset.ready = String(Math.round(performance.now()));
    showSample(state.sample);
    revealRow(state.sample);
    drawCompare();
    drawCharts();
    document.documentElement.dataset.drawn = String(Math.round(performance.now()));
  }
  if (searching !== null) searching.then(ready); else ready();
})();
