"""Live page speed against the decoder, side by side in one run.

Starts the dashboard (`python -m eagle app`), drives it with Debian's headless Chromium (1400x1000), types a
prompt, and records in the page itself (a 50 ms sampler, so the driver does not poll the machine
busy) when the first draft tree appears and how the token count grows. `python -m eagle generate
--json` decodes the same prompt with the same settings before, between and after the page runs.

    .venv/bin/python scripts/bench_live.py [--prompt TEXT] [--max-new-tokens 48] [--repeats 3]

Prints time to first tree (from the last key press), the page's tokens/s, the decoder's tokens/s
and their ratio (the median over the repeats), and how many cores the server and the browser kept
busy meanwhile. The browser test (tests/test_app_browser.py) uses the same driver functions."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000"]
PROMPT = "Explain why the sky is blue in two sentences."
DEBOUNCE_S = 0.7  # app/live.py's DEBOUNCE_MS

# The keyup component renders its <input> inside a shadow root (isolated styles).
FIND_PROMPT = """
for (const e of document.querySelectorAll('*')) {
  const i = e.shadowRoot && e.shadowRoot.querySelector('input.stkeyup__input');
  if (i) return i;
}
return document.querySelector('input[aria-label^="Prompt"]');
"""
# Samples [ms, tokens shown, a tree drawn, finished] every 50 ms until stopped. It reads textContent (no
# layout pass); on an idle page the sampler keeps about 1 % of a core busy.
START_SAMPLER = """
window.__live = [];
const metric = (label) => {  // the streamed summary line (app/render.metrics_html), then the metrics
  const streamed = document.querySelector(`[data-metric="${label}"]`);
  if (streamed) return streamed.textContent;
  for (const m of document.querySelectorAll('[data-testid="stMetric"]')) {
    const l = m.querySelector('[data-testid="stMetricLabel"]');
    if (l && l.textContent.trim() === label) return m.querySelector('[data-testid="stMetricValue"]').textContent;
  }
  return null;
};
window.__liveTimer = setInterval(() => {
  const tokens = parseInt(metric('Tokens') || '0');
  const tree = document.querySelector('.js-plotly-plot, img.eagle-live-tree') !== null;  // finished or streamed
  const done = document.querySelector('[data-testid="stSlider"]') !== null;
  window.__live.push([performance.now(), tokens, tree, done]);
}, 50);
return performance.now();
"""
METRIC = """
for (const m of document.querySelectorAll('[data-testid="stMetric"]')) {
  const l = m.querySelector('[data-testid="stMetricLabel"]');
  if (l && l.innerText.trim() === arguments[0]) return m.querySelector('[data-testid="stMetricValue"]').innerText;
}
return null;
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


# How users start the dashboard: `eagle2-explorer app` (here the checkout's `python -m eagle app`), which
# execs `streamlit run app/main.py`; tests/test_package.py passes an installed wheel's command instead.
CHECKOUT_APP = (sys.executable, "-m", "eagle", "app")


@contextmanager
def streamlit_server(log_path: Path, launcher: Sequence[str] = CHECKOUT_APP, cwd: Path = ROOT) -> Iterator[str]:
    """The dashboard started by `launcher` in `cwd` on a free local port; yields its URL once healthy and
    stops it afterwards."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*launcher, "--server.headless", "true", "--server.port", str(port),
                                 "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                                cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
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


@contextmanager
def chromium(downloads: Path | None = None) -> Iterator[object]:
    """Headless Chromium through the system chromedriver, offline, logging every network request;
    files the page downloads go to `downloads` (without it, downloads are not asked for)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver or browser
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    if downloads is not None:
        opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                               "download.prompt_for_download": False})
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    try:
        if downloads is not None:  # headless Chromium drops downloads unless told where they go
            drv.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def requested_urls(drv) -> list[str]:
    """Every URL the page asked the network for since the last call (Chrome's performance log)."""
    urls = []
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def outside_requests(drv) -> list[str]:
    """Network requests that left this machine (the browser's own chrome:// pages do not)."""
    local = ("http://127.0.0.1", "ws://127.0.0.1")
    return [u for u in requested_urls(drv) if u.startswith(("http", "ws")) and not u.startswith(local)]


