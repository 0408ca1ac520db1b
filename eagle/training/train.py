"""The training run: fit a DraftHead on extracted features (eagle.training.features) with the objective
of eagle.training.objective. Resumable from its checkpoint; before the first step it records run.json
(the features and the recipe) and refuses a resume that differs, naming the field. Saves the final head
with the token counts the reduced draft vocabulary is chosen from."""
from __future__ import annotations

import json
import logging
import math
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..records.files import atomic_write, atomic_write_json, exclusive_lock, locked_append, run_logger, torch_bytes
from ..models.head import AnyHead, cast_head, new_head
from ..models.head3 import top_token_ids
from ..models.headio import COUNTS_FILE, load_head, read_token_counts, save_head
from ..models.precision import dtype_name
from ..models.target import Target
from .features import MANIFEST_DEFAULTS, Sequence, check_features, count_tokens, load_shards
from .objective import (autocast_for, default_loss, evaluate, lr_factor, make_batch, reduced_lm_weight, ttt_loss,
                        unroll)



def _init_head(target: Target, seed: int, kind: str = "eagle1", draft_ids: torch.Tensor | None = None) -> AnyHead:
    """A new fp32 head (fp32 master weights also under bf16 autocast). Its frozen embedding is the
    target's own when the target is fp32, else an fp32 copy (casting must not touch the target)."""
    return _fp32(new_head(target, seed, kind, draft_ids), target).train()


def _fp32(head: AnyHead, target: Target) -> AnyHead:
    """The head in fp32, as it trains and is evaluated; an embedding it shares with the target keeps
    the target's precision (the head casts what it reads from it)."""
    return cast_head(head, torch.float32, target.model.model.embed_tokens)


def _trainable_state(head: AnyHead) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}


def save_checkpoint(path: Path, head: AnyHead, opt: torch.optim.Optimizer, step: int,
                    gen: torch.Generator) -> None:
    state = dict(head=_trainable_state(head), optim=opt.state_dict(), step=step,
                 gen=gen.get_state(), rng=torch.get_rng_state())
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    atomic_write(path, torch_bytes(state))


