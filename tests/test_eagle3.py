"""The EAGLE-3 head: an official-layout checkpoint (random weights, tiny dimensions) loads into our module
and drafts exactly what an independent reference forward, written here from the layout facts in plain
torch, computes; saving writes that layout back; greedy decoding with an EAGLE-3 head is lossless."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import encode_prompt
from eagle.core.draft import Drafter
from eagle.models.head import DraftHead, new_head
from eagle.models.headio import head_identity, head_sha256, load_head, save_head
from eagle.models.head3 import Eagle3Head
from eagle.tools.budget.choice import auto_config
from eagle.records.trace import Trace, TraceHeader, read_trace, write_trace
from eagle.training.features import extract_features, load_shards, prepare_features
from eagle.training.train import train_head
from tests.tiny import tiny_target

H, HEADS, KV, D, INTER, VOCAB, LAYERS = 32, 4, 2, 8, 64, 12, 8  # tests/tiny.py's sizes, 8 layers
SMALL = dict(total_tokens=8, depth=3, top_k=3)
THETA, EPS = 50000.0, 1e-5  # not transformers' defaults, so a config the loader ignores shows
DRAFT_IDS = torch.tensor([0, 2, 3, 5, 6, 8, 9, 11])  # K = 8 target ids make the draft vocabulary
OFFICIAL_KEYS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
    f"midlayer.{k}.weight" for k in ("hidden_norm", "input_layernorm", "post_attention_layernorm",
                                     "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}


def official_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under exactly the official names and shapes; norms away from 1 so a swap shows."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    k = DRAFT_IDS.numel()
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[DRAFT_IDS] = True
    return {"fc.weight": r(H, 3 * H), "midlayer.hidden_norm.weight": 1 + r(H),
            "midlayer.input_layernorm.weight": 1 + r(H), "midlayer.post_attention_layernorm.weight": 1 + r(H),
            "midlayer.self_attn.q_proj.weight": r(HEADS * D, 2 * H),
            "midlayer.self_attn.k_proj.weight": r(KV * D, 2 * H),
            "midlayer.self_attn.v_proj.weight": r(KV * D, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, HEADS * D),
            "midlayer.mlp.gate_proj.weight": r(INTER, H), "midlayer.mlp.up_proj.weight": r(INTER, H),
            "midlayer.mlp.down_proj.weight": r(H, INTER), "norm.weight": 1 + r(H), "lm_head.weight": r(k, H),
            "d2t": DRAFT_IDS - torch.arange(k), "t2d": t2d}


def official_config() -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": H, "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV,
            "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_IDS.numel(),
            "rms_norm_eps": EPS, "rope_theta": THETA, "max_position_embeddings": 256,
            "tie_word_embeddings": False, "torch_dtype": "float32"}


def write_checkpoint(path, state: dict[str, torch.Tensor], config: dict | None = None):
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config or official_config()))
    return path


# ---- the reference: the layout facts in plain torch ----------------------------------------------
def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """(T, n, D) rotated by position, halves convention (Llama): x * cos + rotate_half(x) * sin."""
    inv = THETA ** (-torch.arange(0, D, 2).float() / D)
    ang = pos.float()[:, None] * inv[None]  # (T, D/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin


def reference_layer(s: dict, embed: torch.Tensor, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """midlayer over T positions, causal: embed (T, H) token embeddings, x (T, H) fused features."""
    w = lambda name: s[f"midlayer.{name}.weight"]  # noqa: E731
    wide = torch.cat([_rms(embed, w("input_layernorm")), _rms(x, w("hidden_norm"))], -1)  # (T, 2H)
    q = _rope((wide @ w("self_attn.q_proj").T).view(-1, HEADS, D), pos)
    k = _rope((wide @ w("self_attn.k_proj").T).view(-1, KV, D), pos).repeat_interleave(HEADS // KV, 1)
    v = (wide @ w("self_attn.v_proj").T).view(-1, KV, D).repeat_interleave(HEADS // KV, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
    causal = torch.ones(len(pos), len(pos), dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    x = x + torch.einsum("hts,shd->thd", att, v).reshape(len(pos), HEADS * D) @ w("self_attn.o_proj").T
    n = _rms(x, w("post_attention_layernorm"))
    return x + (F.silu(n @ w("mlp.gate_proj").T) * (n @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T


def reference_probs(s: dict, hidden: torch.Tensor) -> torch.Tensor:
    """(T, H) layer outputs -> (T, V) draft probabilities on target ids (zero outside the draft vocab)."""
    q = torch.softmax(_rms(hidden, s["norm.weight"]) @ s["lm_head.weight"].T, -1)  # (T, K)
    ids = torch.arange(q.shape[1]) + s["d2t"]  # target id = draft id + d2t[draft id]
    return torch.zeros(len(hidden), VOCAB).index_copy_(1, ids, q)


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return tiny_target(vocab=VOCAB, seed=3, layers=LAYERS)


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (5,), generator=g), torch.randn(5, 3 * H, generator=g)  # x_{t+1}, f_t (3H)


def _draft(head, tiny, tokens, feats):
    """Our path: consume 5 pairs through the drafter's cache, then one tree node fed the head's own
    output (its token the first one again). -> hidden (6, H), probabilities (6, V)."""
    drafter = Drafter(head, tiny.model.lm_head.weight, 16)
    with torch.no_grad():
        prefix = head(tokens[None], feats[None], torch.arange(5)[None])[0]  # the training path (no cache)
        root = drafter.consume(tokens, feats)  # (1, H)
        node = drafter.expand(tokens[:1], root, 5, torch.ones(1, 1, dtype=torch.bool))  # (1, H)
        assert torch.allclose(root, prefix[-1:], atol=1e-5)
        hidden = torch.cat([prefix, node])
        return hidden, drafter.full_probs(drafter.log_probs(hidden))


def _reference(s, tiny, tokens, feats):
    embed = tiny.model.model.embed_tokens.weight
    prefix = reference_layer(s, embed[tokens], feats @ s["fc.weight"].T, torch.arange(5))
    # the tree node: token tokens[0] at position 5, fed the head's own output at position 4 (no fc)
    x = torch.cat([feats @ s["fc.weight"].T, prefix[-1:]])
    hidden = reference_layer(s, embed[torch.cat([tokens, tokens[:1]])], x, torch.arange(6))
    return hidden, reference_probs(s, hidden)


# ---- item 1: the module against the reference ----------------------------------------------------
def test_official_checkpoint_drafts_what_the_reference_computes(tmp_path, tiny, inputs):
    state = official_state()
    head = load_head(write_checkpoint(tmp_path / "h", state), tiny)
    assert isinstance(head, Eagle3Head) and head.feature_layers == (2, 4, 5)  # 2, L//2, L-3 of 8 layers
    assert head.embed_tokens is tiny.model.model.embed_tokens  # shared: the file has no embed_tokens
    hidden, probs = _draft(head, tiny, *inputs)
    ref_hidden, ref_probs = _reference(state, tiny, *inputs)
    assert torch.allclose(hidden, ref_hidden, atol=1e-5)
    assert torch.allclose(probs, ref_probs, atol=1e-6)
    assert bool((probs[:, ~state["t2d"]] == 0).all())  # nothing drafted outside the draft vocabulary


@pytest.mark.parametrize("fault", ["swapped norms", "wrong d2t", "fc scrambled"])
def test_the_reference_comparison_catches_a_wrong_layout(tmp_path, tiny, inputs, fault):
    """A checkpoint loaded with one of these mistakes drafts differently from the reference: the
    comparison above would fail, so it checks the layout and not just that something runs."""
    state = official_state()
    bad = dict(state)
    if fault == "swapped norms":
        bad["midlayer.hidden_norm.weight"] = state["midlayer.input_layernorm.weight"]
        bad["midlayer.input_layernorm.weight"] = state["midlayer.hidden_norm.weight"]
    elif fault == "wrong d2t":  # consistent with t2d (else the loader refuses it), but the wrong map
        bad["d2t"] = state["d2t"].clone()
        bad["d2t"][1] -= 1  # draft token 1 -> target 1 instead of 2
        bad["t2d"] = state["t2d"].clone()
        bad["t2d"][1], bad["t2d"][2] = True, False
    else:
        bad["fc.weight"] = state["fc.weight"].reshape(3 * H, H).T.contiguous()  # same shape, other order
    head = load_head(write_checkpoint(tmp_path / "h", bad), tiny)
    _, probs = _draft(head, tiny, *inputs)
    assert not torch.allclose(probs, _reference(state, tiny, *inputs)[1], atol=1e-3)


def test_a_wrong_key_is_refused(tmp_path, tiny):
    state = official_state()
    state["midlayer.hidden_layernorm.weight"] = state.pop("midlayer.hidden_norm.weight")
    with pytest.raises(ValueError, match="hidden_norm"):
        load_head(write_checkpoint(tmp_path / "h", state), tiny)


def test_saving_writes_the_official_layout(tmp_path, tiny, inputs):
    state = official_state()
    head = load_head(write_checkpoint(tmp_path / "in", state), tiny)
    save_head(head, tmp_path / "out", dtype=torch.float32)
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(saved) == OFFICIAL_KEYS
    assert all(torch.equal(saved[k], state[k]) for k in OFFICIAL_KEYS)  # d2t stays int64, t2d bool
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 8 and config["rope_theta"] == THETA
    # SpecForge's convention, which SGLang reads: id i is the output of layer i, so inputs 2, 4, 5 are 1, 3, 4
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    again = load_head(tmp_path / "out", tiny)
    assert torch.equal(_draft(again, tiny, *inputs)[1], _draft(head, tiny, *inputs)[1])


def test_the_head_type_is_read_from_the_checkpoint(tmp_path, tiny):
    save_head(new_head(tiny, seed=1), tmp_path / "e1")
    assert type(load_head(tmp_path / "e1", tiny)) is DraftHead
    config = {k: v for k, v in official_config().items() if k != "architectures"}
    assert isinstance(load_head(write_checkpoint(tmp_path / "e3", official_state(), config), tiny), Eagle3Head)
    assert new_head(tiny, seed=1, kind="eagle3").kind == "eagle3"


def test_a_target_too_shallow_for_eagle3_is_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="at least 3 layers"):
        load_head(write_checkpoint(tmp_path / "h", official_state()), tiny_target(vocab=VOCAB, layers=2))


# ---- item 2: decoding with an EAGLE-3 head -------------------------------------------------------
def test_the_target_returns_the_inputs_of_the_asked_layers(tiny):
    """feature_layers index i is HF output_hidden_states[i]: the input of layer i, L the post-norm output."""
    ids = torch.tensor([[1, 4, 2, 7]])
    _, feats = tiny.forward(ids, torch.arange(4)[None], tiny.new_cache(4), 0, feature_layers=(2, 4, 5, LAYERS))
    with torch.no_grad():
        hf = tiny.model(ids, output_hidden_states=True).hidden_states
    assert feats.shape == (1, 4, 4 * H)
    assert torch.allclose(feats, torch.cat([hf[i] for i in (2, 4, 5, LAYERS)], -1), atol=1e-5)
    _, default = tiny.forward(ids, torch.arange(4)[None], tiny.new_cache(4), 0)
    assert torch.equal(default, feats[..., 3 * H:])  # None: the post-norm last feature, as before


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_greedy_with_an_eagle3_head_equals_vanilla(mode, single_thread):
    target = tiny_target(vocab=VOCAB, seed=5, eos=None, layers=LAYERS)
    head = new_head(target, seed=2, kind="eagle3", draft_ids=DRAFT_IDS)
    assert head.feature_layers == (2, 4, 5)
    cfg = dict(max_new_tokens=40, **SMALL)
    ref = generate(Decoder(target, None, DecodeConfig(mode="vanilla", **cfg)), [1, 2, 3]).tokens
    out = generate(Decoder(target, head, DecodeConfig(mode=mode, **cfg)), [1, 2, 3])
    assert out.tokens == ref and len(ref) == 40
    drafted = {n.token for s in out.steps for n in s.nodes[1:]}
    assert drafted and drafted <= set(DRAFT_IDS.tolist())  # drafts are target ids of the draft vocabulary


def test_a_draft_vocab_narrows_an_eagle3_heads_own_vocabulary(single_thread):
    """FR-Spec on top of d2t: the draft_vocab most frequent tokens of the head's own vocabulary."""
    target = tiny_target(vocab=VOCAB, seed=5, eos=None, layers=LAYERS)
    head = new_head(target, seed=2, kind="eagle3", draft_ids=DRAFT_IDS)
    head.token_counts[torch.tensor([3, 5, 8, 9, 11])] = torch.tensor([50, 40, 30, 20, 1])
    cfg = dict(max_new_tokens=30, **SMALL)
    ref = generate(Decoder(target, None, DecodeConfig(mode="vanilla", **cfg)), [1, 2, 3]).tokens
    out = generate(Decoder(target, head, DecodeConfig(mode="dynamic", draft_vocab=4, **cfg)), [1, 2, 3])
    assert out.tokens == ref
    assert {n.token for s in out.steps for n in s.nodes[1:]} <= {3, 5, 8, 9}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_real_model_greedy_with_a_random_eagle3_head_is_lossless(target, mode):
    """fp32, one short prompt, 32 tokens: losslessness does not depend on the head's quality."""
    head = new_head(target, seed=0, kind="eagle3")
    assert head.feature_layers == (2, 15, 27)
    ids = encode_prompt(target.tokenizer, "Name three colours.", target.max_context)
    ref = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=32)), ids).tokens
    out = generate(Decoder(target, head, DecodeConfig(mode=mode, max_new_tokens=32, **SMALL)), ids).tokens
    assert out == ref


