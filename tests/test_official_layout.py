"""Files and ids other tools use: the shipped head's config carries the keys the official EAGLE layout (and
transformers 4.x) read, and a head saved here round-trips through them."""
import json
import os

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, LlamaConfig

from eagle import cli
from eagle.models.headio import load_head, save_head, shipped_head_path
from eagle.models.conversion import CONVERT_FILE, CONVERT_FORMAT, TOKENIZER_CLASS, resolve_model_path

# The keys of an official EAGLE-1/2 head config.json (e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B).
OFFICIAL_KEYS = ("architectures", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
                 "intermediate_size", "max_position_embeddings", "model_type", "num_attention_heads",
                 "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
                 "tie_word_embeddings", "torch_dtype", "vocab_size")


def _official_view(config: dict) -> LlamaConfig:
    """The config as an older reader builds it: only the official keys, no rope_parameters."""
    return LlamaConfig(**{k: config[k] for k in OFFICIAL_KEYS})


def test_shipped_head_config_has_the_official_keys():
    config = json.loads((shipped_head_path("smollm2-135m-instruct") / "config.json").read_text())
    assert all(k in config for k in OFFICIAL_KEYS)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0  # not the 10000 fallback
    assert config["torch_dtype"] == "float16" and config["rope_scaling"] is None
    assert _official_view(config).rope_parameters["rope_theta"] == 100000.0


def test_saved_head_round_trips_through_the_official_keys(tmp_path, trained_head, target):
    save_head(trained_head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == trained_head.config.rope_parameters["rope_theta"]
    official = {k: config[k] for k in OFFICIAL_KEYS}
    (tmp_path / "config.json").write_text(json.dumps(official))  # as an official head directory would hold
    again = load_head(tmp_path, target)
    assert again.config.rope_parameters["rope_theta"] == trained_head.config.rope_parameters["rope_theta"]
    assert torch.equal(again.fc.weight, trained_head.fc.weight)  # fp16 weights, saved and read back exactly


def test_head_hub_id_offline_is_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # eagle reads it at each lookup: in-process is the same CLI
    code = cli.main(["generate", "--prompt", "hi", "--max-new-tokens", "2", "--head", "yuhuili/EAGLE-no-such-head-18"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--head yuhuili/EAGLE-no-such-head-18" in lines[0] and "HF_HUB_OFFLINE" in lines[0]


def test_converted_target_reads_as_transformers_4_and_official_eagle_expect(target):
    """The embedded GGUF's converted copy: an explicit embedding tensor beside the tied lm_head, rope_theta
    beside rope_parameters, the architecture, and a tokenizer class transformers 4.x knows."""
    path = resolve_model_path("smollm2-135m-instruct")
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        embed, lm_head = f.get_tensor("model.embed_tokens.weight"), f.get_tensor("lm_head.weight")
    assert torch.equal(embed, lm_head) and torch.equal(embed, target.model.model.embed_tokens.weight.float())
    config = json.loads(open(os.path.join(path, "config.json")).read())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads(open(os.path.join(path, CONVERT_FILE)).read())["format"] == CONVERT_FORMAT
    assert json.loads(open(os.path.join(path, "tokenizer_config.json")).read())["tokenizer_class"] == TOKENIZER_CLASS
    text = "Explain why the sky is blue, in two sentences."
    assert AutoTokenizer.from_pretrained(path)(text)["input_ids"] == target.tokenizer(text)["input_ids"]