def load_checkpoint(path: Path, head: AnyHead, opt: torch.optim.Optimizer, gen: torch.Generator) -> int:
    """Restore head, optimizer and RNG state; returns the step to continue from."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        head.load_state_dict(state["head"], strict=False)
        opt.load_state_dict(state["optim"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["rng"])
    except (RuntimeError, EOFError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as err:
        raise ValueError(f"{path} cannot be resumed from ({' '.join(str(err).split())[:200]}): delete it to "
                         "train from the start, or use another --out.") from None
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"])



@dataclass
class TrainConfig:
    steps: int = 1000
    lr: float = 5e-4
    batch: int = 4
    warmup: int = 50
    noise: float = 0.2  # uniform input noise, amplitude noise * 512 / sample length (official recipe)
    vocab_k: int = 8192  # soft CE over the top-K training tokens (0 = full vocabulary)
    ce_weight: float = 0.1
    clip: float = 0.5  # gradient clipping by value, as in the official recipe
    checkpoint_every: int = 100
    eval_every: int = 200
    eval_samples: int = 16  # periodic evaluations use the first N held-out samples; the final one uses all
    log_every: int = 10
    seed: int = 0
    max_minutes: float = 0.0  # safety stop: end early (still saving the head) after this long; 0 = off
    init: str = ""  # warm start: a head directory to start from when no checkpoint exists ("" = random)
    ttt_steps: int = 1  # training-time test: draft steps unrolled per position (1 = the EAGLE-1 recipe)
    ttt_decay: float = 0.8  # weight of step j's loss is ttt_decay ** j (EAGLE-3)
    loss: str = "eagle1"  # one of LOSSES
    head_type: str = "eagle1"  # one of eagle.models.head.HEAD_KINDS; eagle3 needs features prepared for it and loss token
    draft_vocab_size: int = 0  # EAGLE-3: the K most frequent training tokens make its vocabulary (0 = all)
    train_samples: int = 0  # train on the first N training samples only, in shard order (0 = all): nested subsets
    # another extraction whose train split is added to the (first train_samples of the) features' own, e.g. ShareGPT's
    # original multi-turn replies beside the self-distilled ones: the soft CE's labels are the target's own
    # next-token distributions, so a reply the target did not write still teaches what it would predict
    more_features: str = ""


def _log_json(path: Path, record: dict) -> None:
    locked_append(path, (json.dumps(record) + "\n").encode("utf-8"))  # a line torn by a kill stays apart


def _train_step(head: AnyHead, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                lm_weight: torch.Tensor, cfg: TrainConfig, amp: torch.dtype | None) -> dict[str, float] | None:
    """One optimizer step; None when the batch has no counted position (nothing to learn from)."""
    valid = batch["valid"]
    if not bool(valid.any()):
        return None
    with autocast_for(lm_weight.device, amp):
        steps = unroll(head, batch, cfg.ttt_steps)
    losses = ttt_loss(steps, lm_weight, cfg.loss, cfg.ttt_decay, cfg.ce_weight, head)
    opt.zero_grad(set_to_none=True)
    losses["loss"].backward()
    torch.nn.utils.clip_grad_value_([p for p in head.parameters() if p.requires_grad], cfg.clip)
    opt.step()
    return {k: float(v.detach()) for k, v in losses.items()}


def _split(features_dir: Path, split: str, head_type: str, target: Target) -> list[Sequence]:
    """One split as a head of this type reads it (an EAGLE-3 extraction carries the EAGLE-1 features too),
    its shards checked against the target (feature width, token ids)."""
    return load_shards(features_dir, split, last_layer_only=head_type == "eagle1", target_config=target.config)


def _read_counts(features_dir: Path, target: Target) -> torch.Tensor:
    """The train split's token counts, checked as a head's are (one count >= 0 per token of the vocabulary)."""
    counts = read_token_counts(features_dir, target.config.vocab_size)
    if counts is None:
        raise FileNotFoundError(f"{features_dir / COUNTS_FILE} is missing: run prepare again on this --features.")
    return counts


def _load_data(features_dir: Path, head_type: str, target: Target, log: logging.Logger,
               train_samples: int = 0, more_features: str = "") -> tuple[list[Sequence], list[Sequence], torch.Tensor]:
    train, heldout = (_split(features_dir, split, head_type, target) for split in ("train", "heldout"))
    if train_samples > len(train):
        raise ValueError(f"train_samples {train_samples}: {features_dir} holds only {len(train)} training samples.")
    # Shards keep ShareGPT's order, so the first N samples are the first conversations: data fractions nest.
    counts = _read_counts(features_dir, target)
    if train_samples:  # the draft vocabulary and soft-CE rows come from the subset's own tokens, as prepare counts
        train = train[:train_samples]
        counts = count_tokens([(s.input_ids, s.loss_mask) for s in train], counts.numel())
    if more_features:  # its held-out split stays out: the held-out prompts are the same (check_more_features)
        more = _split(Path(more_features), "train", head_type, target)
        log.info("more data: %d train samples (%d tokens) from %s", len(more), sum(len(s.input_ids) for s in more),
                 more_features)
        train, counts = train + more, counts + _read_counts(Path(more_features), target)
    log.info("data: %d train samples (%d tokens), %d held-out samples", len(train),
             sum(len(s.input_ids) for s in train), len(heldout))
    return train, heldout, counts


RUN_FILE = "run.json"
# What a checkpoint's weights depend on; `steps` and the logging/eval cadence may change on resume.
RESUME_FIELDS = ("lr", "batch", "warmup", "noise", "vocab_k", "ce_weight", "clip", "seed", "init",
                 "ttt_steps", "ttt_decay", "loss", "head_type", "draft_vocab_size", "train_samples")
# what a run.json that predates a field means
RESUME_DEFAULTS = {"head_type": "eagle1", "draft_vocab_size": 0, "train_samples": 0, "more_features": "",
                   "more_features_sha256": None}


def _check_run(out_dir: Path, fingerprint: dict) -> None:
    """Record the run's fingerprint before its first step; on resume refuse any difference, naming it."""
    path = out_dir / RUN_FILE
    if not path.exists():
        if (out_dir / "checkpoint.pt").exists():
            raise ValueError(f"{out_dir / 'checkpoint.pt'} has no {RUN_FILE} recording what it was trained with "
                             "(made by an older version): use another --out.")
        atomic_write_json(path, fingerprint)
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): use another --out.") from None
    for k, v in fingerprint.items():
        was = old.get(k, RESUME_DEFAULTS.get(k)) if isinstance(old, dict) else None
        if was != v:
            raise ValueError(f"{out_dir} holds a run trained with {k}={was!r} (this run: {v!r}): resume with the "
                             "same value or use another --out.")


