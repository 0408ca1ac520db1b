#!/usr/bin/env bash
# Create .venv and install everything the dashboard, CLI and tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
# This checkout itself, editable: `streamlit run app/main.py` then imports eagle and analysis without path tricks.
.venv/bin/python -m pip install -q --no-deps -e .
# Headless Chromium: figure export (kaleido) and the browser test. Optional: skipped without root/apt.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver fonts-liberation >/dev/null) \
    || echo "note: could not install chromium; PNG export and the browser test will be skipped"
fi
# Convert the embedded default model once (GGUF -> safetensors cache), so the first page load is fast.
.venv/bin/python -c "from eagle.models.conversion import resolve_model_path; print('model cache:', resolve_model_path('smollm2-135m-instruct'))"
# Choose the CPU tree budget once (a few minutes on two cores; cached per machine), so the dashboard opens at once.
# (Its first line only; not through `| head`: budget exits 141 into a closed pipe, and pipefail is on.)
if [ "${EAGLE_SKIP_BUDGET:-0}" != 1 ]; then
  budget_report=$(.venv/bin/python -m eagle budget)
  echo "${budget_report%%$'\n'*}"
fi
