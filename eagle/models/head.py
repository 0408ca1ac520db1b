"""The EAGLE-1/2 draft head: fc over [embedding ; feature], one decoder layer without input norm,
and the target's own lm_head; new_head makes a fresh one of either kind for a target (headio reads
and writes them)."""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from .head3 import DraftAttention, Eagle3Head, RopeTable, attention_inputs, top_token_ids
from .kvcache import ChainKeys, KVCache
from .layouts import INPUT, LAST, HeadLayout, eagle3_feature_layers


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
        self.rope = RopeTable(self.rotary_emb)
        # Token frequencies from the training data, for the reduced draft vocabulary (0 = unknown).
        self.register_buffer("token_counts", torch.zeros(config.vocab_size, dtype=torch.long), persistent=False)

    def new_cache(self, max_len: int) -> KVCache:
        p = self.fc.weight
        return KVCache(1, self.config.num_key_value_heads, self.config.head_dim, max_len, p.device, p.dtype)

    def _fuse(self, token_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([embed(x_{t+1}) ; f_t]): (B, T) ids and (B, T, H) features -> (B, T, H)."""
        dtype = self.fc.weight.dtype  # the head's own precision; a shared embedding keeps the target's
        return self.fc(torch.cat([self.embed_tokens(token_ids).to(dtype), features.to(dtype)], dim=-1))

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, start: int = 0,
                tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """token_ids (B, T): x_{t+1}; features (B, T, H): f_t; returns predicted f_{t+1} (B, T, H)."""
        x = self._fuse(token_ids, features)
        mask, writer = attention_inputs(cache, start, token_ids.shape[1], tree_mask, x.device)
        return self.layers[0](x, self.rope(x, positions, None if cache is None else cache.max_len), mask, writer)

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
    return cast_head(head.to(target.device), target.dtype, embed).eval()


def cast_head(head: AnyHead, dtype: torch.dtype, shared: nn.Module | None = None) -> AnyHead:
    """The head in `dtype` (in place), all but `shared`, the target's embedding it reads, which keeps
    the target's precision. A head is one layer plus a vocabulary-wide product, so it may draft in a
    precision of its own: the target verifies every token, so greedy output stays the target's."""
    for child in head.children():
        if child is not shared:
            child.to(dtype)
    return head


def head_dtype(head: AnyHead) -> torch.dtype:
    """The precision the head drafts in (a shared embedding may differ: it stays the target's)."""
    return head.fc.weight.dtype


def head_shape(head: AnyHead) -> str:
    """What a head's drafting costs depend on besides the machine: every EAGLE-1/2 head of a target
    drafts alike; an EAGLE-3 head's cost is its own vocabulary's width."""
    return "eagle1" if isinstance(head, DraftHead) else f"eagle3-{head.d2t.numel()}"


def _init_linear(module: nn.Module, std: float) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)

