"""`python -m eagle export-head --head DIR --format eagle3|speculators|eagle --out DIR2`: a head in any
layout eagle.models.layouts reads, written in the layout another server loads. eagle3: SpecForge's EAGLE-3
config (architectures LlamaForCausalLMEagle3, layer ids as outputs of layers), what SGLang loads;
speculators: vLLM's format (layers.0.*, layer ids as inputs of layers); eagle: the official EAGLE-1/2
layout, with architectures LlamaForCausalLMEagle, which SGLang needs and the official loader ignores.
Tensors keep their dtype, so the export decodes exactly as the source does."""
from __future__ import annotations

from pathlib import Path

from .checks import check_output
from ..records.files import atomic_write
from ..models.headio import COUNTS_FILE, read_head
from ..models.layouts import HeadLayout, write_checkpoint
from ..models.location import DEFAULT_MODEL
from .tokenmap import head_dir

STALE = ("pytorch_model.bin",)  # an old weights file the official loader would read before ours


def check_export_out(src: Path, out: Path, overwrite: bool) -> None:
    """--out must be a new or empty directory (or any, with --overwrite), and not the head itself."""
    check_output(out, "--out", directory=True)
    if out.exists() and out.resolve() == src.resolve():
        raise ValueError(f"--out {out} is the --head directory itself: give another directory.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} exists and is not empty: pass --overwrite to replace the head there.")


def export_head(head: str, fmt: str, out: Path, overwrite: bool = False, verifier: str | None = None,
                model: str = DEFAULT_MODEL) -> HeadLayout:
    """Read --head (auto: the shipped head for --model), write it to --out in layout `fmt`, and return
    the layout it was read from. The token counts (this repo's, for --draft-vocab) go along."""
    check_output(out, "--out", directory=True)  # before the head is looked up: a wrong --out costs nothing
    src = head_dir(head, model)
    check_export_out(src, out, overwrite)
    ckpt, config = read_head(src)  # every refusal (unknown layout, bad d2t, ...) before anything is written
    write_checkpoint(out, fmt, config.to_dict(), ckpt.state, ckpt.layout.input_ids(),
                     verifier or ckpt.extra.get("verifier"))
    if (src / COUNTS_FILE).is_file():
        atomic_write(out / COUNTS_FILE, (src / COUNTS_FILE).read_bytes())
    else:  # counts another head left in an overwritten --out would narrow this one's --draft-vocab
        (out / COUNTS_FILE).unlink(missing_ok=True)
    for name in STALE:
        (out / name).unlink(missing_ok=True)
    return ckpt.layout
