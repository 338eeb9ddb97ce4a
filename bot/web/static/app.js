// The chat page: sign in, show the conversation, stream replies, keep it across reloads;
// switch between the key's conversations; regenerate the last reply, edit the last
// message, continue a reply cut at the token cap, and page through the versions
// "‹ 2/3 ›" of an exchange (the conversation's history is a tree: each version a branch).

import { Api, ApiError } from "./api.js";
import { ConversationList } from "./conversations.js";
import { renderError } from "./errors.js";
import { renderMarkdown } from "./markdown.js";
import { chosenPersona, loadPersonas, personaOpen, showPersona } from "./personas.js";
import { FollowBottom } from "./scroll.js";
import { renderTiming } from "./timing.js";
import { showUsage } from "./usage.js";

const KEY_STORAGE = "bot.apiKey";
const CONVERSATION_STORAGE = "bot.conversationId";
const CUT = "length"; // the finish_reason of a reply stopped at the token cap
const $ = (id) => document.getElementById(id);

let api = null;
let conversationId = null;
let activeTurnId = null;
let owner = "";
let views = []; // the turn views on screen, oldest first; each knows its turnId once stored
// Bumped whenever the page leaves what it showed (another conversation, key, sign-out):
// a reply still streaming for the old one stops drawing, and its stream is closed.
let epoch = 0;
let streams = new AbortController();
let follow = null;
const conversations = new ConversationList((id) => openConversation(id));

