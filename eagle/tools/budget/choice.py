"""The budget with the most expected tokens per second: each budget's replayed accept length over its
modelled round cost; auto_config, the choice cached per machine key, head weights and settings and
restated against the fastest vanilla here (an AutoReport); tuned_config, what a generation runs with
under --budget auto or adaptive.

    expected tokens/s (n, depth, top_k, vocab) = E[accept length] / (t_verify(n + lookup nodes)
                                               + t_draft(depth, top_k, vocab) + per-round overhead + host)

With a prompt-lookup branch (greedy dynamic decoding under auto) the replay adds the branch to every
budget: E[accept length] counts the copies the target takes, and the verify pays for the branch's nodes."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Callable

import numpy as np

from ...core.adaptive import RoundCosts
from ...core.config import DecodeConfig, TreeShape
from ...core.prompt import encode_prompt
from ...models.head import AnyHead
from ...models.location import cache_dir
from ...models.precision import choose_cpu_dtype, dtype_name
from ...models.target import Target
from ...records.files import atomic_write_json
from ...records.stats import speedup, tokens_per_second
from ...records.timing import measured_under_load
from .costs import COSTS_VERSION, DEPTHS, HOST_PROMPTS, NS, REPEATS, TOP_KS, VOCABS, Costs, cost_key, cost_path, \
    host_terms, measure_costs, probe_t1
from .replay import AcceptModel, calibrate, calibration_prompts, vocab_masks
from .report import AutoReport, read_auto_report

AUTO_REPORT_VERSION = 11  # bump when the report or the searched grid changes: cached reports are then recomputed


def choose_budget(costs: Costs, model: Callable[[int, int, int, int], float], draft_vocab: int = 0,
                  ns: tuple[int, ...] | None = None, depths: tuple[int, ...] | None = None,
                  top_ks: tuple[int, ...] | None = None,
                  context: int | None = None) -> tuple[int, int, int, list[dict]]:
    """The (total_tokens, depth, top_k) with the most expected tokens/s for one draft vocabulary
    at a context length (None: the reference prefix), and the whole table, best first.
    `model(n, depth, top_k, vocab)` gives E[accepted length]; a budget must fit in the candidates
    its draft produces (top_k + depth * top_k^2)."""
    ns = ns or getattr(model, "ns", NS)
    depths = depths or getattr(model, "depths", DEPTHS)
    top_ks = top_ks or getattr(model, "top_ks", TOP_KS)
    vanilla = tokens_per_second(1, costs.t_plain(context))  # plain decoding: a token per forward
    copies = getattr(model, "lookup_nodes", lambda *_: 0.0)  # a bare accept function has no lookup branch
    shares = getattr(model, "lookup_share", lambda *_: 1.0)
    rows = []
    for n in (x for x in ns if x > 1):
        for depth in depths:
            for k in top_ks:
                if n - 1 > k + depth * k * k:
                    continue
                accept, lookup = model(n, depth, k, draft_vocab), copies(n, depth, k, draft_vocab)
                share = shares(n, depth, k, draft_vocab)
                cost = costs.round_cost(n, depth, k, draft_vocab, context, lookup, share)
                rows.append({"total_tokens": n, "depth": depth, "top_k": k, "draft_vocab": draft_vocab,
                             "accept_length": accept, "lookup_nodes": lookup, "lookup_share": share,
                             "round_s": cost,
                             "tokens_per_s": tokens_per_second(accept, cost),
                             "speedup": speedup(tokens_per_second(accept, cost), vanilla)})
    if not rows:
        raise ValueError("no budget in the grid fits: give total_tokens above 1")
    rows.sort(key=lambda r: (-r["tokens_per_s"], r["total_tokens"], r["depth"], r["top_k"]))
    best = rows[0]
    return best["total_tokens"], best["depth"], best["top_k"], rows


PLAIN = TreeShape(total_tokens=1, depth=0, top_k=1)  # plain decoding: a one-node tree (Costs.round_cost's convention)


def expected_accept_length(report: AutoReport, shape: TreeShape | None = None) -> float:
    """E[accept length] of the report's chosen budget, or of another `shape` of its replayed grid (the
    tree auto chose for another context length; PLAIN: one token a round)."""
    if shape is None or shape == report.shape:
        return report.expected_accept_length
    if shape.total_tokens == 1:
        return 1.0
    return report.accept_table(shape.total_tokens, shape.depth, shape.top_k, shape.draft_vocab)


def expected_lookup_nodes(report: AutoReport, shape: TreeShape | None = None) -> float:
    """The mean prompt-lookup nodes a round of that budget verifies beside its tree (PLAIN: none)."""
    if shape is None or shape == report.shape:
        return report.expected_lookup_nodes
    if shape.total_tokens == 1:
        return 0.0
    return report.accept_table.lookup_nodes(shape.total_tokens, shape.depth, shape.top_k, shape.draft_vocab)


def expected_round_s(report: AutoReport, shape: TreeShape | None = None, context: int | None = None) -> float:
    """The modelled seconds of a round of that budget, its lookup branch included, at a context length."""
    s = shape or report.shape
    lookup = expected_lookup_nodes(report, s)
    share = report.accept_table.lookup_share(s.total_tokens, s.depth, s.top_k, s.draft_vocab) if lookup > 0 else 0.0
    return report.costs.round_cost(s.total_tokens, s.depth, s.top_k, s.draft_vocab, context, lookup, share)


def expected_seconds(report: AutoReport, prompt_tokens: int, new_tokens: int,
                     shape: TreeShape | None = None) -> float:
    """The cost model's wall time for one generation with the report's chosen budget (or `shape`): the
    prompt's prefill, then (new_tokens - 1) / E[accept length] rounds at the generation's mean context length."""
    rounds = max(0, new_tokens - 1) / expected_accept_length(report, shape)
    return report.costs.t_prefill(prompt_tokens) + rounds * expected_round_s(report, shape,
                                                                            prompt_tokens + new_tokens // 2)


def head_fingerprint(head: AnyHead) -> str:
    """A short hash of the head's weights: a retrained head gets a new auto budget."""
    return hashlib.sha1(head.fc.weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:12]


