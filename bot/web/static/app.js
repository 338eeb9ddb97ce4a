// The chat page: sign in, show the conversation, stream replies, keep it across reloads;
// regenerate the last reply, edit the last message, and page through the versions "‹ 2/3 ›"
// of an exchange (the conversation's history is a tree: each version is a branch).

import { Api, ApiError } from "./api.js";
import { renderError } from "./errors.js";
import { renderMarkdown } from "./markdown.js";
import { chosenPersona, loadPersonas, personaOpen, showPersona } from "./personas.js";
import { renderTiming } from "./timing.js";
import { showUsage } from "./usage.js";

const KEY_STORAGE = "bot.apiKey";
const CONVERSATION_STORAGE = "bot.conversationId";
const $ = (id) => document.getElementById(id);

let api = null;
let conversationId = null;
let activeTurnId = null;
let owner = "";
let views = []; // the turn views on screen, oldest first; each knows its turnId once stored

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

function refreshUsage() {
  if (api) showUsage(api, $("usage"));
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
  const view = { item, user, bot, text, meta, source: "", pending: 0, turnId: null };
  views.push(view);
  return view;
}

function controlButton(label, title, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = label;
  button.title = title;
  button.setAttribute("aria-label", title);
  button.addEventListener("click", onClick);
  return button;
}

function clearControls() {
  for (const bar of document.querySelectorAll(".turn-controls")) bar.remove();
}

// Under each turn: "‹ 2/3 ›" when the exchange has versions; under the last one, once it
// has ended, Regenerate and Edit.
function showControls(turns) {
  clearControls();
  turns.forEach((turn, index) => {
    const view = views[index];
    const bar = document.createElement("div");
    bar.className = "turn-controls";
    const versions = turn.alternatives || [];
    if (versions.length > 1) {
      const at = versions.indexOf(turn.turn_id);
      const nav = document.createElement("span");
      nav.className = "versions";
      const previous = controlButton("‹", "Previous version", () => switchTo(versions[at - 1]));
      previous.disabled = at <= 0;
      const position = document.createElement("span");
      position.className = "version-position";
      position.textContent = `${at + 1}/${versions.length}`;
      const next = controlButton("›", "Next version", () => switchTo(versions[at + 1]));
      next.disabled = at >= versions.length - 1;
      nav.append(previous, position, next);
      bar.append(nav);
    }
    const ended = turn.status === "done" || turn.status === "failed";
    if (index === turns.length - 1 && ended) {
      bar.append(
        controlButton("Regenerate", "Regenerate the reply", () => regenerate(turn)),
        controlButton("Edit", "Edit your text", () => startEdit(view, turn)),
      );
    }
    if (bar.childElementCount) view.item.append(bar);
  });
}

// After a turn ends: the controls from the stored tree (a full redraw if the page and the
// server disagree on which turns are shown).
async function refreshControls() {
  const conversation = await api.history(conversationId);
  // A message sent meanwhile is being answered: its own refresh comes when it ends.
  if ($("send").disabled) return;
  const same =
    conversation.turns.length === views.length &&
    conversation.turns.every((turn, index) => turn.turn_id === views[index].turnId);
  if (same) showControls(conversation.turns);
  else await restore(conversation.turns);
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

async function answer(text, start) {
  clearError();
  clearControls();
  const view = addTurnView(text);
  view.bot.classList.add("streaming");
  setBusy(true);
  let answered = false;
  try {
    const accepted = await start();
    view.turnId = accepted.turn_id;
    await streamInto(view, accepted.turn_id);
    answered = true;
  } catch (error) {
    handleFailure(view, error);
  } finally {
    setBusy(false);
    refreshUsage();
  }
  // The chat is open again as soon as the reply is in; its versions and buttons follow.
  if (answered) {
    await refreshControls().catch((error) => showError(error.errorClass || "internal", error.message));
  }
}

function send(text) {
  const starts = personaOpen();
  const persona = chosenPersona();
  return answer(text, async () => {
    showPersona(true, persona);
    try {
      return await api.send(conversationId, randomId("msg-"), text, persona);
    } catch (error) {
      if (starts) showPersona(false); // nothing was stored: the conversation has not begun
      throw error;
    }
  });
}

// The new attempt takes the last turn's place on screen; the old one stays a version.
function replaceLast() {
  const last = views.pop();
  if (last) last.item.remove();
}

function regenerate(turn) {
  if ($("send").disabled) return;
  replaceLast();
  return answer(turn.text, () => api.regenerate(turn.turn_id));
}

function startEdit(view, turn) {
  if ($("send").disabled) return;
  clearControls();
  const form = document.createElement("form");
  form.className = "bubble user edit-form";
  const box = document.createElement("textarea");
  box.value = turn.text;
  box.setAttribute("aria-label", "Edited text");
  const save = document.createElement("button");
  save.type = "submit";
  save.textContent = "Save and answer";
  const cancel = controlButton("Cancel", "Cancel the edit", () => {
    form.replaceWith(view.user);
    refreshControls().catch((error) => showError(error.errorClass || "internal", error.message));
  });
  form.append(box, save, cancel);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = box.value;
    if (!text.trim()) return;
    replaceLast();
    answer(text, () => api.edit(turn.turn_id, text));
  });
  view.user.replaceWith(form);
  box.focus();
}

async function switchTo(turnId) {
  if (!turnId || $("send").disabled) return;
  clearError();
  try {
    await api.activate(turnId);
    await restore((await api.history(conversationId)).turns);
  } catch (error) {
    showError(error.errorClass || "internal", error.message);
  }
}

async function restore(turns) {
  $("messages").replaceChildren();
  views = [];
  const unfinished = [];
  for (const turn of turns) {
    const view = addTurnView(turn.text);
    view.turnId = turn.turn_id;
    showReply(view, turn.reply || "");
    if (turn.status === "done") finishView(view, turn.usage, turn.timings_ms);
    else if (turn.status === "failed") failView(view, turn.error_class || "internal", "");
    else unfinished.push([view, turn.turn_id]);
  }
  if (!unfinished.length) showControls(turns);
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
  if (unfinished.length) await refreshControls().catch(() => {});
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
  refreshUsage();
  await restore(conversation.turns);
}

function newConversation() {
  conversationId = randomId("web-");
  localStorage.setItem(CONVERSATION_STORAGE, conversationId);
  $("messages").replaceChildren();
  views = [];
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
    views = [];
    $("conversation-label").textContent = "";
    $("usage").hidden = true;
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
