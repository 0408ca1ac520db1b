"""export-token-map: SGLang's --speculative-token-map file holds the same ids --draft-vocab drafts with."""
import pytest
import torch
from safetensors.torch import save_file

from eagle.cli import main
from eagle.models.headio import COUNTS_FILE, load_head, save_head
from tests.tiny import tiny_pair


def test_token_map_matches_the_draft_vocabulary(tmp_path, trained_head, capsys):
    out = tmp_path / "map.pt"
    assert main(["export-token-map", "--k", "4096", "--out", str(out)]) == 0
    ids = torch.load(out, weights_only=True)  # as SGLang's load_token_map reads it
    assert ids.dtype == torch.int64 and ids.shape == (4096,)
    assert torch.equal(ids, trained_head.draft_vocab_ids(4096).cpu())
    assert main(["export-token-map", "--k", "4096", "--out", str(out)]) == 2  # no overwrite without --force
    assert "--force" in capsys.readouterr().err
    assert main(["export-token-map", "--k", "0", "--out", str(tmp_path / "x.pt")]) == 2
    assert not (tmp_path / "x.pt").exists()


# ---- the counts are read as load_head reads them (eagle.models.headio.read_token_counts), on a tiny head ----------
def _tiny_head_dir(path):
    target, head = tiny_pair()
    head.token_counts.copy_(torch.arange(12))
    save_head(head, path)
    return target, path


def test_a_tiny_heads_map_is_its_draft_vocabulary(tmp_path):
    target, path = _tiny_head_dir(tmp_path / "h")
    assert main(["export-token-map", "--head", str(path), "--k", "4", "--out", str(tmp_path / "m.pt")]) == 0
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True), load_head(path, target).draft_vocab_ids(4))


BAD_COUNTS = {  # counts file -> words of the sentence
    "garbage": (lambda f: f.write_bytes(b"\x00" * 40), "is corrupt or incomplete"),
    "another key": (lambda f: save_file({"counts": torch.ones(12, dtype=torch.long)}, str(f)),
                    "holds no token_counts tensor"),
    "shorter than the vocabulary": (lambda f: save_file({"token_counts": torch.ones(5, dtype=torch.long)},
                                                        str(f)), "shape (5,), not one count per token"),
    "longer than the vocabulary": (lambda f: save_file({"token_counts": torch.ones(100, dtype=torch.long)}, str(f)),
                                   "of the head's vocabulary of 12"),
    "negative": (lambda f: save_file({"token_counts": -torch.ones(12, dtype=torch.long)}, str(f)), "not counts"),
    "fractional": (lambda f: save_file({"token_counts": torch.rand(12)}, str(f)), "not counts"),
}


@pytest.mark.parametrize("case", sorted(BAD_COUNTS))
def test_bad_token_counts_are_one_sentence_for_load_head_and_the_map(tmp_path, capsys, case):
    target, path = _tiny_head_dir(tmp_path / "h")
    damage, words = BAD_COUNTS[case]
    damage(path / COUNTS_FILE)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_head(path, target)
    assert main(["export-token-map", "--head", str(path), "--k", "4", "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1 and f"{path / COUNTS_FILE}" in err and words in err
    assert not (tmp_path / "m.pt").exists()
