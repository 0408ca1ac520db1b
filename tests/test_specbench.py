"""`bench --export spec-bench` on the real model (shipped head, a few tokens): the answer files parse the
way Spec-Bench's evaluation reads them, agree with our traces, keep no special token in their replies (as
Spec-Bench's eval.py writes them), and the printed speed-up is the one Spec-Bench's speed.py computes."""
import json
import math
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from eagle.models.conversion import resolve_model_path
from eagle.models.location import DEFAULT_MODEL
from eagle.tools.bench.command import main
from eagle.tools.bench.specbench import answer_text, format_speedups, mean_speed, read_answers, special_texts, speedups
from eagle.records.trace import read_trace
from tests.test_reliability import tiny_dir  # noqa: F401  (a fixture: the tiny model on disk)

pytestmark = pytest.mark.usefixtures("single_thread")
MODES = ("vanilla", "dynamic", "hf")


def _spec_bench(path, base_path, tokenizer):
    """Spec-Bench's speed.py, written out: a method's speed is the mean over questions of
    sum(new_tokens) / sum(wall_time) of choices[0]; the baseline's the same mean with its tokens recounted
    as len(tokenizer(turn).input_ids) - 1 per turn of its text; the speed-up is their ratio."""
    def lines(p):
        with open(p, encoding="utf-8") as f:
            return [json.loads(line)["choices"][0] for line in f]
    speed = sum(sum(c["new_tokens"]) / sum(c["wall_time"]) for c in lines(path)) / len(lines(path))
    base = lines(base_path)
    counts = [sum(len(tokenizer(t).input_ids) - 1 for t in c["turns"]) for c in base]
    base_speed = sum(n / sum(c["wall_time"]) for n, c in zip(counts, base)) / len(base)
    return speed, speed / base_speed, sum(counts)


class WordTokenizer:
    """Ids are words, plus a BOS in front when `bos` (the tokenizer speed.py's -1 assumes)."""
    special_tokens_map = {"eos_token": "<end>", "pad_token": "<end>", "additional_special_tokens": ["<a>", "<b>"]}

    def __init__(self, bos: bool) -> None:
        self.bos = bos

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[0] * self.bos + text.split())


def _answer(qid: int, turns: list[str], new_tokens: list[int], wall_time: list[float]) -> str:
    return json.dumps({"question_id": qid, "category": "writing", "choices": [
        {"index": 0, "turns": turns, "new_tokens": new_tokens, "wall_time": wall_time, "accept_lengths": []}]})


def test_replies_lose_every_special_token_text_and_surrounding_space():
    specials = special_texts(WordTokenizer(bos=False))
    assert specials == ("<end>", "<end>", "<a>", "<b>")
    assert answer_text("  Hello <a>there.<end>\n", specials) == "Hello there."
    assert special_texts(object()) == ()  # a tokenizer without a map: nothing to strip


@pytest.mark.parametrize("bos", [True, False])
def test_the_speedup_is_speed_py_s_with_the_baseline_recounted(tmp_path, bos):
    """Each word is a generated token: with a BOS the recount finds them all and vanilla is 1.0x itself;
    without one, speed.py's -1 drops a token a turn and every speed-up it prints grows."""
    tok = WordTokenizer(bos)
    base, fast = tmp_path / "base.jsonl", tmp_path / "fast.jsonl"
    base.write_text(_answer(1, ["a b c", "d e"], [3, 2], [2.0, 1.0]) + "\n" + _answer(2, ["f g"], [2], [1.0]) + "\n")
    fast.write_text(_answer(1, ["a b c", "d e"], [3, 2], [1.0, 0.5]) + "\n" + _answer(2, ["f g"], [2], [0.5]) + "\n")
    table, recount = speedups({"vanilla": base, "dynamic": fast}, tok)
    speed, ratio, counted = _spec_bench(fast, base, tok)
    assert table["dynamic"] == {"spec_bench_tokens_per_second": pytest.approx(speed),
                                "spec_bench_speedup": pytest.approx(ratio)}
    assert (recount.generated, recount.recounted) == (7, counted) and counted == (7 if bos else 4)
    assert table["vanilla"]["spec_bench_speedup"] == pytest.approx(_spec_bench(base, base, tok)[1])
    assert (table["vanilla"]["spec_bench_speedup"] == pytest.approx(1.0)) == bos
    text = format_speedups(table, {}, recount)
    assert f"{counted} tokens for the 7 generated" in text and "speed.py" in text
    no_base, none = speedups({"dynamic": fast}, tok)
    assert none is None and math.isnan(no_base["dynamic"]["spec_bench_speedup"])


