"""Generation for the pages: the torch thread decodes ahead while the script thread draws.

The decoder and the model are shared by every session, so a whole generation holds models.lock.
Decoding and drawing overlap: the torch thread (app.worker) runs round after round into a queue, and the
script thread takes each record from it, so a redraw no longer stalls the decoder for its duration.
A Streamlit rerun (the user typed more, pressed Stop, moved a widget) stops the script thread at its
next element update, while the new run starts at once on another thread: the try/finally below then
stops the decoder after its round in flight and frees the lock, which the new run is polling for."""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import asdict
from typing import Callable

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, Generation
from eagle.records.trace import StepRecord, Trace

from . import worker
from .state import Models

WAIT_MESSAGE = ("Waiting for the model: another generation is running (another tab's, or this tab's "
                "previous one finishing its round)…")
OnStep = Callable[[Trace], bool]  # called after every round; True stops the generation
OnWait = Callable[[], None]  # called while another generation holds the lock (keeps the page live)


def prepare(models: Models, prompt: str, cfg: DecodeConfig, budget: str = "fixed",
            on_wait: OnWait = lambda: None) -> tuple[Decoder, list[int], Trace]:
    """Encode and build the decoder; PromptError / ValueError carry a one-sentence message. On the torch
    thread: building a decoder makes tensors, and one parallel fill on this script thread would give it an
    OpenMP pool that stays alive while it waits for the rounds, throttling the torch thread's (app.worker).
    Behind another session's generation it waits there, calling on_wait."""
    return worker.wait(worker.submit(_prepare, models, prompt, cfg, budget), on_wait)


def _prepare(models: Models, prompt: str, cfg: DecodeConfig, budget: str = "fixed") -> tuple[Decoder, list[int], Trace]:
    """auto and adaptive tune the tree for this prompt exactly as the CLI does (eagle.tools.session)."""
    run = models.session.prepare(prompt, cfg, budget, seconds=0.0, finished=None)
    return run.decoder, run.ids, Trace(run.header, [])


def run(models: Models, decoder: Decoder, ids: list[int], trace: Trace,
        on_step: OnStep, on_wait: OnWait) -> Trace:
    """Decode into `trace` (filled in place, so a caller that keeps it sees partial progress)."""
    _acquire(models, on_wait)
    records: queue.Queue = queue.Queue()
    stop = threading.Event()
    t0 = time.perf_counter()
    decoding = worker.submit(_decode_ahead, decoder, ids, records, stop)
    try:
        while (record := records.get()) is not _END:
            if is_complete(trace):  # marked stopped by this session's next script run
                break
            trace.steps.append(record)
            _stamp(trace, t0, record.finished)
            if on_step(trace):
                _stamp(trace, t0, "stopped")
                break
    finally:
        stop.set()
        try:
            decoding.result()  # the round in flight ends, the generator closes; a decoder error is raised
        finally:
            models.lock.release()
    return trace


_END = object()  # the queue's last item: the generation ended, stopped or failed


def _decode_ahead(decoder: Decoder, ids: list[int], records: queue.Queue, stop: threading.Event) -> None:
    """On the torch thread: every round's record into `records` as it finishes, until the generation
    ends or `stop` is set (checked between rounds, so stopping costs at most the round in flight)."""
    steps = decoder.steps(ids)
    try:
        for record in steps:
            records.put(record)
            if stop.is_set():
                break
    finally:
        steps.close()
        records.put(_END)


def _acquire(models: Models, on_wait: OnWait) -> None:
    # Poll rather than block: each on_wait() touches the page, so a rerun can still interrupt us.
    while not models.lock.acquire(timeout=0.25):
        on_wait()


def _stamp(trace: Trace, t0: float, finished: str | None) -> None:
    # With fast reruns, an interrupted script thread finishes its round while the next run already
    # marks the trace stopped: never turn a finished trace back into an unfinished one.
    meta = trace.header.meta
    meta.update(seconds=time.perf_counter() - t0, finished=meta.get("finished") or finished)


def generation(trace: Trace) -> Generation:
    """The trace as eagle's Generation, for tau and tokens/s."""
    tokens = [t for s in trace.steps for t in s.new_tokens]
    meta = trace.header.meta
    return Generation([], tokens, trace.steps, float(meta.get("seconds") or 0.0), meta.get("finished"))


def is_complete(trace: Trace) -> bool:
    """Finished (eos / max_new_tokens / context) or stopped by the user; not merely interrupted."""
    return trace.header.meta.get("finished") is not None


def last_step(trace: Trace) -> StepRecord | None:
    return trace.steps[-1] if trace.steps else None


def request_key(prompt: str | list[dict], cfg: DecodeConfig, budget: str) -> tuple[str, str, str]:
    """What a run was asked for: the prompt, the sidebar's settings and the budget policy (the trace
    header holds the tree the policy chose for the prompt, which may differ from the sidebar's)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)  # a conversation
    return text, json.dumps(asdict(cfg), sort_keys=True), budget


def prompt_lookup(models: Models, ids: list[int], cfg: DecodeConfig, on_wait: OnWait) -> dict:
    """The same prompt through Hugging Face `generate` with prompt lookup decoding on the same target
    (eagle.tools.bench's hf_pld runner): one row for the Compare table, no trace (HF records no
    rounds). Holds the lock like a decode; runs on the torch thread."""
    _acquire(models, on_wait)
    try:
        return worker.wait(worker.submit(_prompt_lookup, models, ids, cfg), on_wait)
    finally:
        models.lock.release()


def _prompt_lookup(models: Models, ids: list[int], cfg: DecodeConfig) -> dict:
    from eagle.tools.bench.run import HFRunner  # deferred: the bench module pulls in its datasets
    t0 = time.perf_counter()
    tokens, forwards, _ = HFRunner(models.target, cfg, "hf_pld")(ids)
    return {"mode": "hf_pld", "new_tokens": len(tokens), "target_forwards": forwards,
            "seconds": time.perf_counter() - t0}
