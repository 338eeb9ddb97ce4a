// The public HTTP API, as the page uses it. The key goes in the Authorization header only.

export class ApiError extends Error {
  constructor(errorClass, message, status) {
    super(message);
    this.errorClass = errorClass;
    this.status = status;
  }
}

const RECONNECTS = 3;
const PAGE = 30; // conversations a page of the list holds

// The page stopped reading (it shows another conversation now): not an error to show.
const aborted = () => new ApiError("aborted", "No longer followed.", 0);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function* parseSse(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const fields = {};
      for (const line of block.split("\n")) {
        const colon = line.indexOf(": ");
        if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 2);
      }
      if (fields.event && fields.data) {
        yield { id: fields.id, kind: fields.event, data: JSON.parse(fields.data) };
      }
    }
  }
}

async function refusal(response) {
  let document = {};
  try {
    document = await response.json();
  } catch {
    // Not our JSON error (a proxy's page, say): fall back to the status line.
  }
  return new ApiError(
    document.error || `http_${response.status}`,
    document.reason || response.statusText || `HTTP ${response.status}`,
    response.status,
  );
}

export class Api {
  constructor(key) {
    this.key = key;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  async fetch(path, options = {}) {
    try {
      return await fetch(path, { ...options, headers: this.headers(options.headers) });
    } catch {
      if (options.signal?.aborted) throw aborted();
      throw new ApiError("network", "Cannot reach the service.", 0);
    }
  }

  async json(method, path, body) {
    const response = await this.fetch(path, {
      method,
      headers: body ? { "Content-Type": "application/json" } : {},
      body: body ? JSON.stringify(body) : undefined,
    });
    if (!response.ok) throw await refusal(response);
    return response.json();
  }

  history(conversationId) {
    return this.json("GET", `/v1/conversations/${encodeURIComponent(conversationId)}/turns`);
  }

  // The key's conversations, newest first; `cursor` (a page's next_cursor) reads on.
  conversations(cursor = null) {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) query.set("cursor", cursor);
    return this.json("GET", `/v1/conversations?${query}`);
  }

  usage() {
    return this.json("GET", "/v1/usage?days=1");
  }

  // `persona` only on a conversation's first message: it is chosen when one starts.
  send(conversationId, messageId, text, persona = null) {
    const body = { conversation_id: conversationId, message_id: messageId, text };
    if (persona) body.persona = persona;
    return this.json("POST", "/v1/messages", body);
  }

  personas() {
    return this.json("GET", "/v1/personas");
  }

  regenerate(turnId) {
    return this.json("POST", `/v1/turns/${encodeURIComponent(turnId)}/regenerate`);
  }

  // Carries on a reply cut at the token cap (finish_reason "length"): 202 with the new
  // turn, whose reply starts with the cut one's `continued_chars` characters.
  continue(turnId) {
    return this.json("POST", `/v1/turns/${encodeURIComponent(turnId)}/continue`);
  }

  edit(turnId, text) {
    return this.json("POST", `/v1/turns/${encodeURIComponent(turnId)}/edit`, { text });
  }

  activate(turnId) {
    return this.json("POST", `/v1/turns/${encodeURIComponent(turnId)}/activate`);
  }

  cancel(turnId) {
    return this.json("POST", `/v1/turns/${encodeURIComponent(turnId)}/cancel`);
  }

  // Yields delta / done / error events from character `from` of the reply on; a dropped
  // connection resumes where it left off (Last-Event-ID is a character offset into the
  // reply). `signal` stops reading.
  async *events(turnId, signal = undefined, from = 0) {
    let offset = from;
    for (let attempt = 0; ; attempt++) {
      let response;
      try {
        response = await this.fetch(`/v1/turns/${encodeURIComponent(turnId)}/events`, {
          headers: { Accept: "text/event-stream", "Last-Event-ID": String(offset) },
          signal,
        });
      } catch (error) {
        if (signal?.aborted || attempt >= RECONNECTS) throw error;
        await sleep(500 * (attempt + 1));
        continue;
      }
      if (!response.ok) throw await refusal(response);
      try {
        for await (const event of parseSse(response.body)) {
          if (event.kind === "delta") offset = Number(event.id) || offset;
          yield event;
          if (event.kind !== "delta") return;
        }
      } catch {
        if (signal?.aborted) throw aborted();
        if (attempt >= RECONNECTS) throw new ApiError("network", "The reply stream broke.", 0);
      }
      if (attempt >= RECONNECTS) throw new ApiError("network", "The reply stream ended early.", 0);
    }
  }
}
