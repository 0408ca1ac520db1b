"""One step generator for every mode: vanilla (a round with no draft), static (EAGLE-1) and dynamic
(EAGLE-2). Each round reads as named phases: draft -> build tree -> verify -> accept & commit.

A `Decoder` holds the models, the config and the plans (the static tree); everything one generation
changes (caches, RNG, the draft's root feature, counters) is a `DecodeState` that `steps` makes, so
one Decoder runs any number of generations, even interleaved.

Public surface (what eagle/tools/, the app and notebooks may import; the rest is internal):
    Decoder, DecodeState, generate, Generation   decoding and its result
    new_drafter (-> Drafter)                     the draft head and its cache, as a round uses them
    draft_round                                  one dynamic round's drafting, as the Decoder runs it
    greedy_accept                                a greedy round's acceptance, as the Decoder runs it
The prompt (encode_prompt, check_prompt, PromptError) is eagle.core.prompt; a round's trace records
(Round, TokenTexts, trace_nodes) are eagle.core.nodes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .adaptive import RoundCosts, best_tree_size
from .config import DecodeConfig
from .detok import TextWindow, next_text
from .draft import Candidates, Drafter, StaticPlan, draft_dynamic, draft_static
from ..models.head import DraftHead
from ..models.kvcache import KVCache
from ..records.stats import tau, tokens_per_second
from ..models.target import Target
from ..records.timing import PhaseClock
from ..records.trace import NodeRecord, StepRecord
from .lookup import ContextTokens, find_continuation
from .nodes import Round, TokenTexts, trace_nodes
from .prompt import check_prompt
from .tree import Tree, build_tree, load_static_paths, ranking, rerank, static_paths_to_tree_shape, tree_order
from .verify import accept_greedy_tokens, accept_sampling_dynamic, accept_sampling_static, process_logits, row_argmax


__all__ = ["DecodeState", "Decoder", "Drafter", "Generation", "draft_round", "generate", "greedy_accept",
           "new_drafter"]


@dataclass
class DecodeState:
    """Everything one generation changes: the caches, the sampling RNG, the draft's root feature, the
    reply's text window and the counters. `Decoder.steps` makes one per generation, so one Decoder
    (models, config, plans) can run many generations, interleaved or not, without them touching each
    other."""
    max_len: int  # cache slots this generation may use (prompt + max_new_tokens + one tree)
    t_cache: KVCache  # the target's
    generator: torch.Generator  # CPU: acceptance runs on the host
    drafter: Drafter | None  # the draft head's cache and vocabulary (None in vanilla)
    clock: PhaseClock  # splits each round into its phases (StepRecord.timings)
    root_hidden: torch.Tensor | None = None  # (1, H) the draft's predicted feature at the root
    root: int = -1  # the last token the target produced: the next round's tree root
    produced: int = 0  # new tokens so far
    step: int = 0  # the next record's step number
    text: TextWindow = field(default_factory=TextWindow)  # the reply's text so far (eagle.core.detok.next_text)
    context: ContextTokens | None = None  # prompt + reply so far, for the prompt-lookup branch (None: off)

    def advance(self, record: StepRecord) -> None:
        """After a record: its bonus token is the next root, its tokens count as produced."""
        self.root, self.produced, self.step = record.bonus_token, self.produced + len(record.new_tokens), \
            record.step + 1
        if self.context is not None:
            self.context.extend(record.new_tokens)


class Decoder:
    """Target + optional draft head + config; `steps(prompt_ids)` yields one StepRecord per round.
    With `costs` (dynamic mode only), each round verifies as many of its best candidates as pay for
    themselves, up to config.total_tokens (see eagle.core.adaptive). The Decoder holds no per-generation
    state (that is a DecodeState, made by `steps`)."""

    def __init__(self, target: Target, head: DraftHead | None, config: DecodeConfig,
                 costs: RoundCosts | None = None, profile: bool = False) -> None:
        self.target, self.head, self.cfg, self.costs = target, head, config.validate(), costs
        self.profile = profile  # on CUDA: wait for the device at every phase, so the phases are exact
        self.feature_layers = None if head is None else head.feature_layers  # what the head drafts from
        if config.mode != "vanilla" and head is None:
            raise ValueError(f"mode {config.mode!r} needs a draft head")
        if costs is not None and config.mode != "dynamic":
            raise ValueError("an adaptive tree size needs mode 'dynamic'")
        self.texts = TokenTexts(target.tokenizer)
        self.eos = frozenset(target.eos_ids)
        self.static_plan = None
        if config.mode == "static":
            shape = static_paths_to_tree_shape(load_static_paths())
            self.static_plan = StaticPlan.build(*shape, device=target.device)
            if 0 < config.draft_vocab <= int(shape[1].max()):
                raise ValueError(f"draft_vocab {config.draft_vocab} is smaller than the static tree's "
                                 f"widest node ({int(shape[1].max()) + 1} children)")

    # ---- the loop -------------------------------------------------------------------------------
    def steps(self, prompt_ids: list[int]) -> Iterator[StepRecord]:
        """Decode from prompt_ids; the last record has `finished` set. Closing the generator stops."""
        state = self._new_state(prompt_ids)
        record = self._prefill(state, prompt_ids)
        state.advance(record)
        yield record
        while not record.finished:
            record = self._step(state)
            state.advance(record)
            yield record

    def _new_state(self, prompt_ids: list[int]) -> DecodeState:
        cfg, tgt = self.cfg, self.target
        check_prompt(prompt_ids, tgt.max_context)
        max_len = min(tgt.max_context,
                      len(prompt_ids) + cfg.max_new_tokens + cfg.total_tokens + max(cfg.lookup_tokens, 0) + 1)
        drafter = None
        if cfg.mode != "vanilla":
            static_nodes = 0 if self.static_plan is None else self.static_plan.parents.numel()
            extra = cfg.depth * cfg.top_k + static_nodes  # draft slots for tree nodes past the prefix
            drafter = new_drafter(tgt, self.head, max_len + extra, cfg.draft_vocab)
        state = DecodeState(max_len, tgt.new_cache(max_len), torch.Generator().manual_seed(cfg.seed), drafter,
                            PhaseClock(tgt.device, sync=self.profile))
        if cfg.lookup_tokens > 0:  # -1 (the budget decides) reaches a Decoder only when no Session resolved it: off
            state.context = ContextTokens(prompt_ids, len(prompt_ids) + cfg.max_new_tokens)
        return state

    def _prefill(self, s: DecodeState, prompt_ids: list[int]) -> StepRecord:
        s.clock.start()
        ids = torch.tensor([prompt_ids], device=self.target.device)
        n = ids.shape[1]
        logits, features = self.target.forward(ids, torch.arange(n, device=ids.device)[None], s.t_cache, 0,
                                               logits_rows=slice(-1, None), feature_layers=self.feature_layers)
        s.t_cache.length = n
        token = self._choose(s, logits[0])
        if s.drafter is not None:  # pairs (f_t, x_{t+1}) for the whole prompt
            nxt = torch.cat([ids[0, 1:], torch.tensor([token], device=ids.device)])
            s.root_hidden = s.drafter.consume(nxt, features[0])
        finished = self._finish_reason([token], 0)
        new_text = self._new_text(s, [token], finished)
        s.clock.lap("prefill")
        return StepRecord(step=0, mode=self.cfg.mode, nodes=[], accepted=[], bonus_token=token,
                          bonus_text=self.texts(token), new_tokens=[token], new_text=new_text,
                          accept_length=1, timings=dict(s.clock.laps), finished=finished)

    def _step(self, s: DecodeState) -> StepRecord:
        """One round; its timings are the disjoint phases draft.0..draft.d (one per draft step), tree,
        verify (the target forward), accept, commit (the KV cache), consume (the draft catches up) and
        record (the trace's node records), which sum to the round's wall time."""
        clock = s.clock.start()
        cand, kept, tree, lookup = self._draft_and_build(s, self._budget(s))
        clock.lap("tree")
        logits, features = self._verify(s, tree)
        clock.lap("verify")
        accepted, bonus, node_probs = self._accept(s, tree, logits, cand, kept)
        rnd = Round(s.root, cand, kept, tree, accepted, bonus, node_probs, lookup)
        new_tokens = tree.tokens[accepted[1:]].tolist() + [bonus]
        finished = self._finish_reason(new_tokens, s.produced)
        clock.lap("accept")
        if not finished:
            self._commit(s, rnd, features, new_tokens)
            finished = "context" if s.t_cache.length >= s.max_len - 1 else None
        return self._record(s, rnd, new_tokens, finished)

    # ---- phases ---------------------------------------------------------------------------------
    def _budget(self, s: DecodeState) -> int:
        """Nodes to verify this round, shrunk so the tree never overflows the cache."""
        return max(1, min(self.cfg.total_tokens, s.max_len - s.t_cache.length))

    def _draft_and_build(self, s: DecodeState,
                         budget: int) -> tuple[Candidates | None, torch.Tensor | None, Tree, list[int]]:
        """The head's draft and the verification tree: the root, the kept candidates, then the
        prompt-lookup branch (when on and the context's last n-gram recurs)."""
        cand, kept, levels = self._draft(s, budget)
        room = s.max_len - s.t_cache.length - 1 - (0 if kept is None else kept.numel())
        lookup = [] if s.context is None or room < 1 else \
            find_continuation(s.context.tokens, min(self.cfg.lookup_tokens, room))
        levels = max(levels, len(lookup))  # the branch's last node is len(lookup) deep
        return cand, kept, build_tree(*_tree_arrays(s.root, cand, kept, lookup, self.target.device), levels), lookup

    def _draft(self, s: DecodeState, budget: int) -> tuple[Candidates | None, torch.Tensor | None, int]:
        """The head's candidates and the kept ones (None, None: no draft this round), with the tree's
        depth bound (levels)."""
        dev = self.target.device
        if s.drafter is None or budget == 1:
            return None, None, 1
        if self.static_plan is not None:
            gen = None if self.cfg.greedy else s.generator
            cand = draft_static(s.drafter, s.root_hidden, self.static_plan, generator=gen, lap=s.clock.lap)
            kept = torch.arange(min(cand.tokens.numel(), budget - 1), device=dev)
            return cand, kept, self.static_plan.max_depth
        cand = draft_dynamic(s.drafter, s.root_hidden, self.cfg.depth, self.cfg.top_k, lap=s.clock.lap)
        levels = self.cfg.depth + 1  # the deepest candidate: trees are built unchecked to this bound
        best = ranking(cand.scores, cand.parents, cand.depths, levels)[:budget - 1]
        if self.costs is not None:  # the ranking is prefix-closed: a smaller n is a sub-tree
            values = cand.scores[best].exp().sort(descending=True).values
            best = best[:best_tree_size(values, self.costs, s.t_cache.length) - 1]
        return cand, tree_order(best, cand.depths), levels

    def _verify(self, s: DecodeState, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        start = s.t_cache.length
        positions = (start + tree.depths)[None]
        mask = tree.mask if tree.num_nodes > 1 else None
        logits, features = self.target.forward(tree.tokens[None], positions, s.t_cache, start, mask,
                                               feature_layers=self.feature_layers)
        return logits[0], features[0]  # (N, V), (N, H)

    def _accept(self, s: DecodeState, tree: Tree, logits: torch.Tensor, cand: Candidates | None,
                kept: torch.Tensor | None) -> tuple[list[int], int, torch.Tensor]:
        cfg = self.cfg
        if cfg.greedy:
            return greedy_accept(tree, logits)
        parents = tree.parents.clamp(min=0)
        probs = process_logits(logits.float(), cfg.temperature, cfg.top_p, cfg.top_k_sampling).cpu()
        cpu_tree = _tree_to(tree, "cpu")
        if cand is None or cand.draft_probs is None:
            conf = torch.ones(tree.num_nodes) if cand is None else \
                torch.cat([torch.ones(1), cand.logp[kept].exp().cpu()])
            accepted, bonus = accept_sampling_dynamic(cpu_tree, probs, conf, s.generator)
        else:
            q = cand.draft_probs[: tree.num_nodes].cpu()
            accepted, bonus = accept_sampling_static(cpu_tree, probs, q, s.generator)
        return accepted, bonus, probs[parents.cpu(), tree.tokens.cpu()]

    def _commit(self, s: DecodeState, rnd: Round, features: torch.Tensor, new_tokens: list[int]) -> None:
        dev = self.target.device
        s.t_cache.commit([s.t_cache.length + i for i in rnd.accepted])
        s.clock.lap("commit")
        if s.drafter is not None:  # the draft catches up with the target's real features
            idx = torch.tensor(rnd.accepted, device=dev)
            s.root_hidden = s.drafter.consume(torch.tensor(new_tokens, device=dev), features[idx])
            s.clock.lap("consume")

    # ---- helpers --------------------------------------------------------------------------------
    def _choose(self, s: DecodeState, logits_row: torch.Tensor) -> int:
        """The next token from a (1, V) logits row: argmax, or a sample of the processed target."""
        if self.cfg.greedy:
            return int(logits_row[-1].float().argmax())  # fp32 argmax: exact, faster than bf16's on a CPU
        probs = process_logits(logits_row[-1].float(), self.cfg.temperature, self.cfg.top_p,
                               self.cfg.top_k_sampling).cpu()
        return int(torch.multinomial(probs, 1, generator=s.generator))

    def _finish_reason(self, new_tokens: list[int], produced: int) -> str | None:
        """Cut new_tokens (in place) at EOS or the token budget and say why decoding ends."""
        for i, tok in enumerate(new_tokens):
            if produced + i + 1 >= self.cfg.max_new_tokens or tok in self.eos:
                reason = "eos" if tok in self.eos else "max_new_tokens"
                del new_tokens[i + 1:]
                return reason
        return None

    def _new_text(self, s: DecodeState, new_tokens: list[int], finished: str | None) -> str:
        """The text new_tokens add to the reply, whole characters only (the last round flushes), so the
        records' new_text concatenate to the reply's decode without special tokens."""
        text, s.text = next_text(self.target.tokenizer, s.text, new_tokens, final=finished is not None)
        return text

    def _record(self, s: DecodeState, rnd: Round, new_tokens: list[int], finished: str | None) -> StepRecord:
        nodes, accepted_ids = trace_nodes(rnd, self.texts)
        new_text = self._new_text(s, new_tokens, finished)
        s.clock.lap("record")
        return StepRecord(step=s.step, mode=self.cfg.mode, nodes=nodes, accepted=accepted_ids,
                          bonus_token=rnd.bonus, bonus_text=self.texts(rnd.bonus), new_tokens=new_tokens,
                          new_text=new_text, accept_length=len(rnd.accepted), timings=dict(s.clock.laps),
                          finished=finished)


# ---- pure helpers ---------------------------------------------------------------------------------
def new_drafter(target: Target, head: DraftHead, max_len: int, draft_vocab: int = 0,
                stand_in: bool = False) -> Drafter:
    """The draft head with a cache of max_len slots, scoring the draft_vocab most frequent tokens
    (0: all). A head without token counts cannot pick that subset and scores the full vocabulary;
    with stand_in the first draft_vocab ids take the subset's place (for timing a round: its cost
    depends only on the subset's size)."""
    drafter = Drafter(head, target.model.lm_head.weight, max_len, draft_vocab)
    if stand_in and draft_vocab and drafter.vocab_ids is None and draft_vocab < drafter.vocab_size:
        drafter.vocab_ids = torch.arange(draft_vocab, device=target.device)
        drafter.score_with(target.model.lm_head.weight[:draft_vocab])
    return drafter


def draft_round(drafter: Drafter, root_hidden: torch.Tensor, root: int, depth: int, top_k: int, nodes: int,
                texts: TokenTexts) -> list[NodeRecord]:
    """One dynamic (EAGLE-2) round's drafting as the Decoder runs it, for tools that time or inspect
    a round: draft, rerank to the nodes - 1 best candidates, build the verification tree and record
    every drafted node (nothing verified yet, so nothing accepted)."""
    cand, kept = _draft_dynamic_kept(drafter, root_hidden, depth, top_k, nodes)
    tree = build_tree(*_tree_arrays(root, cand, kept, [], root_hidden.device), depth + 1)
    return trace_nodes(Round(root, cand, kept, tree, [0], root, torch.zeros(tree.num_nodes)), texts)[0]


def _draft_dynamic_kept(drafter: Drafter, root_hidden: torch.Tensor, depth: int, top_k: int,
                        nodes: int) -> tuple[Candidates, torch.Tensor]:
    """EAGLE-2's draft, then its rerank to the nodes - 1 best candidates (the root is the n-th)."""
    cand = draft_dynamic(drafter, root_hidden, depth, top_k)
    return cand, rerank(cand.scores, cand.parents, cand.depths, nodes - 1, depth + 1)


def greedy_accept(tree: Tree, logits: torch.Tensor) -> tuple[list[int], int, torch.Tensor]:
    """A greedy round's acceptance of its verified tree (logits (N, V)): the accepted path, the bonus
    token and each node's p(token | parent) for the trace. The budget's cost probe times this too."""
    scores = logits.float()  # exact, and the trace's probabilities in fp32
    accepted, bonus = accept_greedy_tokens(tree, row_argmax(scores))
    # p(token | parent) for the trace; log_softmax's fused kernel is faster on a CPU than exp and a sum
    # (15 x 49,152: ~250 against ~300 us, 2 threads), and no (N, V) softmax is kept
    parents = tree.parents.clamp(min=0)
    return accepted, bonus, scores.log_softmax(-1)[parents, tree.tokens].exp()


def _tree_arrays(root: int, cand: Candidates | None, kept: torch.Tensor | None, lookup: list[int],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification tree's tokens and parents: the root, the kept candidates (kept is parents-first;
    None: no draft), then the prompt-lookup branch, hanging from the root (its node first + j's parent is
    first + j - 1). build_tree takes them with the draft's depth bound, without re-checking them."""
    first = 1 + (0 if kept is None else kept.numel())
    lookup_parents = [0, *range(first, first + len(lookup) - 1)][:len(lookup)]
    ends = torch.tensor([[root, *lookup], [-1, *lookup_parents]], device=device)  # (2, 1 + L): one host copy
    if kept is None:
        return ends[0], ends[1]
    slot = torch.full((cand.tokens.numel(),), -1, dtype=torch.long, device=device)
    slot[kept] = torch.arange(1, kept.numel() + 1, device=device)  # candidate id -> tree index
    cand_parent = cand.parents[kept]
    parents = torch.where(cand_parent < 0, 0, slot[cand_parent.clamp(min=0)])
    return (torch.cat([ends[0, :1], cand.tokens[kept], ends[0, 1:]]),
            torch.cat([ends[1, :1], parents, ends[1, 1:]]))


def _tree_to(tree: Tree, device: str | torch.device) -> Tree:
    return Tree(**{f: getattr(tree, f).to(device) for f in ("tokens", "parents", "depths", "mask")})


@dataclass
class Generation:
    """A finished (or stopped) generation: the tokens, every step record and the wall time."""
    prompt_ids: list[int]
    tokens: list[int]
    steps: list[StepRecord]
    seconds: float
    finished: str | None

    @property
    def target_forwards(self) -> int:
        return sum(s.target_forwards for s in self.steps)

    @property
    def tau(self) -> float:
        """New tokens per target forward pass (the prefill counts as one; eagle.records.stats.tau)."""
        return tau(len(self.tokens), self.target_forwards)

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the generation's wall-clock seconds (eagle.records.stats.tokens_per_second)."""
        return tokens_per_second(len(self.tokens), self.seconds)


def generate(decoder: Decoder, prompt_ids: list[int], on_step=None) -> Generation:
    """Run the step generator to the end. on_step(record) may return True to stop early."""
    t0 = time.perf_counter()
    tokens, steps, finished = [], [], None
    for record in decoder.steps(prompt_ids):
        tokens += record.new_tokens
        steps.append(record)
        finished = record.finished
        if on_step is not None and on_step(record):
            finished = "stopped"
            break
    return Generation(list(prompt_ids), tokens, steps, time.perf_counter() - t0, finished)
