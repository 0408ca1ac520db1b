"""Draft-head checkpoints: reading one in any public layout (eagle.models.layouts) into its module with
every config field and tensor checked, the token counts beside it, saving, the head's identity (the
hash a trace and a resume record), the heads shipped with the package and finding a head by name."""
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

from ..records.files import atomic_write
from ..records.schema import FileFormatError, is_kind
from ..resources import resource_path
from .head import AnyHead, DraftHead, cast_head, new_head
from .head3 import Eagle3Head
from .layouts import EAGLE, EAGLE3, LABELS, Checkpoint, HeadLayoutError, read_checkpoint, read_tensors, \
    write_checkpoint
from .location import hub_offline, looks_like_path

COUNTS_FILE = "token_counts.safetensors"  # our addition: token frequencies for the reduced draft vocabulary
HEADS_DIR = resource_path("heads")  # heads shipped with the package, by target name


class HeadMismatchError(FileFormatError):
    """A draft head does not fit its target (vocabulary or hidden size) or its weights its config.json."""


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


def load_head(path: str | Path, target=None, dtype: torch.dtype | None = None) -> AnyHead:
    """Load a head directory in any public layout (eagle.models.layouts: official EAGLE-1/2 and EAGLE-3,
    SpecForge, vLLM speculators); its layer ids become Target.forward's feature_layers and the layout
    is kept as head.layout. Without `embed_tokens` in the file, the target's embedding is shared
    (target is then required, as it is for an EAGLE-3 head that records no layer ids). dtype: the
    head's precision (None: the target's, fp32 without one); a shared embedding keeps the target's."""
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
    head.to(target.device if target is not None else "cpu")
    own = target.dtype if target is not None else torch.float32
    return cast_head(head, dtype or own, embed).eval()


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
    otherwise a head directory. Returns the head, at the target's precision (cast_head changes it), and
    a description of where it came from."""
    if head in (None, "auto"):
        path = shipped_head_path(target.name)
        if path is None:
            return new_head(target), "random (no trained head ships for this model)"
        return load_head(path, target), str(path)
    if head == "random":
        return new_head(target), "random"
    path = locate_head(head)  # a hub id (the dashboard's head field too) -> its snapshot directory
    return load_head(path, target), str(head)