def body_text(drv) -> str:
    from selenium.webdriver.common.by import By
    return drv.find_element(By.TAG_NAME, "body").text


def metric(drv, label: str) -> str | None:
    return drv.execute_script(METRIC, label)


def set_number(drv, label: str, value: int) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    box = drv.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]')
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.ENTER)


def open_live(drv, url: str, max_new_tokens: int, timeout: float = 300) -> None:
    """Load the page (the first load brings the model up) and set the answer length."""
    from selenium.webdriver.support.ui import WebDriverWait
    wait = WebDriverWait(drv, timeout, poll_frequency=0.5)
    drv.get(url)
    wait.until(lambda d: d.execute_script(FIND_PROMPT))
    wait.until(lambda d: "Type a prompt" in body_text(d))
    set_number(drv, "Max new tokens", max_new_tokens)
    wait.until(lambda d: d.execute_script("return document.querySelector('input[aria-label=\"Max new tokens\"]')"
                                          ".value") == str(max_new_tokens))
    time.sleep(1.0)  # the rerun that took the new value


@dataclass
class PageRun:
    first_tree_s: float  # last key press -> first tree drawn
    tokens: int
    page_tokens_per_s: float  # tokens shown after the first, over the time they took to appear
    decoder_tokens_per_s: float  # the page's own "Decoder tok/s" (the rounds' timings)
    wall_tokens_per_s: float  # the page's "Wall-clock tok/s"


def type_and_measure(drv, prompt: str, timeout: float = 300) -> PageRun:
    """Type into an empty prompt box, wait for the finished generation, read the page's samples."""
    from selenium.webdriver.support.ui import WebDriverWait
    box = drv.execute_script(FIND_PROMPT)
    box.send_keys(prompt)  # generates after the debounce, no Enter needed
    last_key = drv.execute_script(START_SAMPLER)
    WebDriverWait(drv, timeout, poll_frequency=1.0).until(
        lambda d: d.execute_script("return window.__live.some(s => s[3] && s[1] > 0)"))
    time.sleep(0.3)  # the finished view's metrics settle
    samples = drv.execute_script("clearInterval(window.__liveTimer); return window.__live;")
    first_tree = next(t for t, _, tree, _ in samples if tree)
    shown = [(t, n) for t, n, _, _ in samples if n > 0]
    t_first, n_first = shown[0]
    t_done, n_done = next((t, n) for t, n, _, done in samples if done and n > 0)
    last_grow = next(t for t, n in shown if n == n_done)  # when the final count first appeared
    rate = (n_done - n_first) / ((last_grow - t_first) / 1000) if last_grow > t_first else float("nan")
    return PageRun((first_tree - last_key) / 1000, n_done, rate, float(metric(drv, "Decoder tok/s")),
                   float(metric(drv, "Wall-clock tok/s")))


