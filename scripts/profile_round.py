"""Where a decoding round spends its time: per-phase totals from the step records (draft, verify,
commit, and what lies outside them) plus cProfile's top functions by self time.

    .venv/bin/python scripts/profile_round.py --budget 8/3/4/8192 --prompts 3 --tokens 64 --threads 1

Run it on an otherwise idle machine: on 2 cores a second busy process makes torch's threads spin-wait.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

from eagle.questions import load_questions
from eagle.config import DecodeConfig
from eagle.decode import Decoder, encode_prompt, generate
from eagle.head import resolve_head
from eagle.target import load_target


def phase_table(steps: list, wall: float) -> list[tuple[str, float, float]]:
    """(phase, ms per drafted round, % of wall) over the drafted rounds; 'other' is everything the
    phases do not cover (the generator loop, trace records, Python between phases)."""
    rounds = [s for s in steps if s.step > 0]
    totals: dict[str, float] = {}
    for s in rounds:
        for name, seconds in s.timings.items():
            totals[name] = totals.get(name, 0.0) + seconds
    prefill = sum(s.timings.get("prefill", 0.0) for s in steps if s.step == 0)
    totals["other"] = wall - prefill - sum(totals.values())
    n = max(1, len(rounds))
    return [(name, 1000 * t / n, 100 * t / (wall - prefill)) for name, t in totals.items()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="8/3/4/8192", help="TOTAL/DEPTH/TOP_K[/DRAFT_VOCAB]")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=15, help="functions to list by self time")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    parts = [int(x) for x in args.budget.split("/")]
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=args.tokens, **dict(zip(
        ("total_tokens", "depth", "top_k", "draft_vocab"), parts)))
    target = load_target()
    head, source = resolve_head(target, "auto")
    questions, _ = load_questions("mt_bench")
    prompts = [encode_prompt(target.tokenizer, q.turns[0], target.max_context) for q in questions[:args.prompts]]
    generate(Decoder(target, head, cfg.with_(max_new_tokens=8)), prompts[0])  # warm-up
    profiler, steps, tokens = cProfile.Profile(), [], 0
    t0 = time.perf_counter()
    profiler.enable()
    for ids in prompts:
        g = generate(Decoder(target, head, cfg), ids)
        steps += g.steps
        tokens += len(g.tokens)
    profiler.disable()
    wall = time.perf_counter() - t0
    print(f"{source}; budget {args.budget}; {args.prompts} prompts, {tokens} tokens in {wall:.2f} s "
          f"({tokens / wall:.1f} tok/s, under cProfile); threads {args.threads}")
    print(f"{'phase':<10}{'ms/round':>10}{'% of decode':>13}")
    for name, ms, share in phase_table(steps, wall):
        print(f"{name:<10}{ms:>10.2f}{share:>12.1f}%")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