def _run_fingerprint(target: Target, features_dir: Path, manifest: dict | None, cfg: TrainConfig,
                     more: dict | None = None) -> dict:
    return {"model": target.name, "dtype": dtype_name(target.dtype), "features": str(features_dir.resolve()),
            "features_sha256": (manifest or {}).get("samples_sha256"),
            "more_features": str(Path(cfg.more_features).resolve()) if cfg.more_features else "",
            "more_features_sha256": (more or {}).get("samples_sha256"),
            **{k: getattr(cfg, k) for k in RESUME_FIELDS}}


# what two extractions must share for one's train split to join the other's training: the same target, features
# the head reads, and the same held-out rule (it hashes the first user message), so no held-out prompt is trained on
SHARED_FIELDS = ("model", "target_sha256", "head_type", "feature_layers", "heldout_fraction", "seed")


def check_more_features(manifest: dict | None, more_dir: Path) -> dict:
    """The manifest of --more-features, made for the same target, head and held-out rule as --features'."""
    more = check_features(more_dir)
    if manifest is None or more is None:
        raise ValueError(f"--more-features {more_dir}: both extractions need a manifest.json (run prepare again).")
    for k in SHARED_FIELDS:
        a, b = manifest.get(k, MANIFEST_DEFAULTS.get(k)), more.get(k, MANIFEST_DEFAULTS.get(k))
        if a != b:
            raise ValueError(f"--more-features {more_dir} was prepared with {k}={b!r}, --features with {a!r}: prepare "
                             "both with the same target, --head-type, --heldout-fraction and --seed.")
    return more


def train_head(target: Target, features_dir: str | Path, out_dir: str | Path, steps: int = 1000,
               lr: float = 5e-4, batch: int = 4, final_dir: str | Path | None = None,
               progress: bool = True, overwrite: bool = False, **overrides) -> dict:
    """Train (or resume) a head on extracted features; saves the final head to out_dir/head (and
    final_dir when given; an existing head there only with `overwrite`) with the token counts.
    Returns a summary (also written to summary.json)."""
    cfg = TrainConfig(steps=steps, lr=lr, batch=batch, **overrides)
    features_dir, out_dir = Path(features_dir), Path(out_dir)
    if final_dir and (Path(final_dir) / "config.json").exists() and not overwrite:
        raise ValueError(f"{final_dir} already holds a head: pass --overwrite to replace it, or another --final-dir.")
    manifest = check_features(features_dir)
    _check_head_type(cfg, manifest, features_dir)
    more = check_more_features(manifest, Path(cfg.more_features)) if cfg.more_features else None
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / ".lock", f"train --out {out_dir}"):
        _check_run(out_dir, _run_fingerprint(target, features_dir, manifest, cfg, more))
        return _train_locked(target, features_dir, out_dir, cfg, final_dir, progress)


