"""Training a draft head for a target: feature extraction from ShareGPT, then the EAGLE recipe.

`prepare` runs the target over chat-templated ShareGPT conversations and stores, per sample, the
token ids, the target's post-norm last hidden states (fp16) and the assistant-only loss mask in
shards of safetensors files. `train` fits a DraftHead on (f_t, x_{t+1}) -> f_{t+1} with the
official loss (SmoothL1 on features + 0.1 * soft cross-entropy through the target's lm_head).
Both steps are resumable: finished shards are skipped and training restarts from its checkpoint.
Each records what its output depends on before its first unit of work (prepare: manifest.json with
the settings, the target's weights hash and a hash of the tokenized samples; train: run.json with the
features and the recipe) and refuses a resume that differs, naming the field. One lock per output
directory; every file is written atomically (eagle.files).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import pickle
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from .checks import check_argv, check_output, check_runtime_args
from .data import Conversation, read_sharegpt, split_conversations, tokenize_conversation
from .distill import DistillConfig, read_distilled, regenerate
from .distill_store import target_sha256
from .files import atomic_write, atomic_write_json, exclusive_lock, locked_append, read_json_object, run_guarded
from .head import COUNTS_FILE, ChainKeys, DraftHead, load_head, new_head, read_tensors, save_head
from .target import DEFAULT_MODEL, DTYPE_CHOICES, Target, dtype_name, load_target

SPLITS = ("heldout", "train")  # held-out first: training can start on a partial train set
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


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Atomically (eagle.files): an interrupted run never leaves a half-written file that looks finished."""
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))


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
    _save_tensors({
        "input_ids": torch.cat([ids for ids, _ in samples]).to(torch.int32),
        "loss_mask": torch.cat([mask for _, mask in samples]),
        "features": torch.cat(feats).contiguous(),
        "offsets": torch.cumsum(lengths, 0),
    }, path)
    return int(lengths.sum())


SHARD_KEYS = {"input_ids", "loss_mask", "features", "offsets"}


def read_manifest(features_dir: Path) -> dict | None:
    """manifest.json of a features directory (None when there is none); one sentence when unreadable."""
    path = features_dir / MANIFEST
    if not path.exists():
        return None
    return read_json_object(path, fix=": prepare into a new --features")


def _check_manifest(out_dir: Path, manifest: dict) -> None:
    """Refuse to mix shards made with different settings (resume relies on identical shard contents),
    naming the first field that differs."""
    old = read_manifest(out_dir)
    if old is None:
        if any(out_dir.glob("*-[0-9]*.safetensors")):
            raise ValueError(f"{out_dir} holds feature shards but no {MANIFEST}, so their settings are unknown: "
                             "use another --features.")
        return
    for k, v in manifest.items():
        if k not in old:
            raise ValueError(f"{out_dir} holds features made with other settings: its {MANIFEST} does not record "
                             f"{k} (made by an older version): use another --features.")
        if old[k] != v:
            raise ValueError(f"{out_dir} holds features made with other settings: {k}={old[k]!r} (this run: {v!r}); "
                             "use the same settings or another --features.")


def samples_sha256(samples: dict[str, list[Sample]]) -> str:
    """A hash of every tokenized sample and loss mask: the data the shards are made from."""
    h = hashlib.sha256()
    for split in SPLITS:
        for ids, mask in samples[split]:
            h.update(split.encode())
            h.update(ids.numpy().tobytes())
            h.update(mask.numpy().tobytes())
    return h.hexdigest()


def _shard_ok(path: Path) -> bool:
    """A shard that opens and holds every tensor (a file damaged after its atomic write does not)."""
    try:
        with safe_open(str(path), "pt") as f:
            return SHARD_KEYS <= set(f.keys())
    except (SafetensorError, OSError):
        return False


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
    distilled: int = 0  # conversations whose reply the target regenerated (self-distillation)
    distilled_truncated: int = 0  # of those, replies cut at the distillation's max_new_tokens


