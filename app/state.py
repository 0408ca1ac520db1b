"""Process-wide model pair (shared by every session) and this session's UI state.

Imports flow app -> analysis -> eagle; traces live in st.session_state, and every finished or stopped
one is also kept in the run history on disk (app.history)."""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from eagle.core.config import ModelLimits
from eagle.models.head import AnyHead
from eagle.models.kernels import head_precision
from eagle.models.headio import head_identity
from eagle.tools.loading import ModelSpec, open_pair
from eagle.tools.session import Session
from eagle.tools.budget.report import AutoReport
from eagle.models.location import DEFAULT_MODEL, ModelLoadError
from eagle.models.precision import DTYPE_CHOICES, dtype_name
from eagle.models.target import Target
from eagle.records.trace import Trace

from . import history, worker
from .persist import save, seed

TRACES_KEY = "traces"  # list[Trace]: every finished or stopped generation of this session
MAX_TRACES = 200  # typing-as-you-go makes many traces; keep a session's memory bounded
DTYPE_KEY = "dtype"  # one precision for the session: the model pair is shared by every page
ROOT = Path(__file__).resolve().parent.parent
Spec = tuple[str, str, str]  # (model, head, dtype choice)


def short_path(text: str) -> str:
    """A path as the user knows it: relative to the repository, else to the home directory."""
    path = Path(text)
    for base, prefix in ((ROOT, ""), (Path.home(), "~/")):
        if path.is_absolute() and path.is_relative_to(base):
            return prefix + str(path.relative_to(base))
    return text


@dataclass
class Models:
    """The target and draft head, plus the lock that serialises generation across sessions."""
    target: Target
    head: AnyHead
    head_source: str
    # head_type, head_version (the weights hash) and head_layout for trace headers: hashed once, at load, on
    # the torch thread (hashing converts every weight, a torch call no script thread may make: app.worker)
    head_identity: dict[str, str | dict | None] = field(default_factory=dict)
    head_dtype_reason: str | None = None  # how --head-dtype auto chose the head's precision (None: on CUDA)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def session(self) -> Session:
        """The loaded pair as the one session every front end decodes through (eagle.tools.session)."""
        return Session(self.target, self.head, self.head_source, self.head_identity)

    @property
    def limits(self) -> ModelLimits:
        """What the settings' inputs are bounded by: the target's context and vocabulary."""
        return ModelLimits(self.target.max_context, int(self.target.config.vocab_size))

    @property
    def head_trained(self) -> bool:
        return not self.head_source.startswith("random")

    @property
    def head_label(self) -> str:
        return f"trained head ({short_path(self.head_source)})" if self.head_trained else "random head"

    @property
    def head_type_label(self) -> str:
        return HEAD_TYPE_LABELS.get(self.head.kind, self.head.kind)

    @property
    def dtype_label(self) -> str:
        return dtype_name(self.target.dtype)

    @property
    def dtype_reason(self) -> str | None:
        """How "auto" chose the precision (None when the user named one, or on CUDA)."""
        return (self.target.dtype_report or {}).get("reason")


_LOAD_LOCK = threading.Lock()  # two sessions asking for a new pair at once load it once


def open_models(model: str, head: str, dtype: str = "auto") -> Models:
    """The pair as the dashboard serves it: the head drafts in its own fastest precision (--head-dtype auto)."""
    pair = open_pair(ModelSpec(model, head, None, dtype, "auto"))
    return Models(pair.target, pair.head, pair.head_source, head_identity(pair.head), pair.head_dtype_reason)


@st.cache_resource(show_spinner=False)
def _load_models(model: str, head: str, dtype: str = "auto") -> Models:
    with _LOAD_LOCK:
        return worker.call(open_models, model, head, dtype)  # on the app's torch thread, as all torch work (app.worker)


_READY: set[Spec] = set()  # pairs loaded in this process: skip the progress box for them
_BUDGET_REFRESHES: dict[Spec, int] = {}  # "measure again" clicks per pair: a new cache key


def model_spec(dtype: str = "auto") -> Spec:
    """(model, head, dtype) to serve: EAGLE_MODEL / EAGLE_HEAD, else the embedded default and its head."""
    return os.environ.get("EAGLE_MODEL", DEFAULT_MODEL), os.environ.get("EAGLE_HEAD", "auto"), dtype


def dtype_choice() -> str:
    """The sidebar's precision picker; one value for every page (kept across page switches)."""
    seed(DTYPE_KEY, "auto")
    choice = st.sidebar.selectbox("Precision (dtype)", DTYPE_CHOICES, key=DTYPE_KEY,
                                  help="auto: bf16 on a GPU; on a CPU the faster of float32 and bfloat16, "
                                       "measured once on this machine")
    save(DTYPE_KEY)
    return choice


