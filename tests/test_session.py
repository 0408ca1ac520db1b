"""One session for every front end: the same prompt and settings give the same trace header (apart from
times and the generation id), the same tree and the same tokens from the CLI, the notebook API, the
dashboard's runner and bench."""
import json
from dataclasses import asdict, replace

import pytest

from app import runner, state
from app.state import Models
from eagle import cli
from eagle.core.config import DecodeConfig
from eagle.core.lookup import LOOKUP_TOKENS
from eagle.core.decode import generate
from eagle.models.headio import resolve_head
from eagle.tools.loading import budget_mode
from eagle.notebook import Explorer
from eagle.models.loader import load_target
from eagle.tools.bench import command as bench_command
from eagle.tools.budget import choice as budget_choice
from eagle.tools.budget.costs import Costs
from eagle.tools.budget.replay import AcceptModel
from eagle.tools.session import Session
from eagle.records.trace import read_trace
from tests.test_reliability import tiny_dir  # noqa: F401  (a fixture)
from tests.tiny import context_auto_report, fixed_auto_report

PROMPT = "Name a fruit."
TREE = dict(total_tokens=4, depth=2, top_k=2, max_new_tokens=8)
FLAGS = ["--head", "random", "--dtype", "float32", "--budget", "fixed", "--total-tokens", "4", "--depth", "2",
         "--top-k", "2", "--max-new-tokens", "8"]
SAME = ("model", "head", "prompt", "prompt_tokens", "head_type", "head_version", "head_layout")


def app_models(model) -> Models:
    """The pair as the dashboard loads it (app.state: the head in its own fastest precision, --head-dtype auto)."""
    return state.open_models(str(model), "random", "float32")


def _shared(header) -> dict:
    """What every front end's header must agree on (bench adds its question fields to meta)."""
    return {**{k: getattr(header, k) for k in SAME}, "dtype": header.meta["dtype"], "device": header.meta["device"]}


@pytest.mark.slow
def test_four_front_ends_write_the_same_header_and_tokens(tiny_dir, tmp_path, single_thread):  # noqa: F811
    model = str(tiny_dir)
    assert cli.main(["generate", "--model", model, "--prompt", PROMPT, *FLAGS, "--trace", str(tmp_path / "cli.jsonl"),
                     "--json", "--threads", "1"]) == 0
    cli_trace = read_trace(tmp_path / "cli.jsonl")[0][0]

    nb = Explorer().explore(PROMPT, model=model, head="random", dtype="float32", budget="fixed", **TREE)

    decoder, ids, app_trace = runner._prepare(app_models(model), PROMPT, DecodeConfig(**TREE))
    app_tokens = generate(decoder, ids).tokens

    dataset = tmp_path / "q.jsonl"
    dataset.write_text(json.dumps({"question_id": 1, "category": "c", "turns": [PROMPT]}) + "\n")
    assert bench_command.main(["--model", model, "--dataset", str(dataset), "--modes", "dynamic", "--baselines", "same",
                       *FLAGS, "--out", str(tmp_path / "bench"), "--threads", "1"]) == 0
    bench_trace = read_trace(tmp_path / "bench" / "traces" / "dynamic.jsonl")[0][0]

    headers = [cli_trace.header, nb.trace.header, app_trace.header, bench_trace.header]
    assert all(_shared(h) == _shared(cli_trace.header) for h in headers)
    assert cli_trace.header.head_version is not None and cli_trace.header.head_type == "eagle1"
    assert cli_trace.header.config == nb.trace.header.config == app_trace.header.config  # the same tree
    assert bench_trace.header.config == {**cli_trace.header.config, "dtype": "float32"}  # bench names the dtype
    tokens = [t for s in cli_trace.steps for t in s.new_tokens]
    assert tokens == nb.generation.tokens == app_tokens == [t for s in bench_trace.steps for t in s.new_tokens]


def _header_json(header, bench: bool = False) -> dict:
    """A header as its trace line holds it, less what differs by run (the generation id; the times and
    bench's question fields in meta; the dtype bench adds to the config)."""
    d = header.to_dict()
    del d["generation"]
    d["meta"] = {k: v for k, v in d["meta"].items() if k in ("dtype", "device", "note", "messages")}
    if bench:
        assert d["config"].pop("dtype") == header.meta["dtype"]
    return d