def _auto_report(target: Target, head: AnyHead, prompts: list[str] | None, vocabs: tuple[int, ...],
                 repeats: int, max_new_tokens: int, ns: tuple[int, ...], top_ks: tuple[int, ...],
                 lookup_tokens: int, refresh: bool = False) -> dict:
    masks = vocab_masks(head, vocabs)
    costs = measure_costs(target, head, ns=ns, top_ks=top_ks, vocabs=tuple(masks), repeats=repeats,
                          refresh=refresh)
    prompts = prompts or calibration_prompts()
    samples = calibrate(target, head, prompts, max_new_tokens)
    model = AcceptModel(samples, masks, ns=ns, top_ks=top_ks, lookup_tokens=lookup_tokens)
    first = _best_table(costs, model, None)[0][0]
    costs = host_terms(target, head, costs, first, [encode_prompt(target.tokenizer, p, target.max_context)
                                                    for p in prompts[:HOST_PROMPTS]], lookup_tokens)
    table, choices = _best_table(costs, model, None)
    best = table[0]
    by_context = [{"context": c, **TreeShape.of(row).as_dict(), "speedup": row["speedup"]}
                  for c in sorted(costs.verify_by_context) for row in [_best_table(costs, model, c)[0][0]]]
    same_shape = [r for r in table if (r["depth"], r["top_k"]) == (best["depth"], best["top_k"])]
    return {"curve": sorted(same_shape, key=lambda r: r["total_tokens"]),
            "vanilla_tokens_per_s": tokens_per_second(1, costs.t_plain()), "t_plain": costs.t_plain(),
            "t_verify": {str(n): costs.t_verify(n) for n in ns}, "alpha": model.alpha,
            "host_ms": {"tree": 1000 * costs.host_tree, "plain": 1000 * costs.host_plain},
            "chosen": TreeShape.of(best).as_dict(),
            "expected_tokens_per_s": best["tokens_per_s"], "expected_speedup": best["speedup"],
            "expected_accept_length": best["accept_length"], "beats_vanilla": best["speedup"] > 1.0,
            "lookup_tokens": lookup_tokens, "expected_lookup_nodes": best["lookup_nodes"],
            "calibration_rounds": len(samples),
            "calibration_accept_length": float(np.mean([s.accept_length for s in samples])),
            "costs_key": costs.key, "costs_file": str(cost_path(costs.key)),
            "best_per_vocab": sorted((t[0] for t in choices), key=lambda r: -r["tokens_per_s"]), "top": table[:5],
            "by_context": by_context, "costs": costs.to_json(), "accept_table": model.to_json()}


def _best_table(costs: Costs, model: AcceptModel, context: int | None) -> tuple[list[dict], list[list[dict]]]:
    """The ranked table of the best draft vocabulary at a context length, and every vocabulary's."""
    choices = [choose_budget(costs, model, v, context=context)[3] for v in model.vocabs]
    return max(choices, key=lambda t: t[0]["tokens_per_s"]), choices


def choice_at_context(report: AutoReport, context: int) -> dict:
    """The best budget row at a context length, from a report's cached costs and replayed grid."""
    table, _ = _best_table(report.costs, report.accept_table, context)
    return table[0]


