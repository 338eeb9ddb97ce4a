// Under each reply, one small line (total time, tokens/s, share of the prompt from the
// cache) that opens on click into the picture of where the time went: a bar split by
// layer, the largest layers, TTFT and the prompt's tokens, and every layer explained.

// The server's layers (bot/turns/timing.py's LAYERS), in its order, with what each means.
const LAYERS = [
  ["ingress", "Ingress (read and parse the request)"],
  ["auth", "API key check"],
  ["persist", "Store the message"],
  ["wait", "Wait for the previous turn"],
  ["start", "Start the turn (its database write, lock waits included)"],
  ["history", "Load and store history"],
  ["tokenize", "Tokenize the new message"],
  ["compact", "Switch a long chat to its shorter summary base"],
  ["queue", "Engine queue"],
  ["prefill", "Prefill (prompt tokens not in the cache)"],
  ["decode", "Decode (generate the reply)"],
  ["deliver", "Deliver the text"],
];

// Names in a turn's timings the page already places: its layers, and the two totals.
const PLACED = new Set([...LAYERS.map(([name]) => name), "ttft", "e2e"]);

// Every layer the turn spent time in: the known ones in order, then any the page does
// not know yet (a newer server's), under their own names, so the bar still adds up.
function layersIn(timings) {
  const others = Object.keys(timings)
    .filter((name) => !PLACED.has(name))
    .map((name) => [name, name]);
  return [...LAYERS, ...others].filter(
    ([name]) => typeof timings[name] === "number" && timings[name] > 0,
  );
}

const TOP_SHARE = 0.08;
const TOP_COUNT = 4;
const ms = (value) => (value >= 100 ? `${Math.round(value)} ms` : `${value.toFixed(1)} ms`);

// Decode time spans from the first token to the last: completion - 1 tokens.
function tokensPerSecond(usage, timings) {
  const decodeMs = timings.decode || 0;
  const tokens = (usage.completion_tokens || 0) - 1;
  return decodeMs > 0 && tokens > 0 ? Math.round((tokens * 1000) / decodeMs) : null;
}

const seconds = (value) => (value >= 1000 ? `${(value / 1000).toFixed(1)} s` : ms(value));

// The line a reply shows while closed: a person's three numbers, not a console's twelve.
function summaryText(usage, timings) {
  const prompt = usage.prompt_tokens ?? 0;
  const cached = usage.cached_tokens ?? 0;
  const rate = tokensPerSecond(usage, timings);
  return [
    timings.e2e != null ? seconds(timings.e2e) : null,
    rate != null ? `${rate} tok/s` : null,
    prompt > 0 ? `${Math.round((100 * cached) / prompt)}% cached` : null,
  ]
    .filter(Boolean)
    .join(" · ");
}

export function renderTiming(usage = {}, timings = {}) {
  const details = document.createElement("details");
  details.className = "timing";
  const summary = document.createElement("summary");
  summary.className = "timing-summary";
  summary.textContent = summaryText(usage, timings) || "timing";
  summary.title = "Where the time went";
  details.append(summary, renderDetail(usage, timings));
  return details;
}

function renderDetail(usage, timings) {
  const figure = document.createElement("figure");
  figure.className = "timing-detail";
  const present = layersIn(timings);
  const total = present.reduce((sum, [name]) => sum + timings[name], 0);
  const bar = document.createElement("div");
  bar.className = "timing-bar";
  bar.setAttribute("role", "img");
  bar.setAttribute(
    "aria-label",
    "Time by layer: " + present.map(([name]) => `${name} ${ms(timings[name])}`).join(", "),
  );
  for (const [name, label] of present) {
    const part = document.createElement("span");
    part.className = `layer layer-${name}`;
    part.style.flexGrow = String(timings[name] / total);
    part.title = `${label}: ${ms(timings[name])}`;
    part.dataset.layer = name;
    bar.append(part);
  }

  const prompt = usage.prompt_tokens ?? 0;
  const cached = usage.cached_tokens ?? 0;
  const fresh = usage.new_tokens ?? prompt - cached;
  const rate = tokensPerSecond(usage, timings);
  const facts = [
    timings.ttft != null ? `TTFT ${ms(timings.ttft)}` : null,
    rate != null ? `${rate} tok/s` : null,
    timings.e2e != null ? `total ${ms(timings.e2e)}` : null,
    `prompt ${prompt} tok: ${cached} from cache, ${fresh} prefilled`,
    `${usage.completion_tokens ?? 0} generated`,
  ].filter(Boolean);
  const caption = document.createElement("figcaption");
  caption.className = "timing-facts";
  caption.textContent = facts.join(" · ");

  // The few layers that took most of the time, named right under the bar.
  const top = document.createElement("p");
  top.className = "timing-top";
  const largest = [...present]
    .sort(([a], [b]) => timings[b] - timings[a])
    .filter(([name]) => timings[name] / total >= TOP_SHARE)
    .slice(0, TOP_COUNT);
  for (const [name] of largest) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");
    swatch.className = `swatch layer-${name}`;
    item.append(swatch, `${name} ${ms(timings[name])}`);
    top.append(item);
  }

  const list = document.createElement("ul");
  list.className = "timing-legend";
  for (const [name, label] of present) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch layer-${name}`;
    item.append(swatch, `${name}: ${ms(timings[name])} — ${label}`);
    list.append(item);
  }
  figure.append(bar, top, caption, list);
  return figure;
}
