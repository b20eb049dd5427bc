// The server's API as this page calls it (relative URLs, same origin), and what the page shows when a call
// fails: the server's message, a line on what to do about it, or the key form for a 401.

import { $, state, selectedModel, takesPairs } from "./state.js";

// ------------------------------------------------------------------ HTTP
export class ApiError extends Error {
  constructor(status, type, message, field, retryAfter) {
    super(message);
    Object.assign(this, { status, type, field, retryAfter });
  }
}

// A request given up for a newer Check (main.js): not an error, and nothing to show for it.
export const REPLACED = new ApiError(0, "replaced", "A newer Check replaced this one.", null);

// `signal` aborts the request; its reason is what is thrown then (REPLACED, or the Check's time limit).
export async function api(path, body, signal) {
  const headers = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (state.apiKey) headers.authorization = "Bearer " + state.apiKey;
  let res;
  try {
    res = await fetch(path, { method: body === undefined ? "GET" : "POST", headers, signal,
      body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    if (signal && signal.aborted) throw signal.reason;
    throw new ApiError(0, "network", "Could not reach the server at " + location.host + " (" + e.message + ").", null);
  }
  let data = null;
  try { data = await res.json(); } catch (e) { /* not JSON: reported below */ }
  if (signal && signal.aborted) throw signal.reason; // mid-body: not a body that is not JSON
  if (!res.ok) {
    const err = data && data.error;
    throw new ApiError(res.status, err ? err.type : "http_" + res.status,
      err ? err.message : "The server answered " + res.status + " " + res.statusText + ".",
      err ? err.field : null, res.headers.get("retry-after"));
  }
  if (data === null) throw new ApiError(res.status, "bad_response", "The server's answer was not JSON.", null);
  return { data, ms: res.headers.get("x-total-time") };
}

// `model`: the name of the model whose Check this is, if any: choosing another model clears it (controls.js).
export function showError(err, model = null) {
  if (err === REPLACED) return;
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
  state.errorFor = model;
  $("detect").hidden = true;
  $("classify").hidden = true;
  // On a phone the box can be below the fold, under the text box and its keyboard.
  box.scrollIntoView({ block: "nearest" });
}

// What a user of this page can do about an error. The server's message is written for API clients and
// operators (it names flags such as --max-text-tokens); this line is written for the person at the page.
function advice(err) {
  const wait = err.retryAfter ? "in " + err.retryAfter + " s" : "in a moment";
  if (err.type === "timeout") {
    return "It may be stopped, or busy with a long queue: press Check to send the text again. If it still does "
      + "not answer, whoever runs the server can find why in its log.";
  }
  // This page mends what JSON cannot carry (main.js): such a body came from an older copy of the page, or
  // was changed on the way.
  if (err.type === "invalid_json") {
    return "The server could not read what the page sent: reload the page and press Check again. If it fails "
      + "again, whoever runs the server can find why in its log.";
  }
  // A 200 that is not the server's JSON: something between the page and the server answered for it (a
  // captive portal's or a proxy's login page, a cached page).
  if (err.type === "bad_response") {
    return "The answer was not the server's JSON: a proxy or a login page between this device and the server "
      + "may have answered instead (sign in to the network, or open the server's address directly), then "
      + "press Check again.";
  }
  if (err.type === "network") {
    return "Check that the server is running and that this device can reach it, then press Check to try again.";
  }
  if (err.type === "empty_text") {
    // The box as it is labelled: "Second text", or "First text" beside it (a model that takes pairs).
    const second = /^pairs\[\d+\]\[1\]$/.test(err.field || "");
    const box = second ? "second text box" : takesPairs(selectedModel()) ? "first text box" : "text box";
    return "Type or paste some text into the " + box + ", then press Check.";
  }
  if (err.type === "unknown_model" || err.type === "wrong_model_kind") {
    return "The server's models have changed since the page opened: the list now shows those it serves. "
      + "Pick one and press Check.";
  }
  if (modelBroken(err)) {
    return "The server could not load this model, so it cannot score with it: the list now shows the models "
      + "it serves. Pick another, or ask whoever runs the server to fix or replace it.";
  }
  if (err.status === 413) return "Shorten the text, or check it a part at a time.";
  // A 503 with Retry-After is a full queue, a model still loading or a server draining: waiting helps.
  if (err.status === 429 || (err.status === 503 && err.retryAfter)) {
    return "The server is busy: press Check again " + wait + ".";
  }
  if (err.status === 503) return "The server is not scoring now (it is stopping): press Check again once it is back.";
  if (err.status === 408) return "The text took too long to reach the server: press Check to send it again.";
  if (err.status >= 500) return "Press Check to try again; if it fails again, the server's log says why.";
  return "";
}

// The model the page chose is one the server found broken at start-up (a 503 naming the model field).
function modelBroken(err) { return err.status === 503 && err.field === "model"; }

// The server no longer serves the chosen model as the page knows it: its list of models is out of date.
export function modelsChanged(err) {
  return err.type === "unknown_model" || err.type === "wrong_model_kind" || modelBroken(err);
}

export function clearError() {
  $("error").hidden = true;
  state.errorFor = null;
}

// ------------------------------------------------------------------ the key
// The key form, with `problem` (what is wrong with the key given, and what to do) under the box, or none.
export function askForKey(problem) {
  $("key-error").textContent = problem;
  $("key-error").hidden = !problem;
  if (problem) $("key").setAttribute("aria-invalid", "true");
  else $("key").removeAttribute("aria-invalid");
  $("key-form").hidden = false;
  $("key").focus();
}
