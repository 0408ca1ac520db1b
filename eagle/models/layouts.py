"""The public draft-head checkpoint layouts: which one a directory holds, its config and tensors in
this repo's names, its layer ids in Target.forward's convention, and each layout written back.

Layouts read (name: what tells it apart; where its layer ids are and what they mean):
  eagle        official EAGLE-1/2: fc over 2H, layers.0.* (no midlayer.*); drafts from the target's
               post-norm last hidden state, no layer ids. Variants: fc.bias or config "bias": false,
               embed_tokens.weight or not, "qkv_bias": true with q/k/v biases (EAGLE-Qwen2).
  eagle3       official EAGLE-3: midlayer.*, fc 3H -> H, norm, lm_head K x H, d2t, t2d; architectures
               not LlamaForCausalLMEagle3. Optional eagle_config.eagle_aux_hidden_state_layer_ids.
  specforge    the same tensors, architectures ["LlamaForCausalLMEagle3"] (SpecForge, what SGLang loads).
  speculators  vLLM's speculators format: speculators_model_type "eagle3", layers.0.* for midlayer.*,
               transformer_layer_config, top-level eagle_aux_hidden_state_layer_ids.
The two layer-id keys mean different things: under eagle_config (SpecForge, SGLang) id i is the OUTPUT
of layer i, i.e. the input of layer i + 1; at the top level of a speculators config (vLLM) id i is the
INPUT of layer i, as Target.forward's feature_layers are (HF hidden_states[i]). Without ids an EAGLE-3
head drafts from the inputs of layers 2, L//2 and L-3 (the paper's; SpecForge writes them [1, L//2-1, L-4]).

Everything here works on plain dicts and tensors; eagle.models.head builds the modules (and checks every
tensor name and shape against them)."""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from ..records.files import atomic_write, atomic_write_json, read_json_object
from ..records.schema import FileFormatError
from .conversion import with_legacy_keys

EAGLE, EAGLE3, SPECFORGE, SPECULATORS = "eagle", "eagle3", "specforge", "speculators"
FORMATS = (EAGLE3, SPECULATORS, EAGLE)  # what export-head writes
KIND = {EAGLE: "eagle1", EAGLE3: "eagle3", SPECFORGE: "eagle3", SPECULATORS: "eagle3"}  # the module that runs it
LABELS = {EAGLE: "official EAGLE-1/2", EAGLE3: "official EAGLE-3", SPECFORGE: "SpecForge EAGLE-3",
          SPECULATORS: "vLLM speculators EAGLE-3", "new": "created here"}

INPUT, OUTPUT, LAST, DEFAULT = "input", "output", "last", "default"
CONVENTIONS = {INPUT: "layer id i is the input of layer i (vLLM; this repo's feature_layers)",
               OUTPUT: "layer id i is the output of layer i, the input of layer i + 1 (SpecForge, SGLang)",
               LAST: "no layer ids: the target's post-norm last hidden state (EAGLE-1/2)",
               DEFAULT: "no layer ids recorded: the inputs of layers 2, L//2 and L-3 (the EAGLE-3 paper's)"}

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"  # config.json "architectures" of a SpecForge / SGLang EAGLE-3 head
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"  # its conventions differ by layout (CONVENTIONS)
EAGLE1_SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle"  # what SGLang needs to load an EAGLE-1/2 draft
SPECULATORS_ARCHITECTURE = "Eagle3DraftModel"
EAGLE_CONFIG_IDS = f"eagle_config.{LAYER_IDS_KEY}"  # SpecForge / SGLang: outputs of layers
# speculators variants that change the computation and that this decoder does not implement
SPECULATORS_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")
# config keys that describe the layout rather than the Llama layer: dropped when read, written afresh
LAYOUT_KEYS = {"architectures", "eagle_config", LAYER_IDS_KEY, "speculators_model_type", "speculators_version",
               "speculators_config", "transformer_layer_config", "auto_map"}
