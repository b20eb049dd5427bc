// What the page knows: the models the server serves, the last answer, and the key. Shared by the page's
// other modules; only they change it.

export const $ = (id) => document.getElementById(id);
export const state = {
  apiKey: null, // in this tab's memory only: never written to storage
  models: [],
  detect: null, // {text, result, cps}: the last /detect answer and the text it was for
  spans: [], // rendered span elements of the text view, in text order
  scoredInput: null, // the input the shown result was scored from (inputOf): an edit since marks it stale
  scoredWith: null, // the name of the model that gave the shown result
  errorFor: null, // the name of the model whose Check gave the error shown (null: no model's, or none)
  said: null, // () => the status line for the shown answer (/detect's said again as the slider moves), or null
};

export function selectedModel() { return state.models.find((m) => m.name === $("model").value); }

// /classify takes `pairs` for a model fine-tuned on them, and for one whose training is not recorded (an
// imported model takes either); /models' trained_on says which.
export function takesPairs(model) { return !!model && model.kind === "classifier" && model.trained_on !== "texts"; }
