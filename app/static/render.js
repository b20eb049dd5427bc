// Draws an answer: the shaded text, its table and summary, the tooltip and the arrow keys over the words
// (/detect), and a classifier's bars (/classify). User text is only ever inserted with textContent.

import { $, state, selectedModel } from "./state.js";

// ------------------------------------------------------------------ detector
// A probability in percent, to 0.1. Where that rounds to 100.0% or 0.0% but the probability is not 1 or 0,
// it says so: a word at 0.9996 is not certain.
export function pct(p) {
  return percentOf(Number((100 * p).toFixed(1)), p);
}
// A percentage rounded to 0.1 as the page says it: 0.9996 is not "100.0%", nor 0.0004 "0.0%".
function percentOf(rounded, p) {
  if (rounded === 100 && p < 1) return ">99.9%";
  if (rounded === 0 && p > 0) return "<0.1%";
  return rounded.toFixed(1) + "%";
}
// How long the server took (its x-total-time, in ms): a fast answer is not "0 ms".
export function took(ms) {
  const n = Number(ms);
  return n < 1 ? "under 1 ms" : Math.round(n) + " ms";
}
// sqrt: a weak detector's 5-15% stays visible while the order of the shades is the order of the probabilities.
// At most 0.75: the darkest shade keeps the text at 5:1 contrast (WCAG AA; 0.85 gave 4.3:1).
const shade = (p) => "rgba(var(--hot), " + (0.75 * Math.sqrt(Math.min(1, Math.max(0, p)))).toFixed(4) + ")";

function unit() { return document.querySelector("input[name=unit]:checked").value; }
function items() {
  const r = state.detect.result;
  return unit() === "words" ? r.words : r.tokens;
}

export function renderDetect() {
  const { text, cps } = state.detect;
  const marked = $("marked");
  const list = items();
  // Each paragraph a block with a direction of its own (dir=auto): an Arabic line after an English one reads
  // right to left, as in the text box (dir=auto took one direction for the whole box, from its first
  // letter). Not `unicode-bidi: plaintext` on the box: Chromium then turned the brackets of a later
  // paragraph around ("English )with Arabic (مرحبا here."). The blocks are the line breaks, so a copy of the
  // text has one line break where the text has one; an empty line holds a <br>, and a last one is left out.
  const paras = [];
  let para;
  const newPara = () => {
    para = document.createElement("div");
    para.className = "para";
    para.dir = "auto";
    paras.push(para);
  };
  const put = (s) => s.split(/\r?\n/).forEach((line, k) => {
    if (k) newPara();
    if (line) para.append(line);
  });
  newPara();
  state.spans = [];
  let at = 0; // UTF-16 index written so far
  let lastStart = 0; // where the last span starts
  list.forEach((it, i) => {
    const start = cps[it.start], end = cps[it.end];
    if (start < at) {
      // Pieces of one character (a Hangul syllable is several) share its offsets: it shows the most probable.
      // Tokens' offsets only go forward but may overlap; one reaching past the last span takes that span
      // on to its end, so no character of it is left outside every span. (Words never share a character.)
      const last = state.spans[state.spans.length - 1];
      if (last && end > at) {
        last.textContent = text.slice(lastStart, end);
        at = end;
      }
      if (last && it.prob > Number(last.dataset.prob)) {
        last.dataset.i = i;
        last.dataset.prob = it.prob;
        last.style.backgroundColor = shade(it.prob);
      }
      return;
    }
    if (start > at) put(text.slice(at, start));
    const span = document.createElement("span");
    span.className = "w";
    span.textContent = text.slice(start, end);
    span.dataset.i = i;
    span.dataset.prob = it.prob;
    span.tabIndex = -1;
    span.style.backgroundColor = shade(it.prob);
    para.append(span);
    state.spans.push(span);
    lastStart = start;
    at = end;
  });
  if (at < text.length) put(text.slice(at));
  if (paras.length > 1 && !para.firstChild) paras.pop();
  for (const p of paras) if (!p.firstChild) p.append(document.createElement("br"));
  marked.replaceChildren(...paras);
  if (state.spans.length) state.spans[0].tabIndex = 0;
  const words = unit() === "words";
  $("unit-h").textContent = words ? "Word" : "Token";
  // A token's row holds the word it is part of, not pieces of its own (pieces()).
  $("pieces-h").textContent = words ? "Pieces" : "In word";
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
      td.append(...(Array.isArray(c) ? c : [c]));
      tr.append(td);
    });
    body.append(tr);
  });
  $("table").tBodies[0].replaceChildren(body);
}

