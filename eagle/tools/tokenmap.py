"""`python -m eagle export-token-map --k N`: the reduced draft vocabulary (FR-Spec) as SGLang's
`--speculative-token-map` file. SGLang reads that file with `torch.load(path, weights_only=True)` and
makes it a tensor of target token ids (its "hot" tokens); we save a 1-D int64 tensor of the head's
k most frequent ids, the same set `--draft-vocab k` scores here."""
from __future__ import annotations

from pathlib import Path

import torch

from ..records.files import atomic_write, torch_bytes
from ..models.head3 import top_token_ids
from ..models.headio import COUNTS_FILE, read_head, read_token_counts, shipped_head_path
from ..models.location import DEFAULT_MODEL


def head_dir(head: str, model: str) -> Path:
    """--head auto: the shipped head for --model; otherwise a head directory."""
    if head == "auto":
        path = shipped_head_path(model)
        if path is None:
            raise FileNotFoundError(f"--head auto: no trained head ships for {model}; give --head DIR")
        return path
    return Path(head)


def token_map(head: str = "auto", k: int = 32768, model: str = DEFAULT_MODEL) -> torch.Tensor:
    """The k most frequent token ids of a head's recorded counts (ascending), as SGLang wants them."""
    path = head_dir(head, model)
    # read and checked as load_head reads them: the counts must cover the vocabulary config.json names
    _, config = read_head(path)
    counts = read_token_counts(path, config.vocab_size)
    if counts is None:
        raise FileNotFoundError(f"--head {head}: {path / COUNTS_FILE} is missing, so the head has no token "
                                "counts (train records them; see TRAINING.md)")
    if not 0 < k < counts.numel():
        raise ValueError(f"--k must be between 1 and {counts.numel() - 1} (the vocabulary size - 1), got {k}")
    ids = top_token_ids(counts, k)
    if ids is None:
        raise ValueError(f"--head {head}: its token counts are all zero")
    return ids.to(torch.int64)


def export_token_map(out: Path, head: str, k: int, model: str, force: bool) -> torch.Tensor:
    if out.exists() and not force:
        raise ValueError(f"--out {out} exists; pass --force to replace it")
    ids = token_map(head, k, model)
    atomic_write(out, torch_bytes(ids))
    return ids
