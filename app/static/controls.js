// The form's controls: the list of models, and what follows the chosen model (the threshold slider, the
// second text box, the notes on the model, whether a shown result is still the text's).

import { $, state, selectedModel, takesPairs } from "./state.js";
import { ApiError, REPLACED, api, clearError, showError } from "./api.js";
import { remark } from "./render.js";

// ------------------------------------------------------------------ models
// `signal`: a Check's (main.js), which a newer Check or its time limit aborts.
export async function loadModels(signal) {
  const select = $("model");
  const chosen = selectedModel(); // before the list is replaced: the model the user has on screen
  try {
    const { data } = await api("models", undefined, signal);
    state.models = data.models;
    showBroken(data.broken || {});
  } catch (err) {
    if (err === REPLACED) return false;
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
  // The model chosen stays chosen while the server serves it (the list loaded again after a key was given, or
  // after a model it no longer serves): it was set back to the default, and its result hidden. Else the
  // default detector, else the default classifier (a server of classifiers only), else the first detector
  // (the default one broken): as the API picks for a request that names no model.
  const first = (chosen && state.models.find((m) => m.name === chosen.name)) ||
    state.models.find((m) => m.kind === "detector" && m.default) ||
    state.models.find((m) => m.default) || state.models.find((m) => m.kind === "detector") || state.models[0];
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

// ------------------------------------------------------------------ the chosen model
// A model was picked (or the page loaded): the slider starts at that detector's own default threshold,
// the one /detect uses when a request names none (0.5 for a bundle exported before calibration).
let sliderFor = null; // the detector (and its threshold) the slider was last set for
export function syncControls() {
  const model = selectedModel();
  const slider = $("threshold");
  slider.disabled = !!model && model.kind !== "detector";
  // Another model's error is not this one's either (a classifier's 422 said "second text box" under a
  // detector): it goes, and this model's last result shows again.
  if (model && state.errorFor && state.errorFor !== model.name) clearError();
  // Another model's result is not this one's: a result stays only with the model that gave it, and
  // is shown again when that model is chosen again (unless an error of its own has taken its place since).
  // The status line says that result, and goes and comes back with it ("positive, 99.4%" stayed beside the
  // detector's empty page).
  if (model && state.scoredWith && state.scoredWith !== model.name) {
    $("detect").hidden = true;
    $("classify").hidden = true;
    if (state.said && $("status").textContent === state.said()) $("status").textContent = "";
  } else if (model && state.scoredWith === model.name && $("error").hidden) {
    $(model.kind === "classifier" ? "classify" : "detect").hidden = false;
    if (state.said && !$("status").textContent) $("status").textContent = state.said();
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
  markStaleIfEdited();
  const warnings = (model && model.warnings) || [];
  $("model-warnings").textContent = warnings.length ? "Note on this model: " + warnings.join(" ") : "";
  $("model-warnings").hidden = !warnings.length;
  // A new model, or a new threshold of its own: the slider starts there. The same model again (the list
  // loaded again after a key was given) keeps it where the user left it.
  const own = model && model.kind === "detector" && typeof model.threshold === "number"
    ? model.name + "\u0000" + model.threshold : null;
  if (own && own !== sliderFor) {
    slider.value = String(model.threshold);
    remark();
  }
  sliderFor = own;
}

// Results of a text since edited are kept, marked as such, until the next Check.
export function markStaleIfEdited() {
  if (state.scoredInput !== null) markStale(inputNow() !== state.scoredInput);
}

function markStale(stale) {
  for (const note of document.querySelectorAll(".stale-note")) note.hidden = !stale;
  for (const id of ["detect", "classify"]) $(id).classList.toggle("stale", stale);
}

// What a result is scored from: the text, and the second text where the model takes one.
export function inputOf(model, text, pair) { return text + (takesPairs(model) ? "\u0000" + pair : ""); }
export function inputNow() { return inputOf(selectedModel(), $("text").value, $("text-pair").value); }
