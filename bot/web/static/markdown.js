// Replies as Markdown, rendered safely: marked parses, DOMPurify sanitises what it made.
//
// Raw HTML in a reply is shown as text, never parsed: the model's output is untrusted
// (a user can ask it to echo anything). DOMPurify then keeps only the tags Markdown
// produces and drops dangerous URLs, as a second line of defence. Links open in a new
// tab without a referrer. The text is re-rendered whole on each streamed delta, so an
// unclosed **bold** or code fence shows as typed until it closes. Each code block gets
// a Copy button (copy.js), added after sanitising.

import { addCopyButtons } from "./copy.js";
import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";

const ALLOWED_TAGS = [
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
  "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
];
const ALLOWED_ATTR = ["href", "title", "class", "align", "start"];

function escapeHtml(text) {
  return text
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;");
}

const markdown = new Marked({
  gfm: true,
  breaks: true, // a chat reply's single line breaks are meant
  renderer: {
    html({ text }) {
      return escapeHtml(text);
    },
    image({ href, text }) {
      // No remote images (the page's CSP blocks them anyway): show the alt text as a link.
      return `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`;
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

export function renderMarkdown(text) {
  const html = markdown.parse(text, { async: false });
  const fragment = DOMPurify.sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ADD_ATTR: ["target", "rel"],
    RETURN_DOM_FRAGMENT: true,
  });
  return addCopyButtons(fragment);
}