@pytest.mark.slow
def test_spec_bench_export(tmp_path, capsys):
    rc = main(["--dataset", "mt_bench", "--dtype", "float32", "--limit", "2", "--turns", "2", "--max-new-tokens",
               "6", "--modes", ",".join(MODES), "--total-tokens", "8", "--depth", "3", "--top-k", "4",
               "--out", str(tmp_path), "--export", "spec-bench", "--baselines", "same"])
    out = capsys.readouterr().out
    assert rc == 0
    files = {p.stem: p for p in (tmp_path / "spec-bench").glob("*.jsonl")}
    assert sorted(files) == sorted(f"smollm2-135m-instruct-{m}-float32" for m in MODES)
    answers = {m: read_answers(files[f"smollm2-135m-instruct-{m}-float32"]) for m in MODES}
    for mode, lines in answers.items():
        assert [a["question_id"] for a in lines] == [81, 82]
        traces, _ = read_trace(tmp_path / "traces" / f"{mode}.jsonl")
        for a in lines:
            choice = a["choices"][0]
            assert a["model_id"] == f"smollm2-135m-instruct-{mode}-float32" and a["category"] == "writing"
            assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == 2
            mine = sorted((t for t in traces if t.header.meta["question_id"] == a["question_id"]),
                          key=lambda t: t.header.meta["turn"])
            assert choice["new_tokens"] == [sum(len(s.new_tokens) for s in t.steps) for t in mine]
            assert all(w > 0 for w in choice["wall_time"])
    # greedy fp32: every method writes the same replies
    assert [a["choices"][0]["turns"] for a in answers["dynamic"]] == [a["choices"][0]["turns"]
                                                                     for a in answers["vanilla"]]
    assert all(n == 1 for a in answers["vanilla"] for n in a["choices"][0]["accept_lengths"])
    assert all(a["choices"][0]["accept_lengths"] == [] for a in answers["hf"])
    dyn = [n for a in answers["dynamic"] for n in a["choices"][0]["accept_lengths"]]
    assert dyn and all(1 <= n <= 5 for n in dyn)  # depth 3 expands 3 times: 4 draft levels + the bonus
    # replies as Spec-Bench's eval.py writes them: no special token's text, no surrounding space
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    specials = special_texts(tokenizer)
    assert "<|im_end|>" in specials
    turns = [t for lines in answers.values() for a in lines for t in a["choices"][0]["turns"]]
    assert turns and all(t == t.strip() and not any(x in t for x in specials) for t in turns)
    # the printed Spec-Bench speed-up is speed.py's, the baseline's tokens recounted from its text
    base_file = files["smollm2-135m-instruct-vanilla-float32"]
    speed, ratio, counted = _spec_bench(files["smollm2-135m-instruct-dynamic-float32"], base_file, tokenizer)
    assert math.isclose(mean_speed(answers["dynamic"]), speed)
    printed = out[out.index("Spec-Bench answer files"):].splitlines()
    row = next(line.split() for line in printed if line.startswith("dynamic "))
    assert float(row[1]) == pytest.approx(speed, abs=0.006) and float(row[2]) == pytest.approx(ratio, abs=6e-4)
    generated = sum(n for a in answers["vanilla"] for n in a["choices"][0]["new_tokens"])
    assert f"{counted} tokens for the {generated} generated" in out[out.index("Spec-Bench answer files"):]


