"""A multi-line text box that sends its text a pause after the last key (debounced), at once on
Ctrl+Enter (Cmd+Enter) or when the user leaves it, and keeps line breaks and emoji.

Streamlit's st.text_area sends only on Ctrl+Enter or blur, and the as-you-type box (st_keyup) is one
line: a line break typed or pasted there is lost. This is a Components v2 element (inline HTML, CSS
and JavaScript in the page's DOM, no build step and no iframe), the mechanism st_keyup itself uses.
Its value lives under an internal key ("_textarea_<key>") as {"value": text}; a page gives the box
a new key to show a new text (a mounted box keeps what the user typed)."""
from __future__ import annotations

import streamlit as st

PREFIX = "_textarea_"
CSS_CLASS = "eagle-area__input"  # the <textarea>; tests find it in the component's shadow root

_HTML = """
<div class="eagle-area" id="root">
  <label id="label" class="eagle-area__label" for="input"></label>
  <textarea id="input" class="eagle-area__input" spellcheck="false"></textarea>
</div>
"""

_CSS = """
*, *::before, *::after { box-sizing: border-box; margin: 0; padding: 0; }
.eagle-area { display: flex; flex-direction: column; width: 100%;
  font-family: var(--st-font, sans-serif); color: var(--st-text-color, inherit); }
.eagle-area__label { font-size: 14px; line-height: 1.6; margin-bottom: 4px; min-height: 1.4em; }
.eagle-area__input { width: 100%; resize: vertical; padding: 10px 14px; font-size: 15px; line-height: 1.5;
  font-family: var(--st-font, sans-serif); color: var(--st-text-color, inherit);
  background-color: var(--st-secondary-background-color, #f0f2f6);
  border: 1px solid rgba(127, 127, 127, 0.3); border-radius: 6px; outline: none; }
.eagle-area__input:focus { border-color: var(--st-primary-color, #4a5568); }
"""

# Like st_keyup's script, with a <textarea>: Enter is a line break; Ctrl/Cmd+Enter and leaving the box
# send at once. While the user types, a value Python sends back is only adopted once it equals the
# box's own (the round trip is done): an older echo must never overwrite newer keystrokes.
_JS = r"""
export default function({ parentElement, data, setStateValue }) {
  const lbl = parentElement.querySelector("#label");
  const box = parentElement.querySelector("#input");
  lbl.textContent = data.label ?? "";
  box.placeholder = data.placeholder ?? "";
  box.setAttribute("aria-label", data.label ?? "");
  if (!box._sized) { box.style.height = `${data.height ?? 110}px`; box._sized = true; }
  const pyValue = data.value ?? "";
  if (pyValue === box.value) {
    box._typing = false;
  } else if (!box._typing) {
    box.value = pyValue;
    box._sent = pyValue;
  }
  parentElement._debounce = data.debounce ?? 0;
  if (parentElement._attached) return;
  let timer = null;
  const send = () => {
    clearTimeout(timer);
    if (box.value !== box._sent) { box._sent = box.value; setStateValue("value", box.value); }
  };
  box.addEventListener("input", () => {
    box._typing = true;
    clearTimeout(timer);
    timer = setTimeout(send, parentElement._debounce);
  });
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
  });
  box.addEventListener("blur", send);
  parentElement._attached = true;
}
"""

_component = st.components.v2.component("eagle_textarea", html=_HTML, css=_CSS, js=_JS, isolate_styles=True)


def text_area(label: str, key: str, value: str = "", debounce_ms: int = 700, placeholder: str = "",
              height: int = 110) -> str:
    """The box's text: what the user last sent, else `value` (its first draw under this key)."""
    internal = PREFIX + key
    kept = st.session_state.get(internal)
    current = kept.get("value", value) if isinstance(kept, dict) else value
    result = _component(data={"label": label, "value": current, "placeholder": placeholder,
                              "debounce": debounce_ms, "height": height},
                        default={"value": current}, key=internal, on_value_change=_changed)
    return result.value if isinstance(result.value, str) else current


def _changed() -> None:
    """Registers the "value" state with Streamlit (v2 requires a callback); the rerun does the rest."""
