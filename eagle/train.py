"""Training a draft head for a target: feature extraction from ShareGPT, then the EAGLE recipe.

`prepare` runs the target over chat-templated ShareGPT conversations and stores, per sample, the
token ids, the target's post-norm last hidden states (fp16) and the assistant-only loss mask in
shards of safetensors files. `train` fits a DraftHead on (f_t, x_{t+1}) -> f_{t+1} with the
official loss (SmoothL1 on features + 0.1 * soft cross-entropy through the target's lm_head).
Both steps are resumable: finished shards are skipped and training restarts from its checkpoint.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from .data import Conversation, read_sharegpt, split_conversations, tokenize_conversation
from .head import COUNTS_FILE, DraftHead, new_head, save_head
from .target import DEFAULT_MODEL, Target, load_target

SPLITS = ("train", "heldout")
MANIFEST = "manifest.json"
Sample = tuple[torch.Tensor, torch.Tensor]  # (input_ids (T,), loss_mask (T,))


def _logger(name: str, log_path: Path) -> logging.Logger:
    """A logger writing to log_path (appending, so a resumed run keeps its history) and stderr."""
    log = logging.getLogger(f"eagle.train.{name}.{log_path}")
    if not log.handlers:
        log.setLevel(logging.INFO)
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
        for handler in (logging.FileHandler(log_path), logging.StreamHandler()):
            handler.setFormatter(fmt)
            log.addHandler(handler)
        log.propagate = False
    return log


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write then rename, so an interrupted run never leaves a half-written file that looks finished."""
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def _write_json_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


# --- feature extraction ---------------------------------------------------------------------------


def _tokenize_all(target: Target, convs: list[Conversation], max_len: int, desc: str) -> list[Sample]:
    """Tokenize in order (shard contents must be identical across restarts for resume to be sound)."""
    samples = []
    for conv in tqdm(convs, desc=f"tokenize {desc}", unit="conv", leave=False):
        sample = tokenize_conversation(target.tokenizer, conv, max_len)
        # A pair needs two positions after the first and at least one masked prediction.
        if sample is not None and len(sample[0]) >= 3:
            samples.append(sample)
    return samples


def count_tokens(samples: list[Sample], vocab_size: int) -> torch.Tensor:
    """Frequencies of the assistant (loss-masked) tokens: the tokens a draft head has to predict."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in samples:
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def extract_features(target: Target, input_ids: torch.Tensor) -> torch.Tensor:
    """The target's post-norm last hidden states (T, H) for one sequence, through Target.forward
    itself so that training features equal exactly what the decoder feeds the head."""
    n = input_ids.numel()
    ids = input_ids[None].to(target.device)
    positions = torch.arange(n, device=target.device)[None]
    _, features = target.forward(ids, positions, target.new_cache(n), 0, logits_rows=slice(0, 0))
    return features[0]


def _write_shard(target: Target, samples: list[Sample], path: Path) -> int:
    """Forward each sample and store the shard as flat tensors + offsets; returns tokens written."""
    feats = [extract_features(target, ids).to("cpu", torch.float16) for ids, _ in samples]
    lengths = torch.tensor([0] + [len(ids) for ids, _ in samples], dtype=torch.long)
    _save_atomic({
        "input_ids": torch.cat([ids for ids, _ in samples]).to(torch.int32),
        "loss_mask": torch.cat([mask for _, mask in samples]),
        "features": torch.cat(feats).contiguous(),
        "offsets": torch.cumsum(lengths, 0),
    }, path)
    return int(lengths.sum())


def _check_manifest(out_dir: Path, manifest: dict) -> None:
    """Refuse to mix shards made with different settings (resume relies on identical shard contents)."""
    path = out_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        keys = ("model", "n_conversations", "max_len", "heldout_fraction", "seed", "shard_size")
        if any(old.get(k) != manifest[k] for k in keys):
            raise ValueError(f"{out_dir} holds features made with other settings ({old}); use another --out.")


@dataclass
class PrepareStats:
    conversations_read: int = 0
    records_read: int = 0
    train_samples: int = 0
    heldout_samples: int = 0
    train_tokens: int = 0
    train_masked_tokens: int = 0
    heldout_tokens: int = 0
    shards_written: int = 0
    shards_skipped: int = 0
    forwards: int = 0  # target forwards run by this call (0 when everything was already done)


def prepare_features(target: Target, out_dir: str | Path, n_conversations: int = 800, max_len: int = 512,
                     heldout_fraction: float = 0.05, shard_size: int = 64, seed: int = 0,
                     sharegpt: str | Path | None = None) -> PrepareStats:
    """Extract training features into out_dir/{train,heldout}-NNNNN.safetensors (resumable)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = _logger("prepare", out_dir / "prepare.log")
    convs, report = read_sharegpt(sharegpt, limit=n_conversations)
    stats = PrepareStats(conversations_read=len(convs), records_read=report.records_read)
    log.info("read %d conversations (%d records, %d skipped)", len(convs), report.records_read,
             report.records_skipped)
    manifest = dict(model=target.name, n_conversations=n_conversations, max_len=max_len,
                    heldout_fraction=heldout_fraction, seed=seed, shard_size=shard_size)
    _check_manifest(out_dir, manifest)
    by_split = dict(zip(SPLITS, split_conversations(convs, heldout_fraction, seed)))
    samples = {s: _tokenize_all(target, c, max_len, s) for s, c in by_split.items()}
    counts = count_tokens(samples["train"], target.config.vocab_size)
    _save_atomic({"token_counts": counts}, out_dir / COUNTS_FILE)
    stats.train_samples, stats.heldout_samples = len(samples["train"]), len(samples["heldout"])
    stats.train_tokens = sum(len(ids) for ids, _ in samples["train"])
    stats.train_masked_tokens = int(counts.sum())
    stats.heldout_tokens = sum(len(ids) for ids, _ in samples["heldout"])
    log.info("samples: %d train (%d tokens, %d masked), %d held-out (%d tokens)", stats.train_samples,
             stats.train_tokens, stats.train_masked_tokens, stats.heldout_samples, stats.heldout_tokens)
    _write_shards(target, samples, out_dir, shard_size, stats, log)
    _write_json_atomic({**manifest, "stats": asdict(stats)}, out_dir / MANIFEST)
    log.info("done: %s", asdict(stats))
    return stats