def test_answer_lines_are_sorted_by_question_id_as_spec_bench_leaves_them():
    """Spec-Bench's eval reorders every answer file by question_id; ours are written that way whatever the
    order the traces were run in (numeric ids numerically, 100 after 99)."""
    from eagle.tools.bench.specbench import answer_records
    from eagle.records.trace import StepRecord, Trace, TraceHeader

    def trace(qid) -> Trace:
        meta = {"question_id": qid, "turn": 1, "category": "writing", "new_tokens": 1, "seconds": 0.5}
        step = StepRecord(step=0, mode="vanilla", nodes=[], accepted=[], bonus_token=5, bonus_text="Hi",
                          new_tokens=[5], new_text="Hi", accept_length=1, timings={}, finished="eos")
        return Trace(TraceHeader("m", None, {}, "q", 3, meta), [step])
    records = answer_records([trace(q) for q in (100, 81, 99, 82)], "m-vanilla", tstamp=0.0)
    assert [r["question_id"] for r in records] == [81, 82, 99, 100]


# ---- an export never compares unlike runs (issue 37) -----------------------------------------------
def _tiny_bench(tiny_dir, dataset, out, modes: str, *extra: str) -> list[str]:
    return ["--model", str(tiny_dir), "--dataset", str(dataset), "--dtype", "float32", "--modes", modes,
            "--baselines", "same", "--head", "random", "--budget", "fixed", "--total-tokens", "4", "--depth", "1",
            "--top-k", "2", "--max-new-tokens", "8", "--limit", "2", "--out", str(out), *extra]


def _listing(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("first, second, words", [
    ("vanilla", ["--max-new-tokens", "16"], "vanilla.jsonl was made with max_new_tokens 8 and this run with 16"),
    ("vanilla", ["--dtype", "bfloat16"], "vanilla.jsonl was made with dtype 'float32' and this run with 'bfloat16'"),
    ("vanilla", ["--dataset", "{other}"], "vanilla.jsonl was made with dataset"),
    ("vanilla", ["--temperature", "0.7"], "vanilla.jsonl was made with temperature 0.0 and this run with 0.7"),
    ("vanilla", ["--limit", "3"], "vanilla.jsonl has no answer to question 3 turn 1 of this run"),
    ("static", ["--head", "{head}"], "static.jsonl was made with head"),
])
def test_an_export_over_runs_of_other_settings_is_refused_before_anything_is_written(tiny_dir, tmp_path, capsys,
                                                                                      first, second, words):
    from eagle.models.head import new_head
    from eagle.models.headio import save_head
    from eagle.models.loader import load_target
    from tests.test_reliability import QUESTIONS, _questions
    dataset = _questions(tmp_path / "q.jsonl", QUESTIONS)
    other = _questions(tmp_path / "other.jsonl", [q.upper() for q in QUESTIONS])
    if "{head}" in second:  # a head other than --head random's
        save_head(new_head(load_target(str(tiny_dir), dtype="float32"), seed=7), tmp_path / "head")
    out = tmp_path / "out"
    assert main(_tiny_bench(tiny_dir, dataset, out, first)) == 0
    before = _listing(out)
    capsys.readouterr()
    extra = [a.replace("{other}", str(other)).replace("{head}", str(tmp_path / "head")) for a in second]
    assert main([*_tiny_bench(tiny_dir, dataset, out, "dynamic"), *extra, "--export", "spec-bench"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(lines) == 1 and words in lines[0], err
    assert _listing(out) == before  # no trace of the new mode, no summary, no answer file


@pytest.mark.slow
def test_an_export_over_runs_of_the_same_settings_joins_them(tiny_dir, tmp_path, capsys):
    from tests.test_reliability import QUESTIONS, _questions
    dataset = _questions(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "out"
    assert main(_tiny_bench(tiny_dir, dataset, out, "vanilla", "--limit", "3")) == 0  # a superset of questions
    assert main([*_tiny_bench(tiny_dir, dataset, out, "dynamic"), "--export", "spec-bench"]) == 0
    files = {p.name: read_answers(p) for p in sorted((out / "spec-bench").glob("*.jsonl"))}
    assert len(files) == 2  # vanilla from the first run, dynamic from this one, over this run's 2 questions
    assert all([a["question_id"] for a in answers] == [1, 2] for answers in files.values())
