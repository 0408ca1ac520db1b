"""`python -m eagle profile`: a round's phases cover the round, the overhead is the round less its
verify forward, and bad input is one sentence."""
import json

import pytest

from eagle import cli
from eagle.core.config import DecodeConfig
from eagle.tools.profile import OUTSIDE, profile_rounds, tiny_llama
from tests.test_reliability import _one_sentence, tiny_dir  # noqa: F401  (a fixture)
from tests.tiny import tiny_pair

FIXED = ["--budget", "fixed", "--total-tokens", "4", "--depth", "2", "--top-k", "2", "--max-new-tokens", "10",
         "--prompts", "1", "--threads", "1", "--dtype", "float32", "--head", "random"]


def test_phases_sum_to_the_round_and_overhead_is_the_rest(single_thread):
    target, head = tiny_pair(vocab=12, eos=None)
    cfg = DecodeConfig(mode="dynamic", total_tokens=4, depth=2, top_k=2, max_new_tokens=16)
    p = profile_rounds(target, head, cfg, [[1, 2, 3], [4, 5]], "tiny")
    names = [r.phase for r in p.phases]
    assert names[:3] == ["draft.0", "draft.1", "draft.2"] and names[-1] == OUTSIDE and "verify" in names
    assert sum(r.share for r in p.phases) == pytest.approx(1.0)
    assert sum(r.ms_per_round for r in p.phases) == pytest.approx(p.round_ms)
    assert p.overhead_ms == pytest.approx(p.round_ms - p.ms("verify")) and 0 < p.overhead_share < 1
    assert p.ms("draft") == pytest.approx(sum(r.ms_per_round for r in p.phases if r.phase.startswith("draft.")))
    # 15 new tokens each (the prefill makes the 16th): every round's accepted tokens are counted once
    assert p.tokens == 32 and p.rounds * p.accept_length == pytest.approx(30)


def test_tiny_llama_shares_the_tokenizer_and_is_tiny(tiny_dir):  # noqa: F811
    from eagle.models.loader import load_target
    like = load_target(str(tiny_dir), dtype="float32")
    tiny, head = tiny_llama(like)
    assert tiny.tokenizer is like.tokenizer and tiny.config.vocab_size == like.config.vocab_size
    assert (tiny.config.num_hidden_layers, tiny.config.hidden_size, tiny.dtype) == (2, 64, like.dtype)
    assert head.config.hidden_size == 64


def test_profile_command_prints_and_writes_both_models(tiny_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "profile.json"
    assert cli.main(["profile", "--model", str(tiny_dir), *FIXED, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dynamic 4/2/2/0" in printed and "overhead" in printed and "tiny-llama-2x64 float32" in printed
    report = json.loads(out.read_text())
    assert [p["label"].split()[0] for p in report["profiles"]] == [str(tiny_dir), "tiny-llama-2x64"]
    assert all(p["rounds"] > 0 and 0 < p["overhead_share"] < 1 for p in report["profiles"])
    before = out.read_text()

    assert cli.main(["profile", "--model", str(tiny_dir), *FIXED, "--json", str(out)]) == 2  # never overwritten
    assert "--force" in _one_sentence(capsys.readouterr().err) and out.read_text() == before
    assert cli.main(["profile", "--model", str(tiny_dir), *FIXED, "--prompts", "0"]) == 2
    assert "--prompts must be >= 1, got 0" in _one_sentence(capsys.readouterr().err)
    for no_tree in (["--preset", "vanilla"], ["--total-tokens", "1"]):  # nothing to profile: said, not run
        assert cli.main(["profile", "--model", str(tiny_dir), *no_tree]) == 2
        assert no_tree[0] in _one_sentence(capsys.readouterr().err)
    assert cli.main(["profile", "--model", str(tiny_dir), *FIXED, "--no-tiny", "--json", str(out), "--force"]) == 0
    assert len(json.loads(out.read_text())["profiles"]) == 1
