"""The budget chooser on a synthetic cost model with a hand-computed optimum, the replay estimate of
accepted lengths, the per-machine cost cache, and auto_config on the real model."""
import json
from dataclasses import replace

import numpy as np
import torch
import pytest

from eagle.tools.budget import choice as budget_choice, costs as budget_costs
from eagle.tools.budget.choice import choose_budget
from eagle.tools.budget.costs import Costs
from eagle.tools.budget.replay import AcceptModel, Copies, StepSample, samples_from_steps
from eagle.records.timing import measured_under_load
from eagle.records.trace import NodeRecord, StepRecord
from eagle.core.config import DecodeConfig
from tests.tiny import tiny_pair


pytestmark = pytest.mark.usefixtures("single_thread")  # see conftest: OpenMP spin-waits under load


def _chain_model(n: int, depth: int, top_k: int, vocab: int = 0) -> float:
    """A draft whose top-1 chain is accepted with value 0.8^j at depth j (width does not help)."""
    return 1 + sum(0.8 ** j for j in range(1, min(depth + 1, n - 1) + 1))


def test_choose_budget_finds_the_known_optimum():
    # round cost: 10 ms + 1 ms per verified token + 2 ms per expansion per beam node
    costs = Costs("synthetic", {n: 0.010 + 0.001 * n for n in range(1, 11)},
                  {f"{k}/0": (0.0, 0.002 * k) for k in (1, 2, 4)}, overhead=0.0)
    n, depth, top_k, table = choose_budget(costs, _chain_model, 0, ns=tuple(range(1, 11)),
                                           depths=(1, 2, 3, 4, 5), top_ks=(1, 2, 4))
    # by hand: depth 1 -> 2.44 / 15 ms = 162.7 tok/s, depth 2 -> 2.952 / 18 ms = 164.0, depth 3 -> 160.1
    assert (n, depth, top_k) == (4, 2, 1)
    assert table[0]["tokens_per_s"] == pytest.approx(2.952 / 0.018)
    assert table[0]["speedup"] == pytest.approx(2.952 / 0.018 * 0.011)
    assert [r["tokens_per_s"] for r in table] == sorted((r["tokens_per_s"] for r in table), reverse=True)
    assert all(r["total_tokens"] - 1 <= r["top_k"] + r["depth"] * r["top_k"] ** 2 for r in table)


def _sample() -> StepSample:
    """Root -> a (0.9, accepted) -> c (0.72, accepted) -> e (0.36, accepted); b, d, f are rejected
    siblings. Recorded with top_k 2, depth 2 (so e's level is the second expansion)."""
    #                 a     b     c     d     e     f
    parent = np.array([-1, -1, 0, 0, 2, 2])
    value = np.array([0.9, 0.05, 0.72, 0.1, 0.36, 0.3])
    return StepSample(parent=parent, rank=np.array([0, 1, 0, 1, 0, 1]), depth=np.array([1, 1, 2, 2, 3, 3]),
                      value=value, token=np.array([10, 11, 12, 13, 14, 15]),
                      on_path=np.array([True, False, True, False, True, False]), accept_length=4,
                      kept_value_sum=float(value.sum()))


def test_replay_counts_the_accepted_path_a_budget_keeps():
    model = AcceptModel([_sample()], {0: None}, ns=(2, 3, 4, 5), depths=(1, 2), top_ks=(1, 2))
    # kept by value with top_k 2: a .9, c .72, e .36 (depth 2 only), f .3, d .1, b .05
    assert [model(n, 2, 2) for n in (2, 3, 4, 5)] == [2, 3, 4, 4]
    assert [model(n, 1, 2) for n in (2, 3, 4, 5)] == [2, 3, 3, 3]  # e needs a second expansion
    assert model(4, 2, 1) == 4  # the top-1 chain is the accepted path
    blocked = np.zeros(20, dtype=bool)
    blocked[[10, 11, 13, 14, 15]] = True  # c's token is outside the reduced vocabulary
    reduced = AcceptModel([_sample()], {8: blocked}, ns=(4,), depths=(2,), top_ks=(2,))
    assert reduced(4, 2, 2, 8) == 2
    root_only = AcceptModel([_sample()], {0: None}, ns=(2, 3), depths=(0, 1), top_ks=(2,))
    assert [root_only(n, 0, 2) for n in (2, 3)] == [2, 2]  # depth 0: a and b, no expansion
    assert root_only(3, 1, 2) == 3
    value = AcceptModel([_sample()], {0: None}, ns=(4,), depths=(2,), top_ks=(2,), method="value")
    assert value.alpha == pytest.approx(3 / 2.43)
    assert value(4, 2, 2) == pytest.approx(1 + 3 / 2.43 * (0.9 + 0.72 + 0.36))


