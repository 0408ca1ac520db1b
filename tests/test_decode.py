"""The EAGLE-2 decoder end to end: lossless greedy on the real model, lossless sampling on a tiny one,
draft head checkpoints, traces."""
import json
from collections import Counter
from dataclasses import asdict

import pytest
import torch
from scipy.stats import chisquare

from eagle.core.adaptive import RoundCosts
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import PromptError, encode_prompt
from eagle.models.head import new_head
from eagle.models.headio import HeadMismatchError, load_head, save_head
from eagle.records.trace import Trace, TraceHeader, read_trace, write_trace
from eagle.core.verify import process_logits
from tests.tiny import tiny_pair

SMALL = dict(total_tokens=8, depth=3, top_k=3)


def _tokens(target, head, prompt_ids, **cfg):
    return generate(Decoder(target, head, DecodeConfig(**cfg)), prompt_ids)


@pytest.fixture(scope="module")
def vanilla_refs(target, mt_prompts):
    """Plain greedy continuations of 8 MT-bench first turns (one per category), 128 new tokens each.
    Decoded once per test run: the first xdist worker writes them to the run's cache under a lock, the
    other reads them (about a minute of fp32 decoding saved)."""
    from eagle.records.files import atomic_write_json, exclusive_lock, read_json_or_none
    from eagle.models.location import cache_dir
    path = cache_dir() / "test-vanilla-refs.json"
    with exclusive_lock(cache_dir() / ".test-vanilla-refs.lock", "the vanilla references", wait=True):
        refs = read_json_or_none(path)
        if refs is None:
            refs = []
            for q in mt_prompts[::10]:  # the file is grouped by category, 10 questions each
                ids = encode_prompt(target.tokenizer, q["turns"][0], target.max_context)
                refs.append((ids, _tokens(target, None, ids, mode="vanilla", max_new_tokens=128).tokens))
            atomic_write_json(path, refs)
    return [(list(ids), list(ref)) for ids, ref in refs]


@pytest.mark.slow
@pytest.mark.parametrize("mode, every", [("dynamic", 2), ("static", 4)])
def test_greedy_equals_vanilla_with_random_head(target, random_head, vanilla_refs, mode, every):
    # A random head is rejected almost everywhere, so every round exercises the bonus-token and cache-rollback
    # path: four categories (writing, reasoning, coding, stem) x 64 tokens cover it (two for the static
    # tree, which drafts all 63 nodes of its tree every round); the trained head, whose long accepted paths reach
    # deeper into the cache, runs all eight categories x 128 tokens (EAGLE-2's dynamic tree) and four
    # (the static tree).
    for ids, ref in vanilla_refs[::every]:
        assert _tokens(target, random_head, ids, mode=mode, max_new_tokens=64, **SMALL).tokens == ref[:64]


@pytest.mark.slow
@pytest.mark.parametrize("mode, every", [("dynamic", 1), ("static", 2)])
def test_greedy_equals_vanilla_with_trained_head(target, trained_head, vanilla_refs, mode, every):
    # the dynamic tree carries the prompt-lookup branch the auto budget adds (the random-head sweep runs without)
    lookup = dict(lookup_tokens=10) if mode == "dynamic" else {}
    taus = []
    for ids, ref in vanilla_refs[::every]:
        g = _tokens(target, trained_head, ids, mode=mode, max_new_tokens=128, total_tokens=24, depth=5, top_k=6,
                    **lookup)
        assert g.tokens == ref
        taus.append(g.tau)
    assert sum(taus) / len(taus) > 1.2  # a trained head is accepted at least sometimes


@pytest.mark.slow
@pytest.mark.parametrize("total_tokens, depth, top_k", [(16, 4, 4), (3, 0, 2)])  # depth 0: root's children only
def test_reduced_draft_vocabulary_is_lossless(target, trained_head, vanilla_refs, total_tokens, depth, top_k):
    allowed = set(trained_head.draft_vocab_ids(4096).tolist())
    for ids, ref in vanilla_refs[:3]:
        g = _tokens(target, trained_head, ids, mode="dynamic", max_new_tokens=128, total_tokens=total_tokens,
                    depth=depth, top_k=top_k, draft_vocab=4096)
        assert g.tokens == ref
        assert all(n.token in allowed for s in g.steps for n in s.nodes[1:])
        for s in g.steps[1:]:  # root + top_k + depth * top_k^2 candidates, none deeper than depth + 1
            assert len(s.nodes) == 1 + top_k + depth * top_k ** 2
            assert max(n.depth for n in s.nodes) == depth + 1


@pytest.mark.slow
def test_paper_budget_is_lossless_too(target, random_head, vanilla_refs):
    ids, ref = vanilla_refs[0]
    g = _tokens(target, random_head, ids, mode="dynamic", max_new_tokens=32)  # defaults: 60 / 6 / 10
    assert g.tokens == ref[:32]
    assert max(sum(n.kept for n in s.nodes) for s in g.steps[1:]) == 60


