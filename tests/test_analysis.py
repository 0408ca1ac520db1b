"""analysis/: tables with known answers on synthetic traces, figures, the CLI end to end, and a fuzz
that the tables never crash on random valid traces. No model runs here."""
from __future__ import annotations

import math
import random

import pandas as pd
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import figures as F
from analysis import tree_plot as TF
from analysis import tables as T
from analysis.__main__ import main
from analysis.export import find_browser, load_traces, to_markdown
from analysis.report import build_figures, build_tables
from eagle.records.trace import NodeRecord, StepRecord, Trace, TraceHeader, write_trace


# ---- synthetic traces -----------------------------------------------------------------------------
def node(id: int, parent: int, depth: int, conf: float, rank: int = 0, kept: bool = True,
         accepted: bool = False, value: float | None = None) -> NodeRecord:
    return NodeRecord(id, parent, depth, 100 + id, f"t{id}", conf, conf if value is None else value,
                      rank, kept, accepted, 0.5 if kept else None)


def root() -> NodeRecord:
    return NodeRecord(0, -1, 0, 1, " the", 1.0, 1.0, 0, True, True, None)


def step(i: int, nodes: list[NodeRecord], mode: str = "dynamic", new: int | None = None) -> StepRecord:
    accepted = [n.id for n in nodes if n.accepted]
    n_new = len(accepted) if new is None else new
    return StepRecord(i, mode, nodes, accepted, 7, "\n", list(range(n_new)), "x" * n_new, len(accepted),
                      {"draft": 0.1, "verify": 0.2, "commit": 0.05}, 1, None)


def prefill(mode: str = "dynamic") -> StepRecord:
    return StepRecord(0, mode, [], [], 5, "A", [5], "A", 1, {"prefill": 0.5}, 1, None)


def trace(steps: list[StepRecord], mode: str = "dynamic", qid: int = 81) -> Trace:
    header = TraceHeader("model", "head", {"mode": mode, "total_tokens": 16, "depth": 4, "top_k": 4},
                         "prompt", 10, {"question_id": qid})
    return Trace(header, [prefill(mode), *steps])


def one_child_steps(conf: float, n: int, hits: int, mode: str = "dynamic") -> list[StepRecord]:
    """n rounds, each a root with one child of confidence conf; the first `hits` are accepted."""
    return [step(i + 1, [root(), node(1, 0, 1, conf, accepted=i < hits)], mode) for i in range(n)]


# ---- tables: known answers ------------------------------------------------------------------------
def test_nodes_frame_leaves_out_root_and_marks_parent_acceptance() -> None:
    s = step(1, [root(), node(1, 0, 1, 0.6, accepted=True), node(2, 0, 1, 0.3, rank=1),
                 node(3, 1, 2, 0.5, rank=0), node(4, 2, 2, 0.9, rank=0), node(5, 4, 3, 0.9, kept=False)])
    frame = T.nodes_frame([trace([s])]).set_index("id")
    assert list(frame.index) == [1, 2, 3, 4, 5]
    assert frame["parent_accepted"].to_dict() == {1: True, 2: True, 3: True, 4: False, 5: False}
    assert frame["position"].to_dict() == {1: "0", 2: "1", 3: "0-0", 4: "1-0", 5: "1-0-0"}
    assert set(frame["prompt_id"]) == {81} and math.isnan(frame.loc[5, "target_prob"])


def test_perfectly_calibrated_confidence_has_zero_ece() -> None:
    # Bin [0.2, 0.3): 4 siblings at 0.25, one accepted per round -> rate 0.25 exactly.
    quarter = [step(i + 1, [root(), *[node(j + 1, 0, 1, 0.25, rank=j, accepted=j == 0) for j in range(4)]])
               for i in range(3)]
    # Bin [0.7, 0.8): one child at 0.75, accepted in 3 rounds of 4. The rejected child's own child
    # (0.95, not accepted) had no chance: it must not count for confidence, only for value.
    threes = [step(i + 10, [root(), node(1, 0, 1, 0.75, accepted=True)]) for i in range(3)]
    threes.append(step(13, [root(), node(1, 0, 1, 0.75), node(2, 1, 2, 0.95, value=0.7125)]))
    nodes = T.nodes_frame([trace(quarter + threes)])
    table = T.calibration_table(nodes, "confidence", bins=10)
    assert table[["bin", "count", "accepted"]].values.tolist() == [[2, 12, 3], [7, 4, 3]]
    assert table[["lo", "hi"]].to_numpy().ravel().tolist() == pytest.approx([0.2, 0.3, 0.7, 0.8])
    assert T.expected_calibration_error(nodes, "confidence") == pytest.approx(0.0)
    value = T.calibration_table(nodes, "value", bins=10)
    assert value[["bin", "count", "accepted"]].values.tolist() == [[2, 12, 3], [7, 5, 3]]