def _generation(positions: list[int], offered: dict[int, tuple[int, int]], length: int) -> list[StepSample]:
    """_sample()'s round recorded at each position of one reply of `length` tokens, with the copy
    offered (tokens, matched) at the given positions and none elsewhere."""
    proposed, match = np.zeros(length + 1, dtype=np.int64), np.zeros(length + 1, dtype=np.int64)
    for at, (p, m) in offered.items():
        proposed[at], match[at] = p, m
    copies = Copies(proposed, match)
    return [replace(_sample(), position=at, copies=copies) for at in positions]


def test_replay_walks_the_reply_with_the_lookup_branch():
    # the head's path accepts 4 at budget (4, 2, 2) (see above), from every recorded round
    def model(*generations: list[StepSample]) -> AcceptModel:
        return AcceptModel([s for g in generations for s in g], {0: None}, ns=(4,), depths=(2,), top_ks=(2,),
                           lookup_tokens=6)
    walk = model(_generation([0, 4, 7], {0: (5, 4), 9: (5, 0)}, 10))
    # at 0: the copy offers 5, 4 match (> 3 drafted): accept 5; at 5 nothing
    # recurs: the head's 4 (the round recorded at 4 stands in), no branch; at 9: a copy of 5 missing at once
    # loses to the head: accept 4; the reply ends at 10. A long copy is one round, not one per recorded round.
    assert walk(4, 2, 2) == pytest.approx((5 + 4 + 4) / 3)
    assert walk.lookup_nodes(4, 2, 2) == pytest.approx((5 + 0 + 5) / 3)
    assert walk.lookup_share(4, 2, 2) == pytest.approx(2 / 3)  # the round at 5 verified no branch
    tie = model(_generation([0, 4, 8], {0: (3, 3), 4: (9, 9)}, 10))
    # a copy only as long as the head's path is not taken (acceptance keeps the head's): accept 4; the next
    # branch still offers its longest, 6 of the 9 (a branch does not shrink after a miss): accept 7, the end
    assert tie(4, 2, 2) == pytest.approx((4 + 7) / 2) and tie.lookup_nodes(4, 2, 2) == pytest.approx((3 + 6) / 2)
    assert tie.lookup_share(4, 2, 2) == pytest.approx(1)
    restart = model(_generation([0], {0: (3, 3)}, 2), _generation([0], {0: (9, 9)}, 7))
    assert restart(4, 2, 2) == pytest.approx((4 + 7) / 2)  # each generation walks its own reply
    plain = AcceptModel(_generation([0, 4, 7], {0: (5, 4)}, 10), {0: None}, ns=(4,), depths=(2,), top_ks=(2,))
    assert plain(4, 2, 2) == 4 and plain.lookup_nodes(4, 2, 2) == 0  # no branch: the copies are unused
    again = AcceptModel.from_json(json.loads(json.dumps(walk.to_json())))
    assert again(4, 2, 2) == walk(4, 2, 2) and again.lookup_nodes(4, 2, 2) == walk.lookup_nodes(4, 2, 2)
    assert again.lookup_share(4, 2, 2) == walk.lookup_share(4, 2, 2)
    with pytest.raises(ValueError, match="needs what it would copy"):
        AcceptModel([_sample()], {0: None}, ns=(4,), depths=(2,), top_ks=(2,), lookup_tokens=6)


