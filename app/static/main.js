// The page at `/`: calls the server's own /models, /detect and /classify (relative URLs, same origin).
// No framework, no build step. User text is only ever inserted with textContent.
// This module checks a text and wires the page's events; state.js, api.js, render.js and controls.js do
// the rest. ES modules from this server, loaded by index.html: nothing to build.

import { $, state, selectedModel, takesPairs } from "./state.js";
import { ApiError, REPLACED, api, askForKey, clearError, modelsChanged, showError } from "./api.js";
import {
  atDefault, detectSaid, followTip, hideTip, hoverTip, onMarkedKey, renderClassify, renderDetect, showTip,
  remark, thresholdMoved, thresholdNow, took,
} from "./render.js";
import { inputOf, loadModels, markStaleIfEdited, syncControls } from "./controls.js";

// Every module loaded (else none of this runs): the note that they did not goes (index.html).
$("load-failed").remove();

// ------------------------------------------------------------------ scoring
// How long a Check waits for an answer before it says the server did not answer. The server sets no limit
// of its own on an admitted request: it gives a client --read-timeout-s (30 s by default) to send one,
// lets a lone one wait under a minute (--max-wait-ms) for others to batch with, and scores a text at its
// token limit (--max-text-tokens, 8,192) in about 2 s on two busy CPU cores. 120 s is past all of these
// together, so a healthy server is not cut off; only a long queue ahead of the text, or a server that is
// stopped or hung, takes longer, and a Check pressed again gives up on it sooner.
const ANSWER_LIMIT_S = 120;
// After this long the status says the server is slow, and that Check sends the text again.
const SLOW_S = 10;
let checking = null; // the AbortController of the Check under way: a newer Check aborts it

async function run() {
  // A Check pressed while another is under way replaces it: the text or the model may have changed since,
  // or the server may not be answering (it was ignored, and the running one's answer then dropped as
  // another model's: nothing shown, no word). The request given up is aborted; the server counts it as
  // a 499.
  if (checking) checking.abort(REPLACED);
  const check = new AbortController();
  checking = check;
  const limit = setTimeout(() => check.abort(new ApiError(0, "timeout",
    "The server did not answer in " + ANSWER_LIMIT_S + " s.", null)), ANSWER_LIMIT_S * 1000);
  const slow = setTimeout(() => {
    if (checking === check) $("status").textContent = "Still waiting for the server… press Check to send it again.";
  }, SLOW_S * 1000);
  const button = $("run");
  // Not disabled, nor aria-disabled: pressed again it sends the text again (and a disabled button loses
  // the keyboard focus, so the next Tab starts over).
  button.classList.add("busy");
  clearError(); // the last Check's error is not this one's
  state.said = null; // the status line is this Check's now
  $("status").textContent = "Scoring…";
  try {
    // The list of models did not load (the server was down or busy when the page opened): try again now.
    if (!state.models.length) {
      $("status").textContent = "Loading the models…";
      const loaded = await loadModels(check.signal);
      if (check.signal.reason === REPLACED) return;
      if (!loaded) { $("status").textContent = ""; return; }
      syncControls();
      $("status").textContent = "Scoring…";
    }
    await score(selectedModel(), check.signal);
  } finally {
    clearTimeout(limit);
    clearTimeout(slow);
    if (checking === check) {
      checking = null;
      button.classList.remove("busy");
    }
  }
}

