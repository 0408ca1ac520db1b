"""Feature extraction for head training: ShareGPT (or self-distilled) conversations -> shards.

`prepare_features` runs the target over chat-templated conversations and stores, per sample, the token
ids, the target's post-norm last hidden states (fp16) and the assistant-only loss mask, in safetensors
shards of `shard_size` samples per split. It is resumable: finished shards are skipped. Before its first
shard it records manifest.json (settings, the target's weights hash, a hash of the tokenized samples) and
refuses a resume that differs, naming the field. One lock per output directory; every file is written
atomically (eagle.records.files). `load_shards` is the reader train uses."""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save
from tqdm import tqdm

from ..records.files import atomic_write, atomic_write_json, exclusive_lock, read_json_object, run_logger
from ..models.head import HEAD_KINDS
from ..models.headio import COUNTS_FILE
from ..models.layouts import eagle3_feature_layers, read_tensors
from ..records.schema import FileFormatError, check_ids, check_in, check_object, check_offsets, check_tensor
from ..models.precision import dtype_name
from ..models.target import Target
from .data import Conversation, read_sharegpt, split_conversations, tokenize_conversation
from .distill import DistillConfig, read_distilled, regenerate
from .store import target_sha256


SPLITS = ("heldout", "train")  # held-out first: training can start on a partial train set
MANIFEST = "manifest.json"
MANIFEST_DEFAULTS = {"head_type": "eagle1", "feature_layers": None}  # what manifests that predate a field mean
Sample = tuple[torch.Tensor, torch.Tensor]  # (input_ids (T,), loss_mask (T,))



