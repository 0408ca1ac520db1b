"""The draft head's own attention computes what transformers' LlamaAttention computes on the same
weights: with grouped key/value heads, biases, a boolean tree mask, a KV cache and one new token."""
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from eagle.models.head3 import DraftAttention, prefix_mask
from eagle.models.kvcache import KVCache


def _pair(qkv_bias: bool, heads: int, kv_heads: int) -> tuple[DraftAttention, LlamaAttention, LlamaRotaryEmbedding]:
    config = LlamaConfig(hidden_size=32, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=8,
                         intermediate_size=64, attention_bias=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    ours = DraftAttention(config, 32, qkv_bias)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.3)
    ref = LlamaAttention(config, layer_idx=0)
    for name in ("q_proj", "k_proj", "v_proj"):  # transformers' module with biased q/k/v, as EAGLE-Qwen2 heads
        setattr(ref, name, torch.nn.Linear(32, getattr(ref, name).out_features, bias=qkv_bias))
    ref.load_state_dict(ours.state_dict())
    return ours, ref, LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("qkv_bias,heads,kv_heads", [(False, 4, 2), (True, 4, 4), (False, 4, 1)])
def test_draft_attention_equals_transformers_llama_attention(qkv_bias, heads, kv_heads):
    ours, ref, rotary = _pair(qkv_bias, heads, kv_heads)
    x = torch.randn(1, 5, 32)
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)
    caches = [KVCache(1, kv_heads, 8, 16) for _ in range(2)]
    prefix = torch.randn(1, 3, 32)
    with torch.no_grad():
        for cache, module in zip(caches, (ours, ref)):  # a 3-token prefix, causal
            rope = rotary(prefix, torch.arange(3)[None])
            mask = prefix_mask(0, 3, None, "cpu")
            if module is ours:
                module(prefix, rope, mask, cache.writer(0, 3))
            else:
                module(prefix, position_embeddings=rope, attention_mask=mask, cache=cache.writer(0, 3))
            cache.length = 3
        rope = rotary(x, (3 + torch.tensor([0, 1, 1, 2, 2]))[None])  # a tree after the prefix
        mask = prefix_mask(3, 5, tree, "cpu")
        a = ours(x, rope, mask, caches[0].writer(3, 5))
        b = ref(x, position_embeddings=rope, attention_mask=mask, cache=caches[1].writer(3, 5))[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        one = x[:, :1]
        rope = rotary(one, torch.tensor([[3]]))
        a = ours(one, rope, None, caches[0].writer(3, 1))  # one new token: no mask
        b = ref(one, position_embeddings=rope, attention_mask=None, cache=caches[1].writer(3, 1))[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