SPECULATIVE_TOKENS = 3  # speculators_config's default proposal length (vLLM's num_speculative_tokens)


def eagle3_feature_layers(n_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 fuses, low to high: 2, L//2, L-3 (as HF
    output_hidden_states indices, index i being the input of layer i)."""
    layers = (2, n_layers // 2, n_layers - 3)
    if min(layers) < 0 or max(layers) >= n_layers:
        raise ValueError(f"An EAGLE-3 head needs a target of at least 3 layers (its features are the inputs of "
                         f"layers 2, L//2 and L-3); this one has {n_layers}.")
    return layers


class HeadLayoutError(FileFormatError):
    """A head directory in no known layout, or inconsistent with its own layout (one sentence naming the
    file and the field; the command boundary turns a ValueError into exit code 2)."""


@dataclass(frozen=True)
class HeadLayout:
    """Which layout a head came in, and how its layer ids read (for trace headers and the sidebar)."""
    name: str  # eagle | eagle3 | specforge | speculators | new (created in this process)
    convention: str  # input | output | last | default: what `layer_ids` mean (CONVENTIONS)
    layer_ids: tuple[int, ...] | None = None  # as the checkpoint records them
    source: str | None = None  # the config field they were read from

    @property
    def kind(self) -> str:
        return "eagle1" if self.convention == LAST else "eagle3"

    def input_ids(self) -> tuple[int, ...] | None:
        """The ids as inputs of layers (Target.forward's feature_layers); None without ids."""
        if self.layer_ids is None:
            return None
        return tuple(i + 1 for i in self.layer_ids) if self.convention == OUTPUT else self.layer_ids

    def feature_layers(self, n_layers: int, file: Path | str = "") -> tuple[int, ...] | None:
        """The target layers this head drafts from, in Target.forward's convention, checked against a
        target of n_layers layers (an id past the last layer is refused, never clamped)."""
        if self.convention == LAST:
            return None
        layers = self.input_ids() or eagle3_feature_layers(n_layers)
        if max(layers) >= n_layers:
            raise HeadLayoutError(f"Head config {file}: {self.source} {list(self.layer_ids or ())} "
                                  f"({self.convention} convention) asks for the input of layer {max(layers)}, "
                                  f"but the target has {n_layers} layers (0..{n_layers - 1}).")
        return layers

    def describe(self) -> dict:
        return {"name": self.name, "convention": self.convention,
                "layer_ids": None if self.layer_ids is None else list(self.layer_ids), "source": self.source}


@dataclass
class Checkpoint:
    """A head directory read into this repo's names: Llama config fields (plus draft_vocab_size,
    target_hidden_size, bias, qkv_bias, norm_before_residual where they apply) and tensors named as
    DraftHead's / Eagle3Head's state dict."""
    layout: HeadLayout
    fields: dict
    state: dict[str, torch.Tensor]
    config_file: Path
    weights_file: Path
    extra: dict = field(default_factory=dict)  # speculators' verifier, kept for a round trip


# ---- reading ------------------------------------------------------------------------------------
def read_tensors(file: Path, fix: str = "copy it again") -> dict[str, torch.Tensor]:
    """A safetensors file, or one sentence naming it when it is torn or not safetensors at all."""
    try:
        return load_file(str(file))
    except SafetensorError as err:
        raise FileFormatError(f"{file} is corrupt or incomplete ({err}): {fix}.") from None


def _read_pickle(file: Path) -> dict[str, torch.Tensor]:
    # torch's own message runs to several lines of advice about weights_only; the file's name and
    # what to do are the useful part
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError):
        raise FileFormatError(f"{file} is corrupt or incomplete (not a readable PyTorch state dict): copy it again.") \
            from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise FileFormatError(f"{file} is not a state dict of tensors: copy it again.")
    return state