# ---- item 3: training an EAGLE-3 head ------------------------------------------------------------
@pytest.mark.slow
def test_prepare_train_and_decode_with_an_eagle3_head(target, tmp_path):
    """Real model, fp32: 4 conversations, features of layers 2/15/27, 3 training steps with a 2-step
    training-time test over a 512-token draft vocabulary, then the saved head decodes losslessly."""
    feats = tmp_path / "features"
    stats = prepare_features(target, feats, n_conversations=4, max_len=64, heldout_fraction=0.3, shard_size=2,
                             head_type="eagle3")
    manifest = json.loads((feats / "manifest.json").read_text())
    assert (manifest["head_type"], manifest["feature_layers"]) == ("eagle3", [2, 15, 27])
    shard = load_file(str(sorted(feats.glob("train-*.safetensors"))[0]))
    first = slice(0, int(shard["offsets"][1]))
    assert shard["features"].dtype == torch.float16 and shard["features"].shape[1] == 3 * 576
    both = extract_features(target, shard["input_ids"][first].long(), (2, 15, 27, 30)).half()
    assert torch.equal(torch.cat([shard["features"][first], shard["target_features"][first]], -1), both)
    with pytest.raises(ValueError, match="head_type='eagle3'"):  # a resume of another type names the field
        prepare_features(target, feats, n_conversations=4, max_len=64, heldout_fraction=0.3, shard_size=2)
    # The same extraction serves an EAGLE-1 head: it reads the last-layer features, exactly what its own
    # prepare would store (the ablation's "same data").
    seqs = load_shards(feats, "train", last_layer_only=True)
    assert torch.equal(seqs[0].features, shard["target_features"][first]) and seqs[0].targets is None
    eagle1 = train_head(target, feats, tmp_path / "eagle1", steps=1, batch=2, warmup=1, progress=False,
                        eval_samples=2)
    assert math.isfinite(eagle1["last_train"]["loss"])
    assert load_head(tmp_path / "eagle1" / "head", target).kind == "eagle1"

    summary = train_head(target, feats, tmp_path / "train", steps=3, lr=1e-3, batch=2, warmup=1, progress=False,
                         eval_samples=2, ttt_steps=2, loss="token", head_type="eagle3", draft_vocab_size=512)
    assert math.isfinite(summary["last_train"]["loss"]) and 0 <= summary["heldout"]["acc_step2"] <= 1
    head = load_head(tmp_path / "train" / "head", target)
    assert isinstance(head, Eagle3Head) and head.lm_head.out_features == 512 and int(head.t2d.sum()) == 512
    chosen, threshold = head.target_ids(), int(head.token_counts.topk(512).values.min())
    assert int(head.token_counts[chosen].min()) >= threshold  # the 512 most frequent training tokens
    assert set((head.token_counts > threshold).nonzero().flatten().tolist()) <= set(chosen.tolist())
    ids = encode_prompt(target.tokenizer, "Name three colours.", target.max_context)
    ref = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=16)), ids).tokens
    assert generate(Decoder(target, head, DecodeConfig(mode="dynamic", max_new_tokens=16, **SMALL)), ids).tokens == ref


