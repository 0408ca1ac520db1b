"""The target model: a lean forward path over a Hugging Face causal LM with explicit positions, mask and
KV cache that returns logits and EAGLE features (loader.load_target makes one)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .kvcache import KVCache, prefix_mask


@dataclass
class Target:
    model: torch.nn.Module  # a *ForCausalLM with .model.{embed_tokens, layers, norm, rotary_emb} and .lm_head
    tokenizer: object
    name: str
    dtype_report: dict | None = field(default=None, repr=False)  # how "auto" chose the dtype
    kernel_report: dict | None = field(default=None, repr=False)  # how "auto" chose fp32's kernel (models.kernels)

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

