"""Every public draft-head layout, each written by the test in exactly that layout for a tiny random fp32
Llama: it loads, its layer ids read in its own convention, and greedy decoding with it equals vanilla
greedy token for token. Unknown or inconsistent layouts are one sentence naming the file and the field;
export-head writes a head so that loading it back decodes identically."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.draft import Drafter
from eagle.models.head import DraftHead, new_head
from eagle.models.headio import head_identity, load_head, save_head
from eagle.models.head3 import Eagle3Head
from eagle.models.layouts import HeadLayoutError, eagle3_feature_layers
from eagle.tools.headexport import export_head
from tests.test_eagle3 import D, DRAFT_IDS, EPS, H, HEADS, INTER, KV, LAYERS, THETA, VOCAB, official_config, \
    official_state
from tests.tiny import tiny_target

SMALL = dict(total_tokens=8, depth=3, top_k=3, max_new_tokens=24)
PROMPT = [1, 2, 3]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path / "cache"))  # never ~/.cache/eagle2-explorer


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(vocab=VOCAB, seed=5, eos=None, layers=LAYERS)


# ---- the layouts, written as their owners write them -----------------------------------------------
def _rand(g: torch.Generator):
    return lambda *shape: torch.randn(*shape, generator=g) * 0.3


def eagle1_files(target, bias: bool = True, qkv_bias: bool = False, embed: bool = False,
                 seed: int = 0) -> tuple[dict, dict]:
    """An official EAGLE-1/2 checkpoint: fc over [embed; feature], layers.0.* without input norm;
    config "bias": false when fc has no bias, "qkv_bias": true (EAGLE-Qwen2) with q/k/v biases."""
    r = _rand(torch.Generator().manual_seed(seed))
    state = {"fc.weight": r(H, 2 * H), "layers.0.self_attn.q_proj.weight": r(HEADS * D, H),
             "layers.0.self_attn.k_proj.weight": r(KV * D, H), "layers.0.self_attn.v_proj.weight": r(KV * D, H),
             "layers.0.self_attn.o_proj.weight": r(H, HEADS * D), "layers.0.mlp.gate_proj.weight": r(INTER, H),
             "layers.0.mlp.up_proj.weight": r(INTER, H), "layers.0.mlp.down_proj.weight": r(H, INTER),
             "layers.0.post_attention_layernorm.weight": 1 + r(H)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
              "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV,
              "num_hidden_layers": 1, "rms_norm_eps": EPS, "rope_theta": THETA, "vocab_size": VOCAB,
              "max_position_embeddings": 256, "tie_word_embeddings": False, "pad_token_id": 0,
              "torch_dtype": "float32"}
    if bias:
        state["fc.bias"] = r(H)
    else:
        config["bias"] = False
    if qkv_bias:
        config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", qkv_bias=True,
                      use_sliding_window=False, sliding_window=4096, max_window_layers=28)
        for name, rows in (("q", HEADS * D), ("k", KV * D), ("v", KV * D)):
            state[f"layers.0.self_attn.{name}_proj.bias"] = r(rows)
    if embed:  # the official files keep a frozen copy of the target's embedding
        state["embed_tokens.weight"] = target.model.model.embed_tokens.weight.detach().clone()
    return state, config


def yuhuili_config() -> dict:
    """The official EAGLE-3 config (SafeAILab's training config): a plain LlamaForCausalLM, no layer ids."""
    return {**official_config(), "architectures": ["LlamaForCausalLM"]}


def specforge_config(ids: list[int] | None = (1, 3, 4)) -> dict:
    """SpecForge's EAGLE-3 config: layer ids are outputs of layers ([1, L//2-1, L-4] by default)."""
    config = {**official_config(), "architectures": ["LlamaForCausalLMEagle3"]}
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}
    return config


