"""Training-side throughput in fp32 and bf16, side by side in one run: self-distillation (batched
greedy generation), feature extraction (prepare's target forward) and head training (train's own step,
bf16 autocast over fp32 master weights, with a two-step training-time test).

    .venv/bin/python scripts/bench_dtypes.py [--threads 2] [--repeats 3]

Both dtypes are loaded once and timed alternately, repeat by repeat, on the same ShareGPT prompts, so a
machine that slows down mid-run slows both. Prints one table (median of the repeats) and the bf16 / fp32
speed-up of each stage; decoding's costs are `python -m eagle budget`'s (dtype auto) and bench's."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import torch

from eagle.records.markdown import markdown_table
from eagle.models.loader import load_target
from eagle.models.target import Target
from eagle.training.data import _render_ids, read_sharegpt
from eagle.training.distill import DistillConfig, first_exchange, generate_batch
from eagle.training.features import Sequence, extract_features
from eagle.training.objective import make_batch, reduced_lm_weight
from eagle.training.train import TrainConfig, _amp, _init_head, _train_step

DTYPES = ("float32", "bfloat16")


def prompts(target: Target, n: int, max_tokens: int = 128) -> list[list[int]]:
    """The first n ShareGPT first turns that fit max_tokens, rendered with the chat template."""
    convs, _ = read_sharegpt(limit=8 * n)
    ids = [_render_ids(target.tokenizer, first_exchange(c), add_generation_prompt=True) for c in convs]
    return [p for p in ids if len(p) <= max_tokens][:n]


def time_distill(target: Target, batch: list[list[int]], new_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    replies = generate_batch(target, batch, DistillConfig(max_new_tokens=new_tokens, batch_size=len(batch)))
    return time.perf_counter() - t0, sum(len(r) for r, _ in replies)


def sequences(target: Target, samples: list[list[int]]) -> list[Sequence]:
    """Training sequences with the target's real features (every position counted in the loss)."""
    out = []
    for ids in samples:
        t = torch.tensor(ids)
        with torch.inference_mode():
            feats = extract_features(target, t).to(torch.float16)  # as prepare stores them
        out.append(Sequence(t, feats, torch.ones(len(ids), dtype=torch.bool)))
    return out


def time_features(target: Target, samples: list[list[int]]) -> tuple[float, int]:
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in samples:
            extract_features(target, torch.tensor(ids))
    return time.perf_counter() - t0, sum(len(s) for s in samples)


def trainer(target: Target, seqs: list[Sequence], steps: int) -> Callable[[], tuple[float, int]]:
    """A fresh head and optimizer; each call times `steps` optimizer steps of train's own step function."""
    cfg = TrainConfig(batch=4, ttt_steps=2)
    head = _init_head(target, seed=0)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr)
    counts = torch.bincount(torch.cat([s.input_ids for s in seqs]), minlength=target.config.vocab_size)
    lm_weight = reduced_lm_weight(target, counts, cfg.vocab_k)
    gen = torch.Generator().manual_seed(0)

    def run() -> tuple[float, int]:
        t0 = time.perf_counter()
        for _ in range(steps):
            picks = torch.randint(len(seqs), (cfg.batch,), generator=gen).tolist()
            _train_step(head, opt, make_batch([seqs[i] for i in picks], cfg.noise, gen, lm_weight.device),
                        lm_weight, cfg, _amp(target))
        return time.perf_counter() - t0, steps
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="distill batch (distill's default is 32)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per distill reply")
    p.add_argument("--train-steps", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    targets = {d: load_target(dtype=d) for d in DTYPES}
    batch = prompts(targets["float32"], args.batch)
    texts = batch[:8]  # the prompts double as training samples: real token sequences
    stages: dict[str, dict[str, Callable[[], tuple[float, int]]]] = {}
    for d, target in targets.items():
        seqs = sequences(target, texts)
        stages[d] = {"self-distill (tok/s)": lambda t=target: time_distill(t, batch, args.new_tokens),
                     "feature extraction (tok/s)": lambda t=target: time_features(t, texts),
                     "training (steps/s)": trainer(target, seqs, args.train_steps)}
    rates: dict[str, dict[str, list[float]]] = {d: {s: [] for s in stages[d]} for d in DTYPES}
    for r in range(args.repeats + 1):  # repeat 0 warms up (first-call allocations, oneDNN kernels)
        for d in DTYPES:
            for stage, fn in stages[d].items():
                seconds, units = fn()
                if r > 0:
                    rates[d][stage].append(units / seconds)
        print(f"repeat {r}/{args.repeats} done", file=sys.stderr, flush=True)
    rows = [[stage, *(f"{statistics.median(rates[d][stage]):.1f}" for d in DTYPES),
             f"{statistics.median(rates['bfloat16'][stage]) / statistics.median(rates['float32'][stage]):.2f}"]
            for stage in stages["float32"]]
    print(f"{args.threads} threads, distill batch {args.batch} x {args.new_tokens} new tokens, "
          f"median of {args.repeats}")
    print(markdown_table(["stage", "fp32", "bf16", "bf16 / fp32"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