def prepare_features(target: Target, out_dir: str | Path, n_conversations: int = 800, max_len: int = 512,
                     heldout_fraction: float = 0.05, shard_size: int = 64, seed: int = 0,
                     sharegpt: str | Path | None = None, distill: DistillConfig | None = None) -> PrepareStats:
    """Extract training features into out_dir/{train,heldout}-NNNNN.safetensors (resumable, locked).
    With `distill`, the replies are first regenerated by the target (out_dir/distill.jsonl)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / ".lock", f"prepare --features {out_dir}"):
        # what the shards' contents depend on; a resume must match every one (dtype: bf16 features differ)
        manifest = dict(model=target.name, target_sha256=target_sha256(target.model), dtype=dtype_name(target.dtype),
                        n_conversations=n_conversations, max_len=max_len, heldout_fraction=heldout_fraction,
                        seed=seed, shard_size=shard_size, self_distill=asdict(distill) if distill else None)
        _check_manifest(out_dir, manifest)  # before the self-distillation, which can take hours
        return _prepare_locked(target, out_dir, manifest, sharegpt, distill)


def _prepare_locked(target: Target, out_dir: Path, manifest: dict, sharegpt: str | Path | None,
                    distill: DistillConfig | None) -> PrepareStats:
    log = _logger("prepare", out_dir / "prepare.log")
    convs, report = read_sharegpt(sharegpt, limit=manifest["n_conversations"])
    stats = PrepareStats(conversations_read=len(convs), records_read=report.records_read)
    log.info("read %d conversations (%d records, %d skipped)", len(convs), report.records_read,
             report.records_skipped)
    if distill is not None:
        convs = _self_distill(target, convs, out_dir, distill, stats, log)
    split = split_conversations(convs, manifest["heldout_fraction"], manifest["seed"])
    by_split = dict(zip(("train", "heldout"), split))
    samples = {s: _tokenize_all(target, c, manifest["max_len"], s) for s, c in by_split.items()}
    manifest = {**manifest, "samples_sha256": samples_sha256(samples)}
    _check_manifest(out_dir, manifest)
    atomic_write_json(out_dir / MANIFEST, manifest)  # before the first shard; "stats" is added when all are done
    counts = count_tokens(samples["train"], target.config.vocab_size)
    _save_tensors({"token_counts": counts}, out_dir / COUNTS_FILE)
    stats.train_samples, stats.heldout_samples = len(samples["train"]), len(samples["heldout"])
    stats.train_tokens = sum(len(ids) for ids, _ in samples["train"])
    stats.train_masked_tokens = int(counts.sum())
    stats.heldout_tokens = sum(len(ids) for ids, _ in samples["heldout"])
    log.info("samples: %d train (%d tokens, %d masked), %d held-out (%d tokens)", stats.train_samples,
             stats.train_tokens, stats.train_masked_tokens, stats.heldout_samples, stats.heldout_tokens)
    _write_shards(target, samples, out_dir, manifest["shard_size"], stats, log)
    atomic_write_json(out_dir / MANIFEST, {**manifest, "stats": asdict(stats)})
    log.info("done: %s", asdict(stats))
    return stats


def _self_distill(target: Target, convs: list[Conversation], out_dir: Path, cfg: DistillConfig,
                  stats: PrepareStats, log: logging.Logger) -> list[Conversation]:
    """Regenerate what the store at cfg.store (default out_dir/distill) lacks, then read it back."""
    store = Path(cfg.store) if cfg.store else out_dir / "distill"
    run = regenerate(target, convs, store, cfg, log)
    log.info("self-distill: %s", asdict(run))
    convs, stats.distilled_truncated = read_distilled(store, limit=len(convs))
    stats.distilled = len(convs)
    return convs


def _write_shards(target: Target, samples: dict[str, list[Sample]], out_dir: Path, shard_size: int,
                  stats: PrepareStats, log: logging.Logger) -> None:
    jobs = [(split, i, samples[split][i:i + shard_size])
            for split in SPLITS for i in range(0, len(samples[split]), shard_size)]
    bar = tqdm(jobs, desc="extract", unit="shard")
    for split, i, chunk in bar:
        path = out_dir / f"{split}-{i // shard_size:05d}.safetensors"
        if path.exists() and _shard_ok(path):
            stats.shards_skipped += 1
            continue
        if path.exists():
            log.warning("%s is damaged: extracting it again", path.name)
        start = time.perf_counter()
        tokens = _write_shard(target, chunk, path)
        stats.forwards += len(chunk)
        stats.shards_written += 1
        log.info("wrote %s: %d samples, %d tokens, %.1f s", path.name, len(chunk), tokens,
                 time.perf_counter() - start)
    log.info("shards: %d written, %d already there", stats.shards_written, stats.shards_skipped)



# --- training -------------------------------------------------------------------------------------


@dataclass
class Sequence:
    input_ids: torch.Tensor  # (T,) long
    features: torch.Tensor  # (T, H) fp16
    loss_mask: torch.Tensor  # (T,) bool


def load_shards(features_dir: str | Path, split: str) -> list[Sequence]:
    """All samples of one split, in shard order (fp16 features stay fp16 to halve memory)."""
    seqs = []
    for path in sorted(Path(features_dir).glob(f"{split}-*.safetensors")):
        shard = read_tensors(path, "run prepare again on this --features to extract it anew")
        if not SHARD_KEYS <= set(shard):
            raise ValueError(f"{path} is not a feature shard (it lacks {sorted(SHARD_KEYS - set(shard))}).")
        offsets = shard["offsets"].tolist()
        for a, b in zip(offsets[:-1], offsets[1:]):
            seqs.append(Sequence(shard["input_ids"][a:b].long(), shard["features"][a:b], shard["loss_mask"][a:b]))
    return seqs


def make_batch(seqs: list[Sequence], noise: float, gen: torch.Generator | None,
               device: torch.device) -> dict[str, torch.Tensor]:
    """Pairs (f_t, x_{t+1}) -> f_{t+1}, right-padded. A pair counts when the token its target feature
    predicts, x_{t+2}, is an assistant token: that is the token the draft proposes from it.
    Uniform input noise of amplitude noise * 512 / T (the official recipe, T = sample length)."""
    n = max(len(s.input_ids) for s in seqs) - 1
    h = seqs[0].features.shape[1]
    tokens = torch.zeros(len(seqs), n, dtype=torch.long)
    feats_in, feats_out = torch.zeros(len(seqs), n, h), torch.zeros(len(seqs), n, h)
    valid = torch.zeros(len(seqs), n, dtype=torch.bool)
    for i, s in enumerate(seqs):
        m = len(s.input_ids) - 1
        f = s.features.float()
        tokens[i, :m], feats_in[i, :m], feats_out[i, :m] = s.input_ids[1:], f[:-1], f[1:]
        valid[i, :m - 1] = s.loss_mask[2:]
        if noise > 0:
            amp = noise * 512 / len(s.input_ids)
            feats_in[i, :m] += (torch.rand(m, h, generator=gen) - 0.5) * amp
    positions = torch.arange(n)[None].expand(len(seqs), n)
    batch = dict(tokens=tokens, feats_in=feats_in, feats_out=feats_out, valid=valid, positions=positions)
    return {k: v.to(device) for k, v in batch.items()}


def eagle_loss(pred: torch.Tensor, target: torch.Tensor, lm_weight: torch.Tensor,
               ce_weight: float = 0.1) -> dict[str, torch.Tensor]:
    """SmoothL1 on features + ce_weight * soft CE(softmax(target logits), log_softmax(draft logits)),
    both averaged over the given (already masked) positions: pred, target (M, H); lm_weight (V', H)."""
    l1 = F.smooth_l1_loss(pred.float(), target.float())
    with torch.no_grad():
        target_p = torch.softmax(target.float() @ lm_weight.T, dim=-1)
    log_q = torch.log_softmax(pred.float() @ lm_weight.T, dim=-1)
    ce = -(target_p * log_q).sum(-1).mean()
    return dict(loss=l1 + ce_weight * ce, l1=l1, ce=ce)


LOSSES = ("eagle1", "token")  # eagle1: SmoothL1 + ce_weight * soft CE; token: soft CE only (EAGLE-3)
EVAL_STEPS = 4  # held-out accuracy is reported per draft step 1..EVAL_STEPS under the unrolled draft


def step_loss(pred: torch.Tensor, target: torch.Tensor, lm_weight: torch.Tensor, kind: str,
              ce_weight: float = 0.1) -> dict[str, torch.Tensor]:
    """The loss of one draft step over (M, H) masked positions; `token` keeps l1 for logging only."""
    losses = eagle_loss(pred, target, lm_weight, ce_weight)
    if kind == "token":
        losses["loss"], losses["l1"] = losses["ce"], losses["l1"].detach()
    return losses


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t + s] at column t, zero-padded at the end: (B, T, ...) -> (B, T, ...)."""
    if s == 0:
        return x
    pad = x.new_zeros((x.shape[0], min(s, x.shape[1])) + x.shape[2:])
    return torch.cat([x[:, s:], pad], dim=1)


def unroll(head: DraftHead, batch: dict[str, torch.Tensor], steps: int) -> list[dict[str, torch.Tensor]]:
    """Training-time test: from every position t, draft `steps` tokens as the decoder does. Step j
    (0-based) feeds the previous step's predicted feature with the real token x_{t+j+1} at position
    t + j and predicts f_{t+j+1}; per step: pred, target (B, T, H) and valid (B, T)."""
    chain, feats, out = ChainKeys(), batch["feats_in"], []
    for j in range(steps):
        pred = head.chain_step(_shift(batch["tokens"], j), feats, batch["positions"] + j, chain)
        out.append(dict(pred=pred, target=_shift(batch["feats_out"], j), valid=_shift(batch["valid"], j)))
        feats = pred
    return out


def ttt_loss(steps: list[dict[str, torch.Tensor]], lm_weight: torch.Tensor, kind: str, decay: float,
             ce_weight: float = 0.1) -> dict[str, torch.Tensor]:
    """sum_j decay^j * loss_j over the unrolled steps (EAGLE-3's 0.8^j); l1/ce are step 1's."""
    total, first = None, {}
    for j, st in enumerate(steps):
        if not bool(st["valid"].any()):
            continue  # late steps of short sequences may have nothing left to predict
        losses = step_loss(st["pred"][st["valid"]], st["target"][st["valid"]], lm_weight, kind, ce_weight)
        total = decay ** j * losses["loss"] if total is None else total + decay ** j * losses["loss"]
        first = first or losses
    return {**first, "loss": total}


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up to 1 over `warmup` steps, then linear decay to 0 at `steps`."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))


def reduced_lm_weight(target: Target, counts: torch.Tensor, vocab_k: int) -> torch.Tensor:
    """The lm_head rows of the vocab_k most frequent training tokens (all rows when vocab_k <= 0):
    the soft CE is then a renormalised distribution over those tokens, which cuts its CPU cost."""
    weight = target.model.lm_head.weight.detach().float()
    if vocab_k <= 0 or vocab_k >= weight.shape[0]:
        return weight
    return weight[torch.topk(counts, vocab_k).indices.sort().values.to(weight.device)].contiguous()


def _top1_matches(pred: torch.Tensor, target: torch.Tensor, lm_full: torch.Tensor, chunk: int = 512) -> int:
    """Positions where argmax of the draft logits equals argmax of the target logits (full vocab),
    in row chunks so (M, V) logits never materialise at once."""
    hits = 0
    for i in range(0, pred.shape[0], chunk):
        p, t = pred[i:i + chunk].float(), target[i:i + chunk].float()
        hits += int(((p @ lm_full.T).argmax(-1) == (t @ lm_full.T).argmax(-1)).sum())
    return hits


@torch.no_grad()
def evaluate(head: DraftHead, seqs: list[Sequence], lm_weight: torch.Tensor, lm_full: torch.Tensor,
             batch: int = 4, full_ce: bool = False, amp: torch.dtype | None = None,
             loss: str = "eagle1") -> dict[str, float]:
    """Mean held-out step-1 losses (CE over lm_weight's vocabulary, plus the full-vocab CE when asked),
    top-1 agreement of draft and target over the pairs the training loss counts, and acc_step1..4:
    top-1 agreement at each depth of the unrolled draft (acc_step1 == top1)."""
    sums = dict(loss=0.0, l1=0.0, ce=0.0, ce_full=0.0)
    hits, counts = [0] * EVAL_STEPS, [0] * EVAL_STEPS
    for i in range(0, len(seqs), batch):
        b = make_batch(seqs[i:i + batch], 0.0, None, lm_full.device)
        with _autocast(lm_full.device, amp):
            steps = unroll(head, b, EVAL_STEPS)
        for j, st in enumerate(steps):
            p, t = st["pred"][st["valid"]].float(), st["target"][st["valid"]]
            if p.shape[0] == 0:
                continue
            hits[j] += _top1_matches(p, t, lm_full)
            counts[j] += p.shape[0]
            if j == 0:
                _add_step1(sums, p, t, lm_weight, lm_full, full_ce, loss)
    total = counts[0]
    keys = ["loss", "l1", "ce"] + (["ce_full"] if full_ce else [])
    accs = {f"acc_step{j + 1}": hits[j] / max(counts[j], 1) for j in range(EVAL_STEPS)}
    return {**{k: sums[k] / max(total, 1) for k in keys}, "top1": accs["acc_step1"], **accs, "positions": total}


def _add_step1(sums: dict[str, float], p: torch.Tensor, t: torch.Tensor, lm_weight: torch.Tensor,
               lm_full: torch.Tensor, full_ce: bool, loss: str) -> None:
    n = p.shape[0]
    for k, v in step_loss(p, t, lm_weight, loss).items():
        sums[k] += float(v) * n
    if full_ce:
        sums["ce_full"] += float(eagle_loss(p, t, lm_full)["ce"]) * n


def _autocast(device: torch.device, amp: torch.dtype | None):
    """Autocast to the target's reduced precision (fp32 master weights and optimizer state stay);
    plain fp32 when the target runs in fp32 (--dtype auto picks fp32 on CPUs without fast bf16)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp)


def _init_head(target: Target, seed: int) -> DraftHead:
    """A new fp32 head (fp32 master weights also under bf16 autocast). Its frozen embedding is the
    target's own when the target is fp32, else an fp32 copy (casting must not touch the target)."""
    head = new_head(target, seed)
    if target.dtype != torch.float32:
        head.embed_tokens = torch.nn.Embedding.from_pretrained(target.model.model.embed_tokens.weight.float())
    return head.float().train()


def _trainable_state(head: DraftHead) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}


