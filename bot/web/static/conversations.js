// The key's conversations, newest first (GET /v1/conversations), to switch between.
// Each is named by the first words of its first message; the one on screen is marked.

const $ = (id) => document.getElementById(id);
const UNTITLED = "New conversation";

export class ConversationList {
  constructor(onSelect) {
    this.onSelect = onSelect;
    this.api = null;
    this.current = null;
    this.nextCursor = null;
    $("older-conversations").addEventListener("click", () => this.loadOlder());
  }

  // The first page again: after signing in and after each reply (a conversation that
  // just got a message moves to the top; a new one appears).
  async refresh(api, current) {
    this.api = api;
    this.current = current;
    await this.load(null, true);
  }

  async loadOlder() {
    if (this.nextCursor) await this.load(this.nextCursor, false);
  }

  async load(cursor, replace) {
    const api = this.api;
    let page;
    try {
      page = await api.conversations(cursor);
    } catch {
      return; // an older server, or a moment's refusal: the list is a convenience
    }
    if (api !== this.api) return; // signed out or in as another key meanwhile
    const items = page.conversations.map((conversation) => this.item(conversation));
    if (replace) $("conversation-list").replaceChildren(...items);
    else $("conversation-list").append(...items);
    this.nextCursor = page.next_cursor;
    $("older-conversations").hidden = !page.next_cursor;
    this.mark(this.current);
  }

  item(conversation) {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "conversation";
    button.dataset.conversationId = conversation.conversation_id;
    button.textContent = conversation.title || UNTITLED;
    button.title = `${conversation.title || UNTITLED}\nlast message ${new Date(
      conversation.updated_at,
    ).toLocaleString()}`;
    button.addEventListener("click", () => this.onSelect(conversation.conversation_id));
    item.append(button);
    return item;
  }

  // Marks the conversation on screen (none, for a new one not stored yet).
  mark(conversationId) {
    this.current = conversationId;
    for (const button of $("conversation-list").querySelectorAll("button")) {
      if (button.dataset.conversationId === conversationId) {
        button.setAttribute("aria-current", "true");
      } else {
        button.removeAttribute("aria-current");
      }
    }
  }

  // The title of a listed conversation, if it is listed.
  titleOf(conversationId) {
    for (const button of $("conversation-list").querySelectorAll("button")) {
      if (button.dataset.conversationId === conversationId) return button.textContent;
    }
    return null;
  }

  clear() {
    this.api = null;
    this.nextCursor = null;
    $("conversation-list").replaceChildren();
    $("older-conversations").hidden = true;
  }
}