async function score(model, signal) {
  const typed = $("text").value;
  const typedPair = takesPairs(model) ? $("text-pair").value : "";
  const text = wellFormed(typed), pair = wellFormed(typedPair);
  const mended = text !== typed || pair !== typedPair;
  try {
    if (model.kind === "classifier") {
      // A model fine-tuned on pairs gets one; one that may take either gets one when a second text is given.
      const input = model.trained_on === "pairs" || pair.trim() ? { pairs: [[text, pair]] } : { text };
      const { data, ms } = await api("classify", { model: model.name, ...input }, signal);
      if (switchedAway(model)) return;
      clearError();
      const said = renderClassify(model, data.results[0]);
      state.said = () => done(ms, mended, said);
      $("status").textContent = state.said();
    } else {
      // At the model's own threshold the request names none: the server uses the model's, as it does for
      // any client that names none (the slider once sent 0.58 for a bundle's 0.575).
      const t = thresholdNow();
      const threshold = atDefault(t) ? {} : { threshold: t };
      const { data, ms } = await api("detect", { model: model.name, text, ...threshold, return: "both" }, signal);
      if (switchedAway(model)) return;
      clearError();
      // Named none and answered at another: the server was started again with a re-exported bundle. The
      // slider takes the model's new threshold, or the page would underline other words than the answer;
      // unless the user moved it while this scored, which stays where they put it.
      if (!("threshold" in threshold) && typeof data.threshold === "number" && data.threshold !== model.threshold) {
        const moved = atDefault(Number($("threshold").value)) ? null : $("threshold").value;
        model.threshold = data.threshold;
        syncControls();
        if (moved !== null) {
          $("threshold").value = moved;
          remark();
        }
      }
      state.detect = { text, result: data.results[0], cps: codePointIndex(text) };
      renderDetect();
      // Said again as the slider moves (render.js remark): a count at 0.58 read beside a summary at 0.01.
      state.said = () => done(ms, mended, detectSaid());
      $("status").textContent = state.said();
    }
    // What was sent, not what the boxes hold now: an edit made while it scored leaves the result stale.
    // (As typed: a mended character is not an edit.)
    state.scoredInput = inputOf(model, typed, typedPair);
    state.scoredWith = model.name;
    markStaleIfEdited();
    // The result may start below the fold (a laptop's 800 px): bring its top into view.
    $(model.kind === "classifier" ? "classify" : "detect").scrollIntoView({ block: "nearest" });
  } catch (err) {
    if (err === REPLACED) return; // the newer Check says what happens
    $("status").textContent = "";
    // The server was started again with other bundles, or found this one broken: the list is out of date.
    if (modelsChanged(err) && await loadModels()) syncControls();
    // A Check pressed while the list loaded has its own say.
    if (signal.reason !== REPLACED) showError(err, model.name);
  }
}

// Another model was chosen while this one scored, and Check not pressed again: its answer is not the
// chosen model's, and is not shown. The status says so, or the page would just go quiet.
function switchedAway(model) {
  const now = selectedModel();
  if (now && now.name === model.name) return false;
  $("status").textContent = "Another model was chosen while " + model.name + " scored: press Check to score "
    + "with " + (now ? now.name : "it") + ".";
  return true;
}

// The status line is a live region: it says the answer (`said`), not only that one came.
function done(ms, mended, said) {
  return (ms ? "Scored in " + took(ms) + "." : "Scored.") + (said ? " " + said : "")
    + (mended ? " A broken character (half of a UTF-16 surrogate pair) was scored as \uFFFD." : "");
}

// A lone UTF-16 surrogate (half of a pair: a bad paste, a script) is no character, and the server refuses
// the JSON escape that JSON.stringify writes for it (400 invalid_json). U+FFFD takes its place: one UTF-16
// unit and one code point, as the lone half is, so the answer's offsets still fall on the typed text.
const PAIR_OR_LONE = /[\uD800-\uDBFF][\uDC00-\uDFFF]|[\uD800-\uDFFF]/g;
function wellFormed(s) { return s.replace(PAIR_OR_LONE, (m) => (m.length === 2 ? m : "\uFFFD")); }

// The API's offsets count code points (Python str indices); JS strings index UTF-16 units.
function codePointIndex(text) {
  const idx = [0];
  let u = 0;
  for (const ch of text) { u += ch.length; idx.push(u); }
  return idx;
}

// ------------------------------------------------------------------ wiring
document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  for (const id of ["text", "text-pair"]) {
    $(id).addEventListener("input", () => {
      markStaleIfEdited();
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
      syncControls(); // the model chosen before is kept where the server still serves it (controls.js)
      $("key-form").hidden = true;
      $("key-error").hidden = true;
      $("key").removeAttribute("aria-invalid");
      $("key").value = ""; // kept in the script's state only, not in the page for anything that reads it
      $("status").textContent = "Key accepted.";
      $("text").focus();
    }
  });
  $("model").addEventListener("change", syncControls);
  $("threshold").addEventListener("input", thresholdMoved);
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
  marked.addEventListener("mousemove", hoverTip);
  marked.addEventListener("mouseleave", hideTip);
  marked.addEventListener("focusin", (e) => { const s = e.target.closest(".w"); if (s) showTip(s); });
  marked.addEventListener("focusout", hideTip);
  marked.addEventListener("keydown", onMarkedKey);
  // The tip is placed in the window: once the page scrolls or resizes, it would point at nothing. A focused
  // word's follows it (render.js).
  marked.addEventListener("scroll", followTip, { passive: true });
  window.addEventListener("scroll", followTip, { passive: true });
  window.addEventListener("resize", followTip);
  loadModels().then(syncControls);
});