def test_defaults_are_the_papers():
    d = DecodeConfig()
    assert (d.total_tokens, d.depth, d.top_k) == (60, 6, 10)


def test_step_records_describe_the_tree(target, random_head):
    ids = encode_prompt(target.tokenizer, "List three fruits.", target.max_context)
    g = _tokens(target, random_head, ids, mode="dynamic", max_new_tokens=12, total_tokens=10, depth=3, top_k=4)
    for step in g.steps[1:]:
        by_id = {n.id: n for n in step.nodes}
        assert len(step.nodes) == 1 + 4 + 3 * 16  # root + top_k + depth * top_k^2 candidates
        assert sum(n.kept for n in step.nodes) == 10
        for n in step.nodes[1:]:
            assert by_id[n.parent].depth == n.depth - 1
            assert n.kept <= by_id[n.parent].kept  # the verified set is a connected tree
            assert abs(n.value - by_id[n.parent].value * n.confidence) < 1e-4
            assert (n.target_prob is not None) == n.kept
        assert step.accepted[0] == 0 and len(step.accepted) == step.accept_length
        assert step.new_tokens[:len(step.accepted) - 1] == [by_id[i].token for i in step.accepted[1:]]
    assert sum(len(s.new_tokens) for s in g.steps) == len(g.tokens)


def test_trace_round_trip(tmp_path, target, random_head):
    ids = encode_prompt(target.tokenizer, "Hi!", target.max_context)
    cfg = DecodeConfig(mode="dynamic", max_new_tokens=6, **SMALL)
    g = generate(Decoder(target, random_head, cfg), ids)
    path = tmp_path / "t.jsonl"
    write_trace(path, [Trace(TraceHeader(target.name, "random", asdict(cfg), "Hi!", len(ids)), g.steps)])
    with open(path, "a") as f:
        f.write('{"kind": "step", "step": 9, "no')  # a truncated last line
    traces, report = read_trace(path)
    assert report.skipped_lines == 1 and report.steps == len(g.steps)
    assert traces[0].steps[1] == g.steps[1]


# ---- sampling is lossless: the decoder's output distribution equals the target's -------------
def _exact_two_token_dist(target, prompt, temperature, top_p):
    """p(x1, x2) of the target's processed distribution, by enumeration over a tiny vocabulary."""
    ids = torch.tensor([prompt])
    logits = target.model(ids).logits[0, -1].float()
    p1 = process_logits(logits, temperature, top_p, 0)
    dist = {}
    for x1 in range(p1.numel()):
        if p1[x1] > 0:
            l2 = target.model(torch.tensor([prompt + [x1]])).logits[0, -1].float()
            p2 = process_logits(l2, temperature, top_p, 0)
            for x2 in range(p2.numel()):
                dist[(x1, x2)] = float(p1[x1] * p2[x2])
    return dist


@pytest.mark.parametrize("mode, temperature, top_p, draft_vocab, dtype", [
    ("dynamic", 0.7, 1.0, 0, torch.float32), ("static", 1.0, 1.0, 0, torch.float32),
    ("dynamic", 1.3, 0.9, 0, torch.float32), ("dynamic", 0.8, 1.0, 3, torch.float32),
    ("static", 0.8, 1.0, 4, torch.float32),  # the draft sees 3 or 4 of the 6 tokens
    ("dynamic", 0.7, 1.0, 0, torch.bfloat16), ("static", 0.8, 1.0, 4, torch.bfloat16)])
@pytest.mark.slow
def test_sampling_preserves_the_target_distribution(mode, temperature, top_p, draft_vocab, dtype, single_thread):
    """Chi-square of the first two new tokens over many seeds against the exact p(x1) p(x2 | x1).
    The second token comes from a drafted round (accepted draft or bonus), so this checks the tree
    acceptance rule and the bonus token's temperature. The tiny target has no EOS. In bf16 the
    exact distribution is the bf16 target's own (sampling has no near-tie issue: probabilities are
    compared, not argmaxes)."""
    target, head = tiny_pair(vocab=6, seed=4, eos=None)
    target.model.to(dtype)
    head.to(dtype)
    head.token_counts.copy_(torch.tensor([1, 9, 2, 8, 3, 7]))  # most frequent first: 1, 3, 5, 4
    prompt = [1, 2, 3]
    exact = _exact_two_token_dist(target, prompt, temperature, top_p)
    counts, trials = Counter(), 1500
    cfg = DecodeConfig(mode=mode, max_new_tokens=2, temperature=temperature, top_p=top_p,
                       total_tokens=6, depth=2, top_k=2, draft_vocab=draft_vocab)
    for seed in range(trials):
        g = generate(Decoder(target, head, cfg.with_(seed=seed)), prompt)
        counts[tuple(g.tokens[:2])] += 1
        if draft_vocab:  # tokens outside the draft vocabulary are never drafted
            allowed = set(head.draft_vocab_ids(draft_vocab).tolist())
            assert all(n.token in allowed for s in g.steps for n in s.nodes[1:])
    keys = sorted(exact)
    expected = [exact[k] * trials for k in keys]
    observed = [counts.get(k, 0) for k in keys]
    assert sum(observed) == trials
    big = [i for i, e in enumerate(expected) if e >= 5]  # pool rare cells so chi-square is valid
    obs = [observed[i] for i in big] + [trials - sum(observed[i] for i in big)]
    exp = [expected[i] for i in big] + [trials - sum(expected[i] for i in big)]
    assert chisquare(obs, exp).pvalue > 1e-3


