// The chat page: sign in, show the conversation, stream replies, keep it across reloads.

import { Api, ApiError } from "./api.js";
import { renderError } from "./errors.js";
import { renderMarkdown } from "./markdown.js";
import { chosenPersona, loadPersonas, personaOpen, showPersona } from "./personas.js";
import { renderTiming } from "./timing.js";

const KEY_STORAGE = "bot.apiKey";
const CONVERSATION_STORAGE = "bot.conversationId";
const $ = (id) => document.getElementById(id);

let api = null;
let conversationId = null;
let activeTurnId = null;
let owner = "";

function randomId(prefix) {
  // getRandomValues works on plain http too (randomUUID needs a secure context).
  const bytes = crypto.getRandomValues(new Uint8Array(9));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// `make run` opens /#key=...: the fragment never reaches the server; drop it from the
// address bar (and so from history and bookmarks) as soon as the key is stored.
function takeKeyFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("key");
  if (key) localStorage.setItem(KEY_STORAGE, key);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
}

function showError(errorClass, message) {
  const box = $("error");
  box.replaceChildren(renderError(errorClass, message));
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").replaceChildren();
}

function showSignIn() {
  api = null;
  $("sign-in").hidden = false;
  $("chat").hidden = true;
  $("new-conversation").hidden = true;
  $("sign-out").hidden = true;
  $("persona-picker").hidden = true;
  $("api-key").focus();
}

function showChat() {
  $("sign-in").hidden = true;
  $("chat").hidden = false;
  $("new-conversation").hidden = false;
  $("sign-out").hidden = false;
  $("conversation-label").textContent = `${owner} · ${conversationId}`;
  $("message").focus();
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
}

function addTurnView(userText) {
  const item = document.createElement("li");
  item.className = "turn";
  const user = document.createElement("div");
  user.className = "bubble user";
  user.textContent = userText;
  const bot = document.createElement("div");
  bot.className = "bubble bot";
  const text = document.createElement("div");
  text.className = "reply";
  const meta = document.createElement("div");
  meta.className = "meta";
  bot.append(text, meta);
  item.append(user, bot);
  $("messages").append(item);
  item.scrollIntoView({ block: "end" });
  return { item, bot, text, meta, source: "", pending: 0 };
}

// The reply so far, rendered from Markdown; at most once a frame however fast deltas come.
function showReply(view, text) {
  view.source = text;
  if (view.pending) return;
  view.pending = requestAnimationFrame(() => {
    view.pending = 0;
    view.text.replaceChildren(renderMarkdown(view.source));
  });
}

function finishView(view, usage, timings) {
  view.bot.classList.remove("streaming");
  view.meta.replaceChildren(renderTiming(usage, timings));
}

function failView(view, errorClass, message) {
  view.bot.classList.remove("streaming");
  view.bot.classList.add("failed");
  view.meta.replaceChildren(renderError(errorClass, message));
}

async function streamInto(view, turnId) {
  view.bot.classList.add("streaming");
  activeTurnId = turnId;
  try {
    for await (const event of api.events(turnId)) {
      if (event.kind === "delta") {
        showReply(view, view.source + event.data.text);
        view.item.scrollIntoView({ block: "end" });
      } else if (event.kind === "done") {
        showReply(view, event.data.text);
        finishView(view, event.data.usage, event.data.timings_ms);
      } else if (event.kind === "error") {
        failView(view, event.data.error_class, event.data.message);
      }
    }
  } finally {
    activeTurnId = null;
  }
}

function handleFailure(view, error) {
  const errorClass = error instanceof ApiError ? error.errorClass : "internal";
  failView(view, errorClass, error.message);
  if (errorClass === "auth") {
    localStorage.removeItem(KEY_STORAGE);
    showSignIn();
    showError("auth", "The API key was refused.");
  }
}

async function send(text) {
  clearError();
  const view = addTurnView(text);
  view.bot.classList.add("streaming");
  setBusy(true);
  try {
    const starts = personaOpen();
    const persona = chosenPersona();
    showPersona(true, persona);
    let accepted;
    try {
      accepted = await api.send(conversationId, randomId("msg-"), text, persona);
    } catch (error) {
      if (starts) showPersona(false); // nothing was stored: the conversation has not begun
      throw error;
    }
    await streamInto(view, accepted.turn_id);
  } catch (error) {
    handleFailure(view, error);
  } finally {
    setBusy(false);
  }
}

async function restore(turns) {
  $("messages").replaceChildren();
  const unfinished = [];
  for (const turn of turns) {
    const view = addTurnView(turn.text);
    showReply(view, turn.reply || "");
    if (turn.status === "done") finishView(view, turn.usage, turn.timings_ms);
    else if (turn.status === "failed") failView(view, turn.error_class || "internal", "");
    else unfinished.push([view, turn.turn_id]);
  }
  // A reply still being generated when the page was reloaded: follow it again.
  for (const [view, turnId] of unfinished) {
    showReply(view, "");
    setBusy(true);
    try {
      await streamInto(view, turnId);
    } catch (error) {
      handleFailure(view, error);
    } finally {
      setBusy(false);
    }
  }
}

async function signIn(key) {
  clearError();
  api = new Api(key);
  let conversation;
  try {
    conversation = await api.history(conversationId);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      localStorage.removeItem(KEY_STORAGE);
      showSignIn();
      showError("auth", "That API key was refused.");
    } else {
      showSignIn();
      showError(error.errorClass || "internal", error.message);
    }
    return;
  }
  localStorage.setItem(KEY_STORAGE, key);
  owner = conversation.owner;
  await loadPersonas(api);
  showPersona(conversation.turns.length > 0, conversation.persona);
  showChat();
  await restore(conversation.turns);
}

function newConversation() {
  conversationId = randomId("web-");
  localStorage.setItem(CONVERSATION_STORAGE, conversationId);
  $("messages").replaceChildren();
  clearError();
  showPersona(false);
  if (api) showChat();
}

function wire() {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    $("api-key").value = "";
    if (key) signIn(key);
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("message").value;
    if (!text.trim() || $("send").disabled) return;
    $("message").value = "";
    send(text);
  });
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", async () => {
    if (!activeTurnId) return;
    try {
      await api.cancel(activeTurnId);
    } catch (error) {
      showError(error.errorClass || "internal", error.message);
    }
  });
  $("new-conversation").addEventListener("click", newConversation);
  $("sign-out").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORAGE);
    $("messages").replaceChildren();
    $("conversation-label").textContent = "";
    clearError();
    showSignIn();
  });
}

function main() {
  takeKeyFromFragment();
  conversationId = localStorage.getItem(CONVERSATION_STORAGE);
  if (!conversationId) {
    conversationId = randomId("web-");
    localStorage.setItem(CONVERSATION_STORAGE, conversationId);
  }
  wire();
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) signIn(key);
  else showSignIn();
}

main();
