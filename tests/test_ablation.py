"""The recipe ablation (eagle.training.ablation, `python -m eagle ablation`) on a tiny random target and tiny
EAGLE-3 features: every point trains, an interrupted run resumes without redoing finished points (and the
interrupted training from its checkpoint), and analysis draws its figure and table from the results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.__main__ import main as analysis_main
from analysis.ablation import ablation_figure, ablation_markdown
from eagle import cli
from eagle.models.headio import load_head
from eagle.training import ablation
from eagle.training.ablation import AblationConfig, run_ablation
from tests.tiny import tiny_features, tiny_target

VOCAB, LAYERS = 12, 8  # tests/tiny.py's vocabulary; EAGLE-3 features need a few layers


@pytest.fixture
def setup(tmp_path, single_thread):
    target = tiny_target(vocab=VOCAB, seed=3, eos=None, layers=LAYERS)
    tiny_features(target, tmp_path / "features")
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in
                                 enumerate([("writing", "a b c"), ("math", "1 2 3"), ("math", "4 5")])))
    cfg = AblationConfig(features=str(tmp_path / "features"), out=str(tmp_path / "out"), steps=4, batch=2,
                         warmup=1, draft_vocab_size=8, checkpoint_every=2, tau_per_category=1,
                         questions=str(questions), tau_max_new_tokens=8, tau_tree=(6, 2, 2))
    return target, cfg


def _spy(monkeypatch, interrupt_at: int | None = None) -> list[str]:
    """Record the point each train_head call trains; at call `interrupt_at`, train half the steps (leaving
    a checkpoint there) and then stop as Ctrl-C would."""
    calls, real = [], ablation.train_head

    def spy(target, features, out_dir, steps, *args, **kwargs):
        calls.append(Path(out_dir).name)
        if len(calls) == interrupt_at:
            real(target, features, out_dir, steps // 2, *args, **kwargs)
            raise KeyboardInterrupt
        return real(target, features, out_dir, steps, *args, **kwargs)

    monkeypatch.setattr(ablation, "train_head", spy)
    return calls


@pytest.mark.slow
def test_ablation_runs_resumes_and_draws(setup, monkeypatch, tmp_path):
    target, cfg = setup
    first = _spy(monkeypatch, interrupt_at=4)
    with pytest.raises(KeyboardInterrupt):
        run_ablation(target, cfg, progress=False)
    assert first == ["eagle1-0.25", "eagle1-ttt-0.25", "eagle3-0.25", "eagle1-0.5"]
    saved = json.loads((Path(cfg.out) / "ablation.json").read_text())
    assert sorted(saved["points"]) == ["eagle1-0.25", "eagle1-ttt-0.25", "eagle3-0.25"]  # written point by point
    assert all("tau" in p for p in saved["points"].values())

    second = _spy(monkeypatch)
    results = run_ablation(target, cfg, progress=False)
    assert second == ["eagle1-0.5", "eagle1-ttt-0.5", "eagle3-0.5", "eagle1-1", "eagle1-ttt-1", "eagle3-1"]
    points = results["points"]
    assert len(points) == 9 and json.loads((Path(cfg.out) / "ablation.json").read_text()) == results
    assert points["eagle1-0.5"]["resumed_from"] == 2 and points["eagle3-1"]["resumed_from"] == 0
    assert {p["steps"] for p in points.values()} == {4}
    assert [points[f"eagle3-{f}"]["train_samples"] for f in ("0.25", "0.5", "1")] == [3, 6, 12]  # of 12, nested
    assert [points[f"eagle1-{f}"]["train_tokens"] for f in ("0.25", "0.5", "1")] == [60, 120, 240]  # 20 each
    for p in points.values():
        accs = [p["heldout"][f"acc_step{j}"] for j in range(1, 5)]
        assert all(0 <= a <= 1 for a in accs) and p["heldout"]["positions"] > 0
        assert p["tau"]["questions"] == 2 and p["tau"]["tau"] >= 1  # one per category; a round yields >= 1 token
    run = json.loads((Path(cfg.out) / "runs" / "eagle1-ttt-0.5" / "run.json").read_text())
    assert (run["head_type"], run["ttt_steps"], run["loss"], run["train_samples"]) == ("eagle1", 2, "eagle1", 6)
    head = load_head(Path(cfg.out) / "runs" / "eagle3-0.25" / "head", target)
    assert head.kind == "eagle3" and head.lm_head.out_features == 8
    assert int(head.token_counts.sum()) == 3 * 10  # its vocabulary counted on its 3 samples' assistant halves
    assert load_head(Path(cfg.out) / "runs" / "eagle1-1" / "head", target).kind == "eagle1"

    third = _spy(monkeypatch)
    assert run_ablation(target, cfg, progress=False)["points"] == points and third == []  # nothing left to do
    moved = tmp_path / "moved-features"  # a clean clone or another machine: the same data at another path
    Path(cfg.features).rename(moved)
    again = run_ablation(target, AblationConfig(**{**cfg.__dict__, "features": str(moved)}), progress=False)
    assert again["points"] == points and again["settings"]["features"] == str(moved.resolve()) and third == []
    cfg = AblationConfig(**{**cfg.__dict__, "features": str(moved)})
    with pytest.raises(ValueError, match="steps=4 \\(this run: 5\\)"):
        run_ablation(target, AblationConfig(**{**cfg.__dict__, "steps": 5}), progress=False)

    fig = ablation_figure(results)
    assert len(fig.data) == 3 * 5  # three recipes x (four draft steps + tau)
    table = ablation_markdown(results).splitlines()
    assert len(table) == 2 + 9 and table[2].startswith("| EAGLE-1 recipe | 0.25 | 3 |")
    assert analysis_main(["ablation", "--results", str(Path(cfg.out) / "ablation.json"), "--out",
                          str(tmp_path / "fig"), "--formats", "svg"]) == 0
    assert (tmp_path / "fig" / "ablation.md").read_text() == "\n".join(table) + "\n"
    assert (tmp_path / "fig" / "ablation.csv").is_file()
    assert (tmp_path / "fig" / "ablation.svg").is_file() or (tmp_path / "fig" / "ablation.html").is_file()


@pytest.mark.parametrize("flags, words", [
    (["--fractions", "0.5,2"], "--fractions must each be in (0, 1]"),
    (["--fractions", "half"], "--fractions 'half': give numbers"),
    (["--recipes", "eagle1,eagle2"], "--recipes must be from eagle1, eagle1-ttt, eagle3"),
    (["--ttt-steps", "1"], "--ttt-steps must be >= 2"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--tau-tree", "8/2"], "--tau-tree '8/2': give TOTAL/DEPTH/TOP_K"),
    (["--tau-max-new-tokens", "0"], "--tau-max-new-tokens must be >= 1"),
])
def test_a_bad_flag_is_one_sentence_and_writes_nothing(tmp_path, capsys, flags, words):
    argv = ["ablation", "--features", str(tmp_path / "f"), "--out", str(tmp_path / "o"), *flags,
            "--model", str(tmp_path / "no-model")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1 and words in errors[0], err
    assert list(tmp_path.iterdir()) == []


def test_features_not_made_for_eagle3_are_refused(tmp_path, capsys, single_thread):
    target = tiny_target(vocab=VOCAB, seed=3, layers=LAYERS)
    tiny_features(target, tmp_path / "f")
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    (tmp_path / "f" / "manifest.json").write_text(json.dumps({**manifest, "head_type": "eagle1"}))
    assert cli.main(["ablation", "--features", str(tmp_path / "f"), "--out", str(tmp_path / "o"),
                     "--model", str(tmp_path / "no-model")]) == 2
    assert "is not an EAGLE-3 extraction" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_more_features_join_the_training_data_and_make_points_of_their_own(setup, tmp_path, capsys):
    """ablation --more-features (e.g. ShareGPT's original replies beside the self-distilled ones): each point is
    trained twice, on the features alone and with the other extraction's train split added (its held-out split
    stays out), scored on the same held-out set; the table shows both lines."""
    target, cfg = setup
    tiny_features(target, tmp_path / "more", n_train=5, seed=1)
    cfg = AblationConfig(**{**cfg.__dict__, "recipes": ("eagle3",), "fractions": (0.5,), "tau_per_category": 0,
                            "more_features": str(tmp_path / "more")})
    points = run_ablation(target, cfg, progress=False)["points"]
    assert sorted(points) == ["eagle3-0.5", "eagle3-0.5+more"]
    alone, more = points["eagle3-0.5"], points["eagle3-0.5+more"]
    assert (alone["train_samples"], more["train_samples"], more["more_samples"]) == (6, 6, 5)
    assert "more_samples" not in alone and (alone["train_tokens"], more["train_tokens"]) == (120, 220)
    assert more["heldout"]["positions"] == alone["heldout"]["positions"]  # one held-out set: --features'
    head = load_head(Path(cfg.out) / "runs" / "eagle3-0.5+more" / "head", target)
    assert int(head.token_counts.sum()) == (6 + 5) * 10  # the vocabulary is counted on both
    run = json.loads((Path(cfg.out) / "runs" / "eagle3-0.5+more" / "run.json").read_text())
    assert run["more_features"] == str((tmp_path / "more").resolve()) and run["more_features_sha256"]
    results = run_ablation(target, cfg, progress=False)
    table = ablation_markdown(results).splitlines()
    assert [row.split(" | ")[:3] for row in table[2:]] == [["| EAGLE-3", "0.5", "6"],
                                                          ["| EAGLE-3 + more data", "0.5", "6 + 5"]]
    xs = {trace.name: list(trace.x) for trace in ablation_figure(results).data if trace.showlegend}
    # the data axis counts samples; the more-data line starts at its recipe's point
    assert xs == {"EAGLE-3": [0.5], "EAGLE-3 + more data": [0.5, pytest.approx(0.5 + 5 / 12)]}

    manifest = json.loads((tmp_path / "more" / "manifest.json").read_text())
    (tmp_path / "more" / "manifest.json").write_text(json.dumps({**manifest, "heldout_fraction": 0.5}))
    argv = ["train", "--features", cfg.features, "--more-features", str(tmp_path / "more"), "--head-type", "eagle3",
            "--out", str(tmp_path / "train"), "--model", str(tmp_path / "no-model")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--more-features" in err and "heldout_fraction=0.5" in err, err
    assert not (tmp_path / "train").exists()