def get_models(dtype: str | None = None) -> Models:
    """The shared model pair at the session's precision; EAGLE_MODEL / EAGLE_HEAD pick another
    target or head directory. The first load shows progress; a failure stops the page with one sentence."""
    spec = model_spec(dtype or st.session_state.get(DTYPE_KEY, "auto"))
    if spec in _READY:
        return _load_models(*spec)
    with st.status(f"Loading {spec[0]} ({spec[2]}) and its draft head…", expanded=True) as box:
        st.write("The first load ever converts the shipped GGUF to safetensors (about 30 s) and, for "
                 "auto precision, times float32 against bfloat16 once; later loads take a few seconds "
                 "and are shared by every browser tab.")
        try:
            models = _load_models(*spec)
        except (ModelLoadError, FileNotFoundError, ValueError) as err:
            box.update(label="The model could not be loaded", state="error")
            st.error(str(err))
            st.stop()
        box.update(label=f"Loaded {spec[0]} ({models.dtype_label}) with a {models.head_label}",
                   state="complete", expanded=False)
    _READY.add(spec)
    return models


@st.cache_resource(show_spinner=False)
def _auto_budget(spec: Spec, refresh_count: int, _models: Models) -> AutoReport:
    """The auto-budget report for the loaded pair (eagle.tools.budget caches it on disk per machine and
    dtype, so this only measures on the first run ever). Holds the model lock: timings need an idle model.
    The report of the settings a generation under the auto budget runs with (Session.auto_report), so the
    budget the pages show is the one the decoder uses."""
    with _models.lock:
        return worker.call(_models.session.auto_report, refresh=refresh_count > 0)


def auto_budget(models: Models, refresh: bool = False) -> AutoReport:
    """The chosen budget and the curve behind it; `refresh` measures this machine again."""
    spec = model_spec(st.session_state.get(DTYPE_KEY, "auto"))
    if refresh:
        _BUDGET_REFRESHES[spec] = _BUDGET_REFRESHES.get(spec, 0) + 1
    with st.status("Choosing the tree budget for this machine…", expanded=False) as box:
        st.write("The first time ever, this measures the verify and draft costs and calibrates on 16 "
                 "prompts (a few minutes on two cores); afterwards it is read from the cache.")
        report = _auto_budget(spec, _BUDGET_REFRESHES.get(spec, 0), models)
        box.update(label=f"Tree budget: {budget_label(report.chosen)}", state="complete")
    return report


def budget_label(chosen: dict) -> str:
    """The budget in the app's one naming of depth: a node's level below the root (as in the traces
    and the analysis pages). The config's `depth` (CLI --depth) counts expansion steps, so its
    trees reach depth + 1."""
    vocab = chosen["draft_vocab"] or "full"
    return (f"{chosen['total_tokens']} tokens, tree depth {chosen['depth'] + 1} (--depth {chosen['depth']}), "
            f"top-k {chosen['top_k']}, vocabulary {vocab}")


def session_traces() -> list[Trace]:
    return st.session_state.setdefault(TRACES_KEY, [])


def add_trace(trace: Trace, keep: bool = True) -> None:
    """Keep a finished or stopped trace; a rerun of the same prompt and config replaces the old one.
    It is also kept in the run history on disk (app.history) unless `keep` is False (a run the user
    just loaded from there)."""
    traces = [t for t in session_traces() if trace_key(t) != trace_key(trace)]
    traces.append(trace)
    st.session_state[TRACES_KEY] = traces[-MAX_TRACES:]
    if keep:
        try:
            history.RunStore().add(trace)
        except (history.HistoryError, OSError) as err:  # the run itself is fine: say so, go on
            st.warning(f"This run was not saved to the run history: {err}.")


def trace_key(trace: Trace) -> tuple:
    # a conversation's earlier turns and system prompt are in meta["messages"]: part of what was asked
    messages = json.dumps(trace.header.meta.get("messages"), sort_keys=True)
    return trace.header.prompt, messages, tuple(sorted(trace.header.config.items()))


def run_label(index: int, trace: Trace) -> str:
    """How a run is listed in the analysis pages' history picker."""
    cfg, prompt = trace.header.config, " ".join(trace.header.prompt.split())
    prompt = prompt if len(prompt) <= 40 else prompt[:39] + "…"
    tokens = sum(len(s.new_tokens) for s in trace.steps)
    tree = "" if cfg.get("mode") == "vanilla" else f" {cfg.get('total_tokens')}/{cfg.get('depth')}/{cfg.get('top_k')}"
    return f"#{index + 1} {cfg.get('mode')}{tree} · {tokens} tokens · “{prompt}”"


HEAD_TYPE_LABELS = {"eagle1": "EAGLE-1/2 head", "eagle3": "EAGLE-3 head"}


def show_head_badge(models: Models) -> None:
    """Sidebar note on which head drafts (type, version) and at what precision: users must know when
    low acceptance is expected, and which dtype the speeds belong to."""
    st.sidebar.caption(f"Head type: **{models.head_type_label}** · version `{models.head_identity['head_version']}`")
    if models.head_trained:
        st.sidebar.success(f"Draft head: {models.head_label}")
    else:
        st.sidebar.warning("Draft head: random (no trained head ships for this model yet), so drafts "
                           "are rarely accepted and τ stays near 1.")
    reason, head_reason = models.dtype_reason, models.head_dtype_reason
    st.sidebar.caption(f"Precision in use: **{models.dtype_label}**" + (f" (auto: {reason})" if reason else ""))
    st.sidebar.caption(f"Head drafts in: **{head_precision(models.head)}**"
                       + (f" (auto: {head_reason})" if head_reason else ""))
