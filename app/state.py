"""Process-wide model pair (shared by every session) and this session's UI state.

Imports flow app -> analysis -> eagle; nothing here is persisted: traces live in st.session_state
until the user downloads them."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import streamlit as st

from eagle.config import DecodeConfig
from eagle.head import DraftHead, resolve_head
from eagle.target import DEFAULT_MODEL, ModelLoadError, Target, load_target
from eagle.trace import Trace

TRACES_KEY = "traces"  # list[Trace]: every finished or stopped generation of this session
MAX_TRACES = 200  # typing-as-you-go makes many traces; keep a session's memory bounded


@dataclass
class Models:
    """The target and draft head, plus the lock that serialises generation across sessions."""
    target: Target
    head: DraftHead
    head_source: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def head_trained(self) -> bool:
        return not self.head_source.startswith("random")

    @property
    def head_label(self) -> str:
        return f"trained head ({self.head_source})" if self.head_trained else "random head"


@st.cache_resource(show_spinner=False)
def _load_models(model: str, head: str) -> Models:
    target = load_target(model)
    draft, source = resolve_head(target, head)
    return Models(target, draft, source)


_READY: set[tuple[str, str]] = set()  # pairs loaded in this process: skip the progress box for them
_BUDGET_REFRESHES: dict[tuple[str, str], int] = {}  # "measure again" clicks per pair: a new cache key


def model_spec() -> tuple[str, str]:
    """(model, head) to serve: EAGLE_MODEL / EAGLE_HEAD, else the embedded default and its head."""
    return os.environ.get("EAGLE_MODEL", DEFAULT_MODEL), os.environ.get("EAGLE_HEAD", "auto")


def get_models() -> Models:
    """The shared model pair; EAGLE_MODEL / EAGLE_HEAD pick another target or head directory.
    The first load shows progress; a load failure stops the page with one sentence."""
    spec = model_spec()
    if spec in _READY:
        return _load_models(*spec)
    with st.status(f"Loading {spec[0]} and its draft head…", expanded=True) as box:
        st.write("The first load ever converts the shipped GGUF to safetensors (about 30 s); "
                 "later loads take a few seconds and are shared by every browser tab.")
        try:
            models = _load_models(*spec)
        except (ModelLoadError, FileNotFoundError, ValueError) as err:
            box.update(label="The model could not be loaded", state="error")
            st.error(str(err))
            st.stop()
        box.update(label=f"Loaded {spec[0]} with a {models.head_label}", state="complete", expanded=False)
    _READY.add(spec)
    return models


@st.cache_resource(show_spinner=False)
def _auto_budget(spec: tuple[str, str], refresh_count: int, _models: Models) -> dict:
    """The auto-budget report for the loaded pair (eagle.budget caches it on disk per machine, so
    this only measures on the first run ever). Holds the model lock: timings need an idle model."""
    from eagle.budget import auto_config
    with _models.lock:
        return auto_config(_models.target, _models.head, DecodeConfig(), refresh=refresh_count > 0)[1]


def auto_budget(models: Models, refresh: bool = False) -> dict:
    """The chosen budget and the curve behind it; `refresh` measures this machine again."""
    spec = model_spec()
    if refresh:
        _BUDGET_REFRESHES[spec] = _BUDGET_REFRESHES.get(spec, 0) + 1
    with st.status("Choosing the tree budget for this machine…", expanded=False) as box:
        st.write("The first time ever, this measures the verify and draft costs and calibrates on three "
                 "prompts (about a minute); afterwards it is read from the cache.")
        report = _auto_budget(spec, _BUDGET_REFRESHES.get(spec, 0), models)
        box.update(label=f"Tree budget: {budget_label(report['chosen'])}", state="complete")
    return report


def budget_label(chosen: dict) -> str:
    vocab = chosen["draft_vocab"] or "full"
    return f"{chosen['total_tokens']} tokens, depth {chosen['depth']}, top-k {chosen['top_k']}, vocabulary {vocab}"



def session_traces() -> list[Trace]:
    return st.session_state.setdefault(TRACES_KEY, [])


def add_trace(trace: Trace) -> None:
    """Keep a finished or stopped trace; a rerun of the same prompt and config replaces the old one."""
    traces = [t for t in session_traces() if trace_key(t) != trace_key(trace)]
    traces.append(trace)
    st.session_state[TRACES_KEY] = traces[-MAX_TRACES:]


def trace_key(trace: Trace) -> tuple:
    return trace.header.prompt, tuple(sorted(trace.header.config.items()))


def show_head_badge(models: Models) -> None:
    """Sidebar note on which head drafts: users must know when low acceptance is expected."""
    if models.head_trained:
        st.sidebar.success(f"Draft head: {models.head_label}")
    else:
        st.sidebar.warning("Draft head: random (no trained head ships for this model yet), so drafts "
                           "are rarely accepted and τ stays near 1.")
