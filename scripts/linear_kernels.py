"""Where a CPU's time goes in the target's projections: one Linear of each SmolLM2-135M shape at 1-16 rows
(a decoding step is 1 row, a verify tree n rows), through torch's default fp32 path (MKL sgemm on x86
builds), bf16, oneDNN with a prepacked weight (the kernel torch.compile's CPU backend uses), and the AVX2
bf16 kernel of eagle.models.cpukernel where it builds.

    .venv/bin/python scripts/linear_kernels.py --threads 2

Prints the median ms per call of each; run it on an idle machine. A diagnosis tool: the decoder's
`--dtype auto` times the kernels on the whole model (eagle.models.kernels)."""
from __future__ import annotations

import argparse
import time

import torch

from eagle.models import cpukernel

SHAPES = ((576, 576), (576, 1536), (1536, 576), (576, 49152))  # q/o, gate/up, down, lm_head (in -> out)
ROWS = (1, 2, 8, 16)


def median_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def kernels(x: torch.Tensor, w: torch.Tensor) -> dict:
    """The paths for one input (m, k) and weight (n, k)."""
    wb, xb = w.bfloat16(), x.bfloat16()
    paths = {"fp32": lambda: torch.nn.functional.linear(x, w), "bf16": lambda: torch.nn.functional.linear(xb, wb)}
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, x.shape[0])
        paths["onednn fp32"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):  # a build without oneDNN
        pass
    if cpukernel.available():
        paths["avx2 bf16"] = lambda: cpukernel.Bf16Linear.wrapping(wb)(xb)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, {torch.backends.cpu.get_cpu_capability()}")
    with torch.inference_mode():
        for k, n in SHAPES:
            w = torch.randn(n, k)
            for m in ROWS:
                timed = {name: median_ms(fn, args.repeats) for name, fn in kernels(torch.randn(m, k), w).items()}
                print(f"{k:5d} -> {n:5d}, {m:2d} rows: " + "  ".join(f"{a} {b:.3f}" for a, b in timed.items()))


if __name__ == "__main__":
    main()
