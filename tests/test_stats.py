"""eagle.records.stats: the one arithmetic of tau, tokens/s and speed-up, and the bench and the analysis
tables agreeing on it over the same traces."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis import tables as T
from eagle.records import stats
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.tools.bench import report as bench_report, store as bench_store
from eagle.records.trace import StepRecord, Trace, TraceHeader
from tests.tiny import tiny_pair

counts = st.integers(min_value=1, max_value=10_000)
times = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)


@given(st.lists(st.tuples(counts, times), min_size=1, max_size=20))
def test_total_rate_lies_between_the_generations_rates(runs):
    """Total tokens over total seconds is a weighted mean of the per-run rates: never outside them."""
    rates = [stats.tokens_per_second(n, s) for n, s in runs]
    total = stats.tokens_per_second(sum(n for n, _ in runs), sum(s for _, s in runs))
    assert min(rates) * (1 - 1e-9) <= total <= max(rates) * (1 + 1e-9)
    assert min(rates) * (1 - 1e-9) <= stats.mean_rate(runs) <= max(rates) * (1 + 1e-9)


@given(counts, counts)
def test_tau_counts_every_forward(tokens, extra_forwards):
    assert stats.tau(tokens, tokens) == 1.0  # vanilla: one token per forward, prefill included
    assert stats.tau(tokens, tokens + extra_forwards) < 1.0 < stats.tau(tokens + extra_forwards, tokens)


@given(times, times)
def test_speedup_is_the_ratio_of_rates(rate, reference):
    assert stats.speedup(rate, rate) == 1.0
    assert stats.speedup(rate, reference) * reference == pytest.approx(rate)


def test_empty_input_is_nan_not_zero():
    assert math.isnan(stats.tau(0, 0)) and math.isnan(stats.tau(5, 0))
    assert math.isnan(stats.tokens_per_second(0, 0.0)) and math.isnan(stats.tokens_per_second(3, -1.0))
    assert math.isnan(stats.speedup(2.0, 0.0)) and math.isnan(stats.speedup(2.0, math.nan))
    assert math.isnan(stats.mean([])) and math.isnan(stats.mean_rate([])) and math.isnan(stats.mean_rate([(4, 0.0)]))
    assert stats.mean_rate([(4, 0.0), (6, 2.0)]) == 3.0  # an untimed run is left out, as Spec-Bench does


def test_mean_rate_is_not_the_total_rate():
    """Spec-Bench's per-question mean weighs a short answer like a long one; the bench's total does not."""
    runs = [(100, 10.0), (10, 0.5)]
    assert stats.mean_rate(runs) == pytest.approx((10 + 20) / 2)
    assert stats.tokens_per_second(110, 10.5) == pytest.approx(110 / 10.5)


def _bench_like_traces() -> list[Trace]:
    """Tiny-model generations stored the way the bench stores them (wall seconds in the header), and
    an hf-style one-step trace."""
    target, head = tiny_pair(vocab=12, seed=3, eos=None)
    traces = []
    for qid, prompt in enumerate([[1, 2, 3], [4, 5, 6, 7]]):
        for mode in ("vanilla", "dynamic"):
            cfg = DecodeConfig(mode=mode, max_new_tokens=10 + 3 * qid, total_tokens=6, depth=2, top_k=2)
            g = generate(Decoder(target, head if mode != "vanilla" else None, cfg), prompt)
            meta = {"question_id": qid, "category": "writing", "turn": 1, "mode_label": mode,
                    "seconds": g.seconds + 0.01}  # the bench's clock wraps the generation
            traces.append(Trace(TraceHeader("tiny", None, {"mode": mode}, "p", len(prompt), meta), g.steps))
    hf = StepRecord(0, "hf", [], [], 5, "", [5] * 9, "", 1, {"generate": 0.3}, 9, "max_new_tokens")
    meta = {"question_id": 0, "category": "writing", "turn": 1, "mode_label": "hf", "seconds": 0.31}
    traces.append(Trace(TraceHeader("tiny", None, {"mode": "hf"}, "p", 3, meta), [hf]))
    return traces


def test_bench_and_analysis_agree_on_the_same_traces(single_thread):
    traces = _bench_like_traces()
    results = [bench_store._result_of(t) for t in traces]  # how the bench reads its stored generations back
    table = T.compare_modes(traces).set_index("mode")
    assert set(table.index) == {"vanilla", "dynamic", "hf"}
    for mode in table.index:
        ours = bench_report.mode_stats([r for r in results if r.mode == mode])
        row = table.loc[mode]
        assert row["tau"] == pytest.approx(ours["tau"]) and row["new_tokens"] == ours["tokens"]
        assert row["tokens_per_s"] == pytest.approx(ours["tokens_per_second"])
        assert row["seconds"] == pytest.approx(ours["seconds"])
    assert table.loc["vanilla", "tau"] == 1.0 and table.loc["dynamic", "tau"] >= 1.0
    van = table.loc["vanilla", "tokens_per_s"]
    assert table.loc["dynamic", "speedup"] == pytest.approx(table.loc["dynamic", "tokens_per_s"] / van)


def test_wilson_interval_known_values() -> None:
    """Against the closed form's published values (e.g. Newcombe 1998, table I: 0/10, 1/10)."""
    from eagle.records.stats import wilson_interval
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(1, 10) == pytest.approx((0.0179, 0.4042), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    lo, hi = wilson_interval(0, 0)
    assert lo != lo and hi != hi  # no trials: NaN, not a zero-width interval
