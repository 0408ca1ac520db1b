"""`python -m eagle bench` end to end on the real model (random head, a few tokens): files, the JSON
line, greedy equality, resume after an interruption, multi-turn, bad question records."""
import json

import pandas as pd
import pytest

from eagle.tools.bench.command import main
from eagle.tools.bench.spec import parse_modes
from eagle.records.questions import load_questions, select_questions
from eagle.records.trace import read_trace

MODES = "vanilla,dynamic,hf,hf_pld"
BUDGET = ["--total-tokens", "8", "--depth", "3", "--top-k", "4"]


pytestmark = pytest.mark.usefixtures("single_thread")  # see conftest: OpenMP spin-waits under load


def _bench(out, capsys, *extra):
    rc = main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "2", "--max-new-tokens", "8", "--modes", MODES,
               "--head", "random", "--out", str(out), "--json", "--baselines", "same", *BUDGET, *extra])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_bench_end_to_end_and_resume(tmp_path, capsys):
    rc, summary = _bench(tmp_path, capsys)
    assert rc == 0
    assert summary["questions"] == 2 and summary["generations"] == 8 and summary["resumed"] == 0
    assert set(summary["modes"]) == set(MODES.split(","))
    assert summary["mismatches"]["dynamic"] == 0 and summary["modes"]["dynamic"]["mismatches"] == 0
    assert summary["modes"]["vanilla"]["speedup"] == 1.0 and summary["modes"]["hf"]["speedup_vs_hf"] == 1.0
    assert summary["modes"]["hf"]["tau"] == 1.0 and summary["modes"]["hf"]["mean_accept_length"] is None
    for mode in MODES.split(","):
        traces, report = read_trace(tmp_path / "traces" / f"{mode}.jsonl")
        assert len(traces) == 2 and report.skipped_lines == 0
        assert {t.header.meta["question_id"] for t in traces} == {81, 82}
        assert all(sum(len(s.new_tokens) for s in t.steps) == 8 for t in traces)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert set(steps["mode"]) == set(MODES.split(",")) and (steps["kind"] == "dynamic").any()
    assert json.loads((tmp_path / "summary.json").read_text())["generations"] == 8
    assert "| `dynamic` |" in (tmp_path / "summary.md").read_text()

    sizes = {p.name: p.stat().st_size for p in (tmp_path / "traces").iterdir()}
    rc, again = _bench(tmp_path, capsys)  # nothing left to do: every generation is skipped
    assert rc == 0 and again["resumed"] == 8
    assert sizes == {p.name: p.stat().st_size for p in (tmp_path / "traces").iterdir()}

    vanilla = tmp_path / "traces" / "vanilla.jsonl"
    lines = vanilla.read_text().splitlines()
    vanilla.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # a crash mid-write of question 82
    rc, resumed = _bench(tmp_path, capsys)
    assert rc == 0 and resumed["resumed"] == 7 and resumed["mismatches"]["dynamic"] == 0
    traces, report = read_trace(vanilla)  # the torn line was cut; the cut trace stays, marked unfinished
    assert len(traces) == 3 and report.skipped_lines == 0 and report.interrupted == 1
    assert [t.interrupted for t in traces] == [False, True, False]


@pytest.mark.slow
def test_speedups_are_against_the_fastest_baseline(tmp_path, capsys):
    """--baselines fastest (the default): each baseline also runs in the other precision this CPU runs,
    and every speed-up is against the faster of the two, named under the table."""
    rc = main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "1", "--max-new-tokens", "6", "--modes",
               "vanilla,dynamic,hf_pld", "--head", "random", "--out", str(tmp_path), "--json", *BUDGET])
    printed = capsys.readouterr().out
    summary, modes = json.loads(printed.strip().splitlines()[-1]), None
    modes = summary["modes"]
    assert rc == 0 and set(modes) == {"vanilla", "vanilla@bfloat16", "dynamic", "hf_pld", "hf_pld@bfloat16"}
    for kind, key in (("vanilla", "speedup"), ("hf_pld", "speedup_vs_pld")):
        best = max((kind, f"{kind}@bfloat16"), key=lambda m: modes[m]["tokens_per_second"])
        assert summary["baselines"][kind] == best and modes[best][key] == 1.0
        assert modes[f"{kind}@bfloat16" if best == kind else kind][key] < 1.0
        assert f"{kind}: {best} (" in printed
    assert summary["baselines"]["hf"] is None and modes["dynamic"]["speedup_vs_hf"] is None
    assert modes["vanilla@bfloat16"]["speedup_same_dtype"] == 1.0 and modes["dynamic"]["mismatches"] == 0
    assert modes["dynamic"]["speedup_same_dtype"] == pytest.approx(  # the summary rounds to 6 decimals
        modes["dynamic"]["tokens_per_second"] / modes["vanilla"]["tokens_per_second"], rel=1e-5)


