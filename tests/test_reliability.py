"""Bad input and long runs: clear errors, nothing lost, the cache never overflows."""
import json
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle.config import DecodeConfig
from eagle.decode import Decoder, PromptError, generate
from eagle.trace import NodeRecord, StepRecord, Trace, TraceFormatError, TraceHeader, read_trace, write_trace
from tests.tiny import tiny_pair

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("field, value, message", [
    ("total_tokens", 0, "total_tokens"), ("total_tokens", 5000, "total_tokens"), ("depth", -1, "depth"),
    ("top_k", 0, "top_k"), ("temperature", -0.5, "temperature"), ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"), ("max_new_tokens", 0, "max_new_tokens"), ("mode", "medusa", "mode"),
])
def test_out_of_range_parameters_are_one_clear_sentence(field, value, message):
    with pytest.raises(ValueError, match=message) as err:
        DecodeConfig().with_(**{field: value})
    assert str(err.value).count(".") <= 2 and "\n" not in str(err.value)


@pytest.mark.parametrize("mode, temperature", [("vanilla", 0.0), ("static", 0.0), ("dynamic", 0.0),
                                               ("static", 0.9), ("dynamic", 0.9)])
def test_1024_new_tokens_in_every_mode(mode, temperature):
    target, head = tiny_pair(vocab=16, seed=2, eos=None)
    target.model.config.max_position_embeddings = 2048
    cfg = DecodeConfig(mode=mode, max_new_tokens=1100, temperature=temperature, total_tokens=12, depth=3, top_k=3)
    g = generate(Decoder(target, head, cfg), [1, 2, 3])
    assert len(g.tokens) == 1100 and g.finished == "max_new_tokens"


@pytest.mark.parametrize("mode", ["vanilla", "static", "dynamic"])
def test_prompt_near_the_context_limit_stops_cleanly(mode):
    target, head = tiny_pair(vocab=16, seed=3, eos=None)
    target.model.config.max_position_embeddings = 64
    g = generate(Decoder(target, head, DecodeConfig(mode=mode, max_new_tokens=50, total_tokens=30)), [1] * 60)
    assert g.finished == "context" and 1 <= len(g.tokens) <= 4
    with pytest.raises(PromptError, match="context holds 64"):
        next(Decoder(target, head, DecodeConfig(mode=mode)).steps([1] * 64))


def test_mode_needing_a_head_without_one():
    target, _ = tiny_pair()
    with pytest.raises(ValueError, match="needs a draft head"):
        Decoder(target, None, DecodeConfig(mode="dynamic"))


# ---- trace files ----------------------------------------------------------------------------
def _trace(n_steps: int) -> Trace:
    node = NodeRecord(0, -1, 0, 5, "a", 1.0, 1.0, 0, True, True, None)
    steps = [StepRecord(i, "dynamic", [node], [0], 7, "b", [7], "b", 1, {"verify": 0.1}) for i in range(n_steps)]
    return Trace(TraceHeader("m", None, asdict(DecodeConfig()), "p", 3), steps)


def test_truncated_trace_keeps_every_complete_record(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, [_trace(5), _trace(3)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])  # cut the last record in half
    traces, report = read_trace(path)
    assert [len(t.steps) for t in traces] == [5, 2] and report.skipped_lines == 1


def test_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\nnot json\n')
    with pytest.raises(TraceFormatError, match="no readable trace"):
        read_trace(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
                                  st.just('{"kind": "step"}'), st.just('{"kind": "header", "schema": 1}')),
                        max_size=6),
       where=st.integers(0, 8))
def test_trace_reader_fuzz(tmp_path, garbage, where):
    """Random junk spliced into a valid trace: every valid record is still read, junk is counted."""
    good = _trace(8)
    lines = [json.dumps(good.header.to_dict())] + [json.dumps(s.to_dict()) for s in good.steps]
    junk = [g.replace("\n", " ").replace("\r", " ") for g in garbage]
    junk = [j for j in junk if j.strip()]
    at = min(1 + where, len(lines))
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(lines[:at] + junk + lines[at:]) + "\n", encoding="utf-8")
    traces, report = read_trace(path)
    assert sum(len(t.steps) for t in traces) == 8
    assert report.skipped_lines == len(junk)


@pytest.mark.parametrize("total_tokens, depth, top_k", [(1, 6, 10), (2, 1, 1), (5, 1, 4), (30, 4, 1)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_degenerate_budgets_still_decode_losslessly(total_tokens, depth, top_k, temperature):
    """top_k 1, depth 1 and total_tokens 1 (a verify of the root alone) are valid budgets."""
    target, head = tiny_pair(vocab=16, seed=5, eos=None)
    base = DecodeConfig(max_new_tokens=40, temperature=temperature, seed=7)
    ref = generate(Decoder(target, None, base.with_(mode="vanilla")), [1, 2, 3])
    cfg = base.with_(mode="dynamic", total_tokens=total_tokens, depth=depth, top_k=top_k)
    g = generate(Decoder(target, head, cfg), [1, 2, 3])
    assert len(g.tokens) == 40
    if temperature == 0.0:
        assert g.tokens == ref.tokens
    assert all(sum(n.kept for n in s.nodes) <= total_tokens for s in g.steps)


def test_all_equal_draft_confidences_keep_a_connected_tree():
    """A head whose output is constant gives every child the same confidence: ties everywhere."""
    target, head = tiny_pair(vocab=16, seed=6, eos=None)
    for p in head.layers[0].parameters():
        p.data.zero_()
    head.fc.weight.data.zero_()
    head.fc.bias.data.zero_()
    g = generate(Decoder(target, head, DecodeConfig(mode="dynamic", max_new_tokens=20, total_tokens=9,
                                                    depth=3, top_k=3)), [1, 2, 3])
    for step in g.steps[1:]:
        by_id = {n.id: n for n in step.nodes}
        assert all(by_id[n.parent].kept for n in step.nodes[1:] if n.kept)
        assert sum(n.kept for n in step.nodes) == 9