def save_checkpoint(path: Path, head: DraftHead, opt: torch.optim.Optimizer, step: int,
                    gen: torch.Generator) -> None:
    state = dict(head=_trainable_state(head), optim=opt.state_dict(), step=step,
                 gen=gen.get_state(), rng=torch.get_rng_state())
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, head: DraftHead, opt: torch.optim.Optimizer, gen: torch.Generator) -> int:
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


def _log_json(path: Path, record: dict) -> None:
    locked_append(path, (json.dumps(record) + "\n").encode("utf-8"))  # a line torn by a kill stays apart


def _train_step(head: DraftHead, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                lm_weight: torch.Tensor, cfg: TrainConfig, amp: torch.dtype | None) -> dict[str, float] | None:
    """One optimizer step; None when the batch has no counted position (nothing to learn from)."""
    valid = batch["valid"]
    if not bool(valid.any()):
        return None
    with _autocast(lm_weight.device, amp):
        steps = unroll(head, batch, cfg.ttt_steps)
    losses = ttt_loss(steps, lm_weight, cfg.loss, cfg.ttt_decay, cfg.ce_weight)
    opt.zero_grad(set_to_none=True)
    losses["loss"].backward()
    torch.nn.utils.clip_grad_value_([p for p in head.parameters() if p.requires_grad], cfg.clip)
    opt.step()
    return {k: float(v.detach()) for k, v in losses.items()}


