"""What the head is trained on and scored by: batches of (f_t, x_{t+1}) -> f_{t+1} pairs, the EAGLE-1
loss (SmoothL1 on features + 0.1 soft cross-entropy through the target's lm_head) or the token-only
EAGLE-3 loss, training-time test (`unroll`: k draft steps from every position, each fed the previous
step's predicted feature), the learning-rate schedule, and held-out accuracy per draft step.
Pure functions of tensors and the head: no files, no optimizer."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..models.head import AnyHead
from ..models.kvcache import ChainKeys
from ..models.target import Target
from .features import Sequence



def make_batch(seqs: list[Sequence], noise: float, gen: torch.Generator | None,
               device: torch.device) -> dict[str, torch.Tensor]:
    """Pairs (f_t, x_{t+1}) -> f_{t+1}, right-padded. A pair counts when the token its target feature
    predicts, x_{t+2}, is an assistant token: that is the token the draft proposes from it.
    Uniform input noise of amplitude noise * 512 / T (the official recipe, T = sample length)."""
    n = max(len(s.input_ids) for s in seqs) - 1
    h_in = seqs[0].features.shape[1]  # 3H for EAGLE-3 features
    h_out = h_in if seqs[0].targets is None else seqs[0].targets.shape[1]
    tokens = torch.zeros(len(seqs), n, dtype=torch.long)
    feats_in, feats_out = torch.zeros(len(seqs), n, h_in), torch.zeros(len(seqs), n, h_out)
    valid = torch.zeros(len(seqs), n, dtype=torch.bool)
    for i, s in enumerate(seqs):
        m = len(s.input_ids) - 1
        f = s.features.float()
        last = f if s.targets is None else s.targets.float()
        tokens[i, :m], feats_in[i, :m], feats_out[i, :m] = s.input_ids[1:], f[:-1], last[1:]
        valid[i, :m - 1] = s.loss_mask[2:]
        if noise > 0:
            amp = noise * 512 / len(s.input_ids)
            feats_in[i, :m] += (torch.rand(m, h_in, generator=gen) - 0.5) * amp
    positions = torch.arange(n)[None].expand(len(seqs), n)
    batch = dict(tokens=tokens, feats_in=feats_in, feats_out=feats_out, valid=valid, positions=positions)
    return {k: v.to(device) for k, v in batch.items()}


def draft_logits(head: AnyHead | None, pred: torch.Tensor, lm_weight: torch.Tensor) -> torch.Tensor:
    """(M, H) -> (M, V') fp32 draft logits: an EAGLE-1/2 head's predicted feature scored by the
    target's lm_head rows lm_weight; an EAGLE-3 head's output by its own norm and lm_head."""
    if head is not None and head.kind == "eagle3":
        return head.draft_logits(pred.float()).float()
    return pred.float() @ lm_weight.T


def eagle_loss(pred: torch.Tensor, target: torch.Tensor, lm_weight: torch.Tensor,
               ce_weight: float = 0.1, head: AnyHead | None = None) -> dict[str, torch.Tensor]:
    """SmoothL1 on features + ce_weight * soft CE(softmax(target logits), log_softmax(draft logits)),
    both averaged over the given (already masked) positions: pred, target (M, H); lm_weight (V', H).
    With an EAGLE-3 head, lm_weight holds the target's lm_head rows of its K draft tokens (the
    target's distribution renormalised over them) and l1 is 0: that head predicts no feature."""
    eagle3 = head is not None and head.kind == "eagle3"
    l1 = pred.new_zeros((), dtype=torch.float32) if eagle3 else F.smooth_l1_loss(pred.float(), target.float())
    with torch.no_grad():
        target_p = torch.softmax(target.float() @ lm_weight.T, dim=-1)
    log_q = torch.log_softmax(draft_logits(head, pred, lm_weight), dim=-1)
    ce = -(target_p * log_q).sum(-1).mean()
    return dict(loss=l1 + ce_weight * ce, l1=l1, ce=ce)


LOSSES = ("eagle1", "token")  # eagle1: SmoothL1 + ce_weight * soft CE; token: soft CE only (EAGLE-3)


def default_loss(head_type: str) -> str:
    """The loss a head type trains with unless told otherwise: an EAGLE-3 head has no feature to regress."""
    return "token" if head_type == "eagle3" else "eagle1"
EVAL_STEPS = 4  # held-out accuracy is reported per draft step 1..EVAL_STEPS under the unrolled draft


def step_loss(pred: torch.Tensor, target: torch.Tensor, lm_weight: torch.Tensor, kind: str,
              ce_weight: float = 0.1, head: AnyHead | None = None) -> dict[str, torch.Tensor]:
    """The loss of one draft step over (M, H) masked positions; `token` keeps l1 for logging only."""
    losses = eagle_loss(pred, target, lm_weight, ce_weight, head)
    if kind == "token":
        losses["loss"], losses["l1"] = losses["ce"], losses["l1"].detach()
    return losses


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t + s] at column t, zero-padded at the end: (B, T, ...) -> (B, T, ...)."""
    if s == 0:
        return x
    pad = x.new_zeros((x.shape[0], min(s, x.shape[1])) + x.shape[2:])
    return torch.cat([x[:, s:], pad], dim=1)


def unroll(head: AnyHead, batch: dict[str, torch.Tensor], steps: int) -> list[dict[str, torch.Tensor]]:
    """Training-time test: from every position t, draft `steps` tokens as the decoder does. Step j
    (0-based) feeds the previous step's predicted feature with the real token x_{t+j+1} at position
    t + j and predicts f_{t+j+1}; per step: pred, target (B, T, H) and valid (B, T). Step 0 of an
    EAGLE-3 head reads the real 3H features through fc; later steps its own H-wide output."""
    chain, feats, out = ChainKeys(), batch["feats_in"], []
    for j in range(steps):
        pred = head.chain_step(_shift(batch["tokens"], j), feats, batch["positions"] + j, chain)
        out.append(dict(pred=pred, target=_shift(batch["feats_out"], j), valid=_shift(batch["valid"], j)))
        feats = pred
    return out


def ttt_loss(steps: list[dict[str, torch.Tensor]], lm_weight: torch.Tensor, kind: str, decay: float,
             ce_weight: float = 0.1, head: AnyHead | None = None) -> dict[str, torch.Tensor]:
    """sum_j decay^j * loss_j over the unrolled steps (EAGLE-3's 0.8^j); l1/ce are step 1's."""
    total, first = None, {}
    for j, st in enumerate(steps):
        if not bool(st["valid"].any()):
            continue  # late steps of short sequences may have nothing left to predict
        losses = step_loss(st["pred"][st["valid"]], st["target"][st["valid"]], lm_weight, kind, ce_weight, head)
        total = decay ** j * losses["loss"] if total is None else total + decay ** j * losses["loss"]
        first = first or losses
    return {**first, "loss": total}


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up to 1 over `warmup` steps, then linear decay to 0 at `steps`."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))


def reduced_lm_weight(target: Target, counts: torch.Tensor, vocab_k: int) -> torch.Tensor:
    """The lm_head rows of the vocab_k most frequent training tokens (all rows when vocab_k <= 0):
    the soft CE is then a renormalised distribution over those tokens, which cuts its CPU cost."""
    weight = target.model.lm_head.weight.detach().float()
    if vocab_k <= 0 or vocab_k >= weight.shape[0]:
        return weight
    return weight[torch.topk(counts, vocab_k).indices.sort().values.to(weight.device)].contiguous()


def _top1_matches(head: AnyHead, pred: torch.Tensor, target: torch.Tensor, lm_full: torch.Tensor,
                  chunk: int = 512) -> int:
    """Positions where the draft's top-1 target id equals argmax of the target logits (full vocab),
    in row chunks so (M, V) logits never materialise at once."""
    ids = head.target_ids() if head.kind == "eagle3" else None  # EAGLE-3: draft id -> target id
    hits = 0
    for i in range(0, pred.shape[0], chunk):
        p, t = pred[i:i + chunk].float(), target[i:i + chunk].float()
        top = draft_logits(head, p, lm_full).argmax(-1)
        hits += int(((top if ids is None else ids[top]) == (t @ lm_full.T).argmax(-1)).sum())
    return hits


@torch.no_grad()
def evaluate(head: AnyHead, seqs: list[Sequence], lm_weight: torch.Tensor, lm_full: torch.Tensor,
             batch: int = 4, full_ce: bool = False, amp: torch.dtype | None = None,
             loss: str = "eagle1") -> dict[str, float]:
    """Mean held-out step-1 losses (CE over lm_weight's vocabulary, plus the full-vocab CE when asked),
    top-1 agreement of draft and target over the pairs the training loss counts, and acc_step1..4:
    top-1 agreement at each depth of the unrolled draft (acc_step1 == top1)."""
    sums = dict(loss=0.0, l1=0.0, ce=0.0, ce_full=0.0)
    hits, counts = [0] * EVAL_STEPS, [0] * EVAL_STEPS
    for i in range(0, len(seqs), batch):
        b = make_batch(seqs[i:i + batch], 0.0, None, lm_full.device)
        with autocast_for(lm_full.device, amp):
            steps = unroll(head, b, EVAL_STEPS)
        for j, st in enumerate(steps):
            p, t = st["pred"][st["valid"]].float(), st["target"][st["valid"]]
            if p.shape[0] == 0:
                continue
            hits[j] += _top1_matches(head, p, t, lm_full)
            counts[j] += p.shape[0]
            if j == 0:
                _add_step1(sums, p, t, lm_weight, lm_full, full_ce, loss, head)
    total = counts[0]
    keys = ["loss", "l1", "ce"] + (["ce_full"] if full_ce else [])
    accs = {f"acc_step{j + 1}": hits[j] / max(counts[j], 1) for j in range(EVAL_STEPS)}
    return {**{k: sums[k] / max(total, 1) for k in keys}, "top1": accs["acc_step1"], **accs, "positions": total}


def _add_step1(sums: dict[str, float], p: torch.Tensor, t: torch.Tensor, lm_weight: torch.Tensor,
               lm_full: torch.Tensor, full_ce: bool, loss: str, head: AnyHead) -> None:
    n = p.shape[0]
    losses = step_loss(p, t, lm_weight, loss, head=head)
    for k, v in losses.items():
        sums[k] += float(v) * n
    if full_ce:  # an EAGLE-3 head drafts only its own vocabulary: its CE is the full one it has
        ce = losses["ce"] if head.kind == "eagle3" else eagle_loss(p, t, lm_full)["ce"]
        sums["ce_full"] += float(ce) * n


def autocast_for(device: torch.device, amp: torch.dtype | None):
    """Autocast to the target's reduced precision (fp32 master weights and optimizer state stay);
    plain fp32 when the target runs in fp32 (--dtype auto picks fp32 on CPUs without fast bf16)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp)