def _write_shards(target: Target, samples: dict[str, list[Sample]], out_dir: Path, shard_size: int,
                  stats: PrepareStats, log: logging.Logger) -> None:
    jobs = [(split, i, samples[split][i:i + shard_size])
            for split in SPLITS for i in range(0, len(samples[split]), shard_size)]
    bar = tqdm(jobs, desc="extract", unit="shard")
    for split, i, chunk in bar:
        path = out_dir / f"{split}-{i // shard_size:05d}.safetensors"
        if path.exists():
            stats.shards_skipped += 1
            continue
        start = time.perf_counter()
        tokens = _write_shard(target, chunk, path)
        stats.forwards += len(chunk)
        stats.shards_written += 1
        log.info("wrote %s: %d samples, %d tokens, %.1f s", path.name, len(chunk), tokens,
                 time.perf_counter() - start)
    log.info("shards: %d written, %d already there", stats.shards_written, stats.shards_skipped)


# --- command line ---------------------------------------------------------------------------------


def _add_prepare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conversations", type=int, default=800, help="ShareGPT conversations to read")
    p.add_argument("--max-len", type=int, default=512, help="truncate samples to this many tokens")
    p.add_argument("--heldout-fraction", type=float, default=0.05)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: the packaged file)")


def _run_prepare(args: argparse.Namespace, target: Target) -> None:
    prepare_features(target, args.features, args.conversations, args.max_len, args.heldout_fraction,
                     args.shard_size, args.seed, args.sharegpt)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle", description="Train an EAGLE draft head.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"prepare": "extract target features", "train": "train the head", "all": "prepare + train"}
    for name, help_text in commands.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", default=DEFAULT_MODEL)
        p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--features", default="runs/features", help="feature shard directory")
        if name in ("prepare", "all"):
            _add_prepare_args(p)
        if name in ("train", "all"):
            _add_train_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # fp32 target: features are stored in fp16 anyway, and training keeps fp32 master weights.
    target = load_target(args.model, device=args.device, dtype=torch.float32)
    if args.command in ("prepare", "all"):
        _run_prepare(args, target)
    if args.command in ("train", "all"):
        _run_train(args, target)
    return 0


def _add_train_args(p):
    pass


def _run_train(args, target):
    pass