def test_ece_exact_for_calibrated_and_miscalibrated_sets() -> None:
    calibrated = one_child_steps(0.25, 8, 2) + one_child_steps(0.75, 8, 6)
    assert T.expected_calibration_error(T.nodes_frame([trace(calibrated)])) == pytest.approx(0.0)
    wrong = one_child_steps(0.9, 10, 5) + one_child_steps(0.15, 10, 0)
    nodes = T.nodes_frame([trace(wrong)])
    assert T.expected_calibration_error(nodes) == pytest.approx((10 * 0.4 + 10 * 0.15) / 20)
    table = T.calibration_table(nodes, bins=10)
    assert table[["bin", "mean_pred", "rate", "count"]].to_numpy().ravel().tolist() == pytest.approx(
        [1, 0.15, 0.0, 10, 9, 0.9, 0.5, 10])


def test_value_calibration_counts_every_verified_node() -> None:
    s = step(1, [root(), node(1, 0, 1, 0.5, kept=True), node(2, 1, 2, 0.5, value=0.25),
                 node(3, 1, 2, 0.4, rank=1, kept=False, value=0.2)])
    nodes = T.nodes_frame([trace([s])])
    assert T.calibration_table(nodes, "confidence", bins=10)["count"].sum() == 1  # only the child of root
    table = T.calibration_table(nodes, "value", bins=10)
    assert table["count"].sum() == 2 and table["rate"].max() == 0.0  # the pruned node is out
    with pytest.raises(ValueError):
        T.calibration_table(nodes, "bogus")


def test_per_depth_calibration_and_value_one_lands_in_last_bin() -> None:
    s = step(1, [root(), node(1, 0, 1, 1.0, accepted=True), node(2, 1, 2, 0.05)])
    table = T.calibration_table(T.nodes_frame([trace([s])]), bins=10, per_depth=True)
    assert table[["depth", "bin", "count", "accepted"]].values.tolist() == [[1, 9, 1, 1], [2, 0, 1, 0]]


def test_depth_rank_table_is_conditional_on_parent() -> None:
    rounds = [step(i + 1, [root(), node(1, 0, 1, 0.6, accepted=i % 2 == 0), node(2, 0, 1, 0.3, rank=1,
                                                                                 accepted=i % 2 == 1),
                           node(3, 1, 2, 0.5, accepted=i == 0)]) for i in range(4)]
    table = T.depth_rank_table(T.nodes_frame([trace(rounds)])).set_index(["depth", "rank"])
    assert table.loc[(1, 0), ["count", "accepted"]].tolist() == [4, 2]
    assert table.loc[(1, 1), "rate"] == 0.5
    assert table.loc[(2, 0), ["count", "accepted"]].tolist() == [2, 1]  # only rounds 0 and 2 qualify


def test_static_positions_mean_and_spread_across_prompts() -> None:
    def static(hits: list[bool]) -> list[StepRecord]:
        return [step(i + 1, [root(), node(1, 0, 1, 0.7, accepted=h), node(2, 0, 1, 0.2, rank=1),
                             node(3, 1, 2, 0.5, accepted=False)], mode="static") for i, h in enumerate(hits)]
    traces = [trace(static([True, True]), "static", 1), trace(static([True, False]), "static", 2),
              trace(one_child_steps(0.5, 3, 3), "dynamic", 3)]
    table = T.static_position_table(T.nodes_frame(traces)).set_index("position")
    assert list(table.index) == ["0", "1", "0-0"]
    assert table.loc["0", ["mean", "std", "q25", "q75", "traces", "count"]].tolist() == pytest.approx(
        [0.75, math.sqrt(0.125), 0.625, 0.875, 2, 4])
    assert table.loc["0-0", ["mean", "count", "depth"]].tolist() == [0.0, 3, 2]