def _check_features_for(head_type: str, manifest: dict | None, features_dir: Path) -> None:
    """The features must be the ones the head type reads (an EAGLE-3 extraction also holds the EAGLE-1 ones)."""
    prepared = (manifest or {}).get("head_type", "eagle1")
    if prepared != head_type and prepared != "eagle3":
        raise ValueError(f"{features_dir} holds features prepared for head_type {prepared} (manifest.json), not "
                         f"{head_type}: run prepare --head-type {head_type} into another --features.")


def _check_head_type(cfg: TrainConfig, manifest: dict | None, features_dir: Path) -> None:
    """Features the head type reads, and an EAGLE-3 head has no feature to regress."""
    _check_features_for(cfg.head_type, manifest, features_dir)
    if cfg.head_type == "eagle3" and cfg.loss != "token":
        raise ValueError(f"--loss {cfg.loss}: an EAGLE-3 head predicts tokens, not features; use --loss token.")
    if cfg.draft_vocab_size and cfg.head_type != "eagle3":
        raise ValueError("--draft-vocab-size: only an EAGLE-3 head has its own draft vocabulary (use --head-type "
                         "eagle3; an EAGLE-1/2 head reduces its vocabulary at decode time with --draft-vocab).")


def _train_locked(target: Target, features_dir: Path, out_dir: Path, cfg: TrainConfig,
                  final_dir: str | Path | None, progress: bool) -> dict:
    log = run_logger("train", out_dir / "train.log")
    train, heldout, counts = _load_data(features_dir, cfg.head_type, target, log, cfg.train_samples,
                                        cfg.more_features)
    draft_ids = top_token_ids(counts, cfg.draft_vocab_size) if cfg.head_type == "eagle3" else None
    head = _init_head(target, cfg.seed, cfg.head_type, draft_ids)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    ckpt = out_dir / "checkpoint.pt"
    start = load_checkpoint(ckpt, head, opt, gen) if ckpt.exists() else 0
    if start == 0 and cfg.init:
        init = load_head(cfg.init, target)
        if init.kind != head.kind:
            raise ValueError(f"--init {cfg.init} is an {init.kind} head, not {head.kind}: warm start from a head "
                             "of the same type.")
        head.load_state_dict(_trainable_state(init), strict=False)
        log.info("warm start from %s", cfg.init)
    log.info("training %d -> %d steps, config %s", start, cfg.steps, asdict(cfg))
    lm_full, lm_weight = _lm_weights(target, head, counts, cfg.vocab_k)
    began = time.perf_counter()
    amp = _amp(target)
    done, last = _train_loop(head, opt, gen, train, heldout, lm_weight, lm_full, cfg, start, out_dir, progress, amp)
    wall = time.perf_counter() - began
    save_checkpoint(ckpt, head, opt, done, gen)
    final = evaluate(head, heldout, lm_weight, lm_full, cfg.batch, full_ce=True, amp=amp,
                     loss=cfg.loss) if heldout else {}
    summary = dict(dtype=dtype_name(target.dtype), start_step=start, steps=done, planned_steps=cfg.steps, wall_s=wall,
                   steps_per_s=(done - start) / wall if wall > 0 and done > start else None,
                   train_samples=len(train), train_tokens=sum(len(s.input_ids) for s in train),
                   heldout_samples=len(heldout), last_train=last, heldout=final, config=asdict(cfg))
    _log_json(out_dir / "train_log.jsonl", {"step": done, "final_eval": final})
    log.info("final held-out: %s", final)
    head.token_counts.copy_(counts.to(head.token_counts.device))
    for dest in [out_dir / "head"] + ([Path(final_dir)] if final_dir else []):
        save_head(head, dest)
        log.info("saved head to %s", dest)
    atomic_write_json(out_dir / "summary.json", summary)
    return summary