def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Atomically (eagle.records.files): an interrupted run never leaves a half-written file that looks finished."""
    atomic_write(path, save(tensors))


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


def extract_features(target: Target, input_ids: torch.Tensor,
                     feature_layers: tuple[int, ...] | None = None) -> torch.Tensor:
    """The target's features (T, H * len(layers)) for one sequence, through Target.forward itself so
    that training features equal exactly what the decoder feeds the head (None: the post-norm last
    hidden states (T, H), what an EAGLE-1/2 head drafts from)."""
    n = input_ids.numel()
    ids = input_ids[None].to(target.device)
    positions = torch.arange(n, device=target.device)[None]
    _, features = target.forward(ids, positions, target.new_cache(n), 0, logits_rows=slice(0, 0),
                                 feature_layers=feature_layers)
    return features[0]


def _write_shard(target: Target, samples: list[Sample], path: Path, feature_layers: list[int] | None) -> int:
    """Forward each sample and store the shard as flat tensors + offsets; returns tokens written.
    With feature_layers (EAGLE-3), `features` holds those layers' inputs concatenated and
    `target_features` the post-norm last hidden states the token loss takes the target's
    distribution from; both come from one forward."""
    n_layers = target.config.num_hidden_layers
    layers = None if feature_layers is None else (*feature_layers, n_layers)
    feats = [extract_features(target, ids, layers).to("cpu", torch.float16) for ids, _ in samples]
    lengths = torch.tensor([0] + [len(ids) for ids, _ in samples], dtype=torch.long)
    tensors = {"input_ids": torch.cat([ids for ids, _ in samples]).to(torch.int32),
               "loss_mask": torch.cat([mask for _, mask in samples]), "offsets": torch.cumsum(lengths, 0)}
    flat = torch.cat(feats)
    if layers is None:
        tensors["features"] = flat.contiguous()
    else:
        h = target.config.hidden_size
        tensors["features"], tensors["target_features"] = flat[:, :-h].contiguous(), flat[:, -h:].contiguous()
    _save_tensors(tensors, path)
    return int(lengths.sum())


SHARD_KEYS = {"input_ids", "loss_mask", "features", "offsets"}


def shard_keys(feature_layers: list[int] | None) -> set[str]:
    """The tensors a shard holds: EAGLE-3 shards add the last feature the token loss is scored on."""
    return SHARD_KEYS if feature_layers is None else SHARD_KEYS | {"target_features"}


def read_manifest(features_dir: Path) -> dict | None:
    """manifest.json of a features directory (None when there is none); one sentence when unreadable."""
    path = features_dir / MANIFEST
    if not path.exists():
        return None
    manifest = read_json_object(path, fix=": prepare into a new --features")
    check_object(manifest, path, "manifest", {}, MANIFEST_FIELDS)  # all optional: older manifests lack some
    if "head_type" in manifest:
        check_in(manifest["head_type"], HEAD_KINDS, path, "manifest field 'head_type'")
    return manifest


# The kind of every field prepare records (eagle.records.schema kinds), checked where the manifest is read.
MANIFEST_FIELDS = {"model": "str", "target_sha256": "str", "dtype": "str", "n_conversations": "nat",
                   "max_len": "nat", "heldout_fraction": "num", "seed": "nat", "shard_size": "nat",
                   "self_distill": "dict?", "head_type": "str", "feature_layers": "ints?",
                   "first_conversation": "nat", "samples_sha256": "str", "stats": "dict"}


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
        if k not in old and k in MANIFEST_DEFAULTS:  # recorded since: an older manifest means the default
            old = {**old, k: MANIFEST_DEFAULTS[k]}
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


def _shard_ok(path: Path, keys: set[str], target_config) -> bool:
    """A shard that opens, holds every tensor and passes check_shard against the target (a file damaged
    or replaced after its atomic write does not)."""
    try:
        shard = read_tensors(path)
        check_shard(shard, path, target_config)
    except (FileFormatError, OSError):
        return False
    return keys <= set(shard)


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
    shards_damaged: int = 0  # shards found malformed on resume and extracted again
    forwards: int = 0  # target forwards run by this call (0 when everything was already done)
    distilled: int = 0  # conversations whose reply the target regenerated (self-distillation)
    distilled_truncated: int = 0  # of those, replies cut at the distillation's max_new_tokens


def check_conversation_range(first_conversation: int, n_conversations: int) -> None:
    if not 0 <= first_conversation < n_conversations:
        raise ValueError(f"--first-conversation {first_conversation}: must be at least 0 and below "
                         f"--conversations ({n_conversations}).")


def prepare_features(target: Target, out_dir: str | Path, n_conversations: int = 800, max_len: int = 512,
                     heldout_fraction: float = 0.05, shard_size: int = 64, seed: int = 0,
                     sharegpt: str | Path | None = None, distill: DistillConfig | None = None,
                     head_type: str = "eagle1", first_conversation: int = 0) -> PrepareStats:
    """Extract training features into out_dir/{train,heldout}-NNNNN.safetensors (resumable, locked).
    With `distill`, the replies are first regenerated by the target (out_dir/distill.jsonl).
    head_type "eagle3" stores the inputs of target layers 2, L//2, L-3 (3H) besides the last feature.
    first_conversation > 0 keeps only conversations [first_conversation, n_conversations): fresh data for a
    head warm-started on the earlier ones (the held-out rule hashes the prompt, so it is unchanged)."""
    if head_type not in HEAD_KINDS:
        raise ValueError(f"--head-type {head_type!r}: choose from {', '.join(HEAD_KINDS)}")
    check_conversation_range(first_conversation, n_conversations)
    layers = list(eagle3_feature_layers(target.config.num_hidden_layers)) if head_type == "eagle3" else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / ".lock", f"prepare --features {out_dir}"):
        # what the shards' contents depend on; a resume must match every one (dtype: bf16 features differ)
        manifest = dict(model=target.name, target_sha256=target_sha256(target.model), dtype=dtype_name(target.dtype),
                        n_conversations=n_conversations, max_len=max_len, heldout_fraction=heldout_fraction,
                        seed=seed, shard_size=shard_size, self_distill=asdict(distill) if distill else None,
                        head_type=head_type, feature_layers=layers)
        if first_conversation:  # absent when 0, so feature directories written before the option still resume
            manifest["first_conversation"] = first_conversation
        _check_manifest(out_dir, manifest)  # before the self-distillation, which can take hours
        return _prepare_locked(target, out_dir, manifest, sharegpt, distill)


def _prepare_locked(target: Target, out_dir: Path, manifest: dict, sharegpt: str | Path | None,
                    distill: DistillConfig | None) -> PrepareStats:
    log = run_logger("prepare", out_dir / "prepare.log")
    convs, report = read_sharegpt(sharegpt, limit=manifest["n_conversations"])
    stats = PrepareStats(conversations_read=len(convs), records_read=report.records_read)
    log.info("read %d conversations (%d records, %d skipped)", len(convs), report.records_read,
             report.records_skipped)
    first = manifest.get("first_conversation", 0)
    if distill is not None:
        convs = _self_distill(target, convs, out_dir, distill, stats, log, first)
    else:
        convs = convs[first:]
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
    _write_shards(target, samples, out_dir, manifest["shard_size"], manifest["feature_layers"], stats, log)
    atomic_write_json(out_dir / MANIFEST, {**manifest, "stats": asdict(stats)})
    log.info("done: %s", asdict(stats))
    return stats


def _self_distill(target: Target, convs: list[Conversation], out_dir: Path, cfg: DistillConfig,
                  stats: PrepareStats, log: logging.Logger, first: int = 0) -> list[Conversation]:
    """Regenerate what the store at cfg.store (default out_dir/distill) lacks, then read back
    conversations [first, len(convs))."""
    store = Path(cfg.store) if cfg.store else out_dir / "distill"
    run = regenerate(target, convs, store, cfg, log)
    log.info("self-distill: %s", asdict(run))
    convs, stats.distilled_truncated = read_distilled(store, limit=len(convs), start=first)
    stats.distilled = len(convs)
    return convs


def _write_shards(target: Target, samples: dict[str, list[Sample]], out_dir: Path, shard_size: int,
                  layers: list[int] | None, stats: PrepareStats, log: logging.Logger) -> None:
    jobs = [(split, i, samples[split][i:i + shard_size])
            for split in SPLITS for i in range(0, len(samples[split]), shard_size)]
    bar = tqdm(jobs, desc="extract", unit="shard")
    for split, i, chunk in bar:
        path = out_dir / f"{split}-{i // shard_size:05d}.safetensors"
        if path.exists() and _shard_ok(path, shard_keys(layers), target.config):
            stats.shards_skipped += 1
            continue
        if path.exists():
            stats.shards_damaged += 1
            log.warning("%s is damaged: extracting it again", path.name)
        start = time.perf_counter()
        tokens = _write_shard(target, chunk, path, layers)
        stats.forwards += len(chunk)
        stats.shards_written += 1
        log.info("wrote %s: %d samples, %d tokens, %.1f s", path.name, len(chunk), tokens,
                 time.perf_counter() - start)
    log.info("shards: %d written (%d of them damaged before), %d already there", stats.shards_written,
             stats.shards_damaged, stats.shards_skipped)



# --- training -------------------------------------------------------------------------------------


@dataclass
class Sequence:
    input_ids: torch.Tensor  # (T,) long
    features: torch.Tensor  # (T, H) fp16; EAGLE-3: (T, 3H), the three layers' inputs
    loss_mask: torch.Tensor  # (T,) bool
    targets: torch.Tensor | None = None  # EAGLE-3: (T, H) post-norm last features (None: `features` are those)


def load_shards(features_dir: str | Path, split: str, last_layer_only: bool = False,
                target_config=None) -> list[Sequence]:
    """All samples of one split, in shard order (fp16 features stay fp16 to halve memory), each shard
    checked (`check_shard`; widths and token ids against `target_config` when given).
    last_layer_only reads an EAGLE-3 directory as an EAGLE-1/2 head sees it: its `target_features` are
    exactly the post-norm last hidden states an EAGLE-1 prepare stores, so both head types can train on
    one extraction (the ablation's "same data")."""
    seqs = []
    for path in sorted(Path(features_dir).glob(f"{split}-*.safetensors")):
        shard = read_tensors(path, "run prepare again on this --features to extract it anew")
        offsets = check_shard(shard, path, target_config)
        feats, last = shard["features"], shard.get("target_features")
        if last_layer_only and last is not None:
            feats, last = last, None
        for a, b in zip(offsets[:-1], offsets[1:]):
            seqs.append(Sequence(shard["input_ids"][a:b].long(), feats[a:b], shard["loss_mask"][a:b],
                                 None if last is None else last[a:b]))
    return seqs


def check_shard(shard: dict[str, torch.Tensor], path: Path, target_config=None) -> list[int]:
    """A shard's tensors agree with each other (one id, mask and feature row per token, offsets from 0
    to the token count, never decreasing) and, given the target's config, with the model (feature
    width H, or 3H for EAGLE-3's three layers; ids within the vocabulary). Returns the offsets."""
    if not SHARD_KEYS <= set(shard):
        raise FileFormatError(f"{path} is not a feature shard (it lacks {sorted(SHARD_KEYS - set(shard))}).")
    tokens = len(check_tensor(shard["input_ids"], path, "input_ids", (None,), "int"))
    check_tensor(shard["loss_mask"], path, "loss_mask", (tokens,), "bool")
    h = None if target_config is None else target_config.hidden_size
    three = "target_features" in shard  # an EAGLE-3 extraction: three layers' inputs and the last feature
    check_tensor(shard["features"], path, "features", (tokens, None if h is None else 3 * h if three else h), "float")
    if three:
        check_tensor(shard["target_features"], path, "target_features", (tokens, h), "float")
    if target_config is not None:
        check_ids(shard["input_ids"], target_config.vocab_size, path, "input_ids")
    return check_offsets(shard["offsets"], tokens, path)


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