// A word's pieces, or for a token the word it belongs to: nodes, each piece of text isolated.
function pieces(it, r) {
  if (it.tokens) {
    return it.tokens.flatMap((t, k) => [...(k ? [", "] : []), isolated(r.tokens[t].token), " " + pct(r.tokens[t].prob)]);
  }
  const w = r.words[it.word];
  return ["in “", isolated(w.text), "” " + pct(w.prob)];
}

// The text's own words and pieces kept apart from the numbers and marks around them (<bdi>): Arabic or
// Hebrew pieces ran together with their probabilities and read in another order ("<0.1%" drawn as ">"),
// and a U+202E in a word reversed the rest of the line ("1.2% replaced" read as 2.1).
function isolated(text) {
  const b = document.createElement("bdi");
  b.textContent = text;
  return b;
}

// As the server's spans: at or above the threshold, and not punctuation (no letter or digit). The browser's
// Unicode tables, not the server's: they differ only on letters newer than the server's Python knows (README).
const HAS_LETTER_OR_DIGIT = /[\p{L}\p{N}]/u;
function over(it, t) { return it.prob >= t && HAS_LETTER_OR_DIGIT.test(it.text); }

// ------------------------------------------------------------------ threshold
// The slider's threshold: the model's own exactly while it is there (a bundle's may be 0.575, between the
// 0.01 steps a user moves it by), else where the user put it.
export function thresholdNow() {
  const t = Number($("threshold").value);
  return atDefault(t) ? selectedModel().threshold : t;
}

// The chosen detector's own threshold (the one /detect uses when a request names none) is `t`.
export function atDefault(t) {
  const model = selectedModel();
  return !!model && model.kind === "detector" && typeof model.threshold === "number"
    && Math.abs(t - model.threshold) < 1e-9;
}

// As a user would type it: two decimals, or all of them for a threshold off that grid (0.575, not 0.58).
export function thresholdText(t) {
  const two = t.toFixed(2);
  return Number(two) === t ? two : String(t);
}

// The user moved the slider (step="any", so that it can start at 0.575): the threshold goes on the 0.01
// grid. A tie goes back toward where it was, so that an arrow key from 0.575 (to 0.585) reaches 0.58.
let lastThreshold = null;
export function thresholdMoved() {
  const slider = $("threshold");
  const v = Number(slider.value);
  const was = lastThreshold === null ? v : lastThreshold;
  slider.value = String(Math.round(100 * v + (v > was ? -1e-6 : 1e-6)) / 100);
  remark();
}

