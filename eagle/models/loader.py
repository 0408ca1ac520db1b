"""load_target: the embedded default, a Hugging Face id or a local directory, checked from its config
before the weights load, on its device and at its precision."""
from __future__ import annotations

import torch

from .conversion import resolve_model_path
from .location import DEFAULT_MODEL, ModelLoadError, locate_model
from .precision import (CPU_DTYPES, DTYPES, DtypeSpec, choose_cpu_dtype, dtype_name, parse_device, parse_dtype,
                        timed_under_load)
from .kernels import at_their_kernels, choose_linear_kernel, fast_kernel, missing_kernel_note, use_kernel
from .target import Target


def load_target(name_or_path: str = DEFAULT_MODEL, device: str | torch.device | None = None,
                dtype: DtypeSpec = None, plain: bool = False, fastest_kernel: bool = False,
                remeasure: bool = False) -> Target:
    """Load the embedded default (`smollm2-135m-instruct`), a Hugging Face id or a local directory.
    dtype: see parse_dtype; with "auto" on a CPU the choice and its timings are in `target.dtype_report`,
    made for plain decoding (`plain`: no draft head, one token per forward) or for verifying trees; the
    choice also picks its precision's faster kernel (eagle.models.kernels; `target.kernel_report`). An
    explicit dtype runs torch's default kernel (the exact reference), or with `fastest_kernel` on a CPU
    its faster one as auto would (bench's baselines in another precision: the fastest vanilla). `remeasure`:
    time those choices again instead of reading them from the cache (`budget --refresh`)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    dev = parse_device(device)
    chosen = parse_dtype(dtype, dev)
    path, offline = locate_model(resolve_model_path(name_or_path))
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=offline)
        check_architecture(config, name_or_path)  # before the weights take time to load
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=chosen or torch.float32,
                                                     attn_implementation=attention_for(config),
                                                     local_files_only=offline)
    except (OSError, ValueError, StrictDataclassError) as err:  # the last: transformers' config validation
        raise ModelLoadError(f"Could not load model {name_or_path!r}: {' '.join(str(err).split())}") from err
    base = getattr(model, "model", None)
    if not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ModelLoadError(f"{name_or_path!r} is not a Llama-family causal LM "
                             "(needs model.embed_tokens, layers, norm and rotary_emb).")
    model.to(dev).eval().requires_grad_(False)
    target = Target(model=model, tokenizer=tokenizer, name=name_or_path)
    if chosen is None:  # "auto" on a CPU: time both, keep the faster
        _choose_precision(target, plain, remeasure)
    elif fastest_kernel and dev.type == "cpu" and fast_kernel(dtype_name(chosen)):
        _choose_kernel(target, choose_linear_kernel(target, dtype_name(chosen), remeasure, plain))
    return target


def _choose_precision(target: Target, plain: bool, remeasure: bool = False) -> None:
    """fp32 or bf16, whichever is faster here, each at the faster of torch's default kernel and its fast
    one (oneDNN for fp32, the AVX2 kernel for bf16 without bf16 instructions; each timed once per
    machine, cached); the fp32 model is cast and its projections wrapped to match."""
    report = choose_cpu_dtype(target, remeasure, plain)
    stale = timed_under_load(report, target)  # the fresh fp32 target on torch's kernel, as the cache timed it
    if stale:  # every choice of that session is suspect: the kernels' and (open_pair) the head's
        remeasure, report = True, {**choose_cpu_dtype(target, True, plain), "remeasured": True}
    kernels = {d: choose_linear_kernel(target, d, remeasure, plain) for d in CPU_DTYPES if fast_kernel(d)}
    report = at_their_kernels(report, kernels, plain)
    reasons = [report["reason"]]
    if stale:
        reasons.append("measured again: the cached timings were made under load")
    if "bfloat16" not in kernels and (note := missing_kernel_note()):
        reasons.append(note)
    target.dtype_report = {**report, "reason": "; ".join(reasons)}
    chosen = report["chosen"]
    if chosen != "float32":
        target.model.to(DTYPES[chosen])  # fp32 -> bf16 rounds as a bf16 load would
    if chosen in kernels:
        _choose_kernel(target, kernels[chosen])


def _choose_kernel(target: Target, report: dict) -> None:
    """Run the target's projections on the kernel a choose_linear_kernel report chose."""
    target.kernel_report = report
    if report["chosen"] != "default":
        use_kernel(target.model, report["chosen"])


def check_architecture(config, name: str) -> None:
    """Refuse, before loading, a checkpoint whose attention the lean forward cannot reproduce."""
    if getattr(config, "text_config", None) is not None:
        raise ModelLoadError(f"{name!r} is a multimodal checkpoint ({config.model_type}, with a text_config): "
                             "give a text-only causal LM (e.g. a Gemma3ForCausalLM checkpoint).")
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelLoadError(f"{name!r} has use_bidirectional_attention set: it is an encoder, not a causal LM.")


def attention_for(config) -> str:
    """SDPA, unless the model softcaps its attention scores (Gemma2; SDPA has no softcap and transformers
    refuses it) or its class has no SDPA path: then eager, which applies the softcap."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    try:
        sdpa = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]._supports_sdpa
    except KeyError:  # transformers will name what it does not know
        sdpa = True
    return "eager" if getattr(config, "attn_logit_softcapping", None) is not None or not sdpa else "sdpa"