# ---- draft head checkpoints ----------------------------------------------------------------
def test_head_save_load_round_trip_official_layout(tmp_path, target):
    head = new_head(target, seed=2)
    save_head(head, tmp_path / "h")
    from safetensors.torch import load_file
    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert "layers.0.post_attention_layernorm.weight" in keys
    assert not any(k.startswith(("embed_tokens", "norm", "lm_head", "layers.0.input_layernorm")) for k in keys)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152
    loaded = load_head(tmp_path / "h", target)
    x, f = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, 576)
    pos = torch.arange(3)[None]
    assert torch.allclose(head(x, f, pos), loaded(x, f, pos), atol=2e-2)  # fp16 on disk


def test_head_loads_official_pytorch_bin_with_embedding(tmp_path, target):
    """Official checkpoints ship pytorch_model.bin and may include embed_tokens."""
    head = new_head(target, seed=5)
    save_head(head, tmp_path / "h", include_embedding=True, dtype=torch.float32)
    state = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "h" / "model.safetensors"))
    (tmp_path / "h" / "model.safetensors").unlink()
    torch.save(state, tmp_path / "h" / "pytorch_model.bin")
    loaded = load_head(tmp_path / "h", target)
    assert torch.equal(loaded.embed_tokens.weight, target.model.model.embed_tokens.weight)


def test_head_that_does_not_match_its_target_is_refused(tmp_path, target):
    tiny, tiny_head = tiny_pair()
    save_head(tiny_head, tmp_path / "tiny", include_embedding=True)
    with pytest.raises(HeadMismatchError, match="vocab_size 12 but the target has 49152"):
        load_head(tmp_path / "tiny", target)


def test_bad_prompts_are_refused_clearly(target):
    with pytest.raises(PromptError, match="empty"):
        encode_prompt(target.tokenizer, "  ", target.max_context)
    with pytest.raises(PromptError, match="context holds"):
        encode_prompt(target.tokenizer, "word " * 9000, target.max_context)


def _records(steps) -> list[dict]:
    """Step records without their timings' values (wall times differ run to run; the phases do not)."""
    return [{**asdict(s), "timings": sorted(s.timings)} for s in steps]


def _interleaved(decoder: Decoder, prompts: list[list[int]]) -> list[list]:
    """Run one step generator per prompt on the same Decoder, one next() each in turn."""
    gens, out = [decoder.steps(p) for p in prompts], [[] for _ in prompts]
    live = set(range(len(prompts)))
    while live:
        for i in sorted(live):
            record = next(gens[i], None)
            if record is None:
                live.discard(i)
            else:
                out[i].append(record)
    return out


@pytest.mark.parametrize("mode, temperature, adaptive", [
    ("vanilla", 0.0, False), ("static", 0.0, False), ("dynamic", 0.0, False), ("dynamic", 0.0, True),
    ("vanilla", 0.8, False), ("static", 0.8, False), ("dynamic", 0.8, False)])
def test_one_decoder_runs_interleaved_generations(mode, temperature, adaptive, single_thread):
    """Per-generation state lives in a DecodeState, not the Decoder: generations interleaved step by
    step on one Decoder give exactly what separate Decoders give (tokens and every trace record),
    the same prompt twice included (each generation has its own sampling RNG)."""
    target, head = tiny_pair(vocab=12, seed=2, eos=None)
    costs = RoundCosts((1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6), fixed=0.3, alpha=1.0) if adaptive else None
    cfg = DecodeConfig(mode=mode, max_new_tokens=20, temperature=temperature, seed=7, **SMALL)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [1, 2, 3]]
    alone = [_records(generate(Decoder(target, head, cfg, costs), p).steps) for p in prompts]
    shared = [_records(steps) for steps in _interleaved(Decoder(target, head, cfg, costs), prompts)]
    assert shared == alone
    assert len(alone[0]) > 2 and alone[0] != alone[1]  # several rounds each, and different generations


def test_long_generation_stops_at_the_context_limit(single_thread):
    target, head = tiny_pair(vocab=12, seed=1, eos=None)
    target.model.config.max_position_embeddings = 40
    for mode in ("vanilla", "dynamic", "static"):
        g = generate(Decoder(target, head, DecodeConfig(mode=mode, max_new_tokens=1000, **SMALL)), [1, 2, 3])
        assert g.finished == "context"
        assert len(g.tokens) <= 40 - 3
