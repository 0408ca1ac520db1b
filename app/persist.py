"""UI state that survives page switches.

Streamlit forgets a widget's state once a run does not draw it (the user is on another page). Each
remembered widget therefore has a saved copy under a plain session-state key, which re-seeds the
widget when its page is drawn again. Widgets are created without `value=`: their state is always
seeded first, so Streamlit never sees a default and a session-state value fighting."""
from __future__ import annotations

from typing import Any

import streamlit as st

SAVED = "_saved_widgets"  # {widget key: last value}; a plain key, never a widget's


def saved() -> dict[str, Any]:
    return st.session_state.setdefault(SAVED, {})


def seed(key: str, default: Any) -> None:
    """Give the widget `key` its saved value (or `default`) unless it already has one this session."""
    if key not in st.session_state:
        st.session_state[key] = saved().get(key, default)


def save(key: str) -> None:
    if key in st.session_state:
        saved()[key] = st.session_state[key]


def put(key: str, value: Any) -> None:
    """Set a widget's value from code (a callback): takes effect on the widget's next draw."""
    st.session_state[key] = value
    saved()[key] = value
