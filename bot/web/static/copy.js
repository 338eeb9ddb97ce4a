// A "Copy" button on each code block of a rendered reply.
//
// The button is made with the DOM API after the reply was sanitised, outside the <pre>,
// so what it copies is the code's own text and never the button's.

const COPIED_MS = 1500;

async function writeClipboard(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Plain http on another host is no secure context: no async clipboard there, but a
  // copy command from the user's click still works.
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("the browser refused to copy");
}

function copyButton(code) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy-code";
  button.textContent = "Copy";
  button.setAttribute("aria-label", "Copy code");
  button.addEventListener("click", async () => {
    try {
      await writeClipboard(code.textContent);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => {
      button.textContent = "Copy";
    }, COPIED_MS);
  });
  return button;
}

// Wraps every <pre> under `root` with its copy button.
export function addCopyButtons(root) {
  for (const pre of root.querySelectorAll("pre")) {
    const block = document.createElement("div");
    block.className = "code-block";
    pre.replaceWith(block);
    block.append(pre, copyButton(pre.querySelector("code") || pre));
  }
  return root;
}
