"""Every command in README's shell blocks runs as written (placeholders filled, sizes small) from a fresh
directory: the table below holds each README command beside what runs for it, and the test fails when
README gains, loses or changes a command the table does not cover."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = ".venv/bin/python -m "
SMALL = ["--max-new-tokens", "4"]
BENCH = ["bench", "--dataset", "mt_bench", "--limit", "1", *SMALL]  # what `bench ...` leaves to the reader
# EAGLE-3 features: they also hold what train's EAGLE-1 head reads, and ablation needs them
PREPARE = ["prepare", "--self-distill", "--conversations", "6", "--max-len", "48", "--heldout-fraction", "0.5",
           "--distill-max-new-tokens", "6", "--shard-size", "4", "--head-type", "eagle3"]
TRAIN = ["train", "--steps", "2", "--batch", "2", "--eval-every", "1", "--eval-samples", "1"]

# README command (comment dropped) -> (program, argv) run here, in this order: some need another's output
# (the official-layout head export-head writes, prepare's features, train's head, bench's runs/bench/LATEST).
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "make app": ("make", ["-n", "app"]),  # a dry run: the target and the scripts it calls exist
    "make test": ("make", ["-n", "test"]),  # the suite this test is part of
    '.venv/bin/python -m eagle generate --prompt "Explain KV caching." --mode dynamic --json':
        ("eagle", ["generate", "--prompt", "Explain KV caching.", "--mode", "dynamic", "--json", *SMALL]),
    '.venv/bin/python -m eagle generate --prompt "..." --mode static --trace runs/t.jsonl':
        ("eagle", ["generate", "--prompt", "Hi", "--mode", "static", "--trace", "runs/t.jsonl", *SMALL]),
    '.venv/bin/python -m eagle generate --prompt "..." --mode vanilla --temperature 0.7 --seed 1':
        ("eagle", ["generate", "--prompt", "Hi", "--mode", "vanilla", "--temperature", "0.7", "--seed", "1", *SMALL]),
    '.venv/bin/python -m eagle generate --prompt "..." --preset paper':
        ("eagle", ["generate", "--prompt", "Hi", "--preset", "paper", *SMALL]),
    '.venv/bin/python -m eagle generate --prompt "..." --budget adaptive':
        ("eagle", ["generate", "--prompt", "Hi", "--budget", "adaptive", *SMALL]),
    ".venv/bin/python -m eagle budget": ("eagle", ["budget"]),
    ".venv/bin/python -m eagle export-head --head auto --format eagle --out runs/head-for-sglang":
        ("eagle", ["export-head", "--head", "auto", "--format", "eagle", "--out", "runs/head-for-sglang"]),
    '.venv/bin/python -m eagle generate --prompt "..." --head path/to/official/EAGLE-head --model ORG/NAME':
        ("eagle", ["generate", "--prompt", "Hi", "--head", "runs/head-for-sglang", "--model",
                   "smollm2-135m-instruct", *SMALL]),
    ".venv/bin/python -m eagle bench --dataset mt_bench --per-category 2 --modes vanilla,hf,hf_pld,static,dynamic":
        ("eagle", [*BENCH, "--per-category", "2", "--modes", "vanilla,hf,hf_pld,static,dynamic"]),
    ".venv/bin/python -m eagle bench --modes vanilla,dynamic:auto,dynamic:adaptive,dynamic:8/3/4/8192 ...":
        ("eagle", [*BENCH, "--modes", "vanilla,dynamic:auto,dynamic:adaptive,dynamic:8/3/4/8192"]),
    ".venv/bin/python -m eagle bench ... --modes vanilla,dynamic:auto,hf@float32,vanilla@bfloat16,dynamic:auto@bfloat16":
        ("eagle", [*BENCH, "--modes", "vanilla,dynamic:auto,hf@float32,vanilla@bfloat16,dynamic:auto@bfloat16"]),
    ".venv/bin/python -m analysis figures --traces runs/bench/LATEST --out runs/figures":
        ("analysis", ["figures", "--traces", "runs/bench/LATEST", "--out", "runs/figures"]),
    ".venv/bin/python -m eagle prepare --self-distill ...": ("eagle", PREPARE),
    ".venv/bin/python -m eagle train ...": ("eagle", TRAIN),
    ".venv/bin/python -m eagle evaluate --head DIR --features runs/features":
        ("eagle", ["evaluate", "--head", "runs/train/head", "--features", "runs/features"]),
    ".venv/bin/python -m eagle ablation --features runs/features-e3 --out runs/ablation":
        ("eagle", ["ablation", "--features", "runs/features", "--out", "runs/ablation", "--steps", "1",
                   "--fractions", "1", "--recipes", "eagle1,eagle3", "--batch", "2"]),
    ".venv/bin/python -m analysis ablation --results runs/ablation/ablation.json --out runs/ablation/figure":
        ("analysis", ["ablation", "--results", "runs/ablation/ablation.json", "--out", "runs/ablation/figure",
                      "--formats", "svg"]),
    ".venv/bin/python -m eagle profile --prompts 3":
        ("eagle", ["profile", "--prompts", "1", "--no-tiny", *SMALL]),
    '.venv/bin/python -m eagle generate --prompt "..." --dtype bfloat16':
        # a fixed tree: an explicit bf16 runs torch's kernel, whose auto budget (~2 min) no other test needs
        ("eagle", ["generate", "--prompt", "Hi", "--dtype", "bfloat16", "--budget", "fixed", *SMALL]),
    "nice .venv/bin/python -m eagle distill --threads 1":
        ("eagle", ["distill", "--threads", "1", "--conversations", "1", "--distill-max-new-tokens", "4"]),
}


def readme_commands() -> list[str]:
    """Each command of README's ```bash blocks, its trailing comment dropped, `a && b` as two."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    commands = []
    for line in (ln for block in blocks for ln in block.splitlines()):
        line = re.sub(r"\s+#.*$", "", line).strip()
        commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def test_the_table_covers_every_readme_command():
    """Fast: a command added to (or changed in) README without a row here fails, and so does a stale row."""
    assert sorted(readme_commands()) == sorted(COMMANDS)


def _run(program: str, argv: list[str]) -> tuple[int, str]:
    """The command through the same main `python -m PROGRAM` runs (make as a dry run in the checkout)."""
    if program == "make":
        proc = subprocess.run(["make", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        scripts = re.findall(r"bash (\S+)", proc.stdout)
        missing = [s for s in scripts if not (ROOT / s).is_file()]
        return (proc.returncode or int(bool(missing)) or int(not scripts)), proc.stderr + f" missing: {missing}"
    if program == "analysis":
        from analysis.__main__ import main
    else:
        from eagle.cli import main
    return main(argv), ""


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path, monkeypatch, capsys, dashboard_budget):
    """In the table's order from an empty directory (runs/ is made there). dashboard_budget: the default
    pair's auto budget is measured once per run and read back by every dynamic command."""
    import torch
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    failed = []
    for command, (program, argv) in COMMANDS.items():
        try:
            rc, err = _run(program, argv)
        except Exception as exc:  # noqa: BLE001 - one command's crash must not hide the others' results
            rc, err = -1, f"{type(exc).__name__}: {exc}"
        out = capsys.readouterr()
        if rc != 0:
            failed.append(f"{command!r} -> exit {rc}: {(out.err + err).strip()[-400:]}")
    torch.set_num_threads(threads)  # distill --threads 1 sets the process's
    assert not failed, "\n".join(failed)
    assert (tmp_path / "runs" / "bench" / "LATEST").is_symlink() and (tmp_path / "runs" / "figures").is_dir()