def test_samples_know_what_a_copy_would_have_matched():
    def step(i: int, new: list[int]) -> StepRecord:
        nodes = [NodeRecord(0, -1, 0, 0, "", 1.0, 1.0, 0, True, True),
                 NodeRecord(1, 0, 1, new[0], "", 0.9, 0.9, 0, True, True)]
        return StepRecord(i, "dynamic" if i else "prefill", nodes if i else [], [], 0, "", new, "", len(new))
    prompt, steps = [5, 6, 7, 8, 5, 6], [step(0, [7]), step(1, [8, 9]), step(2, [5, 6, 7])]
    samples = samples_from_steps(steps, prompt)  # the reply: 7 8 9 5 6 7
    assert [s.position for s in samples] == [1, 3] and samples[0].copies is samples[1].copies
    copies = samples[0].copies
    # at 0 the prompt ends 5 6, which began it: the copy 7 8 5 6 meets 7 8 9; at 1 the context ends 5 6 7:
    # 8 5 6 7 meets 8 9; at 3 (ends 7 8 9) nothing recurs; at 6, the end, 5 6 7's latest earlier
    # occurrence offers 8 9 5 6 7, and nothing follows to meet it
    assert [(int(copies.proposed[r]), int(copies.match[r])) for r in (0, 1, 3, 6)] == [(4, 2), (4, 1), (0, 0), (5, 0)]
    assert samples_from_steps(steps)[0].copies is None  # without the prompt's ids no copy is known


