"""What a test or benchmark reads of `tunedash serve`'s page: the xterm.js terminal's text (the page draws on a
canvas, so the DOM has none). Shared by tests/integration/test_serve_chromium.py and bench/bench_web.py."""

# Installed before the page loads (Page.addScriptToEvaluateOnNewDocument). textual.js assigns
# `this.terminal = new Terminal(...)` in its constructor; this setter on Object.prototype sees that assignment,
# keeps the terminal and steps aside for the property. `window.__screen()` is the visible rows' text.
TERMINAL_HOOK = """
window.__terms = [];
Object.defineProperty(Object.prototype, 'terminal', {
  configurable: true,
  set(value) {
    Object.defineProperty(this, 'terminal', {value, writable: true, configurable: true, enumerable: true});
    if (value && value.buffer) { window.__terms.push(value); }
  },
});
window.__screen = () => {
  const term = window.__terms[0];
  if (!term) { return null; }
  const buffer = term.buffer.active, lines = [];
  for (let y = 0; y < term.rows; y++) {
    const line = buffer.getLine(buffer.viewportY + y);
    lines.push(line ? line.translateToString(true) : '');
  }
  return lines.join('\\n');
};
"""
SCREEN_JS = "return window.__screen ? window.__screen() : null;"
"""The page's visible text (None before the terminal exists), for execute_script."""
