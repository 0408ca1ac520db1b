"""The dashboard through Streamlit's AppTest, on the real default model at small sizes.

One live generation (module fixture) feeds the analysis pages, so the file stays well under 90 s."""
from __future__ import annotations

import copy
import importlib.util
import io
import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import runner
from eagle.core.config import DecodeConfig
from eagle.models.location import DEFAULT_MODEL
from eagle.records.trace import read_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
APP, PAGES = ROOT / "app" / "main.py", ROOT / "app" / "pages"
TIMEOUT = 180  # seconds per script run: a loaded 2-core CI box decodes slowly
SMALL = dict(max_new_tokens=8, total_tokens=8, depth=2, top_k=3)
# Every page loads the real model pair and shows its auto budget (conftest's dashboard_budget: chosen once
# per run, before the first page runs, so no page waits on it inside AppTest's timeout).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dashboard_budget")]


def _page(name: str) -> AppTest:
    return AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=TIMEOUT)


def _set(at: AppTest, prefix: str, **values) -> None:
    """Set sidebar number inputs; tree sizes need the manual budget (auto hides them)."""
    radio = at.sidebar.radio(key=f"{prefix}_budget")
    if radio.value != "manual":
        radio.set_value("manual").run()
    for name, value in values.items():
        at.sidebar.number_input(key=f"{prefix}_{name}").set_value(value)


def _type_prompt(at: AppTest, text: str) -> None:
    """What the st_keyup component reports after typing (AppTest cannot drive the component itself)."""
    if importlib.util.find_spec("st_keyup") is not None:
        at.session_state["_st_keyup_live_prompt"] = {"value": text}
    else:  # st_keyup missing: the page falls back to st.text_input
        at.text_input(key="live_prompt").set_value(text)


def _type_area(at: AppTest, key: str, text: str) -> None:
    """What the multi-line editor (app.textarea) reports after typing (AppTest cannot drive it either)."""
    at.session_state[f"_textarea_{key}"] = {"value": text}


