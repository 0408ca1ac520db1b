"""One session for every front end: a loaded model pair and, for each prompt, the encoded ids, the
tree the budget policy chooses, a ready Decoder and the trace header. The CLI, the notebook API, the
dashboard and bench all run a prompt through `Session.prepare`, so the same prompt and settings give
the same tree and the same header (apart from times and the generation id) wherever they run."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..core.adaptive import RoundCosts
from ..core.config import DecodeConfig
from ..core.decode import Decoder
from ..core.prompt import encode_prompt
from ..core.lookup import LOOKUP_TOKENS
from ..models.head import AnyHead
from ..models.headio import head_identity
from ..models.kernels import head_precision, linear_kernel
from .loading import check_budget
from ..models.precision import dtype_name
from ..models.target import Target
from ..records.trace import TraceHeader
from .budget import choice as budget_choice  # one module reference: a test's patch of it reaches every use
from .budget.report import AutoReport

Prompt = str | list[dict]  # one user message, or a conversation of chat messages
DRAFT_MODES = ("static", "dynamic")  # the modes that draft with the head (vanilla and bench's HF modes do not)


@dataclass(frozen=True)
class Prepared:
    """A prompt ready to decode: what `eagle.core.decode.generate(prepared.decoder, prepared.ids)` needs,
    and the header its trace gets."""
    ids: list[int]
    config: DecodeConfig  # the tree the budget chose, or the one given
    decoder: Decoder
    header: TraceHeader
    budget_report: AutoReport | None = None  # the auto report when a budget was tuned
    note: str | None = None  # why the settings were changed (auto fell back to plain decoding)


@dataclass(frozen=True)
class Choice:
    """What a prompt decodes with under a budget policy (Session.choose)."""
    config: DecodeConfig
    costs: RoundCosts | None  # the adaptive budget's per-round size model (None: a fixed tree)
    report: AutoReport | None  # the auto report when a budget was tuned
    note: str | None  # why the settings were changed (auto fell back to plain decoding)


@dataclass(frozen=True)
class Session:
    """The target, its draft head and what trace headers record of the head (hashed once: hashing
    reads every weight). `auto`: the auto report to tune every prompt from (bench reads it once per
    run); None: each tune reads it (or makes it) and checks it was not timed under load."""
    target: Target
    head: AnyHead | None
    head_source: str | None
    identity: dict = field(default_factory=lambda: head_identity(None))
    auto: AutoReport | None = None

    @classmethod
    def of(cls, target: Target, head: AnyHead | None, head_source: str | None) -> "Session":
        return cls(target, head, head_source, head_identity(head))

    def tune(self, cfg: DecodeConfig, budget: str,
             context: int | None = None) -> tuple[DecodeConfig, RoundCosts | None, AutoReport | None]:
        """The config under a budget policy: fixed keeps its tree; auto and adaptive (dynamic mode only)
        take the machine-tuned tree for a generation whose mean context is `context` tokens (None:
        auto's own choice, at its probe's prefix length), from the session's auto report if it holds one."""
        check_budget(budget, cfg.mode)
        cfg = self.lookup_policy(cfg, budget)
        if budget == "fixed":
            return cfg, None, None
        return budget_choice.tuned_config(self.target, self.head, cfg, budget, context=context, report=self.auto)

    def auto_report(self, refresh: bool = False) -> AutoReport:
        """The auto budget's report for the settings a generation under --budget auto runs with (the lookup
        policy's branch included), so what `budget`, setup and the dashboard show is what then decodes,
        and one calibration serves them all; `refresh` measures this machine again."""
        base = self.lookup_policy(DecodeConfig(), "auto")
        return budget_choice.auto_config(self.target, self.head, base, refresh=refresh)[1]

    @staticmethod
    def lookup_policy(cfg: DecodeConfig, budget: str) -> DecodeConfig:
        """cfg with its prompt-lookup branch decided where it says the budget decides (-1): on, at
        LOOKUP_TOKENS, for greedy dynamic decoding under the auto and adaptive budgets (the fastest
        settings here); off under a fixed budget (the tree asked for, nothing added)."""
        if cfg.lookup_tokens >= 0:
            return cfg
        on = budget != "fixed" and cfg.mode == "dynamic" and cfg.greedy
        return cfg.with_(lookup_tokens=LOOKUP_TOKENS if on else 0)

    def fallback(self, cfg: DecodeConfig, report: AutoReport | None) -> tuple[DecodeConfig, str | None]:
        """Plain decoding, and the sentence saying why, when the auto budget expects no tree to beat
        vanilla decoding at the model's own precision (a random or poor head, or a CPU whose verify of a
        few tokens costs much more than one); else cfg unchanged. The sentence names a faster precision
        for plain decoding where there is one (the pair stays at the one it was loaded in)."""
        if report is None:
            return cfg, None
        choice = report.context_choice
        expected = choice["speedup_same_dtype"] if choice else report.expected_speedup_same_dtype
        if expected >= 1.0:
            return cfg, None
        why = f"the auto budget expects no tree to pay here (its best, {expected:.2f}x vanilla at this precision)"
        own = dtype_name(self.target.dtype)
        faster = f"; vanilla {report.vanilla_dtype} is faster here (--mode vanilla --dtype auto runs it)" \
            if report.vanilla_dtype != own else ""
        return cfg.with_(mode="vanilla", lookup_tokens=0), f"{why}: decoding as vanilla {own}{faster}"

    def choose(self, cfg: DecodeConfig, budget: str, prompt_tokens: int | None) -> Choice:
        """What a prompt of `prompt_tokens` tokens decodes with: the tree tuned for the generation's
        mean context (the prompt plus half the reply it may write), or plain decoding where auto
        expects no tree to pay. Bench's resume asks it again for a stored generation's prompt length;
        None: auto's reference choice, at its probe's prefix length (what bench prints at start)."""
        # the generation's mean context: the prompt plus half the reply it may write
        context = None if prompt_tokens is None else prompt_tokens + cfg.max_new_tokens // 2
        cfg, costs, report = self.tune(cfg, budget, context)
        cfg, note = self.fallback(cfg, report)
        return Choice(cfg, costs if cfg.mode in DRAFT_MODES else None, report, note)

    def prepare(self, prompt: Prompt, cfg: DecodeConfig, budget: str = "fixed", **meta) -> Prepared:
        """Encode (a bad prompt fails before any tuning), choose the tree, and build the decoder and
        header; `meta` adds front-end fields to the header's meta (bench: the question id, category and turn)."""
        ids = encode_prompt(self.target.tokenizer, prompt, self.target.max_context)
        choice = self.choose(cfg, budget, len(ids))
        cfg = choice.config
        decoder = Decoder(self.target, self.head if cfg.mode in DRAFT_MODES else None, cfg, choice.costs)
        if choice.note:  # the trace says why it is not the mode asked for
            meta = {**meta, "note": choice.note}
        return Prepared(ids, cfg, decoder, self.header(prompt, cfg, len(ids), **meta), choice.report, choice.note)

    def header(self, prompt: Prompt, cfg: DecodeConfig | dict, prompt_tokens: int, **meta) -> TraceHeader:
        """The one trace header: model, the head only when the mode drafts, the config as run (a dict
        for bench's HF modes and its extra fields), the last user message (a conversation's messages in
        meta), dtype, the head's dtype when it drafts, and device in meta."""
        config = asdict(cfg) if isinstance(cfg, DecodeConfig) else cfg
        drafts = config["mode"] in DRAFT_MODES
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        base = {"dtype": dtype_name(self.target.dtype), "device": self.target.device.type}
        if linear_kernel(self.target) != "default":  # the projections' kernel, where auto changed it
            base["linear_kernel"] = linear_kernel(self.target)
        if drafts and self.head is not None:
            base["head_dtype"] = head_precision(self.head)
        if not isinstance(prompt, str) and len(prompt) > 1:
            base["messages"] = prompt
        identity = self.identity if drafts else head_identity(None)
        return TraceHeader(self.target.name, self.head_source if drafts else None, config, text, prompt_tokens,
                           {**base, **meta}, **identity)
