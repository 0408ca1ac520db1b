"""Training-time test (eagle.training.objective.unroll) against the decoder's own drafting, on the tiny model."""
from __future__ import annotations

import torch

from eagle.core.draft import Drafter
from eagle.training.features import Sequence
from eagle.training.objective import make_batch, ttt_loss, unroll
from tests.tiny import tiny_pair


def _pair():
    """The tiny pair with a head whose attention is sharp: at the default init (std 0.02) attention is
    almost uniform and would hide wrong positions or masks."""
    target, head = tiny_pair(vocab=40, seed=2)
    torch.manual_seed(5)
    for name, p in head.named_parameters():
        if p.requires_grad and p.dim() == 2:
            torch.nn.init.normal_(p, std=0.25)
    return target, head


def _sequence(target, n: int = 14, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, target.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))
    _, feats = target.forward(ids[None], torch.arange(n)[None], target.new_cache(n), 0, logits_rows=slice(0, 0))
    return ids, feats[0]


def _drafted_chain(head, target, ids: torch.Tensor, feats: torch.Tensor, t: int, depth: int) -> list[torch.Tensor]:
    """What the decoder's Drafter computes for the chain x_{t+2}, x_{t+3}, ... drafted after the
    context x_0..x_{t+1}: the root's hidden, then each chain node's hidden (depth outputs in all)."""
    drafter = Drafter(head, target.model.lm_head.weight, 64)
    hidden = drafter.consume(ids[1:t + 2], feats[:t + 1])  # (1, H): pairs (f_s, x_{s+1}), s <= t
    out = [hidden[0]]
    for d in range(1, depth):
        rows = torch.ones(1, d, dtype=torch.bool)  # a chain: every earlier node is an ancestor
        hidden = drafter.expand(ids[t + 1 + d:t + 2 + d], hidden, drafter.cache.length + d - 1, rows)
        out.append(hidden[0])
    return out


def test_unroll_matches_drafting_chain() -> None:
    target, head = _pair()
    ids, feats = _sequence(target)
    seq = Sequence(ids, feats.half().float().half(), torch.ones(len(ids), dtype=torch.bool))
    batch = make_batch([seq], 0.0, None, torch.device("cpu"))
    with torch.no_grad():
        steps = unroll(head, batch, 4)
    checked = 0
    for t in range(len(ids) - 5):
        chain = _drafted_chain(head, target, ids, seq.features.float(), t, 4)
        for j in range(4):
            err = (steps[j]["pred"][0, t] - chain[j]).abs().max() / chain[j].abs().max()
            assert err < 1e-5, (t, j, float(err))
            checked += 1
    assert checked == 4 * (len(ids) - 5)


def test_unroll_targets_and_validity_shift() -> None:
    target, head = tiny_pair(vocab=40, seed=2)
    ids, feats = _sequence(target, n=8)
    mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0], dtype=torch.bool)
    batch = make_batch([Sequence(ids, feats.half(), mask)], 0.0, None, torch.device("cpu"))
    with torch.no_grad():
        steps = unroll(head, batch, 3)
    # Step j at t predicts f_{t+j+1}, counted when x_{t+j+2} is an assistant token.
    for j, st in enumerate(steps):
        expected = [bool(mask[t + j + 2]) if t + j + 2 < 8 else False for t in range(7)]
        assert st["valid"][0].tolist() == expected
        assert torch.equal(st["target"][0, :7 - j], feats.half().float()[j + 1:])


def test_one_step_is_the_eagle1_recipe() -> None:
    """--ttt-steps 1: the chain step equals the plain causal forward, so today's results hold."""
    target, head = tiny_pair(vocab=40, seed=2)
    ids, feats = _sequence(target)
    batch = make_batch([Sequence(ids, feats.half(), torch.ones(len(ids), dtype=torch.bool))], 0.0, None,
                       torch.device("cpu"))
    with torch.no_grad():
        plain = head(batch["tokens"], batch["feats_in"], batch["positions"])
        step = unroll(head, batch, 1)[0]["pred"]
    assert torch.equal(plain, step)


def test_ttt_loss_weights_and_gradient_through_steps() -> None:
    target, head = tiny_pair(vocab=40, seed=2)
    ids, feats = _sequence(target)
    batch = make_batch([Sequence(ids, feats.half(), torch.ones(len(ids), dtype=torch.bool))], 0.0, None,
                       torch.device("cpu"))
    head.train()
    lm = target.model.lm_head.weight
    steps = unroll(head, batch, 3)
    parts = [ttt_loss(steps[j:j + 1], lm, "token", 1.0)["loss"] for j in range(3)]
    total = ttt_loss(steps, lm, "token", 0.5)["loss"]
    assert torch.allclose(total, parts[0] + 0.5 * parts[1] + 0.25 * parts[2])
    # The step-2 loss reaches fc through the fed-back step-1 prediction as well as step 2's own input.
    parts[1].backward()
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0
