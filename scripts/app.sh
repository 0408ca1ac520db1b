#!/usr/bin/env bash
# Set up, then start the dashboard on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eagle2-explorer app "$@"
