"""`bench --export spec-bench` on the real model (shipped head, a few tokens): the answer files parse the
way Spec-Bench's evaluation reads them, agree with our traces, and the printed speed-up is theirs."""
import json
import math

import pytest

from eagle.tools.bench import main
from eagle.tools.specbench import mean_speed, read_answers
from eagle.trace import read_trace

pytestmark = pytest.mark.usefixtures("single_thread")
MODES = ("vanilla", "dynamic", "hf")


def _spec_bench_speed(path):
    """Spec-Bench's reading (evaluation/speed.py), written out: per question sum(new_tokens) /
    sum(wall_time) of choices[0], averaged; accept_lengths pooled over questions."""
    speeds, accepts = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            choice = json.loads(line)["choices"][0]
            speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
            accepts.extend(choice["accept_lengths"])
    return sum(speeds) / len(speeds), accepts


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
    # the printed Spec-Bench speed-up is Spec-Bench's own number
    base, _ = _spec_bench_speed(files["smollm2-135m-instruct-vanilla-float32"])
    speed, _ = _spec_bench_speed(files["smollm2-135m-instruct-dynamic-float32"])
    assert math.isclose(mean_speed(answers["dynamic"]), speed)
    printed = out[out.index("Spec-Bench answer files"):].splitlines()
    row = next(line.split() for line in printed if line.startswith("dynamic "))
    assert float(row[1]) == pytest.approx(speed, abs=0.006) and float(row[2]) == pytest.approx(speed / base, abs=6e-4)