def test_measured_verify_costs_never_fall_with_more_tokens():
    """A probe's dip below its smaller neighbour is noise (a verify of more tokens never costs less):
    pooled with its neighbours, as the least-squares non-decreasing fit does; a rising series stays."""
    probe = {1: 40.7, 2: 40.7, 3: 49.1, 4: 46.4, 5: 45.6, 6: 52.4, 8: 53.3}  # ms, 2026-12-07 (AMD EPYC, bf16)
    fitted = budget_costs.monotone(probe)
    assert fitted[3] == fitted[4] == fitted[5] == pytest.approx((49.1 + 46.4 + 45.6) / 3)
    assert {n: fitted[n] for n in (1, 2, 6, 8)} == {n: probe[n] for n in (1, 2, 6, 8)}
    assert sum(fitted.values()) == pytest.approx(sum(probe.values()))  # pooling keeps the mean
    rng = np.random.default_rng(0)
    for _ in range(50):
        noisy = {n: float(v) for n, v in zip((1, 2, 4, 8, 16), rng.uniform(0, 1, 5))}
        out = budget_costs.monotone(noisy)
        assert list(out) == sorted(noisy) and all(a <= b + 1e-12 for a, b in zip(out.values(), list(out.values())[1:]))
    assert budget_costs.monotone({1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0}


def test_verify_cost_interpolates():
    costs = Costs("k", {1: 1.0, 4: 4.0, 8: 6.0}, {"1/0": (1.0, 0.5)}, overhead=0.25)
    assert costs.t_verify(2) == pytest.approx(2.0) and costs.t_verify(6) == pytest.approx(5.0)
    assert costs.t_verify(10) == pytest.approx(7.0)  # extrapolated from the last segment
    assert costs.round_cost(4, 2, 1) == pytest.approx(4.0 + 2.0 + 0.25)
    assert costs.round_cost(1, 2, 1) == pytest.approx(1.0)  # plain decoding: no draft, no draft overhead
    assert costs.round_cost(2, 2, 1, lookup_nodes=2.0) == costs.round_cost(4, 2, 1)  # the branch is verified too
    # a branch of 4 in half the rounds: each kind of round at its own size (t(2) = 2, t(6) = 5), not t(4) for all
    assert costs.round_cost(2, 2, 1, lookup_nodes=2.0, lookup_share=0.5) == pytest.approx(0.5 * 2.0 + 0.5 * 5.0 + 2.25)
    hosted = Costs("k", {1: 1.0, 4: 4.0}, {"1/0": (1.0, 0.5)}, 0.25, prefill={32: 0.5, 192: 2.1},
                   host_tree=0.125, host_plain=0.0625)
    assert hosted.round_cost(4, 2, 1) == pytest.approx(4.0 + 2.0 + 0.25 + 0.125)
    assert hosted.round_cost(1, 2, 1) == hosted.t_plain() == pytest.approx(1.0625)
    assert hosted.t_prefill(112) == pytest.approx(1.3) and costs.t_prefill(112) == 0.0  # none measured: none added
    assert Costs.from_json(hosted.to_json()) == hosted
    # a real decode's verify over the probe's scales every verify the model prices, tree and plain alike
    scaled = replace(hosted, verify_scale_tree=1.5, verify_scale_plain=2.0)
    assert scaled.round_cost(4, 2, 1) == pytest.approx(1.5 * 4.0 + 2.0 + 0.25 + 0.125)
    assert scaled.t_plain() == pytest.approx(2.0 * 1.0 + 0.0625) and Costs.from_json(scaled.to_json()) == scaled
    # a real round's drafting over the probes' scales the draft and its overhead, per depth (not a constant)
    cold = replace(hosted, draft_scale=1.5)
    assert cold.round_cost(4, 2, 1) == pytest.approx(4.0 + 1.5 * (2.0 + 0.25) + 0.125)
    assert cold.round_cost(4, 4, 1) - cold.round_cost(4, 2, 1) == pytest.approx(1.5 * 2 * 0.5)
    assert cold.t_plain() == hosted.t_plain() and Costs.from_json(cold.to_json()) == cold
    longer = Costs("k", {1: 1.0, 8: 6.0}, {"1/0": (1.0, 0.5)}, 0.25,
                   verify_by_context={192: {1: 1.0, 8: 6.0}, 1024: {1: 2.0, 8: 10.0}})
    assert longer.t_verify(8) == longer.t_verify(8, 192) == pytest.approx(6.0)
    assert longer.t_verify(8, 608) == pytest.approx(8.0) and longer.t_verify(1, 1856) == pytest.approx(3.0)
    assert Costs.from_json(longer.to_json()).verify_by_context == longer.verify_by_context


def test_cost_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(budget_costs, "cache_dir", lambda: tmp_path)
    target, head = tiny_pair(vocab=12)
    grid = dict(ns=(1, 2, 4), top_ks=(1, 2), vocabs=(0, 6), repeats=1)
    costs = budget_costs.measure_costs(target, head, **grid)
    path = budget_costs.cost_path(costs.key)
    assert path.is_file() and str(tmp_path) in str(path) and "threads=" in costs.key
    assert set(costs.verify) == {1, 2, 4} and set(costs.draft) == {"1/0", "1/6", "2/0", "2/6"}
    assert all(v > 0 for v in costs.verify.values())
    loaded = budget_costs.load_costs(costs.key)
    assert loaded.verify == costs.verify and loaded.draft == costs.draft and loaded.overhead == costs.overhead

    def fail(*args, **kwargs):
        raise AssertionError("measured again despite the cache")
    real_measure = budget_costs._measure
    monkeypatch.setattr(budget_costs, "_measure", fail)
    monkeypatch.setattr(budget_costs, "probe_t1", lambda *a, **k: costs.t_verify(1))  # the machine as measured
    assert budget_costs.measure_costs(target, head, **grid).verify == costs.verify
    monkeypatch.setattr(budget_costs, "probe_t1", lambda *a, **k: costs.t_verify(1) * 3)  # busier now: keep
    assert budget_costs.measure_costs(target, head, **grid).verify == costs.verify
    monkeypatch.setattr(budget_costs, "probe_t1", lambda *a, **k: costs.t_verify(1) / 3)  # cache timed under load
    calls = []
    monkeypatch.setattr(budget_costs, "_measure", lambda *a, **k: calls.append(1) or real_measure(*a, **k))
    budget_costs.measure_costs(target, head, **grid)
    assert calls == [1]  # measured again (and saved)
    monkeypatch.setattr(budget_costs, "_measure", fail)
    monkeypatch.setattr(budget_costs, "probe_t1", lambda *a, **k: budget_costs.load_costs(costs.key).t_verify(1))
    with pytest.raises(AssertionError):  # a grid the cache does not cover is measured
        budget_costs.measure_costs(target, head, **{**grid, "ns": (1, 2, 4, 8)})
    path.write_text("{broken")
    assert budget_costs.load_costs(costs.key) is None


def test_host_terms_decode_the_tree_and_plain_side_by_side(tmp_path, monkeypatch):
    """What the model predicts is a tree round over a plain token, so the two calibration decodes share
    the same seconds of a drifting machine: each decodes a stretch of HOST_STRETCH tokens while the other
    waits (plain rounds follow plain rounds, as a vanilla decode's do), never further ahead, and every
    round of both is counted."""
    monkeypatch.setattr(budget_costs, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(budget_costs, "HOST_STRETCH", 4)
    target, head = tiny_pair(vocab=12, eos=None)
    costs = budget_costs.measure_costs(target, head, ns=(1, 2, 4), top_ks=(2,), vocabs=(0,), repeats=1,
                                       contexts=())
    seen = []
    real_add = budget_costs._DecodeTerms.add

    def add(self, step, prompt_tokens):
        seen.append((self.cfg.mode, step.step, len(step.new_tokens)))
        real_add(self, step, prompt_tokens)
    monkeypatch.setattr(budget_costs._DecodeTerms, "add", add)
    chosen = {"total_tokens": 4, "depth": 1, "top_k": 2, "draft_vocab": 0}
    hosted = budget_costs.host_terms(target, head, costs, chosen, [[1, 2, 3], [4, 5]], max_new_tokens=12)
    assert hosted.verify_scale_tree > 0 and hosted.verify_scale_plain > 0 and hosted.draft_scale > 0
    for start in [i for i, (_, step, _) in enumerate(seen) if step == 0 and seen[i][0] == "dynamic"]:
        made, order = {"dynamic": 0, "vanilla": 0}, []
        for mode, step, n in seen[start:]:
            if step == 0 and made[mode]:  # the next prompt
                break
            if max(made.values()) < 12:  # both decoding: the one going is at most a stretch ahead
                assert made[mode] - min(made.values()) < 4
                order.append(mode)
            made[mode] += n
        assert made == {"dynamic": 12, "vanilla": 12}
        assert any(a == b == "dynamic" for a, b in zip(order, order[1:]))  # tree rounds back to back, not a round each
    assert sum(1 for mode, _, _ in seen if mode == "vanilla") == 2 * 12  # every plain token: prefill + 11 rounds


def test_host_terms_price_a_rounds_drafting_apart_from_its_host_work() -> None:
    """The draft scale is the rounds' drafting (draft steps, consume, commit) over the probes' draft and
    overhead; the host term is what is left outside verify, acceptance and drafting; a plain round's commit
    is host work (it drafts nothing)."""
    costs = Costs("k", {1: 0.010, 4: 0.020}, {"2/0": (0.001, 0.002)}, overhead=0.0005)
    tree = DecodeConfig(mode="dynamic", total_tokens=4, depth=1, top_k=2)
    terms = budget_costs._DecodeTerms(costs, tree)

    def step(i: int, kept: int, timings: dict) -> StepRecord:
        nodes = [NodeRecord(j, j - 1, j, 5, "t", 1.0, 1.0, 0, j < kept, j == 0, None) for j in range(max(kept, 1))]
        return StepRecord(step=i, mode="dynamic", nodes=nodes, accepted=[0], bonus_token=1, bonus_text="t",
                          new_tokens=[1], new_text="t", accept_length=1, timings=timings, finished=None)
    terms.add(step(0, 0, {"prefill": 0.05}), 10)
    terms.add(step(1, 4, {"draft.0": 0.002, "draft.1": 0.004, "tree": 0.001, "verify": 0.020, "accept": 0.002,
                          "commit": 0.0005, "consume": 0.0015, "record": 0.001}), 10)
    scale, host, draft = terms.result()
    assert scale == pytest.approx(0.022 / 0.020)
    assert draft == pytest.approx(0.008 / (0.001 + 1 * 0.002 + 0.0005))  # 8 ms drafted where the probes say 3.5
    assert host == pytest.approx(0.002)  # tree + record
    plain = budget_costs._DecodeTerms(costs, tree.with_(mode="vanilla"))
    plain.add(step(0, 0, {"prefill": 0.05}), 10)
    plain.add(step(1, 1, {"tree": 0.0002, "verify": 0.010, "accept": 0.0003, "commit": 0.0004, "record": 0.0001}), 10)
    assert plain.result()[1] == pytest.approx(0.0007) and plain.result()[2] == 1.0


def test_a_cache_timed_under_load_is_stale():
    assert measured_under_load(0.30, 0.042)  # 7x slower than the machine is now
    assert not measured_under_load(0.045, 0.042) and not measured_under_load(0.042, 0.30)
    target, head = tiny_pair(vocab=12)
    assert 0 < budget_costs.probe_t1(target, head, prefix_len=8, repeats=2) < 1


@pytest.mark.slow
def test_auto_config_on_the_real_model(target, random_head, tmp_path, monkeypatch):
    monkeypatch.setattr(budget_costs, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(budget_choice, "cache_dir", lambda: tmp_path)
    base = DecodeConfig(max_new_tokens=7)
    cfg, report = budget_choice.auto_config(target, random_head, base, prompts=["Name a fruit."], max_new_tokens=6,
                                     repeats=1, ns=(1, 2, 8, 16), top_ks=(1, 4))
    assert cfg.max_new_tokens == 7 and cfg.draft_vocab == 0  # a random head has no token counts
    assert (cfg.total_tokens, cfg.depth, cfg.top_k) == tuple(report.chosen[k] for k in ("total_tokens", "depth",
                                                                                          "top_k"))
    assert cfg.total_tokens in (2, 8, 16) and cfg.top_k in (1, 4)
    assert report.calibration_rounds > 0 and report.top[0]["tokens_per_s"] > 0
    curve = report.curve  # the chosen shape at every tree size: what the dashboard plots
    assert [r["total_tokens"] for r in curve] == sorted(r["total_tokens"] for r in curve)
    assert {(r["depth"], r["top_k"]) for r in curve} == {(cfg.depth, cfg.top_k)}
    assert max(curve, key=lambda r: r["tokens_per_s"])["total_tokens"] == cfg.total_tokens
    # vanilla: the fastest precision this CPU runs (never slower than the target's own), named
    # plain decoding costs the one-token verify plus what a real plain round spends beyond it (measured)
    # (its one-token verify scaled by what real decoding showed over the probe: measured, positive)
    costs = report.costs
    assert costs.verify_scale_plain > 0 and costs.verify_scale_tree > 0
    assert report.t_plain == pytest.approx(costs.verify_scale_plain * report.t_verify["1"] + report.host_ms["plain"] / 1000)
    assert report.vanilla_same_dtype_tokens_per_s == pytest.approx(1 / report.t_plain)
    assert sorted(costs.prefill) == sorted({min(p, budget_costs.PREFIX_LEN) for p in budget_costs.PREFILL_LENS})
    assert min(costs.prefill.values()) > 0
    assert costs.host_tree == pytest.approx(report.host_ms["tree"] / 1000)
    c = report.chosen
    assert report.top[0]["round_s"] == pytest.approx(costs.round_cost(c["total_tokens"], c["depth"], c["top_k"],
                                                                         c["draft_vocab"]))
    # a generation's expected time: its prompt's prefill, then rounds of E[accept] tokens each
    assert budget_choice.expected_seconds(report, 40, 1) == pytest.approx(costs.t_prefill(40))
    assert budget_choice.expected_seconds(report, 40, 65) > budget_choice.expected_seconds(report, 40, 33) > costs.t_prefill(40)
    assert report.vanilla_tokens_per_s >= report.vanilla_same_dtype_tokens_per_s
    assert report.vanilla_dtype in ("float32", "bfloat16") and "fastest here" in report.vanilla_label
    assert report.expected_speedup == pytest.approx(report.expected_speedup_same_dtype *
                                                       report.vanilla_same_dtype_tokens_per_s /
                                                       report.vanilla_tokens_per_s)
    assert report.beats_vanilla == (report.expected_speedup > 1)
    as_json = json.loads(json.dumps(report.to_json()))  # budget --json and bench's summary.json
    assert as_json["chosen"] == report.chosen and budget_costs.Costs.from_json(as_json["costs"]) == report.costs
    contexts = [row["context"] for row in report.by_context]
    assert contexts == sorted(budget_costs.CONTEXTS)  # verify timed over each prefix; a budget chosen for each
    row = budget_choice.choice_at_context(report, 192)  # the cached report chooses again without measuring
    assert {k: row[k] for k in report.chosen} == report.chosen
    assert report.lookup_tokens == 0 and report.expected_lookup_nodes == 0  # lookup_tokens -1 reaches auto as off
    # a prompt-lookup branch is replayed with every budget: another report (same measured costs), which
    # copies where the reply repeats its prompt and pays for the branch's nodes in its rounds
    _, copying = budget_choice.auto_config(target, random_head, base.with_(lookup_tokens=10),
                                           prompts=["Repeat exactly: one two three one two three one two three"],
                                           max_new_tokens=16, repeats=1, ns=(1, 2, 8, 16), top_ks=(1, 4))
    assert copying.lookup_tokens == 10 and copying.auto_file != report.auto_file
    assert copying.costs_file == report.costs_file and copying.expected_lookup_nodes > 0
    best = copying.top[0]
    assert best["round_s"] == pytest.approx(copying.costs.round_cost(
        best["total_tokens"], best["depth"], best["top_k"], best["draft_vocab"], lookup_nodes=best["lookup_nodes"],
        lookup_share=best["lookup_share"]))
    assert 0 < best["lookup_share"] <= 1 and budget_choice.expected_round_s(copying) == pytest.approx(best["round_s"])

    def fail(*args, **kwargs):
        raise AssertionError("searched again despite the cache")
    monkeypatch.setattr(budget_choice, "probe_t1", lambda *a, **k: report.t_verify["1"])
    monkeypatch.setattr(budget_choice, "_auto_report", fail)
    again, cached = budget_choice.auto_config(target, random_head, base, prompts=["Name a fruit."], max_new_tokens=6,
                                       repeats=1, ns=(1, 2, 8, 16), top_ks=(1, 4))
    assert again == cfg and cached.chosen == report.chosen
    monkeypatch.setattr(budget_choice, "probe_t1", lambda *a, **k: report.t_verify["1"] / 2)  # cache was loaded
    with pytest.raises(AssertionError, match="searched again"):
        budget_choice.auto_config(target, random_head, base, prompts=["Name a fruit."], max_new_tokens=6, repeats=1,
                           ns=(1, 2, 8, 16), top_ks=(1, 4))
    monkeypatch.setattr(budget_choice, "probe_t1", lambda *a, **k: report.t_verify["1"])
    monkeypatch.setattr(budget_choice, "COSTS_VERSION", budget_choice.COSTS_VERSION + 1)  # a new cost model
    with pytest.raises(AssertionError, match="searched again"):  # the report embedding the old costs is not used
        budget_choice.auto_config(target, random_head, base, prompts=["Name a fruit."], max_new_tokens=6, repeats=1,
                           ns=(1, 2, 8, 16), top_ks=(1, 4))

    # tuned_config on the cached report: auto chooses for the generation's context, adaptive per round
    monkeypatch.setattr(budget_choice, "auto_config", lambda t, h, c, **kw: (c.with_(**report.chosen), report))
    long_cfg, _, long_report = budget_choice.tuned_config(target, random_head, base, "auto", context=1500)
    assert long_report.context == 1500
    assert long_cfg.total_tokens == long_report.context_choice["total_tokens"] == \
        budget_choice.choice_at_context(report, 1500)["total_tokens"]
    _, round_costs, _ = budget_choice.tuned_config(target, random_head, base, "adaptive")
    assert round_costs.contexts == budget_costs.CONTEXTS and round_costs.verify_at(2048) != round_costs.verify


def test_fastest_vanilla_names_the_precision_that_is_fastest_here(monkeypatch):
    """Against the precision probe's times: the target's own dtype is scaled by their ratio; a dtype the
    probe does not run (fp16 on a CPU) competes by the probe's absolute times, never claimed fastest blindly."""
    from types import SimpleNamespace
    ms = {"float32": {"1": 55.0, "8": 75.0}, "bfloat16": {"1": 37.0, "8": 41.0}}
    monkeypatch.setattr(budget_choice, "choose_cpu_dtype", lambda target: {"ms": ms})
    cpu = torch.device("cpu")
    target = lambda dtype, report=None: SimpleNamespace(dtype=dtype, device=cpu, dtype_report=report)  # noqa: E731
    fp32 = budget_choice.fastest_vanilla(target(torch.float32), 0.060)
    assert fp32["dtype"] == "bfloat16" and fp32["tokens_per_s"] == pytest.approx(1 / (0.060 * 37 / 55))
    # a load under --dtype auto brings its own report: fp32's times at the kernel it runs (here oneDNN's)
    packed = {"ms": {**ms, "float32": {"1": 36.0, "8": 50.0}}}
    assert budget_choice.fastest_vanilla(target(torch.float32, packed), 0.060) == \
        {"dtype": "float32", "tokens_per_s": pytest.approx(1 / 0.060)}
    slow_fp16 = budget_choice.fastest_vanilla(target(torch.float16), 0.300)
    assert slow_fp16 == {"dtype": "bfloat16", "tokens_per_s": pytest.approx(1 / 0.037)}
    fast_fp16 = budget_choice.fastest_vanilla(target(torch.float16), 0.020)
    assert fast_fp16 == {"dtype": "float16", "tokens_per_s": pytest.approx(50.0)}