def _lm_weights(target: Target, head: AnyHead, counts: torch.Tensor, vocab_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's full lm_head (fp32) and the rows the training CE is scored over: an EAGLE-3 head's own
    vocabulary, else the vocab_k most frequent training tokens (0: all)."""
    lm_full = target.model.lm_head.weight.detach().float()
    if head.kind == "eagle3":
        return lm_full, lm_full[head.target_ids()].contiguous()
    return lm_full, reduced_lm_weight(target, counts.to(target.device), vocab_k)


def _amp(target: Target) -> torch.dtype | None:
    return None if target.dtype == torch.float32 else target.dtype  # train at the precision the target runs in


def evaluate_head(target: Target, head_dir: str | Path, features_dir: str | Path, batch: int = 8,
                  vocab_k: int = TrainConfig.vocab_k, samples: int = 0) -> dict:
    """Held-out metrics of a saved head on a features directory, computed exactly as train's final
    evaluation (top-1 and acc_step1..4 of the unrolled draft, CE): heads trained on other data compare
    on one held-out set. samples > 0 uses only the first N held-out samples."""
    features_dir = Path(features_dir)
    manifest = check_features(features_dir)
    head = _fp32(load_head(head_dir, target), target).eval()  # as train's own held-out evaluation runs it
    _check_features_for(head.kind, manifest, features_dir)
    heldout = _split(features_dir, "heldout", head.kind, target)
    if not heldout:
        raise ValueError(f"{features_dir} has no held-out samples: prepare it with --heldout-fraction > 0.")
    heldout = heldout[:samples] if samples > 0 else heldout
    lm_full, lm_weight = _lm_weights(target, head, _read_counts(features_dir, target), vocab_k)
    metrics = evaluate(head, heldout, lm_weight, lm_full, batch, full_ce=True, amp=_amp(target),
                       loss=default_loss(head.kind))
    return {"head": str(head_dir), "head_type": head.kind, "features": str(features_dir),
            "heldout_samples": len(heldout), **metrics}


def _train_loop(head: AnyHead, opt: torch.optim.Optimizer, gen: torch.Generator, train: list[Sequence],
                heldout: list[Sequence], lm_weight: torch.Tensor, lm_full: torch.Tensor, cfg: TrainConfig,
                start: int, out_dir: Path, progress: bool, amp: torch.dtype | None) -> tuple[int, dict[str, float]]:
    """Steps start..cfg.steps with logging, periodic held-out evaluation and checkpoints;
    returns the step reached and the mean train losses of the last logging window."""
    window: list[dict[str, float]] = []
    last: dict[str, float] = {}
    done = start
    deadline = time.perf_counter() + cfg.max_minutes * 60 if cfg.max_minutes > 0 else math.inf
    bar = tqdm(range(start, cfg.steps), desc="train", unit="step", initial=start, total=cfg.steps,
               disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, cfg.steps, cfg.warmup)
        picks = torch.randint(len(train), (cfg.batch,), generator=gen).tolist()
        batch = make_batch([train[i] for i in picks], cfg.noise, gen, lm_full.device)
        losses = _train_step(head, opt, batch, lm_weight, cfg, amp)
        if losses is not None:
            window.append(losses)
        done = step + 1
        out_of_time = time.perf_counter() > deadline
        if window and (done % cfg.log_every == 0 or done == cfg.steps or out_of_time):
            last = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            _log_json(out_dir / "train_log.jsonl", {"step": done, "lr": opt.param_groups[0]["lr"], **last})
            bar.set_postfix(loss=f"{last['loss']:.3f}", ce=f"{last['ce']:.2f}")
            window = []
        if heldout and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            metrics = evaluate(head, heldout[:cfg.eval_samples], lm_weight, lm_full, cfg.batch, amp=amp,
                               loss=cfg.loss)
            _log_json(out_dir / "train_log.jsonl", {"step": done, "eval": metrics})
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            save_checkpoint(out_dir / "checkpoint.pt", head, opt, done, gen)
        if out_of_time:
            _log_json(out_dir / "train_log.jsonl", {"step": done, "stopped": "time budget reached"})
            break
    return done, last
