// What to tell the user per error class: the class itself, plus a one-line hint.

const HINTS = {
  auth: "Check the API key, or create one with: botctl keys create NAME",
  bad_request: "Shorten or fix the message and send it again.",
  too_large: "The message is too big: send a shorter one.",
  context_overflow: "This conversation is too long for the model: start a new conversation.",
  engine_unavailable: "The model engine is down or still starting: try again in a moment.",
  model_not_found: "The configured model is not being served: check [engine] model.",
  oom: "The engine ran out of memory: try again in a moment, or with a shorter message.",
  network: "Cannot reach the service: is `make run` still running?",
  rate_limited: "Too many messages right now: wait a little and try again.",
  timeout: "The engine took too long: try again.",
  upstream_protocol: "The engine answered in an unexpected way: try again.",
  delivery: "The reply could not be delivered completely.",
  cancelled: "You stopped this reply.",
  not_found: "It no longer exists (or belongs to another key).",
  internal: "Something broke on our side: the server log has the details.",
};

export function hintFor(errorClass) {
  return HINTS[errorClass] || "Unexpected error: the server log has the details.";
}

// An element saying "<class>: <message> — <hint>", for the banner and for a failed reply.
export function renderError(errorClass, message) {
  const box = document.createElement("p");
  box.className = "error-line";
  const name = document.createElement("strong");
  name.className = "error-class";
  name.textContent = errorClass;
  const text = document.createElement("span");
  text.className = "error-message";
  text.textContent = ` ${message} `;
  const hint = document.createElement("span");
  hint.className = "hint";
  hint.textContent = hintFor(errorClass);
  box.append(name, text, hint);
  return box;
}