def test_auto_chooses_the_same_tree_per_prompt_in_every_front_end(tiny_dir, tmp_path, monkeypatch, capsys,
                                                                   single_thread):  # noqa: F811
    """Under the auto budget each front end tunes the tree for the prompt's context (prompt + half the
    reply), from one auto report: this prompt's context is far shorter than auto's reference, so its tree
    is another than auto's own choice, and bench (which reads the report once per run) decodes it too,
    records it in the header, resumes on it and refuses a store made with another."""
    report = context_auto_report()
    calls = []

    def auto_config(target, head, cfg, **kw):
        calls.append(1)
        return cfg.with_(**report.chosen), report
    monkeypatch.setattr(budget_choice, "auto_config", auto_config)
    model, flags = str(tiny_dir), ["--head", "random", "--dtype", "float32", "--budget", "auto", "--max-new-tokens", "8"]
    assert cli.main(["generate", "--model", model, "--prompt", PROMPT, *flags, "--trace", str(tmp_path / "cli.jsonl"),
                     "--json", "--threads", "1"]) == 0
    cli_trace = read_trace(tmp_path / "cli.jsonl")[0][0]
    tree = budget_choice.choice_at_context(report, cli_trace.header.prompt_tokens + 8 // 2)
    config = cli_trace.header.config
    assert {k: config[k] for k in report.chosen} == {k: tree[k] for k in report.chosen} != report.chosen

    nb = Explorer().explore(PROMPT, model=model, head="random", dtype="float32", budget="auto", max_new_tokens=8)
    _, _, app_trace = runner._prepare(app_models(model), PROMPT, DecodeConfig(max_new_tokens=8), "auto")
    dataset = tmp_path / "q.jsonl"
    dataset.write_text(json.dumps({"question_id": 1, "category": "c", "turns": [PROMPT]}) + "\n")
    bench = ["--model", model, "--dataset", str(dataset), "--modes", "dynamic", "--baselines", "same", *flags,
             "--out", str(tmp_path / "bench"), "--threads", "1"]
    calls.clear()
    capsys.readouterr()
    assert bench_command.main(bench) == 0
    assert len(calls) == 1  # the report is read once per run, not once per prompt (nor for the warm-up)
    assert "dynamic: the tree per prompt by context (prompt + max_new_tokens / 2); auto's reference 2/1/2/0 " \
        in capsys.readouterr().err
    bench_trace = read_trace(tmp_path / "bench" / "traces" / "dynamic.jsonl")[0][0]
    want = _header_json(cli_trace.header)
    assert _header_json(nb.trace.header) == _header_json(app_trace.header) == want
    assert _header_json(bench_trace.header, bench=True) == want
    tokens = [t for s in cli_trace.steps for t in s.new_tokens]
    assert tokens == nb.generation.tokens == [t for s in bench_trace.steps for t in s.new_tokens]
    summary = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert summary["configs"]["dynamic"]["budget"] == "auto"  # the mode's reference; each prompt's in its trace
    assert {k: summary["configs"]["dynamic"][k] for k in report.chosen} == report.chosen

    assert bench_command.main([*bench, "--json"]) == 0  # resumed: the stored tree is this prompt's
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["resumed"] == 1
    # a report whose grid holds only auto's reference tree: this run would choose 2/1/2/0 for the prompt
    small = AcceptModel.from_json({"ns": [1, 2], "depths": [1], "top_ks": [2], "vocabs": [0], "grid": {"2/0": [[1, 1.5]]}})
    monkeypatch.setattr(budget_choice, "auto_config", lambda t, h, cfg, **kw: (cfg, replace(report, accept_table=small)))
    assert bench_command.main(bench) == 2  # refused: not mixed with the stored 8/2/2/0
    assert f"was made with depth={tree['depth']} (this run: 1)" in capsys.readouterr().err


def test_budget_and_the_dashboard_show_the_report_auto_decodes_with(tiny_dir, monkeypatch, capsys):  # noqa: F811
    """`budget` (which setup runs) and the dashboard read the auto report made for the settings a generation
    under --budget auto runs with, its prompt-lookup branch on: the budget they show is the one that decodes,
    and the first generation finds it cached instead of calibrating again."""
    report, lookups = context_auto_report(), []

    def auto_config(target, head, cfg, **kw):
        lookups.append(budget_choice.report_lookup(cfg))
        return cfg.with_(**report.chosen), report
    monkeypatch.setattr(budget_choice, "auto_config", auto_config)
    flags = ["--model", str(tiny_dir), "--head", "random", "--dtype", "float32", "--threads", "1"]
    assert cli.main(["budget", *flags]) == 0
    assert cli.main(["generate", "--prompt", PROMPT, "--budget", "auto", "--max-new-tokens", "4", *flags]) == 0
    assert app_models(tiny_dir).session.auto_report() is report  # what the dashboard's pages show (app.state)
    assert lookups == [LOOKUP_TOKENS] * 3 and LOOKUP_TOKENS > 0
    assert "chosen: {'total_tokens': 2" in capsys.readouterr().out


def test_budget_policy_is_checked_once_and_defaults_by_mode(tiny_dir):  # noqa: F811
    class Args:
        budget, preset, total_tokens, depth, top_k, draft_vocab = None, None, None, None, None, None
    assert budget_mode(Args(), "dynamic", "cpu") == "auto" and budget_mode(Args(), "static", "cpu") == "fixed"
    assert budget_mode(Args(), "dynamic", "cuda") == "fixed"
    Args.budget = "huge"
    with pytest.raises(ValueError, match="budget must be one of fixed, auto, adaptive"):
        budget_mode(Args(), "dynamic", "cpu")
    target = load_target(str(tiny_dir), dtype="float32")
    session = Session.of(target, None, None)
    with pytest.raises(ValueError, match="sizes dynamic trees only"):
        session.prepare(PROMPT, DecodeConfig(mode="vanilla"), "auto")
    with pytest.raises(ValueError, match="sizes dynamic trees only"):
        Explorer().explore(PROMPT, model=str(tiny_dir), mode="vanilla", budget="auto")
    run = session.prepare(PROMPT, DecodeConfig(mode="vanilla", max_new_tokens=3))
    assert run.header.head is None and run.header.head_version is None and run.budget_report is None
    assert run.header.config == asdict(run.config) and run.header.meta == {"dtype": "float32", "device": "cpu"}
    conversation = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": PROMPT}]
    header = session.prepare(conversation, DecodeConfig(mode="vanilla", max_new_tokens=3)).header
    assert header.prompt == PROMPT and header.meta["messages"] == conversation


def test_auto_falls_back_to_vanilla_when_no_tree_pays(tiny_dir, monkeypatch):  # noqa: F811
    """A head the auto budget expects to lose (a random one) decodes as vanilla, and says why."""
    from eagle.tools import session as session_module
    target = load_target(str(tiny_dir), dtype="float32")
    head, source = resolve_head(target, "random")
    session = Session.of(target, head, source)
    costs = Costs("k", {1: 0.04, 2: 0.05}, {"2/0": (0.01, 0.005)}, 0.002)
    chosen = dict(total_tokens=4, depth=2, top_k=2, draft_vocab=0)
    losing = fixed_auto_report(chosen, costs, expected_speedup_same_dtype=0.44)
    monkeypatch.setattr(session_module.budget_choice, "tuned_config", lambda t, h, cfg, budget, context, report: (cfg, None, losing))
    run = session.prepare(PROMPT, DecodeConfig(**TREE), "auto")
    assert run.config.mode == "vanilla" and run.decoder.head is None and "0.44x" in run.note
    assert run.header.meta["note"] == run.note and run.header.head is None
    assert run.note.endswith("decoding as vanilla float32")  # fp32 is the fastest vanilla in that report
    elsewhere = replace(losing, vanilla_dtype="bfloat16")  # a CPU where bf16 decodes one token faster
    monkeypatch.setattr(session_module.budget_choice, "tuned_config", lambda t, h, cfg, budget, context, report: (cfg, None, elsewhere))
    note = session.prepare(PROMPT, DecodeConfig(**TREE), "auto").note
    assert "decoding as vanilla float32; vanilla bfloat16 is faster here (--mode vanilla --dtype auto" in note
    paying = replace(losing, expected_speedup_same_dtype=1.3)
    monkeypatch.setattr(session_module.budget_choice, "tuned_config", lambda t, h, cfg, budget, context, report: (cfg, None, paying))
    run = session.prepare(PROMPT, DecodeConfig(**TREE), "auto")
    assert run.config.mode == "dynamic" and run.note is None and "note" not in run.header.meta
    assert run.config.lookup_tokens == 10  # the auto family adds the prompt-lookup branch when greedy
    sampled = session.prepare(PROMPT, DecodeConfig(**TREE, temperature=0.7), "auto")
    assert sampled.config.lookup_tokens == 0
    assert session.prepare(PROMPT, DecodeConfig(**TREE, lookup_tokens=0), "auto").config.lookup_tokens == 0
    assert session.prepare(PROMPT, DecodeConfig(**TREE), "fixed").config.lookup_tokens == 0
