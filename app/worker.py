"""One long-lived thread for every torch call the app makes (model loading, budget timing, decoding).

Why: each Streamlit run executes on a new thread, and torch's OpenMP runtime (libgomp) gives every thread
that runs a parallel region its own pool of worker threads. Once more libgomp threads exist than cores, it
stops spin-waiting between regions and puts its workers to sleep, so every small matrix product pays a
wake-up. Measured on the 2-core machine: a 3x576 by 576x1536 product took 47 us on the thread that made the
first pool and 152 us on any other thread alive beside it, and a 48-token decode ran at 16 tok/s instead of
27. So all torch work runs on this one thread: loading, the budget's timing, building the decoder and every
decoding round. A stray tensor operation on a script thread would make a second pool and slow this one.
(Setting the script threads' torch parallelism to 1 instead does not work: torch.set_num_threads also sets
MKL's process-wide thread count, so the decoding thread would lose its second core.)"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, TypeVar

import streamlit as st

T = TypeVar("T")


@st.cache_resource(show_spinner=False)
def _torch_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle-torch")


def submit(fn: Callable[..., T], *args, **kwargs) -> Future[T]:
    """Queue fn on the torch thread; calls run one after another, in the order submitted."""
    return _torch_thread().submit(fn, *args, **kwargs)


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run fn on the torch thread and wait for it (its exception, if any, is raised here)."""
    return submit(fn, *args, **kwargs).result()


def wait(future: Future[T], on_wait: Callable[[], None], poll_s: float = 0.25) -> T:
    """future's result, calling on_wait every poll_s while it is queued or running: a call queued behind
    another session's generation keeps its page live (and interruptible by a rerun) meanwhile."""
    while True:
        try:
            return future.result(timeout=poll_s)
        except FutureTimeout:
            on_wait()