def speculators_files(ids: list[int] | None = (2, 4, 5), **top) -> tuple[dict, dict]:
    """vLLM's speculators format: midlayer.* named layers.0.*, the layer under transformer_layer_config,
    top-level layer ids that are inputs of layers."""
    state = {(k.replace("midlayer.", "layers.0.")): v for k, v in official_state().items()}
    layer = {"model_type": "llama", "hidden_size": H, "intermediate_size": INTER, "num_attention_heads": HEADS,
             "num_key_value_heads": KV, "head_dim": D, "num_hidden_layers": 1, "rms_norm_eps": EPS,
             "rope_theta": THETA, "vocab_size": VOCAB, "max_position_embeddings": 256, "attention_bias": False,
             "mlp_bias": False, "tie_word_embeddings": False, "hidden_act": "silu"}
    config = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
              "speculators_version": "0.2.0", "draft_vocab_size": DRAFT_IDS.numel(), "norm_before_residual": False,
              "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": None if ids is None else list(ids),
              "transformer_layer_config": layer,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}},
              **top}
    return state, config


def write_dir(path, state: dict, config: dict, weights: str = "model.safetensors"):
    path.mkdir(parents=True, exist_ok=True)
    if weights == "model.safetensors":
        save_file(state, str(path / weights))
    else:
        torch.save(state, path / weights)
    (path / "config.json").write_text(json.dumps(config))
    return path


def greedy(target, head) -> tuple[list[int], list]:
    """Greedy EAGLE tokens and every round's drafted (token, confidence) pairs."""
    out = generate(Decoder(target, head, DecodeConfig(mode="dynamic", **SMALL)), PROMPT)
    return out.tokens, [[(n.token, n.confidence) for n in s.nodes] for s in out.steps]


def vanilla(target) -> list[int]:
    return generate(Decoder(target, None, DecodeConfig(mode="vanilla", **SMALL)), PROMPT).tokens


