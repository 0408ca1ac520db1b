"""End to end: `streamlit run app/main.py` in a subprocess, driven by Debian's headless Chromium.

Types a prompt into the live explorer, waits for the draft tree (a plotly graph) and the finished
generation, and saves docs/screenshot.png. Nothing is downloaded: Selenium gets the chromedriver
path explicitly and runs offline."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOT = ROOT / "docs" / "screenshot.png"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2200"]
PROMPT = "Explain speculative decoding in one sentence."

webdriver = pytest.importorskip("selenium.webdriver",
                                reason="selenium is not installed (pip install selenium)")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("Debian's chromium and chromium-driver are not installed "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# The keyup component renders its <input> inside a shadow root (isolated styles).
FIND_PROMPT = """
for (const e of document.querySelectorAll('*')) {
  const i = e.shadowRoot && e.shadowRoot.querySelector('input.stkeyup__input');
  if (i) return i;
}
return document.querySelector('input[aria-label^="Prompt"]');
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("streamlit did not become healthy")


@pytest.fixture()
def server(tmp_path):
    port = free_port()
    log = open(tmp_path / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless",
                             "true", "--server.port", str(port), "--server.address", "127.0.0.1"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture()
def driver(monkeypatch):
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never fetch a driver or browser
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def set_number(drv, label: str, value: int) -> None:
    box = drv.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]')
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.ENTER)


def test_type_prompt_and_see_the_tree(server, driver):
    wait = WebDriverWait(driver, 240, poll_frequency=0.5)
    driver.get(server)
    prompt = wait.until(lambda d: d.execute_script(FIND_PROMPT))
    set_number(driver, "Max new tokens", 16)  # a short answer keeps the test quick on a 2-core CPU
    wait.until(lambda d: "Type a prompt" in d.find_element(By.TAG_NAME, "body").text)
    prompt = driver.execute_script(FIND_PROMPT)
    prompt.send_keys(PROMPT)  # generates after the debounce, no Enter needed
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"))
    # The round slider is drawn only once the last round is in: the generation finished.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="stSlider"]'))
    time.sleep(2)  # let plotly finish its first paint
    assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "Traceback" not in body
    assert "Tokens" in body and "Round" in body
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOT))
    data = SCREENSHOT.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