def test_steps_frame_shape_and_compare_modes() -> None:
    s = step(1, [root(), node(1, 0, 1, 0.6, accepted=True), node(2, 0, 1, 0.3, rank=1),
                 node(3, 1, 2, 0.5, accepted=True), node(4, 1, 2, 0.1, rank=1),
                 node(5, 2, 2, 0.1, kept=False)], new=3)
    van = [StepRecord(i + 1, "vanilla", [root()], [0], 3, "a", [3], "a", 1, {"verify": 0.2}, 1, None)
           for i in range(4)]
    steps = T.steps_frame([trace([s]), trace(van, "vanilla")])
    row = steps[(steps["mode"] == "dynamic") & (steps["step"] == 1)].iloc[0]
    assert (row.drafted, row.tree_size, row.max_depth, row.width, row.leaves, row.accepted_drafts) == \
        (5, 4, 2, 2, 3, 2)
    modes = T.compare_modes([trace([s]), trace(van, "vanilla")]).set_index("mode")
    assert list(modes.index) == ["vanilla", "dynamic"]
    assert modes.loc["dynamic", "tau"] == pytest.approx(4 / 2)  # prefill 1 + round 3 tokens, 2 forwards
    assert modes.loc["vanilla", "tau"] == pytest.approx(1.0)
    assert modes.loc["dynamic", "tokens_per_s"] == pytest.approx(4 / 0.85)
    assert modes.loc["vanilla", "speedup"] == pytest.approx(1.0)
    assert modes.loc["dynamic", "mean_accept_length"] == 3


def test_accept_length_distribution_excludes_prefill() -> None:
    table = T.accept_length_table(T.steps_frame([trace(one_child_steps(0.5, 4, 1))]))
    assert table[["accept_length", "count", "fraction"]].values.tolist() == [[1, 3, 0.75], [2, 1, 0.25]]


def test_empty_inputs_give_empty_tables() -> None:
    nodes, steps = T.nodes_frame([]), T.steps_frame([])
    assert nodes.empty and steps.empty and list(nodes.columns) == T.NODE_COLUMNS
    assert math.isnan(T.expected_calibration_error(nodes))
    for table in build_tables(nodes, steps).values():
        assert isinstance(table, pd.DataFrame)


# ---- figures --------------------------------------------------------------------------------------
def test_tree_layout_is_tidy() -> None:
    nodes = [root(), node(1, 0, 1, 0.5), node(2, 0, 1, 0.4, rank=1), node(3, 1, 2, 0.5),
             node(4, 1, 2, 0.3, rank=1)]
    pos = TF.tree_layout(nodes)
    assert pos[3] == (2, 0.0) and pos[4] == (2, 1.0) and pos[2] == (1, 2.0)
    assert pos[1] == (1, 0.5) and pos[0] == (0, 1.25)


def test_tree_figure_marks_bonus_path_and_pruned() -> None:
    s = step(1, [root(), node(1, 0, 1, 0.6, accepted=True), node(2, 0, 1, 0.3, rank=1, kept=False)])
    fig = TF.tree_figure(s, show_pruned=True)
    names = [t.name for t in fig.data]
    assert "bonus (target's token)" in names and "accepted path" in names
    path = next(t for t in fig.data if t.name == "accepted path")
    assert len([x for x in path.x if x is not None]) == 4  # root->1 and 1->bonus
    nodes = next(t for t in fig.data if t.name == "draft node")
    assert list(nodes.marker.opacity) == [1.0, 1.0, 0.25]
    assert len(TF.tree_figure(s).data[2].x) == 2  # reranked-away nodes are hidden by default
    assert "1 reranked away (hidden)" in TF.tree_figure(s).layout.title.text
    assert isinstance(TF.tree_figure(prefill()), go.Figure)  # no tree: just the token


def test_tree_svg_draws_what_tree_figure_draws() -> None:
    """The live page's streamed SVG: valid XML, every placed node, the accepted path in red up to the
    bonus diamond, pruned nodes faded, the same title, and a height capped to fit the window."""
    import xml.etree.ElementTree as ET
    from analysis.tree_svg import CSS_CLASS, tree_svg
    s = step(1, [root(), node(1, 0, 1, 0.6, accepted=True), node(2, 0, 1, 0.3, rank=1, kept=False),
                 node(3, 1, 2, 0.2)])
    svg = ET.fromstring(tree_svg(s))
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.get("class") == CSS_CLASS
    circles = svg.findall(f"{ns}circle")  # the reranked-away node is left out, as in the finished view
    assert len(circles) == 2 and [c.get("opacity") for c in circles] == ["1.0", "1.0"]
    red = [e for e in svg.findall(f"{ns}line")
           if e.get("stroke") == F.ACCEPT_COLOR and e.get("stroke-width") == "4"]
    assert len(red) == 3  # root->1, 1->bonus, and the legend's sample
    texts = ["".join(t.itertext()) for t in svg.findall(f"{ns}text")]
    assert TF.tree_parts(s).title in texts and "accepted path" in texts
    assert any(t == "t3 0.20" for t in texts) and any(t.endswith("(bonus)") for t in texts)
    wide = step(1, [root(), *[node(i, 0, 1, 0.1, rank=i) for i in range(1, 60)]])
    assert float(ET.fromstring(tree_svg(wide, max_height=500)).get("height")) == 500
    ET.fromstring(tree_svg(step(1, [root(), node(1, 0, 1, 0.5)], new=0)))  # a tree nothing of which was accepted