def _no_trouble(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def live() -> AppTest:
    """The router, a typed prompt, small settings: one real generation."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    _no_trouble(at)
    assert "Type a prompt" in at.info[0].value
    help_popover = at.get("popover")[0]  # the explainer, out of the way of the first screen
    assert help_popover.proto.popover.label == "How to read this page"
    assert any("bonus token" in m.value for m in at.markdown)
    assert at.sidebar.radio(key="live_budget").value == "auto"  # the machine-tuned tree by default
    assert at.sidebar.selectbox(key="dtype").value == "auto"
    assert any(c.value.startswith("Expected ") for c in at.sidebar.caption)
    _set(at, "live", **SMALL)
    _type_prompt(at, "Name three colours.")
    at.run()
    _no_trouble(at)
    return at


@pytest.fixture(scope="module")
def traces(live):
    return copy.deepcopy(live.session_state["traces"])


def test_live_generates_and_scrubs(live):
    metrics = {m.label: m.value for m in live.metric}
    assert metrics["Tokens"] == "8"
    assert float(metrics["τ"]) >= 1.0
    # The decoder's own rate (rounds' timings) is at least the wall clock's, which adds the page.
    assert float(metrics["Decoder tok/s"]) >= float(metrics["Wall-clock tok/s"]) > 0
    trace = live.session_state["live_run"]
    assert trace.header.meta["finished"] in ("max_new_tokens", "eos")
    assert len(live.get("plotly_chart")) == 1 and len(live.dataframe) == 1
    slider = live.slider[0]
    best = max(range(1, len(trace.steps)), key=lambda i: (len(trace.steps[i].accepted), -i))
    assert slider.value == best  # opens on the longest accepted path, and says so
    assert any(c.value.startswith(f"Opened on round {best}: the longest accepted path") for c in live.caption)
    for step in (0, 1):  # the prefill (no draft) and the first drafted round
        # the slider of the latest run: round 0 draws no tree, so its download widgets leave the page
        # (and their state), and an element of an older run would send their stale ids
        live.slider[0].set_value(step).run()
        _no_trouble(live)
    # Scrubbing reuses the trace: no new generation.
    assert live.session_state["live_run"] is trace
    spec = json.loads(live.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["title"]["text"].startswith("Round 1 (dynamic): ")  # "Round" as on the slider
    assert spec["layout"]["height"] <= 640 and spec["layout"]["margin"]["autoexpand"] is False
    labels = [b.label for b in live.get("download_button")]
    assert "Traces (JSONL): this run" in labels and len(labels) == len(set(labels))
    assert {"PNG", "SVG", "PDF"} <= set(labels)  # the figure, in the "Download figure" popover


def test_live_mode_and_seed_settings_rerun(live):
    before = live.session_state["live_run"]
    live.sidebar.selectbox(key="live_mode").set_value("vanilla")
    _set(live, "live", max_new_tokens=4, temperature=0.8, seed=3)  # the sampling path
    live.run()
    _no_trouble(live)
    after = live.session_state["live_run"]
    assert after is not before and after.header.config["mode"] == "vanilla"
    assert after.header.config["temperature"] == 0.8 and after.header.config["seed"] == 3
    assert {m.label: m.value for m in live.metric}["Tokens"] == "4"


def test_number_inputs_are_bounded_by_the_model(live):
    """Each input is bounded by the model (context, vocabulary) or the decoder and says its bound in
    its help (the browser refuses a value outside it; DecodeConfig.validate(limits) is tests/test_settings.py)."""
    _set(live, "live")
    inputs = {w.key: w for w in live.sidebar.number_input}
    seed, tokens, vocab = inputs["live_seed"], inputs["live_max_new_tokens"], inputs["live_draft_vocab"]
    assert (seed.min, seed.max) == (0, 2**53 - 1) and "largest whole number a browser holds" in seed.help
    assert tokens.max == 8191 and "context" in tokens.help  # SmolLM2's 8,192-token context
    assert vocab.max == 49152 and "49,152" in vocab.help
    assert (inputs["live_total_tokens"].min, inputs["live_total_tokens"].max) == (1, 1024)


def _stopped_after(full, steps: int):
    """The live page rerun after a Stop click that interrupted `full` after `steps` records."""
    partial = copy.deepcopy(full)
    partial.steps, partial.header.meta["finished"] = partial.steps[:steps], None
    at = _page("live").run()
    _set(at, "live", **{k: full.header.config[k] for k in (*SMALL, "seed")})
    _type_prompt(at, full.header.prompt)
    at.session_state["live_run"] = partial  # as app.live.generate leaves it: the run and what it was asked for
    # the sidebar's settings: the header's tree, with the prompt-lookup branch left to the budget (-1) as
    # the sidebar leaves it (the header holds what the fixed budget made of it, 0)
    asked = DecodeConfig(**{**full.header.config, "lookup_tokens": -1})
    at.session_state["live_run_request"] = runner.request_key(full.header.prompt, asked, "fixed")
    at.session_state["live_stop_requested"] = True
    at.run()
    _no_trouble(at)
    return at, partial


def test_stop_keeps_the_partial_trace(traces):
    """A Stop click interrupts the script; the next run marks the partial trace stopped, no rerun."""
    at, partial = _stopped_after(traces[0], 3)
    assert at.session_state["live_run"] is partial
    assert partial.header.meta["finished"] == "stopped" and len(partial.steps) == 3
    assert any("Stopped by the user" in c.value for c in at.caption)


def test_calibration_on_session_traces(traces):
    at = _page("calibration")
    at.session_state["traces"] = traces
    at.run()
    _no_trouble(at)
    assert at.metric[0].label.startswith("ECE")
    at.checkbox(key="cal_per_depth").check().run()
    at.radio(key="cal_by").set_value("value").run()
    at.number_input(key="cal_min_count").set_value(1).run()
    _no_trouble(at)
    assert len(at.get("plotly_chart")) == 1
    at.selectbox(key="cal_mode_filter").set_value("dynamic").run()  # only the traces of that mode
    _no_trouble(at)
    assert at.metric[0].label.startswith("ECE")


def test_calibration_reports_corrupt_lines(traces, tmp_path):
    good = tmp_path / "good.jsonl"
    write_trace(good, traces)
    lines = good.read_text(encoding="utf-8").splitlines()
    mixed = [lines[0], "{not json", *lines[1:], '{"kind": 3}']  # two corrupt lines among good ones
    (tmp_path / "mixed.jsonl").write_text("\n".join(mixed) + "\n")
    (tmp_path / "junk.jsonl").write_text("garbage\n\x00\x01\n")
    at = _page("calibration").run()
    at.radio(key="cal_source").set_value("A trace file or directory").run()
    at.text_input(key="cal_path").set_value(str(tmp_path / "mixed.jsonl")).run()
    assert not at.exception and not at.error
    assert "Skipped 2 corrupt line(s)" in at.warning[0].value
    at.text_input(key="cal_path").set_value(str(tmp_path)).run()  # a directory, with a junk file
    assert not at.exception
    assert any("junk.jsonl is not a readable trace" in e.value for e in at.error)
    assert at.metric, "the readable files are still analysed"
    at.text_input(key="cal_path").set_value(str(tmp_path / "missing.jsonl")).run()
    assert not at.exception and "does not exist" in at.error[0].value


def test_acceptance_page(traces):
    at = _page("acceptance")
    at.session_state["traces"] = traces
    at.run()
    _no_trouble(at)
    assert len(at.get("plotly_chart")) == 2
    at.selectbox(key="acc_mode_filter").set_value("dynamic").run()
    _no_trouble(at)
    assert at.selectbox(key="acc_head_filter").options[0] == "all"


def test_analysis_pages_without_traces():
    for name in ("calibration", "acceptance"):
        at = _page(name).run()
        _no_trouble(at)
        assert "No traces yet" in at.info[0].value


def test_compare_runs_both_modes():
    at = _page("compare").run()
    _set(at, "cmp", **{**SMALL, "max_new_tokens": 6})
    _type_area(at, "cmp_prompt", "Say hello.")
    at.button(key="cmp_run").click().run()
    _no_trouble(at)
    results = at.session_state["cmp_results"]
    assert set(results) == {"static", "dynamic", "vanilla"}
    assert all(t.header.meta["finished"] for t in results.values())
    assert len(at.get("plotly_chart")) == 3  # two trees and the accepted-length histogram
    table = at.table[0].value  # in words, with the baselines and the speed-up
    assert list(table.columns) == ["vanilla (no draft)", "prompt lookup (HF generate)", "static tree (EAGLE-1)",
                                   "dynamic tree (EAGLE-2)"]
    assert table.loc["Speed-up over vanilla (tokens per second)", "vanilla (no draft)"] == "1.00x"
    assert 1 <= int(table.loc["Tokens generated", "prompt lookup (HF generate)"]) <= 6  # eos may end it early
    # One slider of generated positions lines the two trees up on the token they wrote.
    at.slider(key=f"cmp_position_{at.session_state['cmp_run_id']}").set_value(1).run()
    _no_trouble(at)
    assert sum(c.value.startswith("Round 1 wrote tokens 1-") for c in at.caption) == 2


def test_budget_page_shows_the_choice_and_curve():
    at = _page("budget").run()
    _no_trouble(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Chosen tree"].startswith(tuple(f"{n} tokens" for n in range(2, 65)))
    assert metrics["Expected speedup over vanilla"].endswith("x")
    assert "Auto budget" in at.get("plotly_chart")[0].proto.spec
    assert len(at.dataframe) == 2


def test_auto_budget_drives_the_live_config(live):
    from app import state
    radio = live.sidebar.radio(key="live_budget")
    radio.set_value("auto").run()
    _no_trouble(live)
    chosen = state.auto_budget(state._load_models(DEFAULT_MODEL, "auto", "auto")).chosen
    config = live.session_state["live_run"].header.config
    assert {k: config[k] for k in chosen} == chosen
    live.sidebar.radio(key="live_budget").set_value("adaptive").run()  # auto's shape, sized every round
    _no_trouble(live)
    config = live.session_state["live_run"].header.config
    assert (config["depth"], config["top_k"]) == (chosen["depth"], chosen["top_k"])
    assert config["total_tokens"] >= chosen["total_tokens"]  # the cap: each round picks its own size
    live.sidebar.radio(key="live_budget").set_value("manual").run()  # the tree after the auto run
    _no_trouble(live)


def test_page_switch_keeps_prompt_settings_and_result(live):
    """Live -> Calibration -> Live: Streamlit drops the state of widgets a run does not draw; the
    saved copies bring back the prompt, every setting, the result and the slider position."""
    _set(live, "live", **{**SMALL, "seed": 5})
    live.run()
    trace = live.session_state["live_run"]
    live.slider[0].set_value(1).run()
    before = {k: live.session_state[k] for k in ("live_mode", "live_max_new_tokens", "live_seed",
                                                   "live_budget", "live_total_tokens", "dtype")}
    live.switch_page("pages/calibration.py").run()
    _no_trouble(live)
    assert live.multiselect(key="cal_runs").value  # this session's runs are offered there
    live.switch_page("pages/live.py").run()
    _no_trouble(live)
    assert live.session_state["live_run"] is trace  # no new generation on the way back
    assert {k: live.session_state[k] for k in before} == before
    assert live.slider[0].value == 1
    assert live.session_state["_saved_widgets"]["live_prompt"] == "Name three colours."
    assert live.get("popover")[0].proto.popover.label == "How to read this page"


def test_manual_budget_starts_from_auto():
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    chosen = at.session_state["live_auto_chosen"]
    at.sidebar.radio(key="live_budget").set_value("manual").run()
    _no_trouble(at)
    shown = {f: at.sidebar.number_input(key=f"live_{f}").value for f in chosen}
    assert shown == chosen


def test_dtype_is_shown_and_keys_the_model_pair():
    from app import state
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    note = next(c.value for c in at.sidebar.caption if c.value.startswith("Precision in use"))
    auto = state._load_models(DEFAULT_MODEL, "auto", "auto")
    assert f"**{auto.dtype_label}**" in note and auto.target.dtype_report["reason"] in note
    badge = at.sidebar.success[0].value
    assert badge == "Draft head: trained head (eagle/resources/heads/smollm2-135m-instruct)"  # no machine path
    kind = next(c.value for c in at.sidebar.caption if c.value.startswith("Head type"))
    assert kind.startswith("Head type: **EAGLE-1/2 head** · version `") and auto.head_identity["head_version"] in kind
    # A manual tree: the float32 pair then needs no auto budget of its own (measuring one, the whole grid in
    # fp32, took this test over three minutes of the suite's twelve); the dtype switch is what is tested.
    at.sidebar.radio(key="live_budget").set_value("manual").run()
    at.sidebar.selectbox(key="dtype").set_value("float32").run()
    _no_trouble(at)
    named = state._load_models(DEFAULT_MODEL, "auto", "float32")
    assert named is not auto and named.dtype_reason is None
    assert any(c.value == "Precision in use: **float32**" for c in at.sidebar.caption)


def test_long_prompt_warns_then_runs_on_request():
    from app import live as live_mod
    at = _page("live").run()
    _set(at, "live", **{**SMALL, "max_new_tokens": 2})
    long_prompt = "the sky is blue " * 300  # about 1200 tokens, over the threshold
    _type_prompt(at, long_prompt)
    at.run()
    assert not at.exception and "live_run" not in at.session_state
    warning = at.warning[0].value
    assert "tokens long" in warning and " s or more" in warning
    n = int(warning.split(" is ")[1].split(" tokens")[0].replace(",", ""))
    assert n > live_mod.LONG_PROMPT_TOKENS
    at.button(key="live_long_run").click().run()
    _no_trouble(at)
    assert at.session_state["live_run"].header.prompt == long_prompt
    assert at.session_state["live_run"].header.meta["finished"] == "max_new_tokens"


def test_stop_at_the_prefill_shows_no_empty_tree(traces):
    at, partial = _stopped_after(traces[0], 1)
    assert not at.get("plotly_chart")
    assert any("Round 0 is the prefill" in i.value for i in at.info)


def test_streaming_redraws_the_tree_throttled_and_always_the_last_round(monkeypatch):
    """A fake clock that ticks once a round and a redraw interval of 4 ticks: the streamed element (text,
    summary, SVG tree) is drawn on round 1, then every fourth round, never the last; the finished view's
    plotly chart draws once, the round it opens on (the longest accepted path)."""
    from app import live as live_mod
    ticks = iter(range(10_000))
    monkeypatch.setattr(live_mod, "clock", lambda: next(ticks))
    monkeypatch.setattr(live_mod, "STREAM_S", 4)
    streamed: list[int] = []
    drawn: list[int] = []
    real_svg, real_figure = live_mod.tree_svg, live_mod.tree_figure
    monkeypatch.setattr(live_mod, "tree_svg", lambda step, **kw: streamed.append(step.step) or real_svg(step, **kw))
    monkeypatch.setattr(live_mod, "tree_figure", lambda step, **kw: drawn.append(step.step) or real_figure(step, **kw))
    at = _page("live").run()
    _set(at, "live", max_new_tokens=24, total_tokens=2, depth=0, top_k=1)
    _type_prompt(at, "Count from one to twenty.")
    at.run()
    _no_trouble(at)
    trace = at.session_state["live_run"]
    last = trace.steps[-1].step
    best = max(range(1, len(trace.steps)), key=lambda i: (len(trace.steps[i].accepted), -i))
    assert last > 5 and drawn == [trace.steps[best].step]  # the finished view: the slider's round, once
    assert streamed == [s for s in range(1, last + 1, 4) if s != last]
    assert len(at.get("plotly_chart")) == 1


def test_history_picker_on_analysis_pages(traces):
    two = copy.deepcopy(traces[:1]) * 2
    two[1] = copy.deepcopy(two[1])
    two[1].header.prompt = "Another prompt."
    at = _page("acceptance")
    at.session_state["traces"] = two
    at.run()
    _no_trouble(at)
    picker = at.multiselect(key="acc_runs")
    assert picker.value == [0, 1] and "“Another prompt.”" in picker.options[1]
    picker.set_value([1]).run()
    _no_trouble(at)
    assert any(c.value.startswith("1 trace(s)") for c in at.caption)


def test_measured_speedup_is_read_from_the_newest_bench_run(tmp_path):
    from app.benchmarks import measured_auto_speedup
    assert measured_auto_speedup(tmp_path) is None
    for name, speedup in (("20261201-000000", 1.05), ("20261202-000000", 1.17)):
        (tmp_path / name).mkdir()
        modes = {"vanilla": {"speedup": 1.0}, "dynamic:auto": {"speedup": speedup}}
        (tmp_path / name / "summary.json").write_text(json.dumps({"modes": modes, "configs": {}, "generations": 2}))
    (tmp_path / "20261203-000000").mkdir()
    (tmp_path / "20261203-000000" / "summary.json").write_text("{half written")
    got = measured_auto_speedup(tmp_path)
    assert got.speedup == 1.17 and got.where == "dynamic:auto, runs/bench/20261202-000000"


def test_compare_empty_prompt_is_an_error():
    at = _page("compare").run()
    at.button(key="cmp_run").click().run()
    assert not at.exception
    assert at.error[0].value == "The prompt is empty: type something to generate from."


def test_runner_stop_and_lock(traces):
    """on_step returning True stops cleanly; a held lock makes the run wait (calling on_wait)."""
    from app import runner, state
    from eagle.core.config import DecodeConfig
    from eagle.models.location import DEFAULT_MODEL
    models = state._load_models(DEFAULT_MODEL, "auto", "auto")  # the AppTests' cached pair
    decoder, ids, trace = runner.prepare(models, "Count to ten.", DecodeConfig(**SMALL))
    waits = []
    models.lock.acquire()
    threading.Timer(0.6, models.lock.release).start()
    runner.run(models, decoder, ids, trace, on_step=lambda tr: len(tr.steps) >= 2,
               on_wait=lambda: waits.append(time.monotonic()))
    assert waits and trace.header.meta["finished"] == "stopped" and len(trace.steps) == 2
    assert models.lock.acquire(blocking=False)
    models.lock.release()
    # A trace already marked stopped (by the session's next run, while this thread finished its
    # round) takes no more rounds and stays stopped.
    decoder, ids, trace = runner.prepare(models, "Count to ten.", DecodeConfig(**SMALL))
    trace.header.meta["finished"] = "stopped"
    runner.run(models, decoder, ids, trace, on_step=lambda tr: False, on_wait=lambda: None)
    assert trace.steps == [] and trace.header.meta["finished"] == "stopped"


def test_exports_round_trip(traces, tmp_path):
    from app import exports
    path = tmp_path / "t.jsonl"
    path.write_bytes(exports.traces_jsonl(traces))
    back, report = read_trace(path)
    assert report.skipped_lines == 0 and len(back) == len(traces)
    frame = pd.read_parquet(io.BytesIO(exports.nodes_parquet(traces)))
    assert len(frame) > 0 and {"depth", "rank", "confidence", "accepted"} <= set(frame.columns)
    failing = exports._deferred(lambda: (_ for _ in ()).throw(RuntimeError("no browser")))
    assert failing() == b"Export failed: no browser\n"


def test_token_html_escapes_text(traces):
    from app.render import token_html
    step = copy.deepcopy(traces[0].steps[1])
    step.new_text = '<script>alert("x")</script> & more'
    out = token_html([step])
    assert "<script>" not in out and "&lt;script&gt;" in out and "&amp; more" in out
    json.dumps(out)  # plain text, no objects leaking in


def test_multiline_prompt_system_prompt_and_chat_turns():
    """The multi-line editor keeps line breaks and emoji; a system prompt and the kept turns reach the
    decoder as messages through the chat template (the trace's meta records them)."""
    at = _page("live").run()
    _set(at, "live", **SMALL)
    at.toggle(key="live_multiline").set_value(True).run()
    text = "Line one 🙂\nLine two."
    _type_area(at, "live_prompt_area_0", text)
    at.text_area(key="live_system").set_value("Answer briefly.")
    at.run()
    _no_trouble(at)
    first = at.session_state["live_run"]
    assert first.header.prompt == text  # the line break and the emoji intact
    assert first.header.meta["messages"] == [{"role": "system", "content": "Answer briefly."},
                                             {"role": "user", "content": text}]
    at.toggle(key="live_chat").set_value(True).run()
    at.button(key="live_keep_turn").click().run()
    _no_trouble(at)
    assert at.session_state["live_prompt_area_gen"] == 1  # a new, empty editor for the next message
    assert "Type a prompt" in at.info[0].value
    _type_area(at, "live_prompt_area_1", "And a third line?")
    at.run()
    _no_trouble(at)
    second = at.session_state["live_run"]
    roles = [m["role"] for m in second.header.meta["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert second.header.meta["messages"][2]["content"] == "".join(s.new_text for s in first.steps)
    assert [c.name for c in at.chat_message] == ["user", "assistant"]  # the kept turn, above the box


def test_history_page_lists_reopens_and_deletes(traces):
    """The live fixture's runs were kept on disk (the test's EAGLE_CACHE): the page lists them, opens
    one into a fresh session and deletes it."""
    from app.history import RunStore
    before = RunStore().runs()
    assert len(before) >= 1
    at = _page("history").run()
    _no_trouble(at)
    assert len(at.dataframe[0].value) == len(before)
    at.button(key="hist_open").click().run()
    _no_trouble(at)
    assert at.success and len(at.session_state["traces"]) == 1
    at.button(key="hist_delete").click().run()
    _no_trouble(at)
    assert len(RunStore().runs()) == len(before) - 1
