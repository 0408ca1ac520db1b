"""The prompt-lookup branch (eagle.core.lookup): what it copies, that greedy decoding with it stays exactly
vanilla's on the real model, how traces record it, and who turns it on."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle.core.config import DecodeConfig, SettingError
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import encode_prompt
from eagle.frames import nodes_frame
from eagle.core.lookup import ContextTokens, find_continuation
from eagle.records.trace import Trace, read_trace, write_trace
from eagle.tools.session import Session
from analysis.tables import calibration_sample, depth_rank_table

COPY_PROMPT = ("Repeat this sentence exactly, then stop: The treaty was signed on 12 March 1921, ratified on "
               "4 July 1922 and amended on 30 November 1925.")


def _reference(ctx: list[int], length: int, hi: int, lo: int) -> list[int]:
    """The spec, written the slow way: the longest suffix n-gram, its latest earlier occurrence."""
    for n in range(min(hi, len(ctx) - 1), lo - 1, -1):
        suffix = ctx[-n:]
        starts = [i for i in range(len(ctx) - n) if ctx[i:i + n] == suffix]
        if starts:
            return ctx[starts[-1] + n:starts[-1] + n + length]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(1, 6), st.integers(1, 4))
def test_continuation_matches_the_slow_reference(ctx, length, lo):
    hi = lo + 1
    got = find_continuation(np.array(ctx, dtype=np.int64), length, hi, lo)
    assert got == _reference(ctx, length, hi, lo)


def test_continuation_copies_after_the_latest_match_and_needs_two_tokens():
    ctx = np.array([5, 6, 1, 5, 6, 2, 9, 5, 6])
    assert find_continuation(ctx, 3) == [2, 9, 5]  # "5 6" last seen before "2 9 5"
    assert find_continuation(np.array([1, 2, 3, 4, 3]), 3) == []  # only a 1-gram recurs
    assert find_continuation(np.array([7]), 3) == []


def test_context_buffer_grows_past_its_capacity():
    ctx = ContextTokens([1, 2], capacity=3)
    ctx.extend([3, 4, 5])
    assert ctx.tokens.tolist() == [1, 2, 3, 4, 5]


def test_lookup_needs_greedy_dynamic_decoding():
    with pytest.raises(SettingError, match="lookup_tokens 4 needs greedy dynamic"):
        DecodeConfig(lookup_tokens=4, temperature=0.7).validate()
    with pytest.raises(SettingError, match="lookup_tokens 4 needs greedy dynamic"):
        DecodeConfig(mode="static", lookup_tokens=4).validate()
    with pytest.raises(SettingError, match="lookup_tokens must be in -1..64"):
        DecodeConfig(lookup_tokens=65).validate()


@pytest.mark.slow
def test_greedy_with_lookup_equals_vanilla_and_traces_say_which_nodes_were_copied(target, trained_head, tmp_path):
    ids = encode_prompt(target.tokenizer, COPY_PROMPT, target.max_context)
    vanilla = generate(Decoder(target, None, DecodeConfig(mode="vanilla", max_new_tokens=48)), ids)
    cfg = DecodeConfig(total_tokens=6, depth=1, top_k=4, draft_vocab=4096, max_new_tokens=48, lookup_tokens=10)
    gen = generate(Decoder(target, trained_head, cfg), ids)
    assert gen.tokens == vanilla.tokens
    copied = [n for s in gen.steps for n in s.nodes if n.source == "lookup"]
    assert copied and any(n.accepted for n in copied)  # the reply repeats the prompt: the branch pays
    plain = generate(Decoder(target, trained_head, cfg.with_(lookup_tokens=0)), ids)
    assert gen.tau > plain.tau
    context = list(ids)
    for step in gen.steps:  # a branch is a chain under the root, its ids after the head's nodes
        branch = [n for n in step.nodes if n.source == "lookup"]
        drafted = [n for n in step.nodes if n.source == "draft"]
        assert [n.depth for n in branch] == list(range(1, len(branch) + 1))
        assert all(n.id > max(d.id for d in drafted) for n in branch)
        if step.step > 0:  # the whole copy on offer, up to 10, after a miss as after a full take
            assert [n.token for n in branch] == find_continuation(np.array(context), 10)
        context += step.new_tokens
    # the trace keeps the source; calibration and the depth x rank table leave copies out
    path = tmp_path / "t.jsonl"
    write_trace(path, [Trace(Session.of(target, trained_head, "shipped").header(COPY_PROMPT, cfg, len(ids)), gen.steps)])
    back = read_trace(path)[0][0]
    assert [n.source for s in back.steps for n in s.nodes] == [n.source for s in gen.steps for n in s.nodes]
    nodes = nodes_frame(back)
    assert (nodes["source"] == "lookup").sum() == len(copied)
    assert len(calibration_sample(nodes)) == len(calibration_sample(nodes[nodes["source"] == "draft"]))
    assert depth_rank_table(nodes)["count"].sum() == depth_rank_table(nodes[nodes["source"] == "draft"])["count"].sum()


def test_budget_policy_decides_the_branch(target, random_head):
    session = Session.of(target, random_head, None)
    cfg, _, _ = session.tune(DecodeConfig(), "fixed")
    assert cfg.lookup_tokens == 0  # a fixed tree is the tree asked for
    cfg, _, _ = session.tune(DecodeConfig(lookup_tokens=3), "fixed")
    assert cfg.lookup_tokens == 3
    cfg, _, _ = session.tune(DecodeConfig(temperature=0.5), "fixed")
    assert cfg.lookup_tokens == 0