def check_features(features_dir: Path) -> dict | None:
    """A features directory train can use: shards present, and its prepare finished (the manifest
    gets its "stats" only after the last shard). Returns the manifest (None for a directory made
    before manifests existed)."""
    if not any(features_dir.glob("train-*.safetensors")):
        raise FileNotFoundError(f"No train-*.safetensors shards in {features_dir}: run `prepare` first.")
    manifest = read_manifest(features_dir)
    if manifest is not None and "stats" not in manifest:
        raise ValueError(f"{features_dir} is incomplete (its prepare was interrupted or is running): run the same "
                         "`prepare` again to finish it.")
    return manifest


def _load_data(features_dir: Path, log: logging.Logger) -> tuple[list[Sequence], list[Sequence], torch.Tensor]:
    train, heldout = load_shards(features_dir, "train"), load_shards(features_dir, "heldout")
    counts = read_tensors(features_dir / COUNTS_FILE, "run prepare again on this --features")["token_counts"]
    log.info("data: %d train samples (%d tokens), %d held-out samples", len(train),
             sum(len(s.input_ids) for s in train), len(heldout))
    return train, heldout, counts


RUN_FILE = "run.json"
# What a checkpoint's weights depend on; `steps` and the logging/eval cadence may change on resume.
RESUME_FIELDS = ("lr", "batch", "warmup", "noise", "vocab_k", "ce_weight", "clip", "seed", "init",
                 "ttt_steps", "ttt_decay", "loss")


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
        if not isinstance(old, dict) or old.get(k) != v:
            was = old.get(k) if isinstance(old, dict) else None
            raise ValueError(f"{out_dir} holds a run trained with {k}={was!r} (this run: {v!r}): resume with the "
                             "same value or use another --out.")


