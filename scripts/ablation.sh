#!/usr/bin/env bash
# The head ablation of issue #14: one EAGLE-3 extraction (which also holds the EAGLE-1 features), three heads
# trained from scratch with the same data, held-out set and step budget, each scored by `evaluate`.
# Every stage resumes where it stopped; rerun the script after an interruption.
#   usage: scripts/ablation.sh [CONVERSATIONS] [STEPS] [OUT] [DTYPE]   (defaults: 2048 400 runs/ablation auto)
# DTYPE is the target's (features and training autocast; auto: the faster on this machine); one OUT, one dtype.
set -euo pipefail
cd "$(dirname "$0")/.."
convs=${1:-2048}; steps=${2:-400}; out=${3:-runs/ablation}; dtype=${4:-auto}
py=(.venv/bin/python -m eagle)
common=(--threads 1 --dtype "$dtype")
feats=$out/features-eagle3-$convs
"${py[@]}" prepare --self-distill --distill-dir data/distill/smollm2-135m-instruct --conversations "$convs" \
    --max-len 512 --heldout-fraction 0.05 --head-type eagle3 --features "$feats" "${common[@]}"
recipe=(--features "$feats" --steps "$steps" --lr 5e-4 --warmup 20 --batch 8 --eval-every 0 --checkpoint-every 50)
declare -A runs=(
  [eagle1]="--head-type eagle1 --ttt-steps 1"
  [eagle1-ttt2]="--head-type eagle1 --ttt-steps 2 --ttt-decay 0.8"
  [eagle3-ttt2]="--head-type eagle3 --ttt-steps 2 --ttt-decay 0.8 --draft-vocab-size 8192"
)
for name in eagle1 eagle1-ttt2 eagle3-ttt2; do
  # shellcheck disable=SC2086  # the recipe words are meant to split
  "${py[@]}" train "${recipe[@]}" ${runs[$name]} --out "$out/$name" "${common[@]}"
  [ -e "$out/$name.json" ] || "${py[@]}" evaluate --head "$out/$name/head" --features "$feats" --json "$out/$name.json" \
      "${common[@]}" > /dev/null
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path
from eagle.markdown import markdown_table
rows = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
cells = [[Path(r["head"]).parent.name, *(f"{r[k]:.3f}" for k in ("top1", "acc_step2", "acc_step3", "acc_step4")),
          f"{r['ce_full']:.2f}", str(r["positions"])] for r in rows]
print(markdown_table(["head", "top-1", "acc step 2", "acc step 3", "acc step 4", "CE (full vocab)", "positions"],
                     cells, [False] + [True] * 6))
PY
