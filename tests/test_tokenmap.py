"""export-token-map: SGLang's --speculative-token-map file holds the same ids --draft-vocab drafts with."""
import torch

from eagle.cli import main


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
