"""A preallocated, slot-indexed KV cache with two operations: write at slots, commit accepted slots.

Slots [0, length) hold the committed prefix. A forward pass writes its new keys and values into the
contiguous slots [start, start + T) through a `CacheWriter` passed as a forward argument; after
verification, `commit` moves the accepted slots (in order) to [length, length + n) so the prefix
stays contiguous and the rejected tree slots are simply overwritten by the next round.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        shape = (n_layers, 1, n_kv_heads, max_len, head_dim)  # (L, B, H_kv, S, D)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # committed slots

    def writer(self, start: int, n_new: int) -> "CacheWriter":
        if start < 0 or start + n_new > self.max_len:
            raise ValueError(f"KV cache overflow: writing slots {start}..{start + n_new - 1} "
                             f"but the cache holds {self.max_len} slots")
        return CacheWriter(self, start, n_new)

    def commit(self, slots: list[int]) -> None:
        """Move the accepted slots (ascending, each >= length) to [length, length + n)."""
        n = len(slots)
        # a path already at the prefix's end (a round that kept only its root, or took each level's first
        # node) moves nothing: four copies over every layer skipped (~0.15 ms on a CPU)
        if slots != list(range(self.length, self.length + n)):
            dst = torch.arange(self.length, self.length + n, device=self.k.device)
            src = torch.tensor(slots, device=self.k.device)
            # index_select copies first, so overlapping source and destination ranges are safe.
            self.k.index_copy_(3, dst, self.k.index_select(3, src))
            self.v.index_copy_(3, dst, self.v.index_select(3, src))
        self.length += n


class CacheWriter:
    """Duck-types the `update` method Hugging Face attention modules call on their cache argument."""

    def __init__(self, cache: KVCache, start: int, n_new: int) -> None:
        self.cache, self.start, self.end = cache, start, start + n_new

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: (B, H_kv, T, D), already rotated by the layer.
        k, v = self.cache.k[layer_idx], self.cache.v[layer_idx]
        k[:, :, self.start:self.end] = key_states
        v[:, :, self.start:self.end] = value_states
        return k[:, :, :self.end], v[:, :, :self.end]


def prefix_mask(start: int, n_new: int, tree_mask: torch.Tensor | None,
                device: torch.device | str) -> torch.Tensor:
    """Boolean attention mask (1, 1, T, start + T) for T new tokens written at slots [start, start + T).

    tree_mask (T, W) covers the last W slots (W >= T: earlier tree nodes, then the new tokens); all
    slots before them are the committed prefix and fully visible. None means causal among the new."""
    if tree_mask is None:
        tree_mask = torch.ones(n_new, n_new, dtype=torch.bool, device=device).tril_()
    visible = torch.ones(n_new, start + n_new - tree_mask.shape[1], dtype=torch.bool, device=device)
    return torch.cat([visible, tree_mask.to(device)], dim=1)[None, None]


class ChainKeys:
    """Keys and values of the draft chains unrolled from every position of a sequence at once.

    Step 0 runs on the real context (causal). At step j the chain started at position t has drafted
    j tokens beyond it; its query sees what the drafter's query at depth j sees: the real context's
    keys up to t, then the keys its own chain wrote at t in steps 1..j-1, then itself. Duck-types the
    cache `update` the attention calls; it concatenates (never writes in place) so autograd can
    backpropagate through every step."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []  # per step (B, H_kv, T, D)
        self.v: list[torch.Tensor] = []

    def mask(self, n: int, device: torch.device | str) -> torch.Tensor:
        """(1, 1, T, (steps + 1) * T) for the next step: causal over the context, diagonal per earlier step."""
        context = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
        own = torch.eye(n, dtype=torch.bool, device=device)
        return torch.cat([context] + [own] * len(self.k), dim=1)[None, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.append(key_states)
        self.v.append(value_states)
        return torch.cat(self.k, dim=2), torch.cat(self.v, dim=2)
