"""Self-distillation on the real default model: batched regeneration equals one-prompt greedy
generation, the JSONL output resumes after a torn write, and prepare/train use it end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle.data import _render_ids, read_sharegpt
from eagle.distill import DistillConfig, first_exchange, generate_batch, load_done, read_distilled, regenerate
from eagle.head import load_head
from eagle.train import _trainable_state, prepare_features, train_head

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


def test_regenerate_resumes_after_torn_write(target, convs, tmp_path: Path, single_thread) -> None:
    out = tmp_path / "distill.jsonl"
    first = regenerate(target, convs, out, CFG, progress=False)
    assert first.regenerated + first.skipped_long == len(convs) and first.regenerated > 2
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-2]) + lines[-2][:10])  # lose one record, tear the next
    assert len(load_done(out)) == len(lines) - 2
    second = regenerate(target, convs, out, CFG, progress=False)
    assert (second.already_done, second.regenerated) == (len(lines) - 2, 2)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(json.loads(line)["id"] for line in lines)
    distilled, truncated = read_distilled(out)
    assert len(distilled) == len(lines) and truncated == sum(json.loads(x)["truncated"] for x in lines)
    for conv in distilled:
        assert [t["role"] for t in conv][-2:] == ["user", "assistant"]


def test_prepare_self_distill_and_warm_start(target, tmp_path: Path, single_thread) -> None:
    feats = tmp_path / "features"
    stats = prepare_features(target, feats, n_conversations=8, max_len=64, heldout_fraction=0.3,
                             shard_size=4, distill=CFG)
    assert stats.distilled >= stats.train_samples + stats.heldout_samples > 0  # max_len may drop some
    assert (feats / "distill.jsonl").exists()
    with pytest.raises(ValueError, match="other settings"):
        prepare_features(target, feats, n_conversations=8, max_len=64, heldout_fraction=0.3, shard_size=4)

    kw = dict(lr=1e-3, batch=2, warmup=1, vocab_k=1024, progress=False, eval_samples=2)
    train_head(target, feats, tmp_path / "a", steps=2, **kw)
    warm = train_head(target, feats, tmp_path / "b", steps=0, init=str(tmp_path / "a" / "head"), **kw)
    assert warm["steps"] == 0
    start, end = (_trainable_state(load_head(tmp_path / d / "head", target)) for d in ("a", "b"))
    assert all(torch.equal(start[k], end[k]) for k in start)