def auto_config(target: Target, head: AnyHead, base_cfg: DecodeConfig, prompts: list[str] | None = None,
                vocabs: tuple[int, ...] = VOCABS, repeats: int = REPEATS, max_new_tokens: int = 64,
                ns: tuple[int, ...] = NS, top_ks: tuple[int, ...] = TOP_KS,
                refresh: bool = False) -> tuple[DecodeConfig, AutoReport]:
    """The budget with the most expected tokens/s on this machine: (config, report). The first call
    measures costs (~20 s on a CPU) and calibrates on a few prompts (~30-60 s); the result is cached
    per machine key + head weights + settings, so later calls (the app, every bench) are instant.
    base_cfg's prompt-lookup branch (greedy dynamic decoding only) is part of what each budget is
    replayed with, so a report is made for its length."""
    lookup = report_lookup(base_cfg)
    # the cost model's version too: a report embeds its costs, so new costs must mean a new report
    settings = json.dumps([AUTO_REPORT_VERSION, COSTS_VERSION, prompts, vocabs, max_new_tokens, ns, top_ks, lookup])
    fingerprint = hashlib.sha1(f"{cost_key(target, head)}|{head_fingerprint(head)}|{settings}".encode()).hexdigest()[:16]
    path = cache_dir() / "costs" / f"auto-{fingerprint}.json"
    cached = None if refresh else read_auto_report(path, ns, top_ks, vocabs)
    if cached is not None and measured_under_load(cached["t_verify"]["1"], probe_t1(target, head)):
        cached, refresh = None, True  # its costs were timed under load: measure and choose again
    if cached is None:
        cached = _auto_report(target, head, prompts, vocabs, repeats, max_new_tokens, ns, top_ks, lookup, refresh)
        atomic_write_json(path, cached, indent=1)
    report = AutoReport.from_cached(cached, fastest_vanilla(target, cached["t_plain"]), path)
    return base_cfg.with_shape(report.shape), report


def report_lookup(cfg: DecodeConfig) -> int:
    """The prompt-lookup length an auto report for cfg is replayed with (and cached under): the branch
    runs in greedy dynamic decoding only, and -1 (the budget policy decides) reaches here as off."""
    return max(0, cfg.lookup_tokens) if cfg.mode == "dynamic" and cfg.greedy else 0


def fastest_vanilla(target: Target, t1: float) -> dict:
    """The fastest plain decoding of this model here: {"dtype", "tokens_per_s"}. On a CPU the precision
    probe's one-token forward per dtype (measured once, cached) scales `t1`, the target's own measured
    one-token forward (a precision the probe does not run, fp16 on a CPU, is compared by the probe's
    absolute times); on CUDA the target's dtype (bf16/fp16) is taken as the fastest."""
    own = dtype_name(target.dtype)
    # the load's own report where auto chose (its fp32 times are at the kernel the target runs on)
    ms = (target.dtype_report or choose_cpu_dtype(target))["ms"] if target.device.type == "cpu" else {}
    if ms and own not in ms:  # e.g. fp16 on a CPU: no ratio to it, so the probe's own times compete
        best = min(ms, key=lambda d: ms[d]["1"])
        if ms[best]["1"] / 1000 < t1:
            return {"dtype": best, "tokens_per_s": tokens_per_second(1, ms[best]["1"] / 1000)}
        return {"dtype": own, "tokens_per_s": tokens_per_second(1, t1)}
    best = min(ms, key=lambda d: ms[d]["1"]) if own in ms else own
    scale = ms[best]["1"] / ms[own]["1"] if own in ms else 1.0
    return {"dtype": best, "tokens_per_s": tokens_per_second(1, t1 * scale)}


def adaptive_costs(report: AutoReport) -> RoundCosts:
    """The per-round size model for the auto report's draft shape: verify costs by size (and by
    context length when measured at several), the shape's drafting cost, and the value calibration."""
    curve = report.curve
    scale = report.costs.verify_scale_tree  # a real decode's verify over the probe's, as round_cost prices it
    measured = {int(n): scale * t for n, t in report.t_verify.items()}
    by_context = {c: {n: scale * t for n, t in by_n.items()} for c, by_n in report.costs.verify_by_context.items()}
    best = next(r for r in curve if r["total_tokens"] == report.chosen["total_tokens"])
    fixed = max(0.0, best["round_s"] - measured[best["total_tokens"]])
    return RoundCosts.interpolate(measured, fixed, report.alpha, max(r["total_tokens"] for r in curve), by_context)


def tuned_config(target: Target, head: AnyHead, base_cfg: DecodeConfig, budget: str,
                 context: int | None = None,
                 report: AutoReport | None = None) -> tuple[DecodeConfig, RoundCosts | None, AutoReport]:
    """base_cfg with the auto budget (budget "auto"), or with auto's draft shape and an adaptive tree
    size ("adaptive": total_tokens becomes the cap, the largest size the shape can fill, and the
    returned round costs let each round pick its own size up to it, at that round's context length).
    `context`: the typical context length of the generation ahead (auto then chooses for it, from the
    costs measured at several lengths). `report`: the auto report already read for this pair (bench
    reads it once per run and tunes every prompt from it); None: auto_config reads or makes it. Also
    returns the auto report (with `context` and its choice there)."""
    if report is None:
        report = auto_config(target, head, base_cfg)[1]
    report = replace(report, context=None, context_choice=None)  # from auto's own choice, whatever it was given
    cfg = base_cfg.with_shape(report.shape)
    if budget == "auto":
        if context is not None:
            row = choice_at_context(report, context)
            choice = {**TreeShape.of(row).as_dict(), "speedup": row["speedup"] * report.same_dtype_factor,
                      "speedup_same_dtype": row["speedup"]}
            report = replace(report, context=context, context_choice=choice)
            cfg = cfg.with_shape(TreeShape.of(row))
        return cfg, None, report
    costs = adaptive_costs(report)
    return cfg.with_(total_tokens=len(costs.verify)), costs, report