def test_token_label_is_visible_and_html_safe() -> None:
    assert TF.token_label(" <b>\n") == "␣&lt;b&gt;↵"
    assert TF.token_label("x" * 30, limit=5) == "xxxx…"
    assert TF.token_label("\x1c") == "\\x1c"  # control characters are invalid in SVG


def test_figures_build_on_synthetic_traces() -> None:
    traces = [trace(one_child_steps(0.7, 5, 3)), trace(one_child_steps(0.4, 3, 1, "static"), "static")]
    nodes, steps = T.nodes_frame(traces), T.steps_frame(traces)
    figs = build_figures(traces, nodes, steps)
    assert {"reliability_confidence", "depth_rank_heatmap", "static_positions",
            "tree_dynamic_best", "tree_static_typical"} <= set(figs)
    assert "ECE = " in figs["reliability_confidence"].layout.title.text
    assert all(f.layout.width == 1200 for f in figs.values())


def test_budget_figure_marks_the_best_tree_size() -> None:
    rows = [dict(total_tokens=n, depth=2, top_k=4, draft_vocab=8192, accept_length=1 + 0.5 * math.log2(n),
                 round_s=0.04 + 0.002 * n) for n in (2, 4, 8, 16)]
    for r in rows:
        r["tokens_per_s"] = r["accept_length"] / r["round_s"]
    report = dict(curve=rows, chosen=dict(total_tokens=8, depth=2, top_k=4, draft_vocab=8192),
                  vanilla_tokens_per_s=25.0)
    fig = F.budget_figure(report)
    star = next(t for t in fig.data if t.name == "chosen")
    best = max(rows, key=lambda r: r["tokens_per_s"])
    assert (star.x[0], star.y[0]) == (best["total_tokens"], best["tokens_per_s"])
    cost = next(t for t in fig.data if t.name == "round cost (ms)")
    assert list(cost.y) == pytest.approx([r["round_s"] * 1000 for r in rows])
    assert "draft vocabulary 8192" in fig.layout.title.text
    assert "no budget curve" in F.budget_figure({}).layout.annotations[0].text


def test_figure_labels_name_what_they_show() -> None:
    rounds = one_child_steps(0.8, 3, hits=1)
    nodes = T.nodes_frame([trace(rounds)])
    spread = F.static_position_figure(nodes, mode=None)  # dynamic traces: no "Static tree" title
    assert spread.layout.title.text.startswith("Acceptance per position")
    assert list(spread.data[1].text) == ["n=3"]  # every bar says how many nodes it rests on
    static = F.static_position_figure(T.nodes_frame([trace(one_child_steps(0.8, 2, 1, "static"), "static")]))
    assert static.layout.title.text.startswith("Static tree: acceptance per position")
    assert TF.tree_figure(rounds[0]).layout.title.text.startswith("Round 1 (dynamic): 1 draft token(s)")
    report = dict(curve=[dict(total_tokens=n, depth=1, top_k=2, draft_vocab=0, accept_length=1.5,
                              round_s=0.1191 + 0.0113 * n, tokens_per_s=10.0) for n in (2, 4)],
                  chosen=dict(total_tokens=2, depth=1, top_k=2, draft_vocab=0), vanilla_tokens_per_s=9.0)
    budget = F.budget_figure(report)
    assert budget.layout.yaxis2.tickformat == ".0f"  # whole milliseconds, not 128.1 / 164.5
    assert "tree depth 2 (--depth 1)" in budget.layout.title.text


def test_markdown_table() -> None:
    md = to_markdown(pd.DataFrame({"a": [1, 2], "b": [0.5, float("nan")], "c": ["x|y", None]}))
    assert md.splitlines() == ["| a | b | c |", "|---:|---:|---|", "| 1 | 0.500 | x\\|y |", "| 2 |  |  |"]