def read_weights(path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The weights file of a head directory (model.safetensors first, else pytorch_model.bin) and its tensors."""
    if (path / "model.safetensors").is_file():
        return path / "model.safetensors", read_tensors(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return path / "pytorch_model.bin", _read_pickle(path / "pytorch_model.bin")
    raise FileNotFoundError(f"Head {path} has config.json but no model.safetensors or pytorch_model.bin.")


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Detect the layout of a head directory and read it into this repo's names, refusing an unknown
    or self-contradictory one with one sentence (HeadLayoutError)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"No draft head at {path}: expected a directory with config.json and weights.")
    config = read_json_object(config_file, "Head config")
    weights_file, state = read_weights(path)
    name = detect_layout(config, state, config_file, weights_file)
    if name == SPECULATORS:
        fields, state, extra = _from_speculators(config, state, config_file)
    else:
        fields, extra = {k: v for k, v in config.items() if k not in LAYOUT_KEYS}, {}
    layout = HeadLayout(name, LAST) if name == EAGLE else _eagle3_layout(name, config, config_file)
    if layout.kind == "eagle3":
        state = _check_draft_vocab(fields, state, weights_file, config_file)
    return Checkpoint(layout, fields, state, config_file, weights_file, extra)


def detect_layout(config: dict, state: dict[str, torch.Tensor], config_file: Path, weights_file: Path) -> str:
    """The layout's name, from the config's layout keys and the tensor names; anything that fits none,
    or fits two, is refused."""
    kind = config.get("speculators_model_type")
    has = {p: any(k.startswith(p) for k in state) for p in ("midlayer.", "layers.0.")}
    if kind is not None:
        if kind != "eagle3":
            raise HeadLayoutError(f"Head config {config_file}: speculators_model_type {kind!r} is not a layout "
                                  "this decoder reads (only 'eagle3').")
        if not has["layers.0."] or has["midlayer."]:
            raise HeadLayoutError(f"{weights_file} does not hold the speculators layout its config.json names "
                                  "(speculators_model_type 'eagle3'): it needs layers.0.* tensors, no midlayer.*.")
        return SPECULATORS
    if has["midlayer."] and has["layers.0."]:
        raise HeadLayoutError(f"{weights_file} holds both midlayer.* (EAGLE-3) and layers.0.* (EAGLE-1/2) tensors.")
    arch = config.get("architectures") or []
    if not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise HeadLayoutError(f"Head config {config_file}: architectures is {arch!r:.40}, not a list of names.")
    if has["midlayer."]:
        return SPECFORGE if EAGLE3_ARCHITECTURE in arch else EAGLE3
    if has["layers.0."] and "fc.weight" in state:
        if EAGLE3_ARCHITECTURE in arch or "draft_vocab_size" in config:
            field_ = "architectures" if EAGLE3_ARCHITECTURE in arch else "draft_vocab_size"
            raise HeadLayoutError(f"Head config {config_file}: {field_} says EAGLE-3, but {weights_file} holds "
                                  "EAGLE-1/2 tensors (layers.0.*, no midlayer.*).")
        return EAGLE
    keys = ", ".join(sorted(state)[:4])
    raise HeadLayoutError(f"{weights_file} is in no draft-head layout this decoder reads (fc.weight with "
                          f"layers.0.* or midlayer.*, or a speculators config); its tensors start {keys}.")


def _eagle3_layout(name: str, config: dict, config_file: Path) -> HeadLayout:
    """The layer ids where this layout keeps them, in its convention; checked to be a list of
    non-negative integers (their upper bound needs the target: HeadLayout.feature_layers)."""
    if name == SPECULATORS:
        ids, source, convention = config.get(LAYER_IDS_KEY), LAYER_IDS_KEY, INPUT
    else:
        eagle_config = config.get("eagle_config") or {}
        if not isinstance(eagle_config, dict):
            raise HeadLayoutError(f"Head config {config_file}: eagle_config is {eagle_config!r:.40}, not an object.")
        ids, source, convention = eagle_config.get(LAYER_IDS_KEY), EAGLE_CONFIG_IDS, OUTPUT
    if ids is None:
        return HeadLayout(name, DEFAULT, None, source)
    if not (isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)):
        raise HeadLayoutError(f"Head config {config_file}: {source} {ids!r:.60} is not a list of layer numbers.")
    return HeadLayout(name, convention, tuple(ids), source)


def _from_speculators(config: dict, state: dict[str, torch.Tensor],
                      config_file: Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """A speculators config and tensors in this repo's names: the layer config plus the EAGLE-3 fields,
    layers.0.* as midlayer.*; the verifier's own norm and lm_head (unused by a draft) are left out."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise HeadLayoutError(f"Head config {config_file}: transformer_layer_config is missing or not an object.")
    if layer.get("model_type", "llama") != "llama":
        raise HeadLayoutError(f"Head config {config_file}: transformer_layer_config.model_type "
                              f"{layer['model_type']!r} is not a Llama layer (the only one this decoder runs).")
    for flag in SPECULATORS_UNSUPPORTED:
        if config.get(flag):
            raise HeadLayoutError(f"Head config {config_file}: {flag} true is a speculators variant this decoder "
                                  "does not implement.")
    fields = {k: v for k, v in layer.items() if k not in LAYOUT_KEYS}
    # vLLM reads a missing norm_before_residual as true (the residual is the normed feature)
    fields.update(draft_vocab_size=config.get("draft_vocab_size"),
                  norm_before_residual=bool(config.get("norm_before_residual", True)))
    if config.get("target_hidden_size") is not None:
        fields["target_hidden_size"] = config["target_hidden_size"]
    state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
             for k, v in state.items() if not k.startswith("verifier_")}
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    return fields, state, {"verifier": verifier.get("name_or_path")}


