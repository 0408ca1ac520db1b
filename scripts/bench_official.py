"""Our decoder's round time against the official EAGLE-2 code, side by side in one run (issue #30).

On a tiny random Llama (2 layers, hidden 64, fp32, CPU) the models cost almost nothing, so a round's
wall time is the framework's own cost: the Python, the small tensor ops and the host syncs around
the model calls (a stand-in for GPU host overhead). This script times a round of this repo's
`eagle.core.decode.Decoder` (dynamic mode) and of the official `EaModel.eagenerate` (SafeAILab/EAGLE,
EAGLE-2 head, `use_eagle3=False`) at equal tree settings (total_token / depth / top_k), greedy, on
the same prompts (token ids) and the same max_new_tokens.

No official code is in this repo: give the path of a checkout and the python of a venv it runs in.
Setup (the official code needs transformers 4.x; this repo's venv has 5.x, and both packages are
named `eagle`, so each side runs in its own subprocess and venv):

    # a checkout of SafeAILab/EAGLE at /work/official/EAGLE (tested: commit cb7e0841fe0c, 2026-02-19;
    # from a bare snapshot: git --git-dir=REPO archive HEAD eagle setup.py README.md | tar -x -C ...)
    python3 -m venv /work/official/venv
    /work/official/venv/bin/pip install torch==2.13.0                      # CPU build first, never a CUDA one
    /work/official/venv/bin/pip install transformers==4.53.1 accelerate==0.26.0 \
        sentencepiece safetensors protobuf

Run (on an otherwise idle machine; both sides are pinned to one thread):

    nice -n 19 .venv/bin/python scripts/bench_official.py --official /work/official/EAGLE \
        --official-python /work/official/venv/bin/python \
        --total-token 60 --depth 6 --top-k 10 --tokens 128 --prompts 4 --repeats 3

What is timed. Each side is one long-lived worker process (loads once, warms up once); the parent
sends the same prompt to both, alternating which goes first (ABBA...), `--repeats` times over
`--prompts` prompts. Per generation:
  ours      steps(): the first record is the prefill (target + draft head over the prompt); decode
            time is from that record to the last one, rounds = the records after the prefill.
  official  eagenerate(log=True); rounds = idx + 1. Its initialize_tree (the prefill plus the
            first tree's draft) is timed by a wrapper (timing only, same arguments and result) and
            subtracted. Its loop drafts the next tree at the end of each round, the last one never
            verified, so R timed rounds hold R drafts and R verifications, as ours do.
ms/round = summed decode seconds / summed rounds. tokens/round = the tokens the rounds produced
(accepted + bonus; the official new_token) over rounds. The official loop stops once it has *more*
than max_new_tokens (so a round or two more); ms/round is per round, so that does not bias the
ratio. With a random head acceptance is ~1 token/round on both sides: it is the framework's cost
per round that is measured, not speed-up.

--vocab: at 32000 (Llama-2's) the vocabulary-wide work (lm_head rows, log-softmax and top-k over the
vocabulary for every draft step and tree node) is a large share of a round; a small vocabulary
(--vocab 1024) leaves little but the framework. Run both to see which part a difference is in.

Greedy check: both outputs are compared with the vanilla greedy continuation (this repo's vanilla
mode) on the tokens both produced; a mismatch is reported with its position (fp32 near-ties of a
random model can flip an argmax between two different attention implementations).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2; eos is 2


# ---- assets: a tiny random Llama (HF dir, offline tokenizer) and a random EAGLE-1/2 head ----------
def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 byte-level symbols."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tokenizer(path: Path, vocab: int) -> None:
    """A byte-level GPT-2 tokenizer without merges whose vocab.json covers every id of the model
    (so any id decodes): loads offline as the slow GPT2Tokenizer in transformers 4.x (the official
    code asks for use_fast=False) and in transformers 5."""
    tokens = list(SPECIALS) + _byte_symbols()
    tokens += [f"tok{i}" for i in range(vocab - len(tokens))]
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens[:vocab])}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "special_tokens_map.json").write_text(json.dumps(special))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 4096, "add_bos_token": False, **special}))


def make_assets(out: Path, vocab: int, seed: int) -> None:
    """base/: the target as an HF directory (untied lm_head, fp32, rope_theta beside transformers 5's
    rope_parameters, plus model.safetensors.index.json, from which the official head reads its
    embedding); head/: a random EAGLE-1/2 head in the official layout (no embed_tokens: the official
    loader takes the base model's, ours shares the target's)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle.models.head import new_head
    from eagle.models.headio import save_head
    from eagle.models.conversion import with_legacy_keys
    from eagle.models.target import Target

    base, head_dir = out / "base", out / "head"
    base.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(base / "model.safetensors"), metadata={"format": "pt"})
    (base / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model.safetensors" for k in state}}))
    cfg = with_legacy_keys(model.config.to_dict(), torch.float32)
    cfg["architectures"] = ["LlamaForCausalLM"]
    (base / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(base, vocab)
    target = Target(model=model, tokenizer=None, name="tiny")
    save_head(new_head(target, seed=seed + 1), head_dir, dtype=torch.float32)


# ---- workers: one per side, each in its own venv; JSON lines on stdin/stdout ----------------------
def _serve(run, warm_prompt: list[int]) -> None:
    """Answer {"prompt": ids, "tokens": n[, "mode": m]} lines with run(ids, n, m)'s dict; stdout is kept for the
    protocol (anything the code under test prints goes to stderr)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    run(warm_prompt, 8)  # warm-up: first-call allocations, lazy imports
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        out.write(json.dumps(run(req["prompt"], req["tokens"], req.get("mode", "dynamic"))) + "\n")


def worker_ours(args) -> None:
    sys.path.insert(0, str(ROOT))  # this checkout's eagle, ahead of any installed one
    import torch
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()
    import eagle
    from eagle.core.config import DecodeConfig
    from eagle.core.decode import Decoder
    from eagle.models.headio import load_head
    from eagle.models.loader import load_target

    assets = Path(args.assets)
    target = load_target(str(assets / "base"), device="cpu", dtype="float32")
    head = load_head(assets / "head", target)
    base_cfg = DecodeConfig(mode="dynamic", total_tokens=args.total_token, depth=args.depth, top_k=args.top_k)
    print(f"ours: eagle from {Path(eagle.__file__).parent}, torch {torch.__version__}", file=sys.stderr)

    def run(ids: list[int], tokens: int, mode: str = "dynamic") -> dict:
        # A Decoder per generation, as the CLI and eagle.tools.bench make one (its token-text memo too).
        decoder = Decoder(target, head if mode != "vanilla" else None,
                          base_cfg.with_(mode=mode, max_new_tokens=tokens))
        t0 = time.perf_counter()
        steps = decoder.steps(ids)
        first = next(steps)
        t1 = time.perf_counter()
        out, rounds = list(first.new_tokens), 0
        for record in steps:
            out += record.new_tokens
            rounds += 1
        t2 = time.perf_counter()
        return {"tokens": out, "rounds": rounds, "round_tokens": len(out) - len(first.new_tokens),
                "decode_s": t2 - t1, "total_s": t2 - t0,
                "finished": record.finished if rounds else first.finished}

    _serve(run, args.warm_prompt)


def worker_official(args) -> None:
    sys.path.insert(0, str(Path(args.official).resolve()))
    import torch
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()  # its GenerationMixin notice, three times
    import eagle.model.ea_model as ea_model_module
    from eagle.model.ea_model import EaModel

    # Timing only: the same function, called with the same arguments, its result returned unchanged.
    initialize_tree = ea_model_module.initialize_tree
    prefill = {"s": 0.0}

    def timed_initialize_tree(*a, **kw):
        t = time.perf_counter()
        result = initialize_tree(*a, **kw)
        prefill["s"] = time.perf_counter() - t
        return result

    ea_model_module.initialize_tree = timed_initialize_tree
    assets = Path(args.assets)
    model = EaModel.from_pretrained(use_eagle3=False, base_model_path=str(assets / "base"),
                                    ea_model_path=str(assets / "head"), total_token=args.total_token,
                                    depth=args.depth, top_k=args.top_k, torch_dtype=torch.float32)
    model.eval()
    print(f"official: eagle from {Path(ea_model_module.__file__).parent}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}", file=sys.stderr)

    def run(ids: list[int], tokens: int, mode: str = "dynamic") -> dict:
        if mode != "dynamic":
            raise ValueError(f"the official worker runs eagenerate only, not {mode!r}")
        input_ids = torch.tensor([ids])
        max_length = max(2048, len(ids) + tokens + args.total_token + 64)
        t0 = time.perf_counter()
        output, new_token, idx = model.eagenerate(input_ids, temperature=0.0, max_new_tokens=tokens,
                                                  max_length=max_length, log=True)
        total = time.perf_counter() - t0
        # Each round appends its root (the previous round's bonus) and its accepted tokens, so the
        # output holds new_token tokens, the first from the prefill, the last round's bonus left out.
        return {"tokens": output[0, len(ids):].tolist(), "rounds": int(idx) + 1, "round_tokens": int(new_token),
                "decode_s": total - prefill["s"], "total_s": total}

    _serve(run, args.warm_prompt)


class Worker:
    def __init__(self, name: str, cmd: list[str], env: dict) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()  # ready

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (rc {self.proc.wait()}): see its stderr above")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def thread_env(extra_path: str | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """The first position where a and b differ over their common length (None: they agree)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--official", default="/work/official/EAGLE", help="checkout of SafeAILab/EAGLE")
    p.add_argument("--official-python", default="/work/official/venv/bin/python",
                   help="python of a venv the official code runs in (transformers 4.x)")
    p.add_argument("--ours-python", default=sys.executable, help="python of this repo's venv")
    p.add_argument("--total-token", type=int, default=60, help="nodes verified per round, root included")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--tokens", type=int, default=128, help="max_new_tokens")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", help="where the tiny model and head are written (default: a temp dir)")
    p.add_argument("--role", choices=("main", "assets", "ours", "official"), default="main", help=argparse.SUPPRESS)
    p.add_argument("--assets", help=argparse.SUPPRESS)
    p.add_argument("--warm-prompt", type=json.loads, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "assets":
        make_assets(Path(args.assets), args.vocab, args.seed)
        return 0
    if args.role == "ours":
        worker_ours(args)
        return 0
    if args.role == "official":
        worker_official(args)
        return 0

    import random
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(len(SPECIALS), args.vocab) for _ in range(args.prompt_len)]
               for _ in range(args.prompts + 1)]
    warm, prompts = prompts[0], prompts[1:]
    tmp = None
    if args.workdir:
        assets = Path(args.workdir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_official_")
        assets = Path(tmp.name)
    settings = ["--total-token", str(args.total_token), "--depth", str(args.depth), "--top-k", str(args.top_k),
                "--assets", str(assets), "--warm-prompt", json.dumps(warm)]
    me = str(Path(__file__).resolve())
    subprocess.run([args.ours_python, me, "--role", "assets", "--assets", str(assets), "--vocab", str(args.vocab),
                    "--seed", str(args.seed)], check=True, env=thread_env())
    ours = Worker("ours", [args.ours_python, me, "--role", "ours", *settings], thread_env())
    official = Worker("official", [args.official_python, me, "--role", "official", "--official", args.official,
                                   *settings], thread_env())
    sides = {"ours": ours, "official": official}
    sums = {s: {"decode_s": 0.0, "total_s": 0.0, "rounds": 0, "new": 0} for s in sides}
    per_rep = {s: [] for s in sides}
    checks = []
    try:
        vanilla = [ours.ask(prompt=ids, tokens=args.tokens, mode="vanilla")["tokens"] for ids in prompts]
        order = list(sides)
        for rep in range(args.repeats):
            rep_sums = {s: [0.0, 0] for s in sides}
            for i, ids in enumerate(prompts):
                for side in order:
                    r = sides[side].ask(prompt=ids, tokens=args.tokens)
                    s = sums[side]
                    s["decode_s"] += r["decode_s"]
                    s["total_s"] += r["total_s"]
                    s["rounds"] += r["rounds"]
                    s["new"] += r["round_tokens"]  # tokens the rounds produced, bonus tokens included
                    rep_sums[side][0] += r["decode_s"]
                    rep_sums[side][1] += r["rounds"]
                    if rep == 0:
                        n = min(len(r["tokens"]), len(vanilla[i]))
                        checks.append((side, i, n, first_mismatch(r["tokens"], vanilla[i])))
                order.reverse()  # ABBA: neither side always runs first
            for side in sides:
                per_rep[side].append(1000 * rep_sums[side][0] / max(1, rep_sums[side][1]))
    finally:
        ours.close()
        official.close()
        if tmp is not None:
            tmp.cleanup()

    ms = {s: 1000 * sums[s]["decode_s"] / max(1, sums[s]["rounds"]) for s in sides}
    print(f"\nCPU: {cpu_model()}; 1 thread per side; tiny random Llama (2 layers, hidden 64, vocab {args.vocab}, "
          f"fp32); total_token {args.total_token}, depth {args.depth}, top_k {args.top_k}; greedy; "
          f"{args.prompts} prompts x {args.prompt_len} tokens, max_new_tokens {args.tokens}, {args.repeats} repeats "
          f"(ABBA)\n")
    print("| side | ms/round | per-repeat ms/round | rounds | tokens/round | decode s | total s (incl. prefill) |")
    print("|---|---|---|---|---|---|---|")
    for side in sides:
        s = sums[side]
        reps = ", ".join(f"{x:.2f}" for x in per_rep[side])
        print(f"| {side} | {ms[side]:.2f} | {reps} | {s['rounds']} | {s['new'] / max(1, s['rounds']):.2f} | "
              f"{s['decode_s']:.2f} | {s['total_s']:.2f} |")
    ratios = [a / b for a, b in zip(per_rep["ours"], per_rep["official"])]
    print(f"\nratio ours/official (ms/round): {ms['ours'] / ms['official']:.2f} "
          f"(per repeat: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f})")
    bad = [(side, i, n, m) for side, i, n, m in checks if m is not None]
    print(f"greedy check against vanilla (first repeat, common length): "
          f"{len(checks) - len(bad)}/{len(checks)} generations equal"
          + "".join(f"; {side} prompt {i} differs at token {m} of {n}" for side, i, n, m in bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
