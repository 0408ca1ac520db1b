"""Regenerate docs/screenshot.png: the live explorer on the shipped head, driven the way the browser test
drives it (streamlit in a subprocess, Debian's headless Chromium through selenium, 1400x1000).

    .venv/bin/python scripts/screenshot.py [--prompt TEXT] [--max-new-tokens N] [--out docs/screenshot.png]

It refuses to save a picture of a random head (the README's old screenshot showed tau 1.00): the sidebar's
head badge must say "trained head". Takes about a minute on a 2-core CPU (the model loads once).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import bench_live  # scripts/ is on sys.path when this file runs

ROOT = Path(__file__).resolve().parent.parent


def capture(out: Path, prompt: str, max_new_tokens: int, log: Path) -> dict:
    """Type the prompt, wait for the answer, save the page; returns what the page showed."""
    with bench_live.streamlit_server(log) as url, bench_live.chromium() as drv:
        bench_live.open_live(drv, url, max_new_tokens)
        run = bench_live.type_and_measure(drv, prompt)
        if "trained head" not in bench_live.body_text(drv):
            raise RuntimeError("the page is not on the shipped trained head; not saving a random-head screenshot")
        time.sleep(1)  # let plotly finish its paint
        out.parent.mkdir(parents=True, exist_ok=True)
        if not drv.save_screenshot(str(out)):
            raise RuntimeError(f"chromium could not save {out}")
        shown = {label: bench_live.metric(drv, label) for label in ("Tokens", "τ", "Wall-clock tok/s")}
    return {"tokens": run.tokens, **shown}


def main() -> int:
    p = argparse.ArgumentParser(prog="scripts/screenshot.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prompt", default=bench_live.PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "screenshot_streamlit.log")
    args = p.parse_args()
    if not bench_live.CHROMIUM.is_file() or not bench_live.CHROMEDRIVER.is_file():
        print(f"error: needs {bench_live.CHROMIUM} and {bench_live.CHROMEDRIVER} (apt-get install chromium "
              "chromium-driver)", file=sys.stderr)
        return 2
    shown = capture(args.out, args.prompt, args.max_new_tokens, args.log)
    print(f"wrote {args.out}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