def test_changed_settings_need_a_new_out(tmp_path, capsys):
    assert main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "1", "--max-new-tokens", "4", "--modes", "vanilla",
                 "--out", str(tmp_path)]) == 0
    assert main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "1", "--max-new-tokens", "5", "--modes", "vanilla",
                 "--out", str(tmp_path)]) == 2
    assert "was made with max_new_tokens=4 (this run: 5)" in capsys.readouterr().err


@pytest.mark.slow
def test_second_turn_builds_on_the_first_answer(tmp_path, capsys):
    rc = main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "1", "--turns", "2", "--max-new-tokens", "6", "--modes",
               "vanilla,dynamic", "--head", "random", "--out", str(tmp_path), "--json", "--baselines", "same", *BUDGET])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and summary["generations"] == 4 and summary["mismatches"] == {"dynamic": 0}
    traces, _ = read_trace(tmp_path / "traces" / "dynamic.jsonl")
    turn2 = next(t for t in traces if t.header.meta["turn"] == 2)
    messages = turn2.header.meta["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"]  # vanilla's own first answer


def test_bad_question_records_are_skipped_and_counted(tmp_path, capsys):
    good = {"question_id": 1, "category": "math", "turns": ["What is 2+2?"]}
    lines = [json.dumps(good), "not json", json.dumps({"question_id": 2}), json.dumps([1, 2]),
             json.dumps({"question_id": 3, "turns": [""]}), json.dumps(good), "",
             json.dumps({"question_id": "x", "turns": ["Hi"]})]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    questions, bad = load_questions(path)
    assert [q.question_id for q in questions] == [1, "x"] and bad == 5
    assert questions[1].category == "uncategorized"
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("nope\n{}\n")
    assert main(["--dataset", str(only_bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "skipped 2 bad record(s)" in err and "no usable question" in err


def test_mode_specs():
    specs = parse_modes("vanilla, dynamic:24/5/6/8192,hf_pld")
    assert [s.kind for s in specs] == ["vanilla", "dynamic", "hf_pld"]
    assert dict(specs[1].overrides) == {"total_tokens": 24, "depth": 5, "top_k": 6, "draft_vocab": 8192}
    assert specs[1].slug == "dynamic-24-5-6-8192"
    for bad in ("turbo", "hf:8/3/4", "dynamic:8/3", "vanilla,vanilla", "", "hf@fp8", "vanilla@"):
        with pytest.raises(ValueError):
            parse_modes(bad)
    typed = parse_modes("hf@float32,dynamic:auto@bfloat16,vanilla")
    assert [(s.kind, s.budget, s.dtype) for s in typed] == [("hf", "fixed", "float32"), ("dynamic", "auto", "bfloat16"),
                                                            ("vanilla", "fixed", None)]
    assert typed[1].slug == "dynamic-auto-bfloat16"


@pytest.mark.slow
def test_auto_and_adaptive_modes(tmp_path, capsys, monkeypatch):
    """dynamic:auto takes the auto budget and dynamic:adaptive its shape with per-round sizes; both stay
    lossless and resumable. The auto report is fixed here (auto_config itself: test_budget)."""
    from eagle.tools.budget import choice as budget_choice, costs as budget_costs
    from eagle.tools.budget.replay import AcceptModel
    from eagle.core.config import DecodeConfig
    from tests.tiny import fixed_auto_report
    chosen = dict(total_tokens=4, depth=2, top_k=3, draft_vocab=0)
    curve = [dict(chosen, total_tokens=n, round_s=0.05 + 0.004 * n, accept_length=1.2, tokens_per_s=1.0)
             for n in (2, 4, 8)]
    t_verify = {1: 0.04, 2: 0.045, 4: 0.05, 8: 0.07}
    costs = budget_costs.Costs("k", t_verify, {"3/0": (0.01, 0.005)}, 0.002, prefill={32: 0.1, 192: 0.3}, host_tree=0.001)
    # a replayed grid where 4/2/3/0 is the best tree at every context (test_session: one where it is not)
    grid = AcceptModel.from_json({"ns": [1, 2, 4, 8], "depths": [2], "top_ks": [3], "vocabs": [0],
                                  "grid": {"3/0": [[1.0, 1.5, 2.5, 2.6]]}})
    report = fixed_auto_report(chosen, costs, curve, expected_speedup=1.1, expected_tokens_per_s=3.0,
                               expected_accept_length=2.5, accept_table=grid)
    monkeypatch.setattr(budget_choice, "auto_config", lambda t, h, cfg, **kw: (cfg.with_(**chosen), report))
    modes = "vanilla,dynamic:auto,dynamic:adaptive"
    args = ["--dataset", "mt_bench", "--dtype", "float32", "--limit", "1", "--max-new-tokens", "12", "--modes", modes,
            "--head", "random", "--out", str(tmp_path), "--json", "--baselines", "same"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])
    assert summary["mismatches"] == {"dynamic:auto": 0, "dynamic:adaptive": 0}
    # the cost model's prediction for these generations (prefill + rounds of E[accept] tokens) is
    # printed beside what the run measured, with the two parts it predicts
    header = read_trace(tmp_path / "traces" / "dynamic-auto.jsonl")[0][0].header
    new = summary["modes"]["dynamic:auto"]["tokens"]
    rounds_s = (new - 1) / 2.5 * costs.round_cost(4, 2, 3, 0, header.prompt_tokens + new // 2)
    expected = new / (costs.t_prefill(header.prompt_tokens) + rounds_s)
    assert summary["modes"]["dynamic:auto"]["predicted_tokens_per_second"] == pytest.approx(expected, rel=1e-5)
    assert summary["modes"]["dynamic:auto"]["predicted_round_ms"] == pytest.approx(1000 * costs.round_cost(4, 2, 3, 0))
    assert summary["modes"]["vanilla"]["predicted_tokens_per_second"] is None
    assert f"auto's cost model: dynamic:auto: predicted {expected:.2f} tok/s (accept 2.50, " in printed
    # and the speed-up it predicts, times the vanilla measured beside it: tokens/s at this run's speed
    auto_stats = summary["modes"]["dynamic:auto"]
    assert auto_stats["predicted_tokens_per_second_at_run_speed"] == pytest.approx(
        auto_stats["predicted_speedup_same_dtype"] * summary["modes"]["vanilla"]["tokens_per_second"], rel=1e-4)
    assert "at this run's machine speed" in printed
    auto = header.config
    adaptive = read_trace(tmp_path / "traces" / "dynamic-adaptive.jsonl")[0][0].header.config
    assert {k: auto[k] for k in chosen} == chosen
    assert adaptive["total_tokens"] == 8 and len(adaptive["adaptive_costs"]["verify"]) == 8
    assert DecodeConfig(**{k: v for k, v in auto.items() if k in DecodeConfig.__dataclass_fields__}).depth == 2
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["resumed"] == 3


def test_auto_mode_specs():
    specs = parse_modes("dynamic:auto,dynamic:adaptive")
    assert [(s.kind, s.budget, s.slug) for s in specs] == [("dynamic", "auto", "dynamic-auto"),
                                                           ("dynamic", "adaptive", "dynamic-adaptive")]
    with pytest.raises(ValueError):
        parse_modes("static:auto")


def test_per_category_sampling_keeps_file_order(capsys):
    questions, _ = load_questions("mt_bench")
    assert {q.category for q in questions[:10]} == {"writing"}  # why --limit alone is a biased sample
    picked = select_questions(questions, per_category=2)
    cats = [q.category for q in picked]
    assert len(picked) == 2 * len(set(cats)) == 16
    assert [questions.index(q) for q in picked] == sorted(questions.index(q) for q in picked)
    assert select_questions(questions, limit=3, per_category=1) == picked[::2][:3]
    for bad in ({"limit": 0}, {"per_category": 0}):
        with pytest.raises(ValueError):
            select_questions(questions, **bad)
    assert main(["--dataset", "mt_bench", "--per-category", "0"]) == 2
    assert "--per-category must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("flags, device, tuned", [
    ([], "cpu", True), ([], "cuda", False), (["--budget", "fixed"], "cpu", False), (["--preset", "paper"], "cpu", False),
    (["--total-tokens", "8"], "cpu", False), (["--budget", "auto"], "cuda", True),
    (["--budget", "auto", "--preset", "paper"], "cpu", True),
])
def test_plain_dynamic_takes_the_tree_generate_would(flags, device, tuned):
    """bench's plain `dynamic` follows generate's default (auto on a CPU unless a preset, a tree flag or
    --budget fixed), and an explicit budget in the mode name always wins."""
    from eagle.tools.loading import budget_mode
    from eagle.tools.bench.command import _tuned, build_parser
    args = build_parser().parse_args(["--dataset", "mt_bench", *flags])
    plain, sized = parse_modes("dynamic,dynamic:8/3/4,vanilla")[:2]
    assert _tuned(args, plain, device) == tuned == (budget_mode(args, "dynamic", device) == "auto")
    assert not _tuned(args, sized, device) and not _tuned(args, parse_modes("vanilla")[0], device)
    assert _tuned(args, parse_modes("dynamic:auto")[0], device)


def test_auto_prediction_takes_each_generations_own_tree():
    """auto's predicted tokens/s for a mode sums each generation's prediction with the tree auto chose
    for its prompt (its header's config), plain decoding where auto fell back to it."""
    from eagle.core.config import TreeShape
    from eagle.tools.bench.report import mode_stats
    from eagle.tools.bench.run import Result
    from eagle.tools.budget.choice import PLAIN, expected_seconds
    from tests.tiny import context_auto_report
    report = context_auto_report()
    big = {"mode": "dynamic", "total_tokens": 8, "depth": 2, "top_k": 2, "draft_vocab": 0}
    configs = [big, {**big, "total_tokens": 2, "depth": 1}, {**big, "mode": "vanilla"}]
    results = [Result(q, "c", 1, "dynamic:auto", [5] * n, 0.5, n, [], prompt_tokens=p, config=c)
               for q, n, p, c in zip((1, 2, 3), (9, 5, 3), (30, 300, 600), configs)]
    stats = mode_stats(results, report)
    trees = (TreeShape(8, 2, 2), TreeShape(2, 1, 2), PLAIN)
    seconds = sum(expected_seconds(report, r.prompt_tokens, len(r.tokens), t) for r, t in zip(results, trees))
    assert stats["predicted_tokens_per_second"] == pytest.approx(17 / seconds)
    plain_seconds = sum(expected_seconds(report, r.prompt_tokens, len(r.tokens), PLAIN) for r in results)
    assert stats["predicted_speedup_same_dtype"] == pytest.approx(plain_seconds / seconds)  # the same generations, plain
    assert stats["predicted_accept_length"] == pytest.approx(14 / (8 / 2.6 + 4 / 1.5 + 2 / 1))
    plain = expected_seconds(report, 600, 3, PLAIN)
    assert plain == pytest.approx(report.costs.t_prefill(600) + 2 * report.costs.t_plain(601))
    assert expected_seconds(report, 30, 9, TreeShape(8, 2, 2)) < expected_seconds(report, 30, 9)  # the tree pays there
