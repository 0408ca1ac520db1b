"""The EAGLE-1/2 draft head: fc over [embedding ; feature], one decoder layer without input norm,
and the target's own lm_head. Loads and saves the official checkpoint layout."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import save
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from ..records.files import atomic_write
from .head3 import DraftAttention, Eagle3Head, attention_inputs, top_token_ids
from .kvcache import ChainKeys, KVCache
from .layouts import EAGLE, EAGLE3, INPUT, LABELS, LAST, Checkpoint, HeadLayout, HeadLayoutError, read_checkpoint
from .layouts import eagle3_feature_layers, read_tensors, write_checkpoint
from ..resources import resource_path
from ..records.schema import FileFormatError, is_kind
from .target import hub_offline, looks_like_path, with_legacy_keys

COUNTS_FILE = "token_counts.safetensors"  # our addition: token frequencies for the reduced draft vocabulary
HEADS_DIR = resource_path("heads")  # heads shipped with the package, by target name


class HeadMismatchError(FileFormatError):
    """A draft head does not fit its target (vocabulary or hidden size) or its weights its config.json."""


def head_config_from_target(target_config, **overrides) -> LlamaConfig:
    """A one-layer Llama config with the target's sizes (the shape of a new head for that target);
    an override of None drops the field."""
    c = target_config
    fields = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                  num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                  head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                  rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
                  rope_theta=_rope_theta(c), pad_token_id=c.pad_token_id, num_hidden_layers=1, bias=True)
    fields.update(overrides)
    return LlamaConfig(**{k: v for k, v in fields.items() if v is not None})  # None: leave it out


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class DraftLayer(nn.Module):
    """A Llama decoder layer whose input RMSNorm is skipped (the fc output feeds attention directly);
    q/k/v carry biases when the config says qkv_bias (EAGLE-Qwen2 heads)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = DraftAttention(config, config.hidden_size, bool(getattr(config, "qkv_bias", False)))
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, cache) -> torch.Tensor:
        x = x + self.self_attn(x, rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftHead(nn.Module):
    """forward returns the predicted next feature (B, T, H), which the target's lm_head scores and
    later draft steps are fed."""
    kind = "eagle1"  # the EAGLE-1/2 layout (EAGLE-2 changed the tree, not the head)
    feature_layers = None  # drafts from the target's post-norm last hidden state (Target.forward's default)
    layout: HeadLayout | None = None  # the layout it was read from or made in (load_head, new_head)

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding | None = None) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed_tokens = embed_tokens or nn.Embedding(config.vocab_size, h, config.pad_token_id)
        self.embed_tokens.requires_grad_(False)  # a frozen copy of the target's embedding
        self.fc = nn.Linear(2 * h, h, bias=getattr(config, "bias", True))
        self.layers = nn.ModuleList([DraftLayer(config)])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # Token frequencies from the training data, for the reduced draft vocabulary (0 = unknown).
        self.register_buffer("token_counts", torch.zeros(config.vocab_size, dtype=torch.long), persistent=False)

    def new_cache(self, max_len: int) -> KVCache:
        p = self.fc.weight
        return KVCache(1, self.config.num_key_value_heads, self.config.head_dim, max_len, p.device, p.dtype)

    def _fuse(self, token_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([embed(x_{t+1}) ; f_t]): (B, T) ids and (B, T, H) features -> (B, T, H)."""
        return self.fc(torch.cat([self.embed_tokens(token_ids), features.to(self.fc.weight.dtype)], dim=-1))

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, start: int = 0,
                tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """token_ids (B, T): x_{t+1}; features (B, T, H): f_t; returns predicted f_{t+1} (B, T, H)."""
        x = self._fuse(token_ids, features)
        mask, writer = attention_inputs(cache, start, token_ids.shape[1], tree_mask, x.device)
        return self.layers[0](x, self.rotary_emb(x, positions), mask, writer)

    def chain_step(self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                   chain: "ChainKeys") -> torch.Tensor:
        """One step of an unrolled draft chain (training-time test), all T positions at once:
        (B, T) ids, (B, T, H) features, (B, T) positions -> (B, T, H); see ChainKeys for the mask."""
        x = self._fuse(token_ids, features)
        mask = chain.mask(token_ids.shape[1], x.device)
        return self.layers[0](x, self.rotary_emb(x, positions), mask, chain)

    def logit_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # already a post-norm feature: the target's lm_head scores it directly

    def draft_vocab(self, lm_head_weight: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The target ids of the draft vocabulary (None: all, in order) and the lm_head rows scoring
        it: the target's own (V, H)."""
        return None, lm_head_weight

    def draft_vocab_ids(self, k: int) -> torch.Tensor | None:
        """The k most frequent token ids (None when k is 0, >= vocab, or no counts are stored)."""
        ids = top_token_ids(self.token_counts, k)
        return None if ids is None else ids.to(self.fc.weight.device)


AnyHead = DraftHead | Eagle3Head  # the two head layouts the drafter and the trainer take
HEAD_KINDS = (DraftHead.kind, Eagle3Head.kind)  # eagle1: EAGLE-1/2 layout; eagle3: EAGLE-3 layout


def check_head_matches(config: LlamaConfig, target_config, source: str | Path) -> None:
    """The head's vocabulary and the width of the target features it reads (an EAGLE-3 config's
    target_hidden_size when given) must be the target's."""
    fields = {"vocab_size": config.vocab_size,
              "hidden_size": getattr(config, "target_hidden_size", None) or config.hidden_size}
    for field, head_v in fields.items():
        tgt_v = getattr(target_config, field)
        if head_v != tgt_v:
            raise HeadMismatchError(f"Draft head {source} has {field} {head_v} but the target has {tgt_v}: "
                                    "it was trained for another model.")


def head_config(fields: dict, file: Path) -> LlamaConfig:
    """A head's config fields (eagle.models.layouts.Checkpoint.fields) as a one-layer LlamaConfig; one
    sentence naming the file when its sizes cannot make attention heads or transformers refuses it."""
    _check_head_sizes(fields, file)
    _check_head_numbers(fields, file)
    try:
        return LlamaConfig(**{**fields, "num_hidden_layers": 1})
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as err:  # transformers' own
        # validation: a dtype name torch lacks, id2label that is no object, ...
        raise FileFormatError(f"Head config {file} is not a Llama config ({' '.join(str(err).split())}).") from None


OTHER_SIZES = ("intermediate_size", "vocab_size", "head_dim", "draft_vocab_size", "target_hidden_size")
REQUIRED_SIZES = ("intermediate_size", "vocab_size")  # the others may be null (derived, or not EAGLE-3)


def _check_head_numbers(fields: dict, file: Path) -> None:
    """What the layer computes with beside its sizes: a norm epsilon and a rotary base > 0, a rotary type and
    an activation that transformers has (a NaN epsilon or a zero base would draft from NaN features)."""
    rope = fields.get("rope_parameters") or fields.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise FileFormatError(f"Head config {file}: rope_parameters is {rope!r:.40}, not an object.")
    numbers = {"rms_norm_eps": fields.get("rms_norm_eps", 1e-6),
               "rope_theta": rope.get("rope_theta", fields.get("rope_theta", 10000.0))}
    for name, value in numbers.items():
        if not (is_kind(value, "num") and value > 0):
            raise FileFormatError(f"Head config {file}: {name} is {value!r:.40}, not a number > 0.")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default" and (not isinstance(rope_type, str) or rope_type not in ROPE_INIT_FUNCTIONS):
        raise FileFormatError(f"Head config {file}: rope_type {rope_type!r:.40} is not a rotary embedding "
                              "transformers knows.")
    act = fields.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in ACT2FN:
        raise FileFormatError(f"Head config {file}: hidden_act {act!r:.40} is not an activation transformers knows.")


def _check_head_sizes(fields: dict, file: Path) -> None:
    """The sizes attention is built from, checked first so the sentence names the fields and the file."""
    heads = fields.get("num_attention_heads")
    sizes = {"hidden_size": fields.get("hidden_size"), "num_attention_heads": heads,
             "num_key_value_heads": fields.get("num_key_value_heads") or heads}  # null: as many as heads
    if not all(type(v) is int and v > 0 for v in sizes.values()):
        raise FileFormatError(f"Head config {file}: {sizes} must be positive integers.")
    for name in OTHER_SIZES:  # every other size a module is built from, where the config gives it
        value = fields.get(name, 1)  # absent: LlamaConfig's default
        if value is None and name not in REQUIRED_SIZES:
            continue
        if not (type(value) is int and value > 0):
            raise FileFormatError(f"Head config {file}: {name} is {value!r:.40}, not a positive integer.")
    h, heads, kv = sizes.values()
    if h % heads:
        raise FileFormatError(f"Head config {file}: hidden_size {h} does not divide by num_attention_heads {heads}.")
    if heads % kv:
        raise FileFormatError(f"Head config {file}: num_attention_heads {heads} does not divide by "
                         f"num_key_value_heads {kv}.")


def read_head(path: str | Path, target_config=None) -> tuple[Checkpoint, LlamaConfig]:
    """A head directory in any layout eagle.models.layouts reads, its config built (and matched to the target's
    when given: that sentence says more than a shape) and every tensor checked by name and shape against
    the module it will load into (built on the meta device: no memory)."""
    ckpt = read_checkpoint(path)
    config = head_config(ckpt.fields, ckpt.config_file)
    if target_config is not None:
        check_head_matches(config, target_config, ckpt.config_file)
    with torch.device("meta"):
        _check_tensors(_build(ckpt, config, None, None), ckpt)
    return ckpt, config


def _build(ckpt: Checkpoint, config: LlamaConfig, layers: tuple[int, ...] | None,
           embed: nn.Embedding | None) -> AnyHead:
    """The module for a checkpoint: an EAGLE-3 head's fc is sized by how many layers it reads."""
    if ckpt.layout.kind == "eagle1":
        return DraftHead(config, embed)
    count = len(ckpt.layout.layer_ids or ()) or 3  # the paper's three when none are recorded
    return Eagle3Head(config, layers or tuple(range(count)), embed)


def _check_tensors(head: AnyHead, ckpt: Checkpoint) -> None:
    """Every tensor the layout needs, none it does not hold, each of the shape config.json implies."""
    own, file, label = head.state_dict(), ckpt.weights_file, LABELS[ckpt.layout.name]
    missing = [k for k in own if k not in ckpt.state and not k.startswith("embed_tokens.")]
    unexpected = [k for k in ckpt.state if k not in own]
    if missing:
        raise HeadLayoutError(f"{file} lacks the tensor {missing[0]} that the {label} layout needs"
                              f"{f' ({len(missing)} missing)' if len(missing) > 1 else ''}.")
    if unexpected:
        raise HeadLayoutError(f"{file} holds {unexpected[0]}, which is no tensor of the {label} layout as its "
                              f"config.json describes it{f' ({len(unexpected)} such)' if len(unexpected) > 1 else ''}.")
    wrong = [f"{k} {tuple(v.shape)} (config.json says {tuple(own[k].shape)})" for k, v in ckpt.state.items()
             if v.shape != own[k].shape]
    if wrong:
        raise HeadMismatchError(f"Head {file}: the weights do not match its config.json: {', '.join(wrong[:3])}.")
    broken = next((k for k, v in ckpt.state.items() if v.is_floating_point() and not bool(v.isfinite().all())), None)
    if broken is not None:
        raise FileFormatError(f"{file}: the tensor {broken} holds NaN or infinite values: copy it again.")


def load_head(path: str | Path, target=None) -> AnyHead:
    """Load a head directory in any public layout (eagle.models.layouts: official EAGLE-1/2 and EAGLE-3,
    SpecForge, vLLM speculators); its layer ids become Target.forward's feature_layers and the layout
    is kept as head.layout. Without `embed_tokens` in the file, the target's embedding is shared
    (target is then required, as it is for an EAGLE-3 head that records no layer ids)."""
    ckpt, config = read_head(path, None if target is None else target.config)
    embed = None
    if "embed_tokens.weight" not in ckpt.state:
        if target is None:
            raise ValueError(f"Head {path} has no embed_tokens: pass its target to share the embedding.")
        if config.hidden_size != target.config.hidden_size:
            raise HeadMismatchError(f"Head {ckpt.config_file} has hidden_size {config.hidden_size} but no "
                                    f"embed_tokens, and the target's embedding is {target.config.hidden_size} wide.")
        embed = target.model.model.embed_tokens
    layers = None
    if ckpt.layout.kind == "eagle3":
        if target is None and ckpt.layout.layer_ids is None:
            raise ValueError(f"Head {ckpt.config_file} does not record its feature layers: pass its target.")
        n = target.config.num_hidden_layers if target is not None else None
        layers = ckpt.layout.feature_layers(n, ckpt.config_file) if n else ckpt.layout.input_ids()
    head = _build(ckpt, config, layers, embed)
    head.load_state_dict(ckpt.state, strict=False)  # names and shapes checked by read_head
    head.layout = ckpt.layout
    _load_counts(head, Path(path))
    device = target.device if target is not None else "cpu"
    dtype = target.dtype if target is not None else torch.float32
    return head.to(device=device, dtype=dtype).eval()


def _load_counts(head: AnyHead, path: Path) -> None:
    counts = read_token_counts(path, head.config.vocab_size)
    if counts is not None:
        head.token_counts.copy_(counts)


def read_token_counts(path: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The token counts saved beside a head (None when it has none): the one reader of COUNTS_FILE, for
    load_head and export-token-map alike, so a file that one refuses the other never reads as a wrong
    vocabulary. One sentence naming the file unless it holds one count >= 0 per token of the vocabulary."""
    file = Path(path) / COUNTS_FILE
    if not file.is_file():
        return None
    counts = read_tensors(file).get("token_counts")
    if counts is None:
        raise FileFormatError(f"{file} holds no token_counts tensor: copy it again, or delete it to use the head "
                         "without counts.")
    if counts.shape != (vocab_size,):
        raise FileFormatError(f"{file} holds token_counts of shape {tuple(counts.shape)}, not one count per token of "
                         f"the head's vocabulary of {vocab_size}.")
    if counts.is_floating_point() or counts.is_complex() or bool((counts < 0).any()):
        raise FileFormatError(f"{file} holds token_counts that are not counts (negative or not integers, "
                         f"{str(counts.dtype).removeprefix('torch.')}).")
    return counts.long()


def head_sha256(head: AnyHead) -> str:
    """A hash of the head's own weights and token counts (not the target's shared embedding), in
    fp32 so the load precision does not change it: what a stored result must have been drafted with
    for a resume to reuse it."""
    h = hashlib.sha256()
    for name, t in sorted({**head.state_dict(), "token_counts": head.token_counts}.items()):
        if not name.startswith("embed_tokens."):
            h.update(name.encode())
            h.update(t.detach().to("cpu", torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


def head_identity(head: AnyHead | None) -> dict[str, str | dict | None]:
    """What a trace header records of the head: its type, version (head_sha256) and the layout it was
    read from with its layer-id convention (eagle.models.layouts.HeadLayout.describe); None without one."""
    if head is None:
        return {"head_type": None, "head_version": None, "head_layout": None}
    layout = head.layout.describe() if head.layout is not None else None
    return {"head_type": head.kind, "head_version": head_sha256(head), "head_layout": layout}


def save_head(head: AnyHead, path: str | Path, include_embedding: bool = False,
              dtype: torch.dtype = torch.float16, fmt: str | None = None) -> None:
    """Save in a public layout (default: official EAGLE-1/2 for an EAGLE-1/2 head, SpecForge's EAGLE-3,
    which SGLang loads, for an EAGLE-3 head; fmt: any of eagle.models.layouts.FORMATS that fits). No rotary
    buffers; embed_tokens only when asked; d2t/t2d keep their integer and bool types. Each file is
    replaced atomically (eagle.records.files), so a crash or a concurrent save never leaves a torn file."""
    path = Path(path)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype)
             for k, v in head.state_dict().items() if include_embedding or not k.startswith("embed_tokens.")}
    fmt = fmt or (EAGLE3 if head.kind == "eagle3" else EAGLE)
    write_checkpoint(path, fmt, head.config.to_dict(), state, head.feature_layers)
    if int(head.token_counts.sum()) > 0:
        counts = {"token_counts": head.token_counts.cpu()}
        atomic_write(path / COUNTS_FILE, save(counts))


def new_head(target, seed: int = 0, kind: str = "eagle1", draft_ids: torch.Tensor | None = None) -> AnyHead:
    """A freshly initialised head for `target`, sharing its embedding: EAGLE-1/2 (kind "eagle1") or
    EAGLE-3 ("eagle3", over the draft vocabulary `draft_ids`, ascending target ids; None = all)."""
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head type {kind!r}: choose from {', '.join(HEAD_KINDS)}")
    torch.manual_seed(seed)
    embed = target.model.model.embed_tokens
    if kind == "eagle1":
        head = DraftHead(head_config_from_target(target.config), embed)
        head.layout = HeadLayout("new", LAST)
    else:
        k = target.config.vocab_size if draft_ids is None else draft_ids.numel()
        config = head_config_from_target(target.config, bias=None, draft_vocab_size=k)
        head = Eagle3Head(config, eagle3_feature_layers(target.config.num_hidden_layers), embed)
        head.layout = HeadLayout("new", INPUT, head.feature_layers)
    head.apply(lambda m: _init_linear(m, target.config.initializer_range))
    if draft_ids is not None:
        if kind != "eagle3":
            raise ValueError("draft_ids: only an EAGLE-3 head has its own draft vocabulary")
        head.set_draft_vocab(draft_ids)
    return head.to(device=target.device, dtype=target.dtype).eval()


def _init_linear(module: nn.Module, std: float) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def shipped_head_path(target_name: str) -> Path | None:
    """The head committed in the repo for this target name, if there is one."""
    path = HEADS_DIR / Path(target_name).name
    return path if (path / "config.json").is_file() else None


HEAD_FILES = ["config.json", "*.safetensors", "pytorch_model.bin"]  # what an EAGLE head repo holds that we read


def locate_head(head: str | Path | None) -> str | Path | None:
    """'auto', 'random' and directories pass through; a Hugging Face id (ORG/NAME, e.g.
    yuhuili/EAGLE-LLaMA3-Instruct-8B) is downloaded (or found in the cache) and becomes its local snapshot
    directory. Offline and not cached: one sentence at once, before any model loads."""
    if head in (None, "auto", "random") or Path(head).expanduser().exists():
        return head
    if looks_like_path(str(head)):
        raise FileNotFoundError(f"No draft head at {head}: give a head directory, a Hugging Face id (ORG/NAME), "
                                "auto or random.")
    offline = hub_offline(str(head), f"--head {head!r} is neither a directory nor a Hugging Face id (ORG/NAME).",
                          f"--head {head}: not in the local Hugging Face cache and {{why}}; download it once "
                          "online, or give a head directory.")
    return Path(snapshot_download(str(head), allow_patterns=HEAD_FILES, local_files_only=offline))


def resolve_head(target, head: str | Path | None = "auto") -> tuple[AnyHead, str]:
    """'auto': the shipped head for the target, else a random head; 'random': a fresh random head;
    otherwise a head directory. Returns the head and a description of where it came from."""
    if head in (None, "auto"):
        path = shipped_head_path(target.name)
        if path is None:
            return new_head(target), "random (no trained head ships for this model)"
        return load_head(path, target), str(path)
    if head == "random":
        return new_head(target), "random"
    path = locate_head(head)  # a hub id (the dashboard's head field too) -> its snapshot directory
    return load_head(path, target), str(head)