# ---- item 4: which head is loaded --------------------------------------------------------------------
def test_the_trace_header_says_which_head_drafted(tmp_path, tiny):
    head = new_head(tiny, seed=2, kind="eagle3", draft_ids=DRAFT_IDS)
    identity = head_identity(head)
    layout = {"name": "new", "convention": "input", "layer_ids": [2, 4, 5], "source": None}
    assert identity == {"head_type": "eagle3", "head_version": head_sha256(head), "head_layout": layout}
    header = TraceHeader("tiny", "random", {}, "p", 3, **identity)
    write_trace(tmp_path / "t.jsonl", [Trace(header, [])])
    back = read_trace(tmp_path / "t.jsonl")[0][0].header
    assert (back.head_type, back.head_version, back.head_layout) == ("eagle3", head_sha256(head), layout)
    assert head_identity(new_head(tiny, seed=2))["head_type"] == "eagle1" and head_identity(None)["head_type"] is None


def test_draft_vocab_ids_are_the_drafters_tokens_and_auto_budget_runs_on_eagle3(single_thread):
    """bench and the tools ask a head which target ids a draft_vocab keeps; for an EAGLE-3 head these
    must be the ones its Drafter scores. The auto budget times the EAGLE-3 head's own drafting (its
    three-layer features, its vocabulary) under its own cost key, and replays its calibration trees."""
    target = tiny_target(vocab=VOCAB, seed=5, eos=None, layers=LAYERS)
    head = new_head(target, seed=2, kind="eagle3", draft_ids=DRAFT_IDS)
    assert head.draft_vocab_ids(4) is None  # no counts stored: the whole own vocabulary
    head.token_counts[torch.tensor([3, 5, 8, 9, 11])] = torch.tensor([50, 40, 30, 20, 1])
    drafter = Drafter(head, target.model.lm_head.weight, 16, draft_vocab=4)
    assert head.draft_vocab_ids(4).tolist() == drafter.vocab_ids.tolist() == [3, 5, 8, 9]

    grid = dict(prompts=["a tiny prompt"], vocabs=(0, 4), repeats=1, max_new_tokens=12, ns=(1, 2, 4), top_ks=(1, 2))
    cfg, report = auto_config(target, head, DecodeConfig(max_new_tokens=5), **grid)
    assert (cfg.total_tokens, cfg.depth, cfg.top_k, cfg.draft_vocab) == tuple(report.chosen[k] for k in
                                                                             ("total_tokens", "depth", "top_k",
                                                                              "draft_vocab"))
    assert cfg.max_new_tokens == 5 and cfg.total_tokens in (1, 2, 4) and cfg.draft_vocab in (0, 4)
    assert report.calibration_rounds > 0 and f"eagle3-{len(DRAFT_IDS)}" in report.costs.key
    eagle1_key = auto_config(target, new_head(target, seed=2), DecodeConfig(), **grid)[1].costs.key
    assert eagle1_key.endswith("eagle1") and eagle1_key != report.costs.key  # drafting costs differ
    out = generate(Decoder(target, head, cfg.with_(max_new_tokens=12)), [1, 2, 3])
    assert out.tokens == generate(Decoder(target, None, cfg.with_(mode="vanilla", max_new_tokens=12)), [1, 2, 3]).tokens