// Threshold moved: re-mark spans, table and summary from the answer we have; no request.
export function remark() {
  const t = thresholdNow();
  lastThreshold = t;
  $("threshold-out").textContent = thresholdText(t);
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
    ["Replaced at " + thresholdText(t), overWords + " of " + words + " words (" +
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
  if (state.said && !$("detect").hidden) $("status").textContent = state.said(); // not of a result hidden
}

// What a screen reader hears of an answer (main.js puts it in the status line, a polite live region): the
// words at or above the threshold, the first few named. The shading and the table are seen, not said.
const NAMED = 5;
export function detectSaid() {
  const t = thresholdNow();
  const words = state.detect.result.words;
  const counted = words.filter((w) => HAS_LETTER_OR_DIGIT.test(w.text)).length;
  const hits = words.filter((w) => over(w, t)).map((w) => w.text);
  const more = hits.length > NAMED ? " and " + (hits.length - NAMED) + " more" : "";
  return hits.length + " of " + counted + " words at or above " + thresholdText(t)
    + (hits.length ? ": " + hits.slice(0, NAMED).join(", ") + more : "") + ".";
}

// Says whether the slider is at the model's own threshold, and which that is once moved away from it.
function noteDefault(t) {
  const model = selectedModel();
  const note = $("threshold-note");
  if (!model || model.kind !== "detector" || typeof model.threshold !== "number") { note.textContent = ""; return; }
  const suffix = model.calibrated ? "" : ", not calibrated";
  note.textContent = atDefault(t) ? "model default" + (suffix ? " (" + suffix.slice(2) + ")" : "") :
    "(model default " + thresholdText(model.threshold) + suffix + ")";
}

// ------------------------------------------------------------------ tooltip and keyboard
let tipFor = null; // the word the tip was last shown for
export function showTip(span) {
  tipFor = span;
  const r = state.detect.result;
  const it = items()[Number(span.dataset.i)];
  const t = thresholdNow();
  const tip = $("tip");
  const head = document.createElement("div");
  const b = document.createElement("b");
  b.textContent = pct(it.prob);
  head.append("“", isolated(it.text), "”: ", b, " replaced" + (over(it, t) ? " (at or above the threshold)" : ""));
  const more = document.createElement("div");
  more.append(it.tokens ? "pieces: " : "token " + it.token + ", ", ...pieces(it, r));
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

export function hideTip() { $("tip").hidden = true; }

// The pointer moved onto a word: its tip. On a move, not on mouseover: a box scrolled under a still pointer
// (End, Home: the focused word scrolled to) fires a mouseover on the word come under it, and that word's tip
// took the place of the focused word's.
export function hoverTip(e) {
  const span = e.target.closest(".w");
  if (span && (span !== tipFor || $("tip").hidden)) showTip(span);
}

// The page or the text's box scrolled, or the window resized: the tip would point at nothing. A focused
// word's tip follows it while it is in view: focusing a word scrolls to it (End, Home, an arrow key at the
// box's edge), and the tip the focus had just shown went at once. Any other tip (a hovered word's) goes.
export function followTip() {
  const span = document.activeElement;
  if ($("tip").hidden || span !== tipFor || !state.spans.includes(span)) { hideTip(); return; }
  const box = span.getBoundingClientRect(), view = $("marked").getBoundingClientRect();
  const inView = box.bottom > Math.max(0, view.top) && box.top < Math.min(window.innerHeight, view.bottom);
  if (inView) showTip(span);
  else hideTip();
}

function moveFocus(from, to) {
  const spans = state.spans;
  if (!spans.length) return;
  to = Math.max(0, Math.min(spans.length - 1, to));
  if (from >= 0) spans[from].tabIndex = -1;
  spans[to].tabIndex = 0;
  spans[to].focus();
}

// The arrow keys go where they point: to the nearest word on that side of this one on its line, wherever
// it is in the text. Bidirectional text lays words out in another order than they are written: an Arabic
// phrase in an English line reads leftwards, a lone English name in Arabic rightwards (by the word's own
// script, or by its neighbours in the text alone, the arrows went the wrong way or bounced between two
// words). At a line's end the paragraph's direction says which way reads on.
const LINE_REACH = 200; // words looked at on either side in the text: more than a line holds
function sideways(i, leftwards) {
  const spans = state.spans, here = spans[i].getBoundingClientRect();
  const middle = here.top + here.height / 2, centre = here.left + here.width / 2;
  let nearest = null, gap = Infinity;
  for (let j = Math.max(0, i - LINE_REACH); j < Math.min(spans.length, i + LINE_REACH + 1); j++) {
    const r = spans[j].getBoundingClientRect();
    if (j === i || Math.abs(r.top + r.height / 2 - middle) >= here.height / 2) continue;
    const d = leftwards ? centre - (r.left + r.width / 2) : r.left + r.width / 2 - centre;
    if (d > 0 && d < gap) [nearest, gap] = [j, d];
  }
  if (nearest !== null) return nearest - i;
  return leftwards === (getComputedStyle(spans[i]).direction === "rtl") ? 1 : -1;
}

export function onMarkedKey(e) {
  const span = e.target.closest(".w");
  if (!span) return;
  const i = state.spans.indexOf(span);
  const sideKey = e.key === "ArrowLeft" || e.key === "ArrowRight";
  const step = sideKey ? sideways(i, e.key === "ArrowLeft") : { ArrowDown: 1, ArrowUp: -1 }[e.key];
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

export function renderClassify(model, result) {
  const entries = Object.entries(result.probs).sort((a, b) => b[1] - a[1]);
  const list = $("bars");
  const note = $("classify-note");
  list.replaceChildren();
  const regression = model.problem_type === "regression";
  const multi = model.problem_type === "multi_label_classification";
  // Whatever the model's kind, a text cut to its maximum length is said: the scores are of its start.
  note.textContent = (regression ? "A regression model: the raw predicted value" :
    multi ? "Each label is scored on its own: the bars need not add up to 100%" :
    "Probabilities of the labels (they add up to 100%)") +
    (result.truncated ? "; the text was cut to the model's maximum length." : ".");
  const shown = regression || multi ? entries.map(([, v]) => Math.round(v * 1000) / 10) :
    roundedPercents(entries.map(([, v]) => v));
  // What a screen reader hears of it (main.js: the status line): the top label and its value.
  const said = !entries.length ? "" :
    entries[0][0] + ", " + (regression ? entries[0][1].toPrecision(4) : percentOf(shown[0], entries[0][1])) + ".";
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
    value.textContent = regression ? v.toPrecision(4) : percentOf(shown[k], v);
    li.append(name, track, value);
    list.append(li);
  });
  $("classify").hidden = false;
  $("detect").hidden = true;
  return said;
}
