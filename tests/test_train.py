"""Tests for eagle.training (features, objective, train): pair construction, schedule, and a tiny resumable end-to-end run on the real
default model (a few conversations, 64 tokens, 3 steps)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle.models.headio import load_head
from eagle.models.loader import load_target
from eagle.training.features import Sequence, extract_features, prepare_features
from eagle.training.objective import lr_factor, make_batch
from eagle.training.train import train_head


def test_make_batch_pairs_and_mask() -> None:
    ids = torch.arange(10, 16)
    feats = torch.arange(6, dtype=torch.float16)[:, None].repeat(1, 3)
    mask = torch.tensor([0, 0, 0, 1, 1, 0], dtype=torch.bool)
    short = Sequence(ids[:4], feats[:4], mask[:4])
    b = make_batch([Sequence(ids, feats, mask), short], noise=0.0, gen=None, device=torch.device("cpu"))
    assert b["tokens"][0].tolist() == [11, 12, 13, 14, 15]  # x_{t+1}
    assert b["feats_in"][0, :, 0].tolist() == [0, 1, 2, 3, 4]  # f_t
    assert b["feats_out"][0, :, 0].tolist() == [1, 2, 3, 4, 5]  # f_{t+1}
    # A pair counts when x_{t+2} (the token predicted from f_{t+1}) is masked.
    assert b["valid"][0].tolist() == [False, True, True, False, False]
    assert b["valid"][1].tolist() == [False, True, False, False, False]  # padding never counts


def test_make_batch_noise_amplitude() -> None:
    n = 64
    seq = Sequence(torch.zeros(n, dtype=torch.long), torch.zeros(n, 8, dtype=torch.float16),
                   torch.ones(n, dtype=torch.bool))
    b = make_batch([seq], noise=0.2, gen=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    amp = 0.2 * 512 / n
    assert b["feats_in"].abs().max() <= amp / 2
    assert b["feats_in"].abs().max() > amp / 4
    assert b["feats_out"].abs().max() == 0  # targets stay clean


def test_lr_factor_warmup_then_decay() -> None:
    factors = [lr_factor(s, 10, 2) for s in range(10)]
    assert factors[0] == 0.5 and factors[1] == 1.0
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))
    assert factors[-1] > 0 and lr_factor(10, 10, 2) == 0


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return load_target(dtype=torch.float32)


def test_prepare_and_train_end_to_end(target, tmp_path: Path) -> None:
    feats_dir, out = tmp_path / "features", tmp_path / "train"
    stats = prepare_features(target, feats_dir, n_conversations=8, max_len=64, heldout_fraction=0.3,
                             shard_size=2)
    assert stats.train_samples > 0 and stats.heldout_samples > 0
    assert stats.forwards == stats.train_samples + stats.heldout_samples
    shards = sorted(feats_dir.glob("*.safetensors"))
    assert any(p.name.startswith("train-") for p in shards)
    shard = load_file(str(sorted(feats_dir.glob("train-*.safetensors"))[0]))
    first = slice(0, int(shard["offsets"][1]))
    assert shard["features"].dtype == torch.float16 and shard["features"].shape[1] == 576
    expected = extract_features(target, shard["input_ids"][first].long()).half()
    assert torch.equal(shard["features"][first], expected)
    again = prepare_features(target, feats_dir, n_conversations=8, max_len=64, heldout_fraction=0.3,
                             shard_size=2)
    assert again.forwards == 0 and again.shards_written == 0 and again.shards_skipped == stats.shards_written

    kw = dict(lr=1e-3, batch=2, warmup=1, vocab_k=1024, progress=False, eval_samples=2)
    first_run = train_head(target, feats_dir, out, steps=2, **kw)
    assert first_run["start_step"] == 0
    second = train_head(target, feats_dir, out, steps=3, final_dir=tmp_path / "final", **kw)
    assert second["start_step"] == 2
    assert math.isfinite(second["last_train"]["loss"])
    assert all(math.isfinite(v) for v in second["heldout"].values())
    assert 0 <= second["heldout"]["top1"] <= 1
    accs = [second["heldout"][f"acc_step{j}"] for j in range(1, 5)]  # per draft step, unrolled
    assert accs[0] == second["heldout"]["top1"] and all(0 <= a <= 1 for a in accs)
    steps_logged = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert max(steps_logged) == 3
    # Training-time test with the token loss (EAGLE-3 recipe) runs on the same data.
    ttt = train_head(target, feats_dir, tmp_path / "ttt", steps=2, ttt_steps=3, loss="token", **kw)
    assert ttt["config"]["ttt_steps"] == 3 and math.isfinite(ttt["last_train"]["loss"])
    assert ttt["last_train"]["loss"] > ttt["last_train"]["ce"]  # later steps add their weighted losses
    stopped = train_head(target, feats_dir, out, steps=10, max_minutes=1e-9, **kw)  # time budget: one step
    assert (stopped["start_step"], stopped["steps"], stopped["planned_steps"]) == (3, 4, 10)

    head = load_head(tmp_path / "final", target)
    assert int(head.token_counts.sum()) == stats.train_masked_tokens
    assert head.draft_vocab_ids(100) is not None
    ids = shard["input_ids"][first].long()[None]
    with torch.no_grad():
        pred = head(ids[:, 1:], shard["features"][first][None, :-1].float(),
                    torch.arange(ids.shape[1] - 1)[None], head.new_cache(64), 0)
    assert pred.shape == (1, ids.shape[1] - 1, 576) and torch.isfinite(pred).all()


def test_ttt_flags_parse() -> None:
    """(--ttt-steps 0 and other out-of-range values: tests/test_arguments.py.)"""
    from eagle.training.commands import build_parser
    args = build_parser().parse_args(["train", "--ttt-steps", "4", "--loss", "token"])
    assert (args.ttt_steps, args.ttt_decay, args.loss) == (4, 0.8, "token")