def draft_probs(head, target) -> torch.Tensor:
    """Draft probabilities on target ids after consuming 5 pairs through the drafter's cache."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (5,), generator=g)
    _, feats = target.forward(tokens[None], torch.arange(5)[None], target.new_cache(8), 0,
                              feature_layers=head.feature_layers)
    drafter = Drafter(head, target.model.lm_head.weight, 16)
    return drafter.full_probs(drafter.log_probs(drafter.consume(tokens, feats[0])))


# ---- item 1: every layout loads and decodes losslessly --------------------------------------------
EAGLE1_VARIANTS = {
    "bin, fc.bias": dict(weights="pytorch_model.bin"),
    "safetensors, fc.bias": dict(),
    "bin, bias false": dict(weights="pytorch_model.bin", bias=False),
    "safetensors, bias false": dict(bias=False),
    "bin, fc.bias, embed_tokens": dict(weights="pytorch_model.bin", embed=True),
    "safetensors, bias false, embed_tokens": dict(bias=False, embed=True),
    "qwen2 qkv_bias": dict(qkv_bias=True),
}


@pytest.mark.parametrize("variant", sorted(EAGLE1_VARIANTS))
def test_official_eagle1_variants_load_and_decode_losslessly(tmp_path, tiny, variant, single_thread):
    opts = dict(EAGLE1_VARIANTS[variant])
    weights = opts.pop("weights", "model.safetensors")
    state, config = eagle1_files(tiny, **opts)
    head = load_head(write_dir(tmp_path / "h", state, config, weights), tiny)
    assert type(head) is DraftHead and head.layout.name == "eagle" and head.layout.convention == "last"
    assert head.feature_layers is None  # the post-norm last hidden state
    assert (head.fc.bias is not None) == ("fc.bias" in state)
    if "embed_tokens.weight" in state:
        assert head.embed_tokens is not tiny.model.model.embed_tokens
        assert torch.equal(head.embed_tokens.weight, state["embed_tokens.weight"])
    else:
        assert head.embed_tokens is tiny.model.model.embed_tokens
    tokens, _ = greedy(tiny, head)
    assert tokens == vanilla(tiny) and len(tokens) == SMALL["max_new_tokens"]


def test_qwen2_qkv_biases_are_read_and_used(tmp_path, tiny):
    state, config = eagle1_files(tiny, qkv_bias=True)
    head = load_head(write_dir(tmp_path / "h", state, config), tiny)
    attn = head.layers[0].self_attn
    for name in ("q", "k", "v"):
        assert torch.equal(getattr(attn, f"{name}_proj").bias, state[f"layers.0.self_attn.{name}_proj.bias"])
    assert attn.o_proj.bias is None  # EAGLE-Qwen2: o_proj has none
    with_bias = draft_probs(head, tiny)
    for name in ("q", "k", "v"):
        getattr(attn, f"{name}_proj").bias.data.zero_()
    assert not torch.allclose(with_bias, draft_probs(head, tiny), atol=1e-4)  # the biases change the drafts


EAGLE3_LAYOUTS = {
    "official": lambda: (official_state(), yuhuili_config()),
    "official with layer ids": lambda: (official_state(),
                                        {**specforge_config(), "architectures": ["LlamaForCausalLM"]}),
    "specforge": lambda: (official_state(), specforge_config()),
    "specforge without ids": lambda: (official_state(), specforge_config(None)),
    "speculators": lambda: speculators_files(),
    "speculators without ids": lambda: speculators_files(None),
}
EXPECTED = {"official": ("eagle3", "default"), "official with layer ids": ("eagle3", "output"),
            "specforge": ("specforge", "output"), "specforge without ids": ("specforge", "default"),
            "speculators": ("speculators", "input"), "speculators without ids": ("speculators", "default")}


@pytest.mark.parametrize("layout", sorted(EAGLE3_LAYOUTS))
def test_every_eagle3_layout_reads_the_same_head_and_decodes_losslessly(tmp_path, tiny, layout, single_thread):
    """The same weights in each EAGLE-3 layout: one layout name and convention each, the same feature
    layers (inputs of 2, 4, 5 = the paper's for 8 layers), the same drafts, and lossless greedy decoding."""
    state, config = EAGLE3_LAYOUTS[layout]()
    head = load_head(write_dir(tmp_path / "h", state, config), tiny)
    assert isinstance(head, Eagle3Head) and (head.layout.name, head.layout.convention) == EXPECTED[layout]
    assert head.feature_layers == eagle3_feature_layers(LAYERS) == (2, 4, 5)
    assert head_identity(head)["head_layout"] == head.layout.describe()
    reference = load_head(write_dir(tmp_path / "ref", official_state(), official_config()), tiny)
    assert torch.equal(draft_probs(head, tiny), draft_probs(reference, tiny))
    tokens, _ = greedy(tiny, head)
    assert tokens == vanilla(tiny)


def test_layer_ids_read_in_each_layouts_own_convention(tmp_path, tiny):
    """SpecForge's [1, 3, 4] are outputs of layers: inputs 2, 4, 5. Read as inputs (one off) they would
    give the target's features at 1, 3, 4, which differ; speculators' top-level ids are inputs as given."""
    head = load_head(write_dir(tmp_path / "sf", official_state(), specforge_config([1, 3, 4])), tiny)
    assert head.layout.layer_ids == (1, 3, 4) and head.feature_layers == (2, 4, 5)
    ids = torch.tensor([[1, 4, 2, 7]])
    feats = lambda layers: tiny.forward(ids, torch.arange(4)[None], tiny.new_cache(4), 0,  # noqa: E731
                                        feature_layers=layers)[1]
    assert not torch.allclose(feats((2, 4, 5)), feats((1, 3, 4)), atol=1e-3)
    state, config = speculators_files([1, 3, 4])
    vllm = load_head(write_dir(tmp_path / "sp", state, config), tiny)
    assert vllm.layout.convention == "input" and vllm.feature_layers == (1, 3, 4)
    assert not torch.allclose(draft_probs(vllm, tiny), draft_probs(head, tiny), atol=1e-4)


def test_speculators_norm_before_residual_is_read_as_vllm_reads_it(tmp_path, tiny, single_thread):
    """vLLM takes a missing norm_before_residual as true: the residual starts from the normed feature."""
    state, config = speculators_files()
    del config["norm_before_residual"]
    head = load_head(write_dir(tmp_path / "h", state, config), tiny)
    assert head.midlayer.norm_before_residual
    plain = load_head(write_dir(tmp_path / "p", *speculators_files()), tiny)
    assert not plain.midlayer.norm_before_residual
    assert not torch.allclose(draft_probs(head, tiny), draft_probs(plain, tiny), atol=1e-4)
    assert greedy(tiny, head)[0] == vanilla(tiny)
    with pytest.raises(ValueError, match="norm_before_residual"):  # the eagle3 layout cannot say it
        export_head(str(tmp_path / "h"), "eagle3", tmp_path / "out")


# ---- item 2: unknown or inconsistent layouts are one sentence --------------------------------------
def _eagle3(state_edit=None, config_edit=None):
    def make(tiny):
        state, config = official_state(), specforge_config()
        (state_edit or (lambda s: None))(state)
        (config_edit or (lambda c: None))(config)
        return state, config
    return make


def _speculators(**top):
    return lambda tiny: speculators_files(**top)


def _nemo(tiny):
    state, config = official_state(), official_config()
    return {f"model.{k}": v for k, v in state.items()}, config


def _eagle3_arch_on_eagle1(tiny):
    state, config = eagle1_files(tiny)
    return state, {**config, "architectures": ["LlamaForCausalLMEagle3"]}


def _hass(tiny):
    state, config = eagle1_files(tiny)
    return {**state, "embed_layernorm.weight": torch.ones(H)}, config


BAD = {  # case -> (files, file named, field named)
    "unknown layout (NeMo names)": (_nemo, "model.safetensors", "model.fc.weight"),
    "EAGLE-3 config on EAGLE-1 tensors": (_eagle3_arch_on_eagle1, "config.json", "architectures"),
    "extra tensor (HASS layernorm)": (_hass, "model.safetensors", "embed_layernorm.weight"),
    "d2t too short": (_eagle3(lambda s: s.update(d2t=s["d2t"][:-1])), "model.safetensors", "d2t"),
    "d2t out of range": (_eagle3(lambda s: s["d2t"].__setitem__(-1, 5)), "model.safetensors", "d2t"),
    "d2t below zero": (_eagle3(lambda s: s["d2t"].__setitem__(0, -1)), "model.safetensors", "d2t"),
    "t2d disagrees with d2t": (_eagle3(lambda s: s["t2d"].__setitem__(1, True)), "model.safetensors", "t2d"),
    "no d2t for a smaller draft vocabulary": (_eagle3(lambda s: (s.pop("d2t"), s.pop("t2d"))),
                                              "model.safetensors", "d2t"),
    "missing tensor": (_eagle3(lambda s: s.pop("norm.weight")), "model.safetensors", "norm.weight"),
    "layer id past the last layer": (_eagle3(config_edit=lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[1, 3, 7])), "config.json", "eagle_aux_hidden_state_layer_ids"),
    "layer ids not numbers": (_eagle3(config_edit=lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=["2"])), "config.json", "eagle_aux_hidden_state_layer_ids"),
    "speculators layer id past the last layer": (_speculators(ids=[2, 4, 8]), "config.json",
                                                 "eagle_aux_hidden_state_layer_ids"),
    "hidden size differs from the target": (_eagle3(config_edit=lambda c: c.update(hidden_size=16)),
                                            "config.json", "hidden_size"),
    "unknown speculators type": (_speculators(speculators_model_type="eagle"), "config.json",
                                 "speculators_model_type"),
    "speculators variant not implemented": (_speculators(norm_before_fc=True), "config.json", "norm_before_fc"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_unknown_or_inconsistent_layouts_are_one_sentence(tmp_path, tiny, case):
    make, file, field = BAD[case]
    path = write_dir(tmp_path / "h", *make(tiny))
    with pytest.raises(ValueError) as err:
        load_head(path, tiny)
    message = str(err.value)
    assert str(path / file) in message and field in message and "\n" not in message, message


def test_the_cli_refuses_a_bad_layout_in_one_sentence_with_exit_2(tmp_path, tiny):
    path = write_dir(tmp_path / "h", *_eagle3(lambda s: s["d2t"].__setitem__(-1, 5))(tiny))
    out = subprocess.run([sys.executable, "-m", "eagle", "export-head", "--head", str(path), "--format",
                          "speculators", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "model.safetensors: d2t maps" in lines[0], out.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ---- item 3: export-head --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_here(tmp_path_factory, tiny):
    """Heads as this repo saves them (fp32, with token counts): EAGLE-3 over a draft vocabulary, EAGLE-1/2."""
    root = tmp_path_factory.mktemp("heads")
    e3 = new_head(tiny, seed=2, kind="eagle3", draft_ids=DRAFT_IDS)
    e3.token_counts[DRAFT_IDS] = torch.arange(1, 9) * 10
    save_head(e3, root / "eagle3", dtype=torch.float32)
    e1 = new_head(tiny, seed=3)
    e1.token_counts += 1
    save_head(e1, root / "eagle1", dtype=torch.float32)
    return root


@pytest.mark.parametrize("kind, fmt", [("eagle3", "eagle3"), ("eagle3", "speculators"), ("eagle1", "eagle")])
def test_export_then_load_back_decodes_identically(tmp_path, tiny, trained_here, kind, fmt, single_thread):
    src = trained_here / kind
    export_head(str(src), fmt, tmp_path / "out")
    before, after = load_head(src, tiny), load_head(tmp_path / "out", tiny)
    assert after.feature_layers == before.feature_layers and torch.equal(after.token_counts, before.token_counts)
    assert greedy(tiny, after) == greedy(tiny, before)  # tokens and every drafted node's confidence
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    names = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    if fmt == "eagle3":  # what SGLang loads: SpecForge's config, ids as outputs of layers
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and "midlayer.fc" not in names
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert after.layout.name == "specforge" and {"midlayer.hidden_norm.weight", "d2t", "t2d"} <= names
    elif fmt == "speculators":  # what vLLM loads: ids as inputs of layers, the layer config nested
        assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        assert config["transformer_layer_config"]["vocab_size"] == VOCAB and config["draft_vocab_size"] == 8
        assert config["norm_before_residual"] is False  # vLLM would read a missing one as true
        assert after.layout.name == "speculators" and "layers.0.hidden_norm.weight" in names
        assert not any(n.startswith("midlayer.") for n in names)
    else:  # what SGLang needs for an EAGLE-1/2 draft; the official loader ignores architectures
        assert config["architectures"] == ["LlamaForCausalLMEagle"] and "fc.bias" in names
        assert after.layout.name == "eagle"


def test_speculators_export_reads_back_and_converts_to_eagle3(tmp_path, tiny, single_thread):
    path = write_dir(tmp_path / "sp", *speculators_files())
    export_head(str(path), "eagle3", tmp_path / "e3")
    again = load_head(tmp_path / "e3", tiny)
    assert again.layout.layer_ids == (1, 3, 4) and again.feature_layers == (2, 4, 5)
    assert greedy(tiny, again) == greedy(tiny, load_head(path, tiny))


def test_export_refuses_a_wrong_format_and_a_non_empty_out(tmp_path, trained_here):
    with pytest.raises(ValueError, match="--format speculators holds EAGLE-3 heads"):
        export_head(str(trained_here / "eagle1"), "speculators", tmp_path / "a")
    with pytest.raises(ValueError, match="--format eagle holds EAGLE-1/2 heads"):
        export_head(str(trained_here / "eagle3"), "eagle", tmp_path / "a")
    out = tmp_path / "out"
    out.mkdir()
    (out / "pytorch_model.bin").write_bytes(b"an older head")
    with pytest.raises(ValueError, match="exists and is not empty: pass --overwrite"):
        export_head(str(trained_here / "eagle1"), "eagle", out)
    export_head(str(trained_here / "eagle1"), "eagle", out, overwrite=True)
    assert not (out / "pytorch_model.bin").exists()  # the official loader would read it before ours
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_export_head_command(tmp_path, trained_here):
    cmd = [sys.executable, "-m", "eagle", "export-head", "--head", str(trained_here / "eagle3"), "--format",
           "speculators", "--out", str(tmp_path / "out"), "--verifier", "org/target"]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "SpecForge EAGLE-3" in ok.stdout, ok.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert again.returncode == 2 and len(lines) == 1 and "--overwrite" in lines[0]
