// Follows a job's logs on its page: reads the output again from the start (so a line split
// across chunks comes out whole), then every two seconds what the nodes sent since. Without
// this script the page still shows the output as it was when the page was rendered.
"use strict";
(function () {
  const pre = document.getElementById("logs");
  if (!pre) return;
  const url = pre.dataset.url;
  const run = pre.dataset.run;
  const follow = pre.dataset.follow === "true";
  const partial = new Map(); // "epoch/node/stream" -> [prefix, the line so far]
  let after = 0;
  let shown = [];

  function prefix(chunk) {
    if (chunk.stream === "gpuprov") return "[gpuprov] ";
    return "[" + chunk.node + (chunk.epoch ? " r" + chunk.epoch : "") + "] ";
  }

  function feed(chunks) {
    const lines = [];
    for (const chunk of chunks) {
      const key = chunk.epoch + "/" + chunk.node + "/" + chunk.stream;
      const before = partial.has(key) ? partial.get(key)[1] : "";
      const parts = (before + chunk.data).split("\n");
      partial.set(key, [prefix(chunk), parts.pop()]);
      for (const text of parts) lines.push(prefix(chunk) + text);
    }
    return lines;
  }

  async function read() {
    for (;;) {
      const query = new URLSearchParams({ after: String(after) });
      if (run) query.set("run", run);
      const answer = await fetch(url + "?" + query, { credentials: "same-origin" });
      if (!answer.ok) return false;
      const page = await answer.json();
      after = page.next_after;
      shown = shown.concat(feed(page.chunks));
      if (!page.more) return true;
    }
  }

  function render() {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    const pending = [];
    for (const [start, text] of partial.values()) {
      if (text) pending.push(start + text);
    }
    pre.textContent = shown.concat(pending).join("\n") + "\n";
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  async function tick() {
    const ok = await read().catch(() => false);
    if (ok) render();
    if (follow && ok) setTimeout(tick, 2000);
  }
  tick();
})();
