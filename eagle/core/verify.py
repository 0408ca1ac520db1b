"""Verification of a drafted tree against the target, as pure functions.

All samplers emit (accepted node indices starting with the root 0, bonus token). The
emitted tokens of a round are tree.tokens[accepted[1:]] followed by the bonus token.
Randomness comes only from the torch.Generator passed in; sampling runs on its device.
"""
from __future__ import annotations

import functools
import math

import torch

from eagle.core.tree import Tree


def _check_sampling_params(temperature: float, top_p: float, top_k: int) -> None:
    if temperature == 0:
        raise ValueError("temperature 0 means greedy decoding: "
                         "use accept_greedy, not process_logits")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {top_p}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")


def _nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(..., V) bool: True for tokens outside the smallest set whose mass reaches top_p."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p  # (..., V); 0 for the top token: always kept
    drop_sorted = mass_before >= top_p
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def process_logits(logits: torch.Tensor, temperature: float, top_p: float,
                   top_k: int) -> torch.Tensor:
    """The target's processed distribution (..., V): temperature, then top-k, then top-p.

    top-k keeps every token tied with the k-th logit (as Hugging Face does).
    """
    _check_sampling_params(temperature, top_p, top_k)
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    scaled = logits / temperature  # (..., V)
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = scaled.softmax(dim=-1)  # (..., V)
    if top_p < 1:
        probs = probs.masked_fill(_nucleus_mask(probs, top_p), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def accept_greedy(tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest root-to-node path whose tokens each equal the target's argmax at their parent.

    Evaluated for all nodes at once; the bonus token is the argmax at the last accepted node. Ties
    in argmax resolve to the lowest token id, as in plain greedy; between equal paths, the one ending
    at the lower node index.
    """
    if target_logits.dim() != 2 or target_logits.shape[0] != tree.num_nodes:
        raise ValueError(f"target_logits must be (N={tree.num_nodes}, V), got "
                         f"{tuple(target_logits.shape)}")
    return accept_greedy_tokens(tree, target_logits.argmax(dim=-1))


def row_argmax(scores: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """scores (N, V) -> (N,) the argmax of each row, exactly torch.argmax's (ties and NaN included: the
    first maximum), in two passes: the maximum of each block of a row, then argmax inside the first
    block holding the row's maximum. On a CPU a plain max-reduction vectorises and an index-reduction
    does not (15 x 49,152 fp32, 2026-12-07, AMD EPYC Zen 5, 2 threads: ~55 us against argmax's ~250)."""
    n, v = scores.shape
    width = _block_width(v, block)
    # a few blocks (1,024 x 8 rows: 7 us against 21), or no divisor of V in [128, block]: one plain pass
    if v <= 4 * block or width is None:
        return scores.argmax(-1)
    blocks = scores.reshape(n, v // width, width)  # (N, B, W)
    first = blocks.amax(-1).argmax(-1)  # (N,) argmax takes the first block whose maximum ties
    return first * width + blocks[torch.arange(n, device=scores.device), first].argmax(-1)


@functools.lru_cache(maxsize=16)
def _block_width(vocab: int, block: int) -> int | None:
    return next((w for w in range(block, 127, -1) if vocab % w == 0), None)


def accept_greedy_tokens(tree: Tree, greedy: torch.Tensor) -> tuple[list[int], int]:
    """accept_greedy given the target's argmax after each node, greedy (N,) (the decoder's greedy_accept
    takes it from row_argmax). A node is accepted when it and each of its ancestors (its mask row) carries
    the target's choice at its parent; the path ends at the deepest such node, the lowest index on a tie
    (equal tokens: a lookup branch repeating a drafted child). Read from the mask, not from root-to-leaf
    paths: a round never builds those."""
    match = tree.tokens == greedy[tree.parents.clamp(min=0)]  # (N,) the root's entry is replaced below
    match[0] = True
    good = (tree.mask <= match).all(-1)  # (N,) every ancestor-or-self matches (mask implies match)
    best = torch.where(good, tree.depths, -1).argmax()  # argmax: the first of the deepest
    # one device-to-host copy for the round's result: the best node's mask row (its path), then the bonus
    row = torch.cat([tree.mask[best].long(), greedy[best].view(1)]).tolist()
    return [i for i, on in enumerate(row[:-1]) if on], row[-1]


def _check_sampling_inputs(tree: Tree, target_probs: torch.Tensor) -> None:
    if target_probs.dim() != 2 or target_probs.shape[0] != tree.num_nodes:
        raise ValueError(f"target_probs must be (N={tree.num_nodes}, V), got "
                         f"{tuple(target_probs.shape)}")


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))


def _sample(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One token from unnormalised non-negative weights (V,)."""
    return int(torch.multinomial(weights, 1, generator=generator))


def _try_children_q1(p: torch.Tensor, children: list[int], tokens: torch.Tensor,
                     generator: torch.Generator) -> int | None:
    """EAGLE-2 step (draft q = 1 per child); mutates the residual p (V,) in place.

    Accept child x with probability p(x)/sum(p); on reject zero p(x), so a duplicate
    sibling token is then rejected for sure. Returns the accepted child, or None.
    """
    for child in children:
        x = int(tokens[child])
        # Compare against the unnormalised mass: a sure token (p(x) == sum) is always accepted.
        if _uniform(generator) * float(p.sum()) < float(p[x]):
            return child
        p[x] = 0.0
    return None


def accept_sampling_dynamic(tree: Tree, target_probs: torch.Tensor, draft_conf: torch.Tensor,
                            generator: torch.Generator) -> tuple[list[int], int]:
    """EAGLE-2 lossless acceptance for a top-k drafted tree (each draft token has q = 1).

    target_probs (N, V): processed target distribution after each node. draft_conf (N,):
    the draft's confidence in each node's token; children are tried in descending order.
    """
    _check_sampling_inputs(tree, target_probs)
    if draft_conf.shape != (tree.num_nodes,):
        raise ValueError(f"draft_conf must be (N={tree.num_nodes},), got {tuple(draft_conf.shape)}")
    accepted = [0]
    while True:
        node = accepted[-1]
        # Only visited rows move to the generator's device (cheap for GPU-resident probs).
        p = target_probs[node].to(generator.device, torch.float64, copy=True)  # (V,) residual
        children = tree.children(node)
        children = children[torch.argsort(draft_conf[children], descending=True, stable=True)]
        child = _try_children_q1(p, children.tolist(), tree.tokens, generator)
        if child is None:  # leaf, or all children rejected: sample from the residual
            return accepted, _sample(p, generator)
        accepted.append(child)


def sample_children_without_replacement(q: torch.Tensor, k: int,
                                        generator: torch.Generator) -> torch.Tensor:
    """Draw k distinct tokens (..., k) from q (..., V) sequentially without replacement.

    Column j is the j-th draw, from q with the previous draws removed (renormalised). The
    static sampler is lossless only if each node's children were drawn this way, in this
    order (rank j = j-th draw): deterministic top-k children break the q-based residual.
    """
    if not 1 <= k <= q.shape[-1]:
        raise ValueError(f"k must be in [1, V={q.shape[-1]}], got {k}")
    if ((q > 0).sum(-1) < k).any():
        raise ValueError("q has fewer than k tokens with nonzero probability")
    weights = q.reshape(-1, q.shape[-1]).to(generator.device, torch.float64, copy=True)  # (B, V)
    rows = torch.arange(weights.shape[0], device=generator.device)
    draws = []
    for _ in range(k):
        x = torch.multinomial(weights, 1, generator=generator).squeeze(-1)  # (B,)
        weights[rows, x] = 0.0
        draws.append(x)
    return torch.stack(draws, dim=-1).reshape(*q.shape[:-1], k)


def _try_children_q(p: torch.Tensor, q: torch.Tensor, children: list[int], tokens: torch.Tensor,
                    generator: torch.Generator) -> tuple[int | None, torch.Tensor]:
    """SpecInfer multi-draft step: returns (accepted child or None, residual p (V,)).

    p and q are normalised (V,). Child x is accepted with prob min(1, p(x)/q(x)); on reject
    p <- norm(max(p - q, 0)) and q <- norm(q with x zeroed).
    """
    for child in children:
        x = int(tokens[child])
        if not q[x] > 0:
            raise ValueError("a child token has zero draft probability: children must be "
                             "drawn without replacement from draft_probs "
                             "(sample_children_without_replacement)")
        if _uniform(generator) * float(q[x]) < float(p[x]):
            return child, p
        residual = (p - q).clamp(min=0.0)
        if residual.sum() > 0:  # p == q cannot be rejected; keep p if rounding says otherwise
            p = residual / residual.sum()
        q = q.clone()
        q[x] = 0.0
        if q.sum() > 0:
            q = q / q.sum()
    return None, p


def accept_sampling_static(tree: Tree, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                           generator: torch.Generator) -> tuple[list[int], int]:
    """EAGLE-1 / SpecInfer lossless acceptance using the draft's real probabilities.

    draft_probs (N, V): the draft distribution at each node, from which that node's
    children were drawn WITHOUT replacement, in ascending node-index order (use
    sample_children_without_replacement; rank j = j-th draw). Children are verified in
    that order.
    """
    _check_sampling_inputs(tree, target_probs)
    if draft_probs.shape != target_probs.shape:
        raise ValueError(f"draft_probs must be {tuple(target_probs.shape)}, "
                         f"got {tuple(draft_probs.shape)}")
    accepted = [0]
    while True:
        node = accepted[-1]
        p = target_probs[node].to(generator.device, torch.float64)
        p = p / p.sum()  # (V,)
        children = tree.children(node).tolist()
        child = None
        if children:  # a leaf's draft_probs are never used (may be zeros)
            q = draft_probs[node].to(generator.device, torch.float64)
            child, p = _try_children_q(p, q / q.sum(), children, tree.tokens, generator)
        if child is None:
            return accepted, _sample(p, generator)
        accepted.append(child)
