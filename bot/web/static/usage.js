// One line under the header: this key's messages and tokens today (UTC) against its daily
// limit, and the share of prompt tokens the prefix cache served (GET /v1/usage, "today").

const number = (value) => Number(value || 0).toLocaleString("en-US");
const percent = (share) => (share === null || share === undefined ? "-" : `${Math.round(share * 100)}%`);

export function usageText(today) {
  const failed = today.turns_failed ? `, ${number(today.turns_failed)} failed` : "";
  const messages = `${number(today.turns_done)} message${today.turns_done === 1 ? "" : "s"}${failed}`;
  const parts = [
    `Today (UTC): ${messages}`,
    `${number(today.prompt_tokens)} prompt tokens, ${percent(today.cache_share)} from cache`,
    `${number(today.completion_tokens)} generated`,
  ];
  if (today.tokens_per_day) {
    const used = Math.round((100 * today.counted_tokens) / today.tokens_per_day);
    parts.push(
      `limit: ${number(today.counted_tokens)} of ${number(today.tokens_per_day)} tokens (${used}%)`,
    );
  } else {
    parts.push("no daily limit");
  }
  return parts.join(" · ");
}

// Shows the line; a failure to read it hides the line and never disturbs the chat.
export async function showUsage(api, element) {
  try {
    const usage = await api.usage();
    element.textContent = usageText(usage.today);
    element.title =
      "Counted against the limit: prompt tokens not served from the cache, plus generated tokens. Resets at 00:00 UTC.";
    element.hidden = false;
  } catch {
    element.hidden = true;
  }
}
