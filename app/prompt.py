"""The pages' prompts: on the Live page the one-line box that generates as you type
(app.live.prompt_box) or the multi-line editor, an optional system prompt and a multi-turn chat, every
turn through the model's chat template (eagle.core.prompt.encode_prompt takes the list of messages); the
Compare page's prompt is the same multi-line editor (`multiline`).

The multi-line editor (app.textarea) sends its text a pause after the last key, as the one-line box
does, and at once on Ctrl+Enter or when the user leaves it; line breaks and emoji are kept."""
from __future__ import annotations

import streamlit as st

from eagle.records.trace import Trace

from . import live, runner, textarea
from .persist import save, saved, seed

Prompt = str | list[dict]
MULTI, AREA, SYSTEM = "live_multiline", "live_prompt_area", "live_system"
AREA_GEN = "live_prompt_area_gen"  # bumped to give the editor a new, empty box (a kept chat turn)
CHAT_ON, HISTORY = "live_chat", "live_chat_history"  # the toggle; the kept turns [{"role", "content"}]


def editor() -> str:
    """The user's message: the as-you-type box, or the multi-line editor (always in chat mode). Both
    share the saved prompt, so switching keeps the text."""
    c1, c2, _ = st.columns([1, 1, 2])  # one row: the first screen has no height to spare
    with c1:
        multi = _remembered(st.toggle, MULTI, False, "Multi-line editor",
                            help="Line breaks kept (code, chat, several paragraphs); generates a pause after "
                                 "the last key, or at once on Ctrl+Enter")
    with c2:
        chat = _remembered(st.toggle, CHAT_ON, False, "Chat (several turns)",
                           help="Each kept reply becomes part of the conversation the next message continues")
    if not (multi or chat):
        return live.prompt_box()
    what = "Message" if chat else "Prompt"
    text = multiline(f"{what} (generates as you pause typing; Ctrl+Enter at once; Enter is a new line)",
                     area_key(), saved().get(live.PROMPT_KEY, ""), live.HINT)
    saved()[live.PROMPT_KEY] = text
    return text


def multiline(label: str, key: str, value: str, placeholder: str, height: int = 110) -> str:
    """The pages' one multi-line prompt editor: line breaks kept, sent a pause after the last key."""
    return textarea.text_area(label, key, value, live.DEBOUNCE_MS, placeholder, height)


def area_key() -> str:
    """The Live editor's current key: a new one after a kept turn shows an empty box."""
    return f"{AREA}_{st.session_state.get(AREA_GEN, 0)}"


def system_prompt() -> str:
    with st.expander("System prompt (optional)"):
        return _remembered(st.text_area, SYSTEM, "", "System prompt", height=80,
                           help="Sent first, as the chat template's system message")


def conversation(text: str, system: str) -> Prompt:
    """What the decoder is given: the plain text when there is no system prompt and no earlier turn
    (as before: the template wraps it as one user message), else the list of messages."""
    history = st.session_state.get(HISTORY, []) if st.session_state.get(CHAT_ON) else []
    if not system.strip() and not history:
        return text
    return ([{"role": "system", "content": system}] if system.strip() else []) + history + \
        [{"role": "user", "content": text}]


def show_history() -> None:
    """The kept turns, above the message box, and the button that starts over."""
    history = st.session_state.get(HISTORY, [])
    if not (st.session_state.get(CHAT_ON) and history):
        return
    for turn in history:
        st.chat_message(turn["role"]).markdown(turn["content"])
    st.button("New chat", key="live_new_chat", icon=":material/restart_alt:", on_click=_new_chat)


def keep_turn_button(trace: Trace | None, text: str) -> None:
    """In chat mode, after a finished reply: keep the turn and clear the box for the next message."""
    if not (st.session_state.get(CHAT_ON) and trace is not None and runner.is_complete(trace) and text.strip()):
        return
    reply = "".join(s.new_text for s in trace.steps)
    st.button("Keep this reply and continue", key="live_keep_turn", icon=":material/reply:",
              on_click=_keep, args=(text, reply))


def _keep(text: str, reply: str) -> None:
    st.session_state[HISTORY] = [*st.session_state.get(HISTORY, []), {"role": "user", "content": text},
                                 {"role": "assistant", "content": reply}]
    st.session_state[AREA_GEN] = st.session_state.get(AREA_GEN, 0) + 1  # a new, empty editor
    saved()[live.PROMPT_KEY] = ""


def _new_chat() -> None:
    st.session_state[HISTORY] = []


def _remembered(make, key: str, default, *args, **kwargs):
    seed(key, default)
    value = make(*args, key=key, **kwargs)
    save(key)
    return value