function randomId(prefix) {
  // getRandomValues works on plain http too (randomUUID needs a secure context).
  const bytes = crypto.getRandomValues(new Uint8Array(9));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// `make run` prints /#key=...: the fragment never reaches the server. It is read when
// the page loads and when such a link is pasted into a tab already on the page (only
// the fragment changes: no load, a hashchange); either way it leaves the address bar
// (and so history and bookmarks) at once.
function takeKeyFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("key");
  if (key) localStorage.setItem(KEY_STORAGE, key);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  return key;
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

function leave() {
  epoch += 1;
  streams.abort();
  streams = new AbortController();
  activeTurnId = null;
  setBusy(false);
}

function showSignIn() {
  leave();
  api = null;
  toggleSidebar(false);
  conversations.clear();
  for (const id of ["chat", "sidebar", "sidebar-toggle", "new-conversation", "sign-out"]) {
    $(id).hidden = true;
  }
  $("persona-picker").hidden = true;
  $("usage").hidden = true;
  $("conversation-label").textContent = "";
  $("sign-in").hidden = false;
  $("api-key").focus();
}

function showChat() {
  $("sign-in").hidden = true;
  for (const id of ["chat", "sidebar", "sidebar-toggle", "new-conversation", "sign-out"]) {
    $(id).hidden = false;
  }
  showLabel();
  $("message").focus();
}

// Who is signed in and which conversation is on screen, on one line (cut with "…").
function showLabel() {
  const first = views.length ? views[0].user.textContent : "";
  const title = conversations.titleOf(conversationId) || first || "New conversation";
  $("conversation-label").textContent = `${owner} · ${title}`;
  $("conversation-label").title = `${owner} · ${conversationId}`;
}

function refreshUsage() {
  if (api) showUsage(api, $("usage"));
}

async function refreshList() {
  if (!api) return;
  await conversations.refresh(api, conversationId);
  showLabel();
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
// has ended, Regenerate and Edit, and Continue when its reply was cut at the token cap.
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
      if (turn.status === "done" && turn.finish_reason === CUT) {
        bar.append(controlButton("Continue", "Continue the reply", () => continueReply(turn)));
      }
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
  const shown = epoch;
  const conversation = await api.history(conversationId);
  // Another conversation since, or a message sent meanwhile (its own refresh comes).
  if (shown !== epoch || $("send").disabled) return;
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

// A reply stopped at the token cap says so, in words, under its text.
function cutMark() {
  const mark = document.createElement("p");
  mark.className = "cut-mark";
  mark.textContent = "✂ Reply cut off at the length limit";
  return mark;
}

function finishView(view, usage, timings, finishReason) {
  view.bot.classList.remove("streaming");
  const parts = [renderTiming(usage, timings)];
  if (finishReason === CUT) parts.unshift(cutMark());
  view.meta.replaceChildren(...parts);
}

function failView(view, errorClass, message) {
  view.bot.classList.remove("streaming");
  view.bot.classList.add("failed");
  view.meta.replaceChildren(renderError(errorClass, message));
}

// Streams a turn's reply into `view`. `from` > 0: the view already shows the reply's first
// `from` characters (a continuation's cut text), the stream starts after them.
async function streamInto(view, turnId, from = 0) {
  const shown = epoch;
  if (!from) view.source = "";
  view.bot.classList.add("streaming");
  view.meta.replaceChildren();
  activeTurnId = turnId;
  try {
    for await (const event of api.events(turnId, streams.signal, from)) {
      if (shown !== epoch) return;
      if (event.kind === "delta") {
        showReply(view, view.source + event.data.text);
      } else if (event.kind === "done") {
        showReply(view, event.data.text); // the whole reply, a continuation's too
        finishView(view, event.data.usage, event.data.timings_ms, event.data.finish_reason);
      } else if (event.kind === "error") {
        failView(view, event.data.error_class, event.data.message);
      }
    }
  } finally {
    if (shown === epoch) activeTurnId = null;
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

// Runs one exchange into `view`: `start` stores the turn, then its reply streams in.
async function answer(view, start) {
  const shown = epoch;
  clearError();
  clearControls();
  view.bot.classList.add("streaming");
  setBusy(true);
  follow.toBottom(); // who sends wants to see the answer
  let answered = false;
  try {
    const accepted = await start();
    if (shown !== epoch) return;
    view.turnId = accepted.turn_id;
    refreshList(); // stored: a new conversation is listed now, a used one moves to the top
    // A continuation's reply starts with the cut text, which the view shows already.
    await streamInto(view, accepted.turn_id, accepted.continued_chars || 0);
    answered = shown === epoch;
  } catch (error) {
    if (shown !== epoch) return; // the page has moved on: nothing of this is on screen
    handleFailure(view, error);
  } finally {
    if (shown === epoch) setBusy(false);
  }
  if (shown !== epoch) return;
  refreshUsage();
  // The chat is open again as soon as the reply is in; its versions and buttons follow.
  if (answered) {
    await refreshControls().catch((error) => showError(error.errorClass || "internal", error.message));
  }
}

function send(text) {
  const starts = personaOpen();
  const persona = chosenPersona();
  return answer(addTurnView(text), async () => {
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
  return answer(addTurnView(turn.text), () => api.regenerate(turn.turn_id));
}

// A cut reply goes on in place: a new turn (POST /v1/turns/{id}/continue, docs/replies.md)
// whose reply is the whole reply, the cut text and then the new; it becomes the active
// version and the cut one stays a version beside it.
function continueReply(turn) {
  if ($("send").disabled) return;
  const view = views[views.length - 1];
  view.source = turn.reply || "";
  return answer(view, () => api.continue(turn.turn_id));
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
    answer(addTurnView(text), () => api.edit(turn.turn_id, text));
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
  const shown = epoch;
  $("messages").replaceChildren();
  views = [];
  const unfinished = [];
  for (const turn of turns) {
    const view = addTurnView(turn.text);
    view.turnId = turn.turn_id;
    showReply(view, turn.reply || "");
    if (turn.status === "done") finishView(view, turn.usage, turn.timings_ms, turn.finish_reason);
    else if (turn.status === "failed") failView(view, turn.error_class || "internal", "");
    else unfinished.push([view, turn.turn_id]);
  }
  showLabel();
  follow.toBottom();
  if (!unfinished.length) showControls(turns);
  // A reply still being generated when the page was reloaded: follow it again.
  for (const [view, turnId] of unfinished) {
    showReply(view, "");
    setBusy(true);
    try {
      await streamInto(view, turnId);
    } catch (error) {
      if (shown !== epoch) return;
      handleFailure(view, error);
    } finally {
      if (shown === epoch) setBusy(false);
    }
  }
  if (unfinished.length && shown === epoch) await refreshControls().catch(() => {});
}

// Shows conversation `id` of the signed-in key (an empty one if it has no message yet).
async function showConversation(id, conversation) {
  leave();
  conversationId = id;
  localStorage.setItem(CONVERSATION_STORAGE, id);
  conversations.mark(id);
  clearError();
  showPersona(conversation.turns.length > 0, conversation.persona);
  showChat();
  await restore(conversation.turns);
}

async function openConversation(id) {
  toggleSidebar(false);
  if (id === conversationId) return;
  try {
    await showConversation(id, await api.history(id));
  } catch (error) {
    showError(error.errorClass || "internal", error.message);
  }
}

async function signIn(key) {
  leave();
  clearError();
  const candidate = new Api(key);
  let conversation;
  try {
    conversation = await candidate.history(conversationId);
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
  api = candidate;
  localStorage.setItem(KEY_STORAGE, key);
  owner = conversation.owner;
  await loadPersonas(api);
  refreshUsage();
  await showConversation(conversationId, conversation);
  await refreshList();
}

function newConversation() {
  leave();
  conversationId = randomId("web-");
  localStorage.setItem(CONVERSATION_STORAGE, conversationId);
  $("messages").replaceChildren();
  views = [];
  clearError();
  showPersona(false);
  conversations.mark(conversationId);
  toggleSidebar(false);
  if (api) showChat();
}

// On narrow screens the list is a drawer over the chat, opened from the header.
function toggleSidebar(open = !document.body.classList.contains("sidebar-open")) {
  document.body.classList.toggle("sidebar-open", open);
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
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
  $("sidebar-toggle").addEventListener("click", () => toggleSidebar());
  // The drawer closes on Escape and on a tap beside it, as drawers do.
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") toggleSidebar(false);
  });
  document.querySelector(".main").addEventListener("click", () => toggleSidebar(false));
  $("sign-out").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORAGE);
    $("messages").replaceChildren();
    views = [];
    clearError();
    showSignIn();
  });
  window.addEventListener("hashchange", () => {
    const key = takeKeyFromFragment();
    if (key) signIn(key);
  });
}

function main() {
  follow = new FollowBottom($("scroller"), $("messages"), $("jump"));
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
