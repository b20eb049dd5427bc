// The page at `/`: calls the server's own /models, /detect and /classify (relative URLs, same origin).
// No framework, no build step. User text is only ever inserted with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  apiKey: null, // in this tab's memory only: never written to storage
  models: [],
  detect: null, // {text, result, cps}: the last /detect answer and the text it was for
  spans: [], // rendered span elements of the text view, in text order
  busy: false, // a Check is under way: another is ignored until it ends
};

// ------------------------------------------------------------------ HTTP
class ApiError extends Error {
  constructor(status, type, message, field, retryAfter) {
    super(message);
    Object.assign(this, { status, type, field, retryAfter });
  }
}

async function api(path, body) {
  const headers = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (state.apiKey) headers.authorization = "Bearer " + state.apiKey;
  let res;
  try {
    res = await fetch(path, { method: body === undefined ? "GET" : "POST", headers,
      body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, "network", "Could not reach the server at " + location.host + " (" + e.message + ").", null);
  }
  let data = null;
  try { data = await res.json(); } catch (e) { /* not JSON: reported below */ }
  if (!res.ok) {
    const err = data && data.error;
    throw new ApiError(res.status, err ? err.type : "http_" + res.status,
      err ? err.message : "The server answered " + res.status + " " + res.statusText + ".",
      err ? err.field : null, res.headers.get("retry-after"));
  }
  if (data === null) throw new ApiError(res.status, "bad_response", "The server's answer was not JSON.", null);
  return { data, ms: res.headers.get("x-total-time") };
}

function showError(err) {
  if (err.status === 401) {
    // The key form says what to do, beside the box to type it in: not an error box further down the page.
    // A first 401 only asks for the key; one after a key was given says that key was refused.
    clearError();
    askForKey(state.apiKey
      ? "The server refused this key (401). Check it, paste it again and press Use key." : "");
    return;
  }
  const box = $("error");
  box.replaceChildren();
  const head = document.createElement("strong");
  head.textContent = err.status ? "Error " + err.status + " (" + err.type + ")" : "Error";
  const msg = document.createElement("span");
  msg.className = "message";
  msg.textContent = err.message;
  box.append(head, msg);
  const todo = advice(err);
  if (todo) {
    const what = document.createElement("span");
    what.className = "advice";
    what.textContent = todo;
    box.append(what);
  }
  box.hidden = false;
  $("detect").hidden = true;
  $("classify").hidden = true;
  // On a phone the box can be below the fold, under the text box and its keyboard.
  box.scrollIntoView({ block: "nearest" });
}

// What a user of this page can do about an error. The server's message is written for API clients and
// operators (it names flags such as --max-text-tokens); this line is written for the person at the page.
function advice(err) {
  const wait = err.retryAfter ? "in " + err.retryAfter + " s" : "in a moment";
  if (err.type === "network") {
    return "Check that the server is running and that this device can reach it, then press Check to try again.";
  }
  if (err.type === "empty_text") {
    const second = /^pairs\[\d+\]\[1\]$/.test(err.field || "");
    return "Type or paste some text into the " + (second ? "second text box" : "text box") + ", then press Check.";
  }
  if (err.type === "unknown_model" || err.type === "wrong_model_kind") {
    return "The server's models have changed since the page opened: the list now shows those it serves. "
      + "Pick one and press Check.";
  }
  if (err.status === 413) return "Shorten the text, or check it a part at a time.";
  if (err.status === 429 || err.status === 503) return "The server is busy: press Check again " + wait + ".";
  if (err.status === 408) return "The text took too long to reach the server: press Check to send it again.";
  if (err.status >= 500) return "Press Check to try again; if it fails again, the server's log says why.";
  return "";
}

function clearError() { $("error").hidden = true; }

// ------------------------------------------------------------------ models and the key
// The key form, with `problem` (what is wrong with the key given, and what to do) under the box, or none.
function askForKey(problem) {
  $("key-error").textContent = problem;
  $("key-error").hidden = !problem;
  if (problem) $("key").setAttribute("aria-invalid", "true");
  else $("key").removeAttribute("aria-invalid");
  $("key-form").hidden = false;
  $("key").focus();
}

async function loadModels() {
  const select = $("model");
  try {
    const { data } = await api("models");
    state.models = data.models;
    showBroken(data.broken || {});
  } catch (err) {
    if (!state.models.length) select.firstElementChild.textContent = "not loaded";
    showError(err);
    return false;
  }
  clearError();
  select.replaceChildren();
  const groups = { detector: "Replaced-word detectors", classifier: "Classifiers" };
  for (const [kind, title] of Object.entries(groups)) {
    const ms = state.models.filter((m) => m.kind === kind);
    if (!ms.length) continue;
    const group = document.createElement("optgroup");
    group.label = title;
    for (const m of ms) {
      const opt = document.createElement("option");
      opt.value = m.name;
      opt.textContent = m.name + " (" + m.kind + ", " + m.precision + ")";
      group.append(opt);
    }
    select.append(group);
  }
  if (!state.models.length) {
    showError(new ApiError(0, "no_models", "This server serves no models.", null));
    return false;
  }
  const first = state.models.find((m) => m.kind === "detector" && m.default) || state.models[0];
  select.value = first.name;
  select.disabled = false;
  return true;
}

// Bundles in the models directory that failed their checks or their loading: not in the list, so say so.
function showBroken(broken) {
  const names = Object.keys(broken).sort();
  $("broken-models").textContent = names.length
    ? "Not served: " + names.map((n) => n + " (" + broken[n] + ")").join("; ")
    : "";
  $("broken-models").hidden = !names.length;
}

function selectedModel() { return state.models.find((m) => m.name === $("model").value); }

// ------------------------------------------------------------------ scoring
async function run() {
  const button = $("run");
  // aria-disabled, not disabled: a disabled button loses the keyboard focus, and the next Tab starts over.
  if (state.busy) return;
  state.busy = true;
  button.setAttribute("aria-disabled", "true");
  $("status").textContent = "Scoring…";
  try {
    // The list of models did not load (the server was down or busy when the page opened): try again now.
    if (!state.models.length) {
      $("status").textContent = "Loading the models…";
      if (!(await loadModels())) { $("status").textContent = ""; return; }
      syncControls();
      $("status").textContent = "Scoring…";
    }
    await score(selectedModel());
  } finally {
    state.busy = false;
    button.removeAttribute("aria-disabled");
  }
}

async function score(model) {
  const text = $("text").value;
  const pair = takesPairs(model) ? $("text-pair").value : "";
  try {
    if (model.kind === "classifier") {
      // A model fine-tuned on pairs gets one; one that may take either gets one when a second text is given.
      const input = model.trained_on === "pairs" || pair.trim() ? { pairs: [[text, pair]] } : { text };
      const { data, ms } = await api("classify", { model: model.name, ...input });
      if (switchedAway(model)) return;
      clearError();
      renderClassify(model, data.results[0]);
      $("status").textContent = done(ms);
    } else {
      const threshold = Number($("threshold").value);
      const { data, ms } = await api("detect", { model: model.name, text, threshold, return: "both" });
      if (switchedAway(model)) return;
      clearError();
      state.detect = { text, result: data.results[0], cps: codePointIndex(text) };
      renderDetect();
      $("status").textContent = done(ms);
    }
    state.scoredInput = inputNow();
    state.scoredWith = model.name;
    markStale(false);
    // The result may start below the fold (a laptop's 800 px): bring its top into view.
    $(model.kind === "classifier" ? "classify" : "detect").scrollIntoView({ block: "nearest" });
  } catch (err) {
    $("status").textContent = "";
    // The server was started again with other bundles: the page's list of models is out of date.
    if ((err.type === "unknown_model" || err.type === "wrong_model_kind") && await loadModels()) syncControls();
    showError(err);
  }
}

// /classify takes `pairs` for a model fine-tuned on them, and for one whose training is not recorded (an
// imported model takes either); /models' trained_on says which.
function takesPairs(model) { return !!model && model.kind === "classifier" && model.trained_on !== "texts"; }

// What a result was scored from: the text, and the second text where the model takes one.
function inputNow() { return $("text").value + (takesPairs(selectedModel()) ? "\u0000" + $("text-pair").value : ""); }

// Another model was chosen while this one scored: its answer is not the chosen model's, and is dropped.
function switchedAway(model) {
  if (selectedModel() && selectedModel().name === model.name) return false;
  $("status").textContent = "";
  return true;
}

function done(ms) { return ms ? "Scored in " + Math.round(Number(ms)) + " ms." : "Scored."; }

// The API's offsets count code points (Python str indices); JS strings index UTF-16 units.
function codePointIndex(text) {
  const idx = [0];
  let u = 0;
  for (const ch of text) { u += ch.length; idx.push(u); }
  return idx;
}

const pct = (p) => (100 * p).toFixed(1) + "%";
// sqrt: a weak detector's 5-15% stays visible while the order of the shades is the order of the probabilities.
// At most 0.75: the darkest shade keeps the text at 5:1 contrast (WCAG AA; 0.85 gave 4.3:1).
const shade = (p) => "rgba(var(--hot), " + (0.75 * Math.sqrt(Math.min(1, Math.max(0, p)))).toFixed(4) + ")";

function unit() { return document.querySelector("input[name=unit]:checked").value; }
function items() {
  const r = state.detect.result;
  return unit() === "words" ? r.words : r.tokens;
}

function renderDetect() {
  const { text, cps } = state.detect;
  const marked = $("marked");
  const list = items();
  const frag = document.createDocumentFragment();
  state.spans = [];
  let at = 0; // UTF-16 index written so far
  list.forEach((it, i) => {
    const start = cps[it.start], end = cps[it.end];
    if (start < at) {
      // Pieces of one character (a Hangul syllable is several) share its offsets: it shows the most probable.
      const last = state.spans[state.spans.length - 1];
      if (last && it.prob > Number(last.dataset.prob)) {
        last.dataset.i = i;
        last.dataset.prob = it.prob;
        last.style.backgroundColor = shade(it.prob);
      }
      return;
    }
    if (start > at) frag.append(text.slice(at, start));
    const span = document.createElement("span");
    span.className = "w";
    span.textContent = text.slice(start, end);
    span.dataset.i = i;
    span.dataset.prob = it.prob;
    span.tabIndex = -1;
    span.style.backgroundColor = shade(it.prob);
    frag.append(span);
    state.spans.push(span);
    at = end;
  });
  if (at < text.length) frag.append(text.slice(at));
  marked.replaceChildren(frag);
  if (state.spans.length) state.spans[0].tabIndex = 0;
  $("unit-h").textContent = unit() === "words" ? "Word" : "Token";
  renderTable();
  remark();
  $("detect").hidden = false;
  $("classify").hidden = true;
}

function renderTable() {
  const r = state.detect.result;
  const list = items();
  const order = list.map((it, i) => i).sort((a, b) => list[b].prob - list[a].prob || a - b);
  const body = document.createDocumentFragment();
  order.forEach((i, rank) => {
    const it = list[i];
    const tr = document.createElement("tr");
    tr.dataset.i = i;
    tr.dataset.prob = it.prob;
    const cells = [String(rank + 1), it.text, pct(it.prob), "", pieces(it, r), it.start + "–" + it.end];
    const classes = ["", "item", "p", "flag", "pieces", "chars"];
    cells.forEach((c, k) => {
      const td = document.createElement(k === 1 ? "th" : "td");
      if (k === 1) td.scope = "row";
      td.className = classes[k];
      td.textContent = c;
      tr.append(td);
    });
    body.append(tr);
  });
  $("table").tBodies[0].replaceChildren(body);
}

// A word's pieces, or for a token the word it belongs to.
function pieces(it, r) {
  if (it.tokens) return it.tokens.map((t) => r.tokens[t].token + " " + pct(r.tokens[t].prob)).join(", ");
  const w = r.words[it.word];
  return "in “" + w.text + "” " + pct(w.prob);
}

// As the server's spans: at or above the threshold, and not punctuation (no letter or digit).
const HAS_LETTER_OR_DIGIT = /[\p{L}\p{N}]/u;
function over(it, t) { return it.prob >= t && HAS_LETTER_OR_DIGIT.test(it.text); }

// Threshold moved: re-mark spans, table and summary from the answer we have; no request.
function remark() {
  const t = Number($("threshold").value);
  $("threshold-out").textContent = t.toFixed(2);
  noteDefault(t);
  if (!state.detect) return;
  const list = items();
  for (const span of state.spans) span.classList.toggle("over", over(list[Number(span.dataset.i)], t));
  for (const tr of $("table").tBodies[0].rows) {
    const o = over(list[Number(tr.dataset.i)], t);
    tr.classList.toggle("over", o);
    tr.cells[3].textContent = o ? "yes" : "no";
  }
  const r = state.detect.result, s = r.summary;
  // As the server's replaced_fraction: punctuation is never a span, so it is not counted as a word either.
  const words = r.words.filter((w) => HAS_LETTER_OR_DIGIT.test(w.text)).length;
  const overWords = r.words.filter((w) => over(w, t)).length;
  const rows = [
    ["Highest", pct(s.max_prob)],
    ["Mean", pct(s.mean_prob)],
    ["Replaced at " + t.toFixed(2), overWords + " of " + words + " words (" +
      pct(words ? overWords / words : 0) + ")"],
    ["Tokens", String(s.num_tokens)],
    ["Windows", String(s.windows)],
  ];
  const dl = $("summary");
  dl.replaceChildren(...rows.map(([k, v]) => {
    const div = document.createElement("div");
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    div.append(dt, dd);
    return div;
  }));
  if (!$("tip").hidden && document.activeElement && document.activeElement.classList.contains("w")) {
    showTip(document.activeElement);
  }
}

// ------------------------------------------------------------------ tooltip and keyboard
function showTip(span) {
  const r = state.detect.result;
  const it = items()[Number(span.dataset.i)];
  const t = Number($("threshold").value);
  const tip = $("tip");
  const head = document.createElement("div");
  const b = document.createElement("b");
  b.textContent = pct(it.prob);
  head.append("“" + it.text + "”: ", b, " replaced" + (over(it, t) ? " (at or above the threshold)" : ""));
  const more = document.createElement("div");
  more.textContent = (it.tokens ? "pieces: " : "token " + it.token + ", ") + pieces(it, r);
  tip.replaceChildren(head, more);
  tip.hidden = false;
  // A screen reader says the focused word's probability with it, as the tip shows it.
  for (const s of state.spans) if (s !== span) s.removeAttribute("aria-describedby");
  span.setAttribute("aria-describedby", "tip");
  const box = span.getBoundingClientRect();
  const w = tip.offsetWidth, h = tip.offsetHeight;
  const left = Math.max(4, Math.min(box.left, window.innerWidth - w - 4));
  const top = box.bottom + 6 + h < window.innerHeight ? box.bottom + 6 : Math.max(4, box.top - h - 6);
  tip.style.left = left + "px";
  tip.style.top = top + "px";
}

function hideTip() { $("tip").hidden = true; }

function moveFocus(from, to) {
  const spans = state.spans;
  if (!spans.length) return;
  to = Math.max(0, Math.min(spans.length - 1, to));
  if (from >= 0) spans[from].tabIndex = -1;
  spans[to].tabIndex = 0;
  spans[to].focus();
}

function onMarkedKey(e) {
  const span = e.target.closest(".w");
  if (!span) return;
  const i = state.spans.indexOf(span);
  // A right-to-left text (dir=auto: Arabic, Hebrew) reads leftwards: the left arrow goes to the next word.
  const ahead = getComputedStyle($("marked")).direction === "rtl" ? "ArrowLeft" : "ArrowRight";
  const back = ahead === "ArrowLeft" ? "ArrowRight" : "ArrowLeft";
  const step = { [ahead]: 1, ArrowDown: 1, [back]: -1, ArrowUp: -1 }[e.key];
  if (step) moveFocus(i, i + step);
  else if (e.key === "Home") moveFocus(i, 0);
  else if (e.key === "End") moveFocus(i, state.spans.length - 1);
  else if (e.key === "Escape") hideTip();
  else return;
  e.preventDefault();
}

// ------------------------------------------------------------------ classifier
// Percentages rounded to 0.1 that still add up to 100.0 (largest remainder).
function roundedPercents(values) {
  const tenths = values.map((v) => v * 1000);
  const floors = tenths.map(Math.floor);
  let left = 1000 - floors.reduce((a, b) => a + b, 0);
  const byRemainder = tenths.map((v, i) => i).sort((a, b) => (tenths[b] - floors[b]) - (tenths[a] - floors[a]));
  for (const i of byRemainder) { if (left <= 0) break; floors[i] += 1; left -= 1; }
  return floors.map((f) => f / 10);
}

function renderClassify(model, result) {
  const entries = Object.entries(result.probs).sort((a, b) => b[1] - a[1]);
  const list = $("bars");
  const note = $("classify-note");
  list.replaceChildren();
  const regression = model.problem_type === "regression";
  const multi = model.problem_type === "multi_label_classification";
  note.textContent = regression ? "A regression model: the raw predicted value." :
    multi ? "Each label is scored on its own: the bars need not add up to 100%." :
    "Probabilities of the labels (they add up to 100%)" + (result.truncated ? "; the text was cut to the model's maximum length." : ".");
  const shown = regression || multi ? entries.map(([, v]) => Math.round(v * 1000) / 10) :
    roundedPercents(entries.map(([, v]) => v));
  entries.forEach(([label, v], k) => {
    const li = document.createElement("li");
    if (label === result.label) li.className = "top";
    const name = document.createElement("span");
    name.className = "label";
    name.textContent = label;
    const track = document.createElement("span");
    track.className = "track";
    track.setAttribute("aria-hidden", "true");
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.display = "block";
    fill.style.width = regression ? "0" : Math.max(0, Math.min(100, 100 * v)) + "%";
    track.append(fill);
    const value = document.createElement("span");
    value.className = "pct";
    value.textContent = regression ? v.toPrecision(4) : shown[k].toFixed(1) + "%";
    li.append(name, track, value);
    list.append(li);
  });
  $("classify").hidden = false;
  $("detect").hidden = true;
}

// ------------------------------------------------------------------ wiring
// A model was picked (or the page loaded): the slider starts at that detector's own default threshold,
// the one /detect uses when a request names none (0.5 for a bundle exported before calibration).
function syncControls() {
  const model = selectedModel();
  const slider = $("threshold");
  slider.disabled = !!model && model.kind !== "detector";
  // Another model's result is not this one's: a result stays only with the model that gave it, and
  // is shown again when that model is chosen again (unless an error has taken its place since).
  if (model && state.scoredWith && state.scoredWith !== model.name) {
    $("detect").hidden = true;
    $("classify").hidden = true;
  } else if (model && state.scoredWith === model.name && $("error").hidden) {
    $(model.kind === "classifier" ? "classify" : "detect").hidden = false;
  }
  const pairs = takesPairs(model);
  $("pair-box").hidden = !pairs;
  if (pairs) {
    const required = model.trained_on === "pairs";
    $("text-pair").setAttribute("aria-required", String(required));
    $("pair-help").textContent = required
      ? "This model was fine-tuned on pairs of texts: it scores the text above together with this one."
      : "Optional: this model may take a pair of texts. Leave it empty to score the text above alone.";
    $("text-label").textContent = "First text";
  } else {
    $("text-label").textContent = "Text";
  }
  if (state.scoredInput !== undefined) markStale(inputNow() !== state.scoredInput);
  const warnings = (model && model.warnings) || [];
  $("model-warnings").textContent = warnings.length ? "Note on this model: " + warnings.join(" ") : "";
  $("model-warnings").hidden = !warnings.length;
  if (model && model.kind === "detector" && typeof model.threshold === "number") {
    slider.value = String(model.threshold);
    remark();
  }
}

// Says whether the slider is at the model's own threshold, and which that is once moved away from it.
function noteDefault(t) {
  const model = selectedModel();
  const note = $("threshold-note");
  if (!model || model.kind !== "detector" || typeof model.threshold !== "number") { note.textContent = ""; return; }
  const suffix = model.calibrated ? "" : ", not calibrated";
  note.textContent = Math.abs(t - model.threshold) < 0.005 ? "model default" + (suffix ? " (" + suffix.slice(2) + ")" : "") :
    "(model default " + model.threshold.toFixed(2) + suffix + ")";
}

// Results of a text since edited are kept, marked as such, until the next Check.
function markStale(stale) {
  for (const note of document.querySelectorAll(".stale-note")) note.hidden = !stale;
  for (const id of ["detect", "classify"]) $(id).classList.toggle("stale", stale);
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  for (const id of ["text", "text-pair"]) {
    $(id).addEventListener("input", () => {
      if (state.scoredInput !== undefined) markStale(inputNow() !== state.scoredInput);
    });
    $(id).addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
    });
  }
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const given = $("key").value.trim();
    if (!/^[\x20-\x7e]*$/.test(given)) {
      // The browser refuses such a header before anything is sent: not a server it could not reach.
      askForKey("An API key holds printable ASCII only: this one has another character (a pasted space or "
        + "quote?). Paste the key again.");
      return;
    }
    state.apiKey = given || null;
    if (await loadModels()) {
      syncControls(); // the slider starts at the model's threshold, as it does without a key
      $("key-form").hidden = true;
      $("key-error").hidden = true;
      $("key").removeAttribute("aria-invalid");
      $("key").value = ""; // kept in the script's state only, not in the page for anything that reads it
      $("status").textContent = "Key accepted.";
      $("text").focus();
    }
  });
  $("model").addEventListener("change", syncControls);
  $("threshold").addEventListener("input", remark);
  for (const radio of document.querySelectorAll("input[name=unit]")) {
    radio.addEventListener("change", () => { if (state.detect) renderDetect(); hideTip(); });
  }
  for (const radio of document.querySelectorAll("input[name=view]")) {
    radio.addEventListener("change", () => {
      const table = document.querySelector("input[name=view]:checked").value === "table";
      $("table-view").hidden = !table;
      $("text-view").hidden = table;
      hideTip();
    });
  }
  const marked = $("marked");
  marked.addEventListener("mouseover", (e) => { const s = e.target.closest(".w"); if (s) showTip(s); });
  marked.addEventListener("mouseleave", hideTip);
  marked.addEventListener("focusin", (e) => { const s = e.target.closest(".w"); if (s) showTip(s); });
  marked.addEventListener("focusout", hideTip);
  marked.addEventListener("keydown", onMarkedKey);
  marked.addEventListener("scroll", hideTip);
  // The tip is placed in the window: once the page scrolls or resizes, it would point at nothing.
  window.addEventListener("scroll", hideTip, { passive: true });
  window.addEventListener("resize", hideTip);
  loadModels().then(syncControls);
});