def cli_generate(prompt: str, max_new_tokens: int) -> dict:
    """`python -m eagle generate --json` on the same prompt and settings as the page's defaults."""
    out = subprocess.run([sys.executable, "-m", "eagle", "generate", "--prompt", prompt, "--max-new-tokens",
                          str(max_new_tokens), "--json"], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _side(cmdline: list[str]) -> str:
    """Which part of the run a child process is: the Streamlit server, or one kind of browser process
    (Chromium names its helpers with --type=renderer / gpu-process / utility; the parent has none)."""
    if any("streamlit" in part for part in cmdline):
        return "streamlit"
    kind = next((part.split("=", 1)[1] for part in cmdline if part.startswith("--type=")), "browser-main")
    return f"browser:{kind}"


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this script's children, by _side: the Streamlit
    server (decoder, script and server threads), chromedriver and each kind of Chromium process."""
    import psutil
    used: dict[str, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            side = _side(proc.cmdline())
            times = proc.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        used[side] = used.get(side, 0.0) + times.user + times.system
    return used


def renderer_seconds(drv) -> dict[str, float]:
    """The page's main-thread time so far (Chrome DevTools Performance metrics): scripts, style
    recalculation and layout, and all its tasks together; painting and raster run elsewhere."""
    metrics = {m["name"]: m["value"] for m in drv.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
    return {name: metrics.get(name, 0.0) for name in ("TaskDuration", "ScriptDuration", "RecalcStyleDuration",
                                                       "LayoutDuration")}


def measured_page_run(drv, url: str, prompt: str, max_new_tokens: int) -> tuple[PageRun, dict]:
    """One page run from a fresh Live page, with the cores each side kept busy meanwhile and the page's
    main-thread share."""
    open_live(drv, url, max_new_tokens)
    drv.execute_cdp_cmd("Performance.enable", {})
    cpu_before, main_before, wall_before = cpu_seconds(), renderer_seconds(drv), time.perf_counter()
    page = type_and_measure(drv, prompt)
    wall = time.perf_counter() - wall_before
    cpu = {side: round((used - cpu_before.get(side, 0.0)) / wall, 3) for side, used in sorted(cpu_seconds().items())}
    main = {name: round((t - main_before[name]) / wall, 3) for name, t in renderer_seconds(drv).items()}
    return page, {"cores_used": cpu, "page_main_thread_share": main}


def bench(prompt: str, max_new_tokens: int, repeats: int, log: Path) -> dict:
    """`repeats` page runs, each between two `eagle generate` runs (the page's server idles meanwhile);
    each page run is compared with the mean of its two neighbours, and the median ratio is the result:
    on two shared cores a single pair varies by +-10 %."""
    cli = [cli_generate(prompt, max_new_tokens)]
    pages, loads = [], []
    with streamlit_server(log) as url, chromium() as drv:
        open_live(drv, url, max_new_tokens)
        type_and_measure(drv, "Say hello.")  # warm-up: model, auto budget, first-call allocations
        for _ in range(repeats):
            page, load = measured_page_run(drv, url, prompt, max_new_tokens)
            pages.append(page)
            loads.append(load)
            cli.append(cli_generate(prompt, max_new_tokens))
        outside = outside_requests(drv)
    cli_rates = [c["tokens_per_second"] for c in cli]
    ratios = [p.page_tokens_per_s / statistics.mean(cli_rates[i:i + 2]) for i, p in enumerate(pages)]
    return {"prompt": prompt, "max_new_tokens": max_new_tokens, "repeats": repeats,
            "first_tree_s": [round(p.first_tree_s, 3) for p in pages], "page_tokens": [p.tokens for p in pages],
            "page_tokens_per_s": [round(p.page_tokens_per_s, 2) for p in pages],
            "page_wall_clock_tokens_per_s": [p.wall_tokens_per_s for p in pages],
            "page_decoder_tokens_per_s": [p.decoder_tokens_per_s for p in pages],
            "cli_tokens_per_s": cli_rates, "cli_tokens": [c["new_tokens"] for c in cli], "cli_config": cli[0]["config"],
            "ratios": [round(r, 3) for r in ratios], "ratio_page_vs_cli": round(statistics.median(ratios), 3),
            "outside_requests": outside, "load": loads}


def report(result: dict) -> None:
    print(f"time to first tree after the last key, s: {result['first_tree_s']} (the debounce is {DEBOUNCE_S} s)")
    print(f"page tok/s as seen in the browser: {result['page_tokens_per_s']} (page's wall clock "
          f"{result['page_wall_clock_tokens_per_s']}, its decoder {result['page_decoder_tokens_per_s']})")
    print(f"eagle generate tok/s, before, between and after: {result['cli_tokens_per_s']}")
    print(f"ratio page / eagle generate: {result['ratios']}, median {result['ratio_page_vs_cli']:.2f}; "
          f"outside requests: {len(result['outside_requests'])}")
    for i, load in enumerate(result["load"], 1):
        print(f"run {i}, cores busy (of {os.cpu_count()}): " +
              ", ".join(f"{side} {c:.2f}" for side, c in load["cores_used"].items()) + "; page main thread: " +
              ", ".join(f"{name.removesuffix('Duration')} {c:.2f}" for name, c in load["page_main_thread_share"].items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3, help="page runs, each between two eagle generate runs (3)")
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench_live_streamlit.log")
    args = p.parse_args()
    if args.repeats < 1 or args.max_new_tokens < 1:
        p.error("--repeats and --max-new-tokens must be at least 1")
    result = bench(args.prompt, args.max_new_tokens, args.repeats, args.log)
    report(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