# ---- CLI end to end -------------------------------------------------------------------------------
def test_cli_writes_figures_and_tables(tmp_path, capsys) -> None:
    src = tmp_path / "traces"
    src.mkdir()
    write_trace(src / "dyn.jsonl", [trace(one_child_steps(0.7, 4, 3))])
    write_trace(src / "static.jsonl", [trace(one_child_steps(0.4, 3, 1, "static"), "static", 2)])
    with open(src / "dyn.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "step", "truncated\n')
    (src / "notes.txt").write_text("ignored")
    out = tmp_path / "out"
    assert main(["figures", "--traces", str(src), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 bad line" in err
    for name in ("compare_modes", "calibration_confidence", "static_positions", "depth_rank"):
        assert (out / f"{name}.csv").stat().st_size > 0 and (out / f"{name}.md").stat().st_size > 0
    assert len(pd.read_csv(out / "steps.csv")) == 9
    if find_browser() is None:
        assert (out / "reliability_confidence.html").stat().st_size > 0 and "no browser" in err
        pytest.skip("no Chrome/Chromium installed (apt-get install chromium): checked the HTML fallback")
    for name in ("reliability_confidence", "depth_rank_heatmap", "static_positions", "accept_length",
                 "tree_dynamic_best"):
        assert (out / f"{name}.png").stat().st_size > 1000
        assert (out / f"{name}.svg").read_text(encoding="utf-8").lstrip().startswith("<svg")


def test_cli_reports_missing_input(tmp_path, capsys) -> None:
    assert main(["figures", "--traces", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "no trace file" in capsys.readouterr().err
    traces, messages = load_traces(tmp_path)
    assert traces == [] and messages == []


def test_traces_from_a_bench_dir_a_traces_folder_or_a_file(tmp_path) -> None:
    bench = tmp_path / "run"  # the layout `eagle bench --out run` writes
    (bench / "traces").mkdir(parents=True)
    finished = [one_child_steps(0.7, 4, 3), one_child_steps(0.4, 3, 1, "static")]
    for steps in finished:  # complete generations, as bench writes them (else the reader reports them partial)
        steps[-1].finished = "length"
    write_trace(bench / "traces" / "dynamic.jsonl", [trace(finished[0])])
    write_trace(bench / "traces" / "static.jsonl", [trace(finished[1], "static", 2)])
    (bench / "summary.json").write_text("{}")
    for path in (bench, bench / "traces"):
        found, messages = load_traces(path)
        assert sorted(t.header.config["mode"] for t in found) == ["dynamic", "static"] and messages == []
    found, _ = load_traces(bench / "traces" / "static.jsonl")
    assert [t.header.config["mode"] for t in found] == ["static"]
    assert main(["figures", "--traces", str(bench), "--out", str(tmp_path / "figs"), "--formats", "svg"]) == 0
    assert len(pd.read_csv(tmp_path / "figs" / "steps.csv")) == 9


# ---- fuzz -----------------------------------------------------------------------------------------
@st.composite
def random_step(draw, index: int, mode: str) -> StepRecord:
    """A valid round: parents precede children, ranks by sibling order, kept is ancestor-closed,
    the accepted nodes form one path from the root through kept nodes."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 30))
    nodes = [root()]
    for i in range(1, n):
        parent = nodes[rnd.randrange(i)]
        rank = sum(1 for m in nodes if m.parent == parent.id)
        conf = rnd.random()
        text = rnd.choice(["a", " ", "\x1c"])
        nodes.append(NodeRecord(i, parent.id, parent.depth + 1, rnd.randrange(50), text, conf,
                                parent.value * conf, rank, parent.kept and rnd.random() < 0.7, False))
    current = nodes[0]
    while kids := [m for m in nodes if m.parent == current.id and m.kept]:
        if rnd.random() < 0.5:
            break
        current = rnd.choice(kids)
        current.accepted = True
    accepted = [m.id for m in nodes if m.accepted]
    return StepRecord(index, mode, nodes, accepted, 1, "b", [1] * len(accepted), "b", len(accepted),
                      {"draft": rnd.random(), "verify": rnd.random()}, 1, None)


@st.composite
def random_traces(draw) -> list[Trace]:
    traces = []
    for qid in range(draw(st.integers(0, 3))):
        mode = draw(st.sampled_from(["vanilla", "static", "dynamic"]))
        steps = [draw(random_step(i + 1, mode)) for i in range(draw(st.integers(0, 4)))]
        traces.append(trace(steps, mode, qid))
    return traces


@settings(max_examples=30, deadline=None)
@given(random_traces(), st.integers(1, 12))
def test_tables_never_crash_on_random_traces(traces: list[Trace], bins: int) -> None:
    nodes, steps = T.nodes_frame(traces), T.steps_frame(traces)
    tables = build_tables(nodes, steps, bins)
    for name in ("calibration_confidence", "calibration_value"):
        table = tables[name]
        assert ((table["rate"] >= 0) & (table["rate"] <= 1)).all()
        assert table["count"].sum() == len(T.calibration_sample(nodes, name.split("_")[1]))
    assert T.compare_modes(traces)["new_tokens"].sum() == steps["new_tokens"].sum()
    for t in traces:
        for s in t.steps:
            assert len(TF.tree_layout(s.nodes)) == len(s.nodes)


@settings(max_examples=5, deadline=None)
@given(random_traces())
def test_figures_never_crash_on_random_traces(traces: list[Trace]) -> None:
    nodes, steps = T.nodes_frame(traces), T.steps_frame(traces)
    for fig in build_figures(traces, nodes, steps).values():
        assert isinstance(fig, go.Figure) and fig.layout.width == 1200


# ---- the tree view: informative round, aligned rounds, labels that never overlap -------------------
def wide_tree(n: int = 60, accepted_depth: int = 3) -> StepRecord:
    """A root with a long accepted chain and many siblings of long, wide-character tokens."""
    nodes = [root()]
    for d in range(1, accepted_depth + 1):
        nodes.append(node(d, d - 1, d, 0.9, accepted=True))
    for i in range(accepted_depth + 1, n):
        parent = (i % accepted_depth) + 1 if i % 3 else 0
        depth = next(x.depth for x in nodes if x.id == parent) + 1
        nodes.append(NodeRecord(i, parent, depth, 100 + i, "長い token 🙂" * (i % 2 + 1), 0.5 / (i % 7 + 1),
                                0.1, i, i % 4 != 0, False, 0.5))
    return step(1, nodes)


def label_boxes(fig: go.Figure) -> list[tuple[float, float, float, float]]:
    """(x0, y0, x1, y1) in pixels of every drawn label, from the figure's own axes and margins."""
    import html as h
    import re
    from analysis.labels import GAP, text_px
    lay = fig.layout
    plot_w = lay.width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    (x0, x1), (y0, y1) = lay.xaxis.range, lay.yaxis.range
    boxes = []
    for tr in fig.data:
        if tr.mode != "markers+text":
            continue
        for x, y, text in zip(tr.x, tr.y, tr.text):
            if not text:
                continue
            plain = h.unescape(re.sub("<[^>]+>", "", text))
            px = lay.margin.l + (x - x0) / (x1 - x0) * plot_w + GAP
            py = lay.margin.t + (y1 - y) / (y1 - y0) * plot_h
            font = tr.textfont.size
            boxes.append((px, py - 0.55 * font, px + text_px(plain, font), py + 0.55 * font))
    return boxes


@pytest.mark.parametrize("width,max_height,pruned", [(420, 560, True), (860, 560, False), (1200, None, True)])
def test_tree_labels_never_overlap_and_nothing_is_clipped(width, max_height, pruned) -> None:
    fig = TF.tree_figure(wide_tree(), show_pruned=pruned, width=width, max_height=max_height)
    boxes = label_boxes(fig)
    assert len(boxes) >= 4  # at least the root, the accepted chain's labels and the bonus
    for i, a in enumerate(boxes):
        assert 0 <= a[0] and a[2] <= fig.layout.width and 0 <= a[1] and a[3] <= fig.layout.height
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    bonus = next(t for t in fig.data if t.name == "bonus (target's token)")
    assert bonus.cliponaxis is False and fig.layout.yaxis.range[0] <= bonus.y[0] - 0.4
    if max_height:
        assert fig.layout.height <= max_height


def test_tree_legend_matches_the_markers() -> None:
    """Nodes are circles coloured by confidence: the legend says so with circle samples, the mixed
    node trace (square root, circles of every colour) stays out of it."""
    fig = TF.tree_figure(wide_tree(12), show_pruned=True)
    shown = {t.name: t for t in fig.data if t.showlegend is not False}
    assert "draft node" not in shown
    assert shown["draft node, low confidence"].marker.symbol == "circle"
    assert shown["root (last committed token)"].marker.symbol == "square"
    assert "reranked away (faded)" in shown and "faded = reranked away" in fig.layout.title.text
    assert "reranked away (faded)" not in {t.name for t in TF.tree_figure(wide_tree(12)).data}


def test_best_round_and_rounds_by_generated_position() -> None:
    rounds = [step(1, [root(), node(1, 0, 1, 0.9, accepted=True)], new=1),
              step(2, [root(), node(1, 0, 1, 0.9, accepted=True), node(2, 1, 2, 0.9, accepted=True)], new=2),
              step(3, [root(), node(1, 0, 1, 0.9, accepted=True), node(2, 1, 2, 0.9, accepted=True)], new=2),
              step(4, [root()], new=0)]
    steps = trace(rounds).steps  # the prefill writes token 0, the rounds 1, 2, 2 and 0 tokens
    assert TF.best_round(steps) == 2  # the longest accepted path, the earliest of two equals
    assert TF.best_round([prefill()]) == 0
    # prefill: token 0; round 1: token 1; round 2: tokens 2-3; round 3: tokens 4-5; round 4: none
    assert [TF.round_at_position(steps, p) for p in range(6)] == [0, 1, 2, 2, 3, 3]
    assert TF.round_at_position(steps, 99) == 4 and TF.round_start(steps, 3) == 4


def test_tree_svg_labels_never_overlap() -> None:
    import xml.etree.ElementTree as ET
    from analysis.tree_svg import tree_svg
    svg = ET.fromstring(tree_svg(wide_tree(), max_height=300))
    ns = "{http://www.w3.org/2000/svg}"
    font = float(svg.get("font-size"))
    labels = [(float(t.get("x")), float(t.get("y"))) for t in svg.findall(f"{ns}text") if t.get("dominant-baseline")]
    assert len(labels) >= 4
    for i, (x, y) in enumerate(labels):
        for x2, y2 in labels[i + 1:]:
            assert x != x2 or abs(y - y2) >= font * 1.2  # one level's labels at least a line apart


def test_paper_size_export_is_exactly_that_wide_with_fonts_embedded(tmp_path) -> None:
    """Two columns = 7 in: a PDF 504 pt wide that embeds its fonts, an SVG 672 CSS px (7 in) wide, a
    PNG of 7 in at 300 dpi; the tree is laid out afresh at the paper width (its labels fit it)."""
    import re
    import struct
    from analysis.export import PAPER_WIDTHS, PaperSize, write_figures
    paper = PaperSize(PAPER_WIDTHS["two columns (7 in)"])
    if find_browser() is None:
        pytest.skip("no Chrome/Chromium installed (apt-get install chromium)")
    fig = TF.tree_figure(wide_tree(20), width=paper.layout_width)
    result = write_figures({"tree": fig}, tmp_path, ("pdf", "svg", "png"), paper=paper)
    assert not result.messages, result.messages
    pdf = (tmp_path / "tree.pdf").read_bytes()
    box = re.search(rb"/MediaBox \[0 0 ([\d.]+) ([\d.]+)\]", pdf)
    assert float(box.group(1)) == pytest.approx(504, abs=1)
    assert b"/FontFile2" in pdf and b"LiberationSans" in pdf  # embedded (subset) TrueType fonts
    svg = (tmp_path / "tree.svg").read_text(encoding="utf-8")
    assert float(re.search(r'<svg[^>]* width="([\d.]+)"', svg).group(1)) == pytest.approx(672, abs=1)
    width, _ = struct.unpack(">II", (tmp_path / "tree.png").read_bytes()[16:24])
    assert width == pytest.approx(7 * 300, abs=2)


def _flaky_renderer(fail: dict[int, BaseException]):
    """A stand-in for kaleido's batch: attempt i (0, 1, ...) writes every job's file, unless fail names
    that attempt, when it writes none and returns that error. Records each attempt's file names."""
    attempts: list[list[str]] = []

    def render(jobs: list[dict], browser: str) -> list[BaseException]:
        attempts.append([j["final"].name for j in jobs])
        if len(attempts) - 1 in fail:
            return [fail[len(attempts) - 1]]
        for job in jobs:
            job["path"].write_bytes(b"image")
        return []
    return render, attempts


def test_a_render_the_browser_fails_once_is_retried_in_a_fresh_launch(tmp_path, monkeypatch) -> None:
    """Headless Chromium now and then fails a render under load; the export tries the empty ones once
    more before it falls back to HTML, and a second failure still falls back, saying why."""
    from analysis import export
    monkeypatch.setattr(export, "find_browser", lambda: "/usr/bin/chromium")
    render, attempts = _flaky_renderer({0: RuntimeError("JavascriptError: Uncaught")})
    monkeypatch.setattr(export, "_kaleido_write", render)
    figs = {"a": go.Figure(), "b": go.Figure()}
    result = export.write_figures(figs, tmp_path / "once", ("png", "pdf"))
    assert len(attempts) == 2 and attempts[1] == attempts[0]
    assert not result.messages and sorted(p.name for p in result.written) == ["a.pdf", "a.png", "b.pdf", "b.png"]
    render, attempts = _flaky_renderer({0: RuntimeError("Uncaught"), 1: RuntimeError("Uncaught again")})
    monkeypatch.setattr(export, "_kaleido_write", render)
    result = export.write_figures(figs, tmp_path / "twice", ("png",))
    assert len(attempts) == 2 and "Uncaught again" in result.messages[0]
    assert sorted(p.name for p in result.written if p.suffix == ".html") == ["a.html", "b.html"]


def test_a_failed_file_write_is_not_retried(tmp_path, monkeypatch) -> None:
    """A full disk stays full: one attempt, and the error names the directory."""
    import errno
    from analysis import export
    from eagle.records.files import WriteError
    monkeypatch.setattr(export, "find_browser", lambda: "/usr/bin/chromium")
    render, attempts = _flaky_renderer({0: OSError(errno.ENOSPC, "No space left on device")})
    monkeypatch.setattr(export, "_kaleido_write", render)
    with pytest.raises(WriteError, match="No space left"):
        export.write_figures({"a": go.Figure()}, tmp_path, ("png",))
    assert len(attempts) == 1 and list(tmp_path.iterdir()) == []


def test_calibration_has_wilson_intervals_and_a_minimum_count() -> None:
    """Bin [0.2, 0.3): 12 nodes, 3 accepted; bin [0.7, 0.8): 4 nodes, 4 accepted. With min_count 5 the
    small bin stays in the table (marked) but leaves the ECE and the curve."""
    from eagle.records.stats import wilson_interval
    quarter = [step(i + 1, [root(), *[node(j + 1, 0, 1, 0.25, rank=j, accepted=j == 0) for j in range(4)]])
               for i in range(3)]
    threes = [step(i + 10, [root(), node(1, 0, 1, 0.75, accepted=True)]) for i in range(4)]
    nodes = T.nodes_frame([trace(quarter + threes)])
    table = T.calibration_table(nodes, "confidence", bins=10, min_count=5)
    assert table["enough"].tolist() == [True, False]
    assert (table.loc[0, "ci_lo"], table.loc[0, "ci_hi"]) == pytest.approx(wilson_interval(3, 12))
    assert T.table_ece(table) == pytest.approx(0.0)  # only the 0.25 bin, exactly calibrated
    assert T.table_ece(T.calibration_table(nodes, "confidence", bins=10)) > 0
    fig = F.reliability_figure(nodes, "confidence", 10, min_count=5)
    curve = next(t for t in fig.data if t.name.startswith("all depths"))
    assert list(curve.x) == [0.25] and curve.error_y.array[0] > 0
    assert any(t.name == "fewer than 5 nodes (not in ECE)" for t in fig.data)
    sparse = F.reliability_figure(nodes, "confidence", 10, min_count=1000)  # every bin too small: still a figure
    assert "ECE n/a: no bin holds 1000 nodes over 0 nodes" in sparse.layout.title.text
    with pytest.raises(ValueError, match="min_count"):
        T.calibration_table(nodes, min_count=0)


def test_a_zero_rate_is_drawn_and_a_missing_position_is_not() -> None:
    """A position accepted 0 times of 3 has a dot at 0 with its n and a Wilson whisker above 0; the
    heatmap draws missing cells grey, distinct from a rate of 0."""
    rounds = one_child_steps(0.8, 3, hits=0)
    nodes = T.nodes_frame([trace(rounds)])
    fig = F.static_position_figure(nodes, mode=None)
    bar, dots = fig.data[0], fig.data[1]
    assert list(bar.y) == [0.0] and bar.error_y.array[0] > 0.2  # 0 of 3 is not "certainly 0"
    assert list(dots.y) == [0.0] and list(dots.text) == ["n=3"]
    assert "quartiles" not in fig.layout.title.text  # one prompt: no spread drawn
    assert "no position has 5" in F.static_position_figure(nodes, mode=None, min_count=5).layout.annotations[0].text
    assert F.depth_rank_heatmap(nodes).layout.plot_bgcolor == "#d9d9d9"


def test_compare_table_in_words_with_baselines() -> None:
    traces = [trace(one_child_steps(0.7, 4, 3)), trace(one_child_steps(0.4, 3, 1, "static"), "static"),
              trace(one_child_steps(0.0, 5, 0, "vanilla"), "vanilla")]
    for t, seconds in zip(traces, (1.0, 1.0, 2.0)):
        t.header.meta["seconds"] = seconds
    summary = T.mode_summary(T.steps_frame(traces), T.trace_seconds(traces))
    table = T.with_baseline_rows(summary, [{"mode": "hf_pld", "new_tokens": 10, "target_forwards": 5,
                                            "seconds": 1.0}])
    assert table["mode"].tolist() == ["vanilla", "hf_pld", "static", "dynamic"]
    words = T.plain_summary(table)
    assert list(words.columns) == ["vanilla (no draft)", "prompt lookup (HF generate)", "static tree (EAGLE-1)",
                                   "dynamic tree (EAGLE-2)"]
    vanilla_rate = summary.set_index("mode").loc["vanilla", "tokens_per_s"]
    assert words.loc["Speed-up over vanilla (tokens per second)", "prompt lookup (HF generate)"] == \
        f"{10 / vanilla_rate:.2f}x"
    assert words.loc["Tokens per target forward (τ)", "prompt lookup (HF generate)"] == "2.00"
    assert words.loc["Nodes verified per round, mean", "prompt lookup (HF generate)"] == "–"  # no rounds
    assert "–" in T.plain_summary(T.with_baseline_rows(summary[summary["mode"] != "vanilla"], [])).loc[
        "Speed-up over vanilla (tokens per second)"].tolist()
