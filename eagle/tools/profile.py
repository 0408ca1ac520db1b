"""Where a decoding round spends its time: each phase's milliseconds per round and share of the round,
from the step records' PhaseClock laps, and the overhead (the round minus its verify forward) that
decides the speed-up on a GPU, where the target's forward is cheap and host work is not.

The same rounds run on the chosen model and on a tiny random Llama (2 layers, hidden 64, the same
tokenizer): there model compute is negligible, so its round time is the framework's own cost."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..core.config import DecodeConfig
from ..core.decode import Decoder, generate
from ..core.adaptive import RoundCosts
from ..models.head import AnyHead, new_head
from ..records.stats import tau
from ..models.kernels import linear_kernel, pack_beside, use_kernel
from ..models.precision import dtype_name
from ..models.target import Target
from ..records.timing import STEP_PHASES, phase_seconds
from ..records.trace import StepRecord

ROUND_PHASES = tuple(p for p in STEP_PHASES if p != "prefill")
OUTSIDE = "outside"  # the generator loop between rounds: what no phase of a round covers


@dataclass(frozen=True)
class PhaseRow:
    phase: str  # a STEP_PHASES name, "draft.i" for one draft step, or OUTSIDE
    ms_per_round: float
    share: float  # of the mean round (phases and OUTSIDE sum to 1)


@dataclass(frozen=True)
class RoundProfile:
    """One model's rounds, summed over its prompts."""
    label: str
    rounds: int
    tokens: int
    seconds: float  # wall time of the generations, prefill excluded
    accept_length: float  # tau: tokens per drafted round (the prefill's token excluded)
    phases: list[PhaseRow]

    @property
    def round_ms(self) -> float:
        return 1000 * self.seconds / max(1, self.rounds)

    def ms(self, phase: str) -> float:
        return sum(r.ms_per_round for r in self.phases if r.phase == phase or r.phase.startswith(phase + "."))

    @property
    def overhead_ms(self) -> float:
        """Everything in a round but the target's verify forward: drafting, tree, acceptance, cache
        and trace work, and the loop around them."""
        return self.round_ms - self.ms("verify")

    @property
    def overhead_share(self) -> float:
        return self.overhead_ms / self.round_ms if self.round_ms else float("nan")

    def to_json(self) -> dict:
        return {**asdict(self), "round_ms": self.round_ms, "overhead_ms": self.overhead_ms,
                "overhead_share": self.overhead_share}


def phase_rows(rounds: list[StepRecord], seconds: float) -> list[PhaseRow]:
    """Per-round ms and share of each phase over the drafted rounds, draft steps kept apart; OUTSIDE
    is `seconds` (the rounds' wall time) minus what the phases cover."""
    n = max(1, len(rounds))
    names = sorted({k for s in rounds for k in s.timings if k.startswith("draft.")}, key=lambda k: int(k[6:]))
    names += [p for p in ROUND_PHASES if p != "draft"]
    totals = {k: sum(s.timings.get(k, 0.0) for s in rounds) for k in names}
    totals = {k: t for k, t in totals.items() if t > 0 or k in ROUND_PHASES}
    totals[OUTSIDE] = max(0.0, seconds - sum(totals.values()))
    return [PhaseRow(k, 1000 * t / n, t / seconds if seconds else float("nan")) for k, t in totals.items()]


def profile_rounds(target: Target, head: AnyHead, cfg: DecodeConfig, prompts: list[list[int]],
                   label: str, costs: RoundCosts | None = None) -> RoundProfile:
    """Decode each prompt once after a short warm-up and profile the drafted rounds (not the prefill)."""
    generate(Decoder(target, head, cfg.with_(max_new_tokens=min(8, cfg.max_new_tokens)), costs, profile=True),
             prompts[0])
    rounds: list[StepRecord] = []
    seconds, tokens = 0.0, 0
    for ids in prompts:
        t0 = time.perf_counter()
        g = generate(Decoder(target, head, cfg, costs, profile=True), ids)  # exact phases on CUDA too
        seconds += time.perf_counter() - t0 - sum(phase_seconds(s.timings, "prefill") for s in g.steps if s.step == 0)
        rounds += [s for s in g.steps if s.step > 0]
        tokens += len(g.tokens)
    accepted = sum(s.accept_length for s in rounds)
    return RoundProfile(label, len(rounds), tokens, seconds, tau(accepted, len(rounds)), phase_rows(rounds, seconds))


def tiny_llama(like: Target, layers: int = 2, hidden: int = 64, seed: int = 0) -> tuple[Target, AnyHead]:
    """A random Llama with `like`'s tokenizer and vocabulary, `layers` layers of width `hidden`, in
    `like`'s dtype and device, and a random EAGLE-1/2 head for it: model compute negligible, so a
    round's time is the decoder's own (the stand-in for host overhead on a GPU)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=like.config.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=like.max_context, eos_token_id=None, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(like.device, like.dtype).eval().requires_grad_(False)
    tiny = Target(model=model, tokenizer=like.tokenizer, name=f"tiny-llama-{layers}x{hidden}")
    if linear_kernel(like) != "default":  # the same projection kernel as the target's, its head's beside it
        use_kernel(tiny.model, linear_kernel(like))
    head = new_head(tiny, seed=seed + 1)
    pack_beside(tiny, head)
    return tiny, head


def model_label(target: Target) -> str:
    return f"{target.name} {dtype_name(target.dtype)}"


def format_profiles(profiles: list[RoundProfile]) -> str:
    """One column per model: ms per round of each phase (share of the round), then the totals."""
    phases = list(dict.fromkeys(r.phase for p in profiles for r in p.phases))
    cells = {p.label: {r.phase: f"{r.ms_per_round:7.2f} ({100 * r.share:4.1f}%)" for r in p.phases}
             for p in profiles}
    width = max(20, *(len(p.label) + 2 for p in profiles))
    lines = [f"{'phase (ms/round)':<18}" + "".join(f"{p.label:>{width}}" for p in profiles)]
    lines += [f"{ph:<18}" + "".join(f"{cells[p.label].get(ph, '-'):>{width}}" for p in profiles) for ph in phases]
    summary = {"round": lambda p: f"{p.round_ms:7.2f}",
               "overhead": lambda p: f"{p.overhead_ms:7.2f} ({100 * p.overhead_share:4.1f}%)",
               "tau": lambda p: f"{p.accept_length:.2f}",
               "rounds": lambda p: str(p.rounds)}
    lines += [f"{name:<18}" + "".join(f"{cell(p):>{width}}" for p in profiles) for name, cell in summary.items()]
    return "\n".join(lines)
