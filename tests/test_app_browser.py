"""End to end: the dashboard (`python -m eagle app`, i.e. `streamlit run app/main.py`) in a subprocess,
driven by Debian's headless Chromium.

Types a prompt into the live explorer, measures (in the page) the time to the first draft tree and
the tokens/s the page shows against the decoder's own tokens/s, switches to another page and back
and checks that the prompt, the settings and the result are still there, that the page asked
nothing of the outside network, and takes a screenshot into the test's temporary folder (never the tracked
docs/screenshot.png: scripts/screenshot.py regenerates that on purpose). The speed ratio is printed, not
asserted: scripts/bench_live.py measures it side by side with `eagle generate`, whose page driver
this test shares. Nothing is downloaded: Selenium gets the chromedriver path explicitly."""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Explain speculative decoding in one sentence."
MAX_NEW_TOKENS = 24  # a short answer keeps the test quick on a 2-core CPU

pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
_spec = importlib.util.spec_from_file_location("bench_live", ROOT / "scripts" / "bench_live.py")
bench_live = importlib.util.module_from_spec(_spec)
sys.modules["bench_live"] = bench_live  # its dataclasses look their module up while being defined
_spec.loader.exec_module(bench_live)
if not (bench_live.CHROMIUM.exists() and bench_live.CHROMEDRIVER.exists()):
    pytest.skip("Debian's chromium and chromium-driver are not installed "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def go_to(drv, title: str) -> None:
    """Click a page in the sidebar navigation (a client-side switch: the same browser session)."""
    drv.find_element(By.XPATH, f'//section[@data-testid="stSidebar"]//a[contains(., "{title}")]').click()


def no_trouble(drv) -> None:
    assert not drv.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert "Traceback" not in bench_live.body_text(drv)


@pytest.mark.slow
def test_live_page_streams_and_keeps_its_work(tmp_path, capsys, dashboard_budget):
    # dashboard_budget: the server reads the auto budget from the run's cache instead of measuring it
    with bench_live.streamlit_server(tmp_path / "streamlit.log") as url, bench_live.chromium() as drv:
        wait = WebDriverWait(drv, 240, poll_frequency=0.5)
        bench_live.open_live(drv, url, MAX_NEW_TOKENS)
        run = bench_live.type_and_measure(drv, PROMPT)
        with capsys.disabled():
            print(f"\nlive page: first tree {run.first_tree_s:.2f} s after the last key, {run.tokens} tokens, "
                  f"page {run.page_tokens_per_s:.1f} tok/s vs decoder {run.decoder_tokens_per_s:.1f} tok/s "
                  f"(wall clock {run.wall_tokens_per_s:.1f})")
        no_trouble(drv)
        assert 0 < run.tokens <= MAX_NEW_TOKENS
        assert run.first_tree_s > 0 and run.page_tokens_per_s > 0
        assert run.decoder_tokens_per_s >= run.wall_tokens_per_s > 0
        time.sleep(1)  # let plotly finish its paint before the screenshot
        shot = tmp_path / "live.png"
        assert drv.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        shown = {label: bench_live.metric(drv, label) for label in ("Tokens", "τ", "Wall-clock tok/s")}
        go_to(drv, "Calibration")
        wait.until(lambda d: "ECE" in bench_live.body_text(d))
        no_trouble(drv)
        go_to(drv, "Live explorer")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="stSlider"]'))
        time.sleep(1)  # the prompt component re-seeds its input on its first draw
        no_trouble(drv)
        assert drv.execute_script(bench_live.FIND_PROMPT).get_attribute("value") == PROMPT
        box = drv.find_element(By.CSS_SELECTOR, 'input[aria-label="Max new tokens"]')
        assert box.get_attribute("value") == str(MAX_NEW_TOKENS)
        # The same result, not a new generation: the wall-clock rate would differ.
        assert {label: bench_live.metric(drv, label) for label in shown} == shown
        assert drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        outside = bench_live.outside_requests(drv)
        assert outside == []  # a bundled favicon; nothing fetched from a CDN