def _check_draft_vocab(fields: dict, state: dict[str, torch.Tensor], weights_file: Path,
                       config_file: Path) -> dict[str, torch.Tensor]:
    """d2t and t2d against the config's vocabularies: K entries mapping draft ids into 0..V-1, t2d
    marking exactly those. Without them (allowed when K == V) the identity map is filled in."""
    vocab = fields.get("vocab_size")
    k = fields.get("draft_vocab_size") or vocab
    if not (type(vocab) is int and type(k) is int and 0 < k <= vocab):
        raise HeadLayoutError(f"Head config {config_file}: draft_vocab_size {k!r} and vocab_size {vocab!r} must be "
                              "positive integers with draft_vocab_size <= vocab_size.")
    if "d2t" not in state:
        if k != vocab:
            raise HeadLayoutError(f"{weights_file} lacks d2t: a draft vocabulary of {k} of the {vocab} target tokens "
                                  "needs it to map draft ids to target ids.")
        return {**state, "d2t": torch.zeros(k, dtype=torch.long), "t2d": torch.ones(vocab, dtype=torch.bool)}
    d2t = state["d2t"]
    if d2t.shape != (k,) or d2t.is_floating_point():
        raise HeadLayoutError(f"{weights_file}: d2t is {d2t.dtype} {tuple(d2t.shape)}, but config.json's "
                              f"draft_vocab_size is {k} (one integer per draft token).")
    ids = torch.arange(k) + d2t.long()
    bad = ((ids < 0) | (ids >= vocab)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise HeadLayoutError(f"{weights_file}: d2t maps draft token {i} to target id {int(ids[i])}, outside the "
                              f"target vocabulary of {vocab} ({bad.numel()} such).")
    t2d = state.get("t2d")
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    elif t2d.shape != (vocab,) or int(t2d.bool().sum()) != ids.unique().numel() or not bool(t2d.bool()[ids].all()):
        raise HeadLayoutError(f"{weights_file}: t2d ({tuple(t2d.shape)}, {int(t2d.bool().sum())} set) does not mark "
                              f"exactly the {k} target ids d2t maps to.")
    return {**state, "d2t": d2t.long(), "t2d": t2d.bool()}


# ---- writing ------------------------------------------------------------------------------------
EAGLE3_FIELDS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "bias", "qkv_bias")


