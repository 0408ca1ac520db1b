"""Self-distillation on the real default model: batched regeneration equals one-prompt greedy
generation, the store resumes window by window (bad and torn lines skipped, nothing truncated away),
refuses other settings, and prepare/train use it end to end."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eagle.training.data import _render_ids, read_sharegpt
from eagle.training.distill import DistillConfig, first_exchange, generate_batch, read_distilled, regenerate
from eagle.training.store import OPEN_FILE, DistillStore, ReadStats
from eagle.records.files import BusyError, exclusive_lock
from eagle.models.headio import load_head
from eagle.training.features import prepare_features
from eagle.training.train import _trainable_state, train_head

CFG = DistillConfig(max_new_tokens=8, max_prompt_tokens=96, batch_size=3)


@pytest.fixture(scope="module")
def convs():
    return read_sharegpt(limit=8)[0]


def test_batched_generation_equals_single_prompt_greedy(target, convs, single_thread) -> None:
    prompts = [_render_ids(target.tokenizer, first_exchange(c), add_generation_prompt=True) for c in convs[:3]]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    batched = generate_batch(target, prompts, CFG)
    for prompt, (reply, cut) in zip(prompts, batched):
        alone = generate_batch(target, [prompt], CFG)[0]
        assert (reply, cut) == alone
        assert cut == (len(reply) == CFG.max_new_tokens)
        assert not set(reply) & target.eos_ids


def test_store_resumes_window_by_window_and_survives_bad_lines(target, convs, tmp_path: Path,
                                                             single_thread) -> None:
    store_dir = tmp_path / "store"
    first = regenerate(target, convs[:5], store_dir, CFG, progress=False, window=3)
    store = DistillStore.open(store_dir)
    assert [(c["first_index"], c["end_index"]) for c in store.manifest["chunks"]] == [(0, 3), (3, 5)]
    assert first.regenerated + first.skipped_long == 5 and not (store_dir / OPEN_FILE).exists()
    sealed = {r["id"]: r for r in store.records()}

    # A killed run: one finished batch of the next window in open.jsonl, a blank and a bad line in the
    # middle, and a torn last line. Resume keeps the good record and regenerates only the rest.
    prompts = {i: _render_ids(target.tokenizer, first_exchange(convs[i]), True) for i in range(5, len(convs))}
    k = next(i for i, p in prompts.items() if len(p) <= CFG.max_prompt_tokens)
    reply, cut = generate_batch(target, [prompts[k]], CFG)[0]
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    good = {"id": k, "conversations": turns, "truncated": cut, "new_tokens": len(reply), "marker": True}
    (store_dir / OPEN_FILE).write_text(json.dumps(good) + "\n\nnot json\n" + '{"id": 7, "conv')
    read = ReadStats()
    assert set(DistillStore.open(store_dir).read_open(read)) == {k}
    assert read.bad_lines == 1 and read.torn_tail
    second = regenerate(target, convs, store_dir, CFG, progress=False, window=3)
    assert second.already_done == 5 and second.regenerated + second.skipped_long == len(convs) - 6
    assert second.bad_lines == 1  # the bad middle line, said once; the good record kept
    records = {r["id"]: r for r in DistillStore.open(store_dir).records()}
    assert records[k].get("marker") and all(records[i] == r for i, r in sealed.items())
    distilled, truncated = read_distilled(store_dir, limit=len(convs))
    assert len(distilled) == len(records) and truncated == sum(r["truncated"] for r in records.values())


def test_store_refuses_other_settings_and_a_changed_chunk(target, convs, tmp_path: Path, single_thread) -> None:
    regenerate(target, convs[:2], tmp_path, CFG, progress=False)
    with pytest.raises(ValueError, match="max_new_tokens=8"):
        regenerate(target, convs[:2], tmp_path, DistillConfig(max_new_tokens=9, max_prompt_tokens=96), progress=False)
    chunk = tmp_path / DistillStore.open(tmp_path).manifest["chunks"][0]["file"]
    chunk.write_bytes(chunk.read_bytes() + b"x")
    with pytest.raises(ValueError, match="hash"):
        DistillStore.open(tmp_path).records()


def test_a_covered_store_is_read_while_another_run_holds_its_lock(target, convs, tmp_path: Path,
                                                                 single_thread) -> None:
    """prepare --self-distill over conversations the sealed chunks already cover needs no lock, so it
    runs beside the background distill job; asking for more than is sealed still says busy."""
    regenerate(target, convs[:3], tmp_path, CFG, progress=False, window=3)
    with exclusive_lock(tmp_path / ".lock", "the store"):
        again = regenerate(target, convs[:3], tmp_path, CFG, progress=False, window=3)
        assert again.already_done == 3 and again.regenerated == 0
        with pytest.raises(BusyError):
            regenerate(target, convs[:4], tmp_path, CFG, progress=False, window=3)


def test_the_committed_store_reads_back() -> None:
    store = DistillStore.open(Path(__file__).resolve().parent.parent / "data" / "distill" / "smollm2-135m-instruct")
    records = list(store.chunk_records())
    assert len(records) == store.manifest["totals"]["records"] > 0
    assert all(r["conversations"][-1]["from"] == "gpt" for r in records)


@pytest.mark.slow
def test_prepare_self_distill_and_warm_start(target, tmp_path: Path, single_thread) -> None:
    feats = tmp_path / "features"
    stats = prepare_features(target, feats, n_conversations=8, max_len=64, heldout_fraction=0.3,
                             shard_size=4, distill=CFG)
    assert stats.distilled >= stats.train_samples + stats.heldout_samples > 0  # max_len may drop some
    assert (feats / "distill" / "manifest.json").exists()
    with pytest.raises(ValueError, match="other settings"):
        prepare_features(target, feats, n_conversations=8, max_len=64, heldout_fraction=0.3, shard_size=4)
    # fresh data for a warm start: only conversations 4-7, read from the same store, and said so in the manifest
    tail = prepare_features(target, tmp_path / "tail", n_conversations=8, max_len=64, heldout_fraction=0.3,
                            shard_size=4, distill=replace(CFG, store=str(feats / "distill")), first_conversation=4)
    ids = [int(r["id"]) for r in DistillStore.open(feats / "distill").records()]
    assert 0 < tail.distilled == sum(i >= 4 for i in ids) < stats.distilled
    assert json.loads((tmp_path / "tail" / "manifest.json").read_text())["first_conversation"] == 4

    kw = dict(lr=1e-3, batch=2, warmup=1, vocab_k=1024, progress=False, eval_samples=2)
    train_head(target, feats, tmp_path / "a", steps=2, **kw)
    warm = train_head(target, feats, tmp_path / "b", steps=0, init=str(tmp_path / "a" / "head"), **kw)
    assert warm["steps"] == 0
    start, end = (_trainable_state(load_head(tmp_path / d / "head", target)) for d in ("a", "b"))
    assert all(torch.equal(start[k], end[k]) for k in start)
