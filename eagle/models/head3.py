"""The EAGLE-3 draft head: fc over three of the target's hidden states (3H -> H), one decoder layer
whose attention reads [norm(embedding) ; norm(fused feature)] (2H), a final norm and the head's own
lm_head over a draft vocabulary of K tokens, mapped to target ids by the buffer d2t. Module names
follow the official checkpoint layout (fc, midlayer.*, norm, lm_head, d2t, t2d); loading and saving
live in eagle.models.head beside the EAGLE-1/2 head's."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from .kvcache import CacheWriter, ChainKeys, KVCache, prefix_mask
from .layouts import HeadLayout


def top_token_ids(counts: torch.Tensor, k: int) -> torch.Tensor | None:
    """The k most frequent token ids, ascending (FR-Spec's reduced draft vocabulary); None when k is 0,
    covers the whole vocabulary, or there are no counts."""
    if k <= 0 or k >= counts.numel() or int(counts.sum()) == 0:
        return None
    return torch.topk(counts, k).indices.sort().values


def attention_inputs(cache: KVCache | None, start: int, n_new: int, tree_mask: torch.Tensor | None,
                     device: torch.device) -> tuple[torch.Tensor | None, CacheWriter | None]:
    """The mask (1, 1, T, start + T) and cache writer of a draft forward over T new tokens. Without a
    cache (training) attention is plain causal over the sequence; one new token on a chain needs no mask."""
    if cache is None:
        return prefix_mask(0, n_new, tree_mask, device), None
    mask = None if (n_new == 1 and tree_mask is None) else prefix_mask(start, n_new, tree_mask, device)
    return mask, cache.writer(start, n_new)


class RopeTable:
    """A head's rotary cos and sin for positions [0, n), made once per dtype, device and frequency tensor
    (n grows to the next power of two a cache needs) and indexed by each forward: one index per forward
    instead of the rotary module's eight small ops (37 us a forward, 2026-12-07, AMD EPYC Zen 5). Each
    position's values are the module's own: its angles are products of a position and a frequency,
    whatever the batch. A rope type that rescales with the sequence (dynamic NTK) and a forward without a
    cache (training) use the module."""

    def __init__(self, rotary: nn.Module) -> None:
        self.rotary, self.tables = rotary, {}

    def __call__(self, x: torch.Tensor, positions: torch.Tensor,
                 bound: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (B, T, D) at positions (B, T), each below `bound` (a cache's slots; None: unknown)."""
        if bound is None or getattr(self.rotary, "rope_type", "default") != "default":
            return self.rotary(x, positions)
        freq = self.rotary.inv_freq  # a cast of the head replaces it: a table of the old one is stale
        key = (x.dtype, x.device)
        made = self.tables.get(key)
        if made is None or made[0] is not freq or made[1] != freq._version or made[2].shape[1] < bound:
            n = 1 << max(bound - 1, 1).bit_length()
            made = self.tables[key] = (freq, freq._version,
                                       *self.rotary(x, torch.arange(n, device=x.device)[None]))  # (1, n, D) each
        return made[2][0, positions], made[3][0, positions]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (B, heads, T, D) with cos, sin (B, T, D) (Llama's half rotation)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DraftAttention(nn.Module):
    """Llama self-attention as a draft head runs it: q/k/v/o projections under the checkpoints' names,
    rotary positions, the cache argument's update (the head's KV cache, or a training chain) and SDPA
    over a boolean mask. Written out instead of transformers' LlamaAttention because a head forward
    over a few tokens costs little more than that module's per-call dispatch, and a draft round makes
    several. q/k/v read `in_features` inputs (2H for EAGLE-3) and, with qkv_bias, carry biases
    (EAGLE-Qwen2 heads: biased q/k/v and an unbiased o_proj, which config.attention_bias cannot say)."""

    def __init__(self, config: LlamaConfig, in_features: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=qkv_bias or bias)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=qkv_bias or bias)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=qkv_bias or bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                cache) -> torch.Tensor:
        """x (B, T, in_features), rope: cos, sin (B, T, D), mask (1, 1, T, S) bool or None (one new token
        sees the whole prefix) -> (B, T, H)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, kv_heads, T, D)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, 0)  # (B, kv_heads, S, D): the prefix, then these T
        groups = self.heads // self.kv_heads
        # each key/value head serves `groups` consecutive query heads. A CPU's SDPA takes them as they are,
        # masked or not (bitwise the same; 4 queries over 304 keys in bf16: 87 us against 137 with the keys
        # copied out, 2026-12-07, AMD EPYC Zen 5, 2 threads); CUDA's would fall back to its math kernel
        # under a mask, so there the keys are expanded
        gqa = groups > 1 and x.device.type == "cpu"
        if groups > 1 and not gqa:
            k, v = (z[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2) for z in (k, v))
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Eagle3Layer(nn.Module):
    """The official `midlayer`: the fused feature and the token embedding are normed separately
    (hidden_norm, input_layernorm), concatenated embedding first, and attended over; the residual
    stream is the un-normed fused feature (the normed one under speculators' norm_before_residual)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = DraftAttention(config, 2 * h)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(config)
        # speculators' variant: the residual stream starts from the normed feature, not the raw one
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, embeds: torch.Tensor, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, cache) -> torch.Tensor:
        """embeds, x: (B, T, H) token embeddings and fused features -> (B, T, H)."""
        normed = self.hidden_norm(x)
        wide = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H)
        residual = normed if self.norm_before_residual else x
        x = residual + self.self_attn(wide, rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """forward returns the layer's output hidden state (B, T, H), the feature later draft steps are
    fed; `logit_features` (the final norm) turns it into what lm_head scores."""
    kind = "eagle3"
    layout: HeadLayout | None = None  # the layout it was read from or made in (set by eagle.models.head)

    def __init__(self, config: LlamaConfig, feature_layers: tuple[int, ...],
                 embed_tokens: nn.Embedding | None = None) -> None:
        super().__init__()
        self.config, self.feature_layers = config, tuple(feature_layers)
        h, vocab = config.hidden_size, config.vocab_size
        k = getattr(config, "draft_vocab_size", None) or vocab
        target_h = getattr(config, "target_hidden_size", None) or h
        self.embed_tokens = embed_tokens or nn.Embedding(vocab, h, config.pad_token_id)
        self.embed_tokens.requires_grad_(False)  # the target's embedding, frozen
        self.fc = nn.Linear(len(self.feature_layers) * target_h, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, k, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.rope = RopeTable(self.rotary_emb)
        self.register_buffer("d2t", torch.zeros(k, dtype=torch.long))  # target id = draft id + d2t[draft id]
        self.register_buffer("t2d", torch.arange(vocab) < k)  # which target ids the draft vocabulary holds
        # Token frequencies of the training data (0 = unknown); the draft vocabulary was chosen from them.
        self.register_buffer("token_counts", torch.zeros(vocab, dtype=torch.long), persistent=False)

    def new_cache(self, max_len: int) -> KVCache:
        p, c = self.fc.weight, self.config
        return KVCache(1, c.num_key_value_heads, c.head_dim, max_len, p.device, p.dtype)

    def _fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, 3H') target features go through fc; (B, T, H) outputs of the head itself (later
        draft steps) are already in its space and pass as they are."""
        features = features.to(self.fc.weight.dtype)
        return self.fc(features) if features.shape[-1] == self.fc.in_features else features

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, start: int = 0,
                tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """token_ids (B, T): x_{t+1}; features (B, T, 3H') or (B, T, H): f_t; -> hidden (B, T, H)."""
        x = self._fuse(features)
        embeds = self.embed_tokens(token_ids).to(x.dtype)
        mask, writer = attention_inputs(cache, start, token_ids.shape[1], tree_mask, x.device)
        return self.midlayer(embeds, x, self.rope(x, positions, None if cache is None else cache.max_len), mask, writer)

    def chain_step(self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                   chain: ChainKeys) -> torch.Tensor:
        """One step of an unrolled draft chain (training-time test), as DraftHead.chain_step."""
        x = self._fuse(features)
        embeds = self.embed_tokens(token_ids).to(x.dtype)
        mask = chain.mask(token_ids.shape[1], x.device)
        return self.midlayer(embeds, x, self.rotary_emb(x, positions), mask, chain)

    def logit_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def draft_vocab(self, lm_head_weight: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The target ids of the draft vocabulary (None: all, in order) and the lm_head rows scoring it:
        the head's own (K, H)."""
        identity = self.d2t.numel() == lm_head_weight.shape[0] and not bool(self.d2t.any())
        return (None if identity else self.target_ids()), self.lm_head.weight

    def draft_vocab_ids(self, k: int) -> torch.Tensor | None:
        """The target ids FR-Spec's k keeps of this head's own vocabulary (its k most frequent by the
        stored counts, as the Drafter picks them); None when k keeps them all or no counts are stored."""
        ids = self.target_ids()
        rows = top_token_ids(self.token_counts[ids], k)
        return None if rows is None else ids[rows.to(ids.device)]

    def target_ids(self) -> torch.Tensor:
        """(K,) the target id of each draft token: draft id + d2t[draft id]."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Fill d2t and t2d from the K target ids (ascending) the draft vocabulary stands for."""
        if target_ids.numel() != self.d2t.numel():
            raise ValueError(f"{target_ids.numel()} draft tokens for a draft vocabulary of {self.d2t.numel()}")
        ids = target_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True