def write_checkpoint(out: str | Path, fmt: str, config: dict, state: dict[str, torch.Tensor],
                     feature_layers: tuple[int, ...] | None, verifier: str | None = None) -> None:
    """Write a head in layout `fmt` (eagle, eagle3 or speculators): config is its LlamaConfig's fields,
    state its tensors in this repo's names (dtypes kept), feature_layers in Target.forward's convention
    (None: EAGLE-1/2, or an EAGLE-3 head on the paper's default layers, which then records none).
    Weights first, config.json last, each replaced atomically (eagle.records.files)."""
    out = Path(out)
    kind = "eagle3" if any(k.startswith("midlayer.") for k in state) else "eagle1"
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: choose from {', '.join(FORMATS)}")
    if KIND[fmt] != kind:
        raise ValueError(f"--format {fmt} holds {LABELS[fmt].split()[-1]} heads, but this head is "
                         f"{'EAGLE-3' if kind == 'eagle3' else 'EAGLE-1/2'}: use --format "
                         f"{'eagle3 or speculators' if kind == 'eagle3' else 'eagle'}.")
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    base = with_legacy_keys({k: v for k, v in config.items() if k not in LAYOUT_KEYS}, dtype)
    if fmt == EAGLE:
        config, tensors = {**base, "architectures": [EAGLE1_SGLANG_ARCHITECTURE]}, state
    elif fmt == EAGLE3:
        config, tensors = _eagle3_config(base, state, feature_layers), state
    else:
        config = _speculators_config(base, state, feature_layers, verifier)
        tensors = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
                   for k, v in state.items()}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    atomic_write(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic_write_json(out / "config.json", config)


def _eagle3_config(base: dict, state: dict[str, torch.Tensor], feature_layers: tuple[int, ...] | None) -> dict:
    """The official EAGLE-3 config as SpecForge writes it and SGLang loads it; layer ids, when recorded,
    as outputs of layers (SGLang adds one to each)."""
    if base.get("norm_before_residual"):
        raise ValueError("this head norms its residual stream (speculators' norm_before_residual), which the "
                         "eagle3 layout cannot say: use --format speculators")
    config = {**base, "architectures": [EAGLE3_ARCHITECTURE], "draft_vocab_size": state["lm_head.weight"].shape[0]}
    config.pop("norm_before_residual", None)
    if feature_layers is not None:
        if min(feature_layers) < 1:
            raise ValueError(f"feature layers {list(feature_layers)} include the embeddings (layer 0's input), "
                             "which has no layer-output id in the eagle3 layout: use --format speculators")
        config["eagle_config"] = {LAYER_IDS_KEY: [i - 1 for i in feature_layers], "use_aux_hidden_state": True}
    return config


def _speculators_config(base: dict, state: dict[str, torch.Tensor], feature_layers: tuple[int, ...] | None,
                        verifier: str | None) -> dict:
    """vLLM's speculators config: the Llama layer under transformer_layer_config (vocab_size the
    target's), the EAGLE-3 fields at the top, layer ids as inputs of layers (null: vLLM's default)."""
    layer = {k: v for k, v in base.items() if k not in EAGLE3_FIELDS and k != "torch_dtype"}
    layer.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    config = {"architectures": [SPECULATORS_ARCHITECTURE], "speculators_model_type": "eagle3",
              "draft_vocab_size": state["lm_head.weight"].shape[0],
              # written out: vLLM reads a missing one as true, which is not this head
              "norm_before_residual": bool(base.get("norm_before_residual", False)),
              "norm_before_fc": False, "fc_norm": False, "norm_output": False,
              "target_hidden_size": base.get("target_hidden_size"),
              LAYER_IDS_KEY: None if feature_layers is None else list(feature_layers),
              "transformer_layer_config": layer, "torch_dtype": base["torch_dtype"],
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy",
                                                           "speculative_tokens": SPECULATIVE_TOKENS,
                                                           "accept_tolerance": 0.0, "verifier_accept_k": 1}],
                                     # this decoder's targets are Llama-family models
                                     "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}
    return config