def _run_fingerprint(target: Target, features_dir: Path, manifest: dict | None, cfg: TrainConfig) -> dict:
    return {"model": target.name, "dtype": dtype_name(target.dtype), "features": str(features_dir.resolve()),
            "features_sha256": (manifest or {}).get("samples_sha256"),
            **{k: getattr(cfg, k) for k in RESUME_FIELDS}}


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
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / ".lock", f"train --out {out_dir}"):
        _check_run(out_dir, _run_fingerprint(target, features_dir, manifest, cfg))
        return _train_locked(target, features_dir, out_dir, cfg, final_dir, progress)


def _train_locked(target: Target, features_dir: Path, out_dir: Path, cfg: TrainConfig,
                  final_dir: str | Path | None, progress: bool) -> dict:
    log = _logger("train", out_dir / "train.log")
    train, heldout, counts = _load_data(features_dir, log)
    head = _init_head(target, cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    ckpt = out_dir / "checkpoint.pt"
    start = load_checkpoint(ckpt, head, opt, gen) if ckpt.exists() else 0
    if start == 0 and cfg.init:
        head.load_state_dict(_trainable_state(load_head(cfg.init, target)), strict=False)
        log.info("warm start from %s", cfg.init)
    log.info("training %d -> %d steps, config %s", start, cfg.steps, asdict(cfg))
    lm_weight = reduced_lm_weight(target, counts.to(target.device), cfg.vocab_k)
    lm_full = target.model.lm_head.weight.detach().float()
    began = time.perf_counter()
    amp = None if target.dtype == torch.float32 else target.dtype  # train at the precision the target runs in
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


def _train_loop(head: DraftHead, opt: torch.optim.Optimizer, gen: torch.Generator, train: list[Sequence],
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


# --- command line ---------------------------------------------------------------------------------


def _add_distill_args(p: argparse.ArgumentParser) -> None:
    d = DistillConfig()
    p.add_argument("--distill-dir", default=d.store or None,
                   help="self-distillation store (default: FEATURES/distill; the committed data is "
                        "data/distill/smollm2-135m-instruct)")
    p.add_argument("--distill-max-new-tokens", type=int, default=d.max_new_tokens, help="reply length (%(default)s)")
    p.add_argument("--distill-max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                   help="skip longer prompts (%(default)s)")
    p.add_argument("--distill-batch", type=int, default=d.batch_size, help="prompts per batch (%(default)s)")
    p.add_argument("--distill-temperature", type=float, default=d.temperature, help="0 = greedy (%(default)s)")


def _add_prepare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conversations", type=int, default=800, help="ShareGPT conversations to read (%(default)s)")
    p.add_argument("--max-len", type=int, default=512, help="truncate samples to this many tokens (%(default)s)")
    p.add_argument("--heldout-fraction", type=float, default=0.05, help="(%(default)s)")
    p.add_argument("--shard-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: the packaged file)")
    p.add_argument("--self-distill", action="store_true",
                   help="regenerate each first reply with the target before extracting features")
    _add_distill_args(p)


def _distill_config(args: argparse.Namespace) -> DistillConfig:
    return DistillConfig(args.distill_max_new_tokens, args.distill_max_prompt_tokens, args.distill_batch,
                         args.distill_temperature, args.seed, args.distill_dir or "")


def _run_prepare(args: argparse.Namespace, target: Target) -> None:
    prepare_features(target, args.features, args.conversations, args.max_len, args.heldout_fraction,
                     args.shard_size, args.seed, args.sharegpt, _distill_config(args) if args.self_distill else None)


def _run_distill(args: argparse.Namespace, target: Target) -> None:
    """Fill a self-distillation store (no features): the long background job whose output is committed."""
    convs, report = read_sharegpt(args.sharegpt, limit=args.conversations)
    print(f"self-distill: {len(convs)} conversations read ({report.records_read} records); "
          f"{target.name} in {str(target.dtype).removeprefix('torch.')}", file=sys.stderr)
    stats = regenerate(target, convs, args.distill_dir, _distill_config(args))
    print(json.dumps(asdict(stats)))


def _add_train_args(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--out", default="runs/train", help="checkpoints, logs and the trained head")
    p.add_argument("--final-dir", default=None, help="also save the final head here (e.g. eagle/resources/heads/NAME)")
    p.add_argument("--overwrite", action="store_true", help="replace a head already in --final-dir")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--noise", type=float, default=d.noise)
    p.add_argument("--vocab-k", type=int, default=d.vocab_k, help="soft-CE vocabulary (0 = full)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-samples", type=int, default=d.eval_samples)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--init", default=d.init, help="warm start from this head directory")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="end early (saving the head) after this many minutes; 0 = no limit")
    p.add_argument("--ttt-steps", type=_positive_int, default=d.ttt_steps,
                   help="training-time test: draft steps unrolled per position (%(default)s = no unrolling)")
    p.add_argument("--ttt-decay", type=float, default=d.ttt_decay,
                   help="loss weight of unrolled step j is DECAY**j (%(default)s)")
    p.add_argument("--loss", choices=LOSSES, default=d.loss,
                   help="eagle1: SmoothL1 + 0.1 soft CE; token: soft CE only, the EAGLE-3 recipe (%(default)s)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _run_train(args: argparse.Namespace, target: Target) -> None:
    train_head(target, args.features, args.out, args.steps, args.lr, args.batch, args.final_dir,
               warmup=args.warmup, noise=args.noise, vocab_k=args.vocab_k,
               checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
               eval_samples=args.eval_samples, log_every=args.log_every, seed=args.seed,
               max_minutes=args.max_minutes, init=args.init, overwrite=args.overwrite, ttt_steps=args.ttt_steps,
               ttt_decay=args.ttt_decay, loss=args.loss)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eagle", description="Train an EAGLE draft head.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"prepare": "extract target features (optionally self-distilling the replies first)",
                "train": "train the head on extracted features",
                "distill": "regenerate ShareGPT first replies with the target into a resumable store"}
    for name, help_text in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--model", default=DEFAULT_MODEL, help="target model (%(default)s)")
        p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
        p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                       help="target precision; auto: bf16 on CUDA, on a CPU the faster of fp32 and bf16 as "
                            "measured on this machine (%(default)s)")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
        p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
        if name == "distill":
            p.add_argument("--conversations", type=int, default=None,
                           help="ShareGPT conversations to cover (default: all)")
            p.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: the packaged file)")
            _add_distill_args(p)
            p.set_defaults(distill_dir=f"data/distill/{DEFAULT_MODEL}")
            continue
        p.add_argument("--features", default="runs/features", help="feature shard directory (%(default)s)")
        (_add_prepare_args if name == "prepare" else _add_train_args)(p)
    return parser


def _check_paths(args: argparse.Namespace) -> None:
    """Inputs that must exist and outputs that must be directories, checked before the model loads."""
    if getattr(args, "sharegpt", None) and not Path(args.sharegpt).is_file():
        raise FileNotFoundError(f"--sharegpt {args.sharegpt}: no such file")
    if args.command == "train":
        check_features(Path(args.features))
        outputs = {"--out": args.out, "--final-dir": args.final_dir}
        if args.final_dir and (Path(args.final_dir) / "config.json").exists() and not args.overwrite:
            raise ValueError(f"--final-dir {args.final_dir} already holds a head: pass --overwrite to replace it.")
    else:
        outputs = {"--features": getattr(args, "features", None), "--distill-dir": args.distill_dir}
    for flag, path in outputs.items():
        if path:
            check_output(Path(path), flag, directory=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_guarded(lambda: _main(argv), "interrupted: finished shards, chunks and checkpoints are kept; "
                                            "rerun the same command to resume")


def _main(argv: list[str]) -> int:
    check_argv(argv)
    args = build_parser().parse_args(argv)
    check_runtime_args(args)
    _check_paths(args)
    # Features are stored in fp16 whatever the dtype; training keeps fp32 master weights and uses
    # autocast when the target runs in bf16/fp16.
    target = load_target(args.model, device=args.device, dtype=args.dtype)
    if target.dtype_report:
        print(f"dtype auto: {target.dtype_report['reason']}", file=sys.stderr)
    {"prepare": _run_prepare, "train": _run_train, "distill": _run_distill}[args.command](args, target)
    return 0
