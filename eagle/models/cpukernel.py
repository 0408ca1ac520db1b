"""bf16 projections on CPUs without bf16 instructions: a small AVX2 kernel, compiled once per machine.

Without AVX512_BF16 or AMX, torch's bf16 Linear costs about N times its one-row time for N rows (the
lm_head at 8 rows 29 ms against 4 ms for one, AVX2 EPYC, 2026-12-07), so a bf16 target verifies a tree
at four times a decoding step and no tree pays. `resources/kernels/bf16_linear.cpp` reads each bf16
weight row once for up to 8 rows and widens it to fp32 in registers (the whole model at 8 tokens 55 ms
against 145, and against 76 for fp32 on oneDNN; a single row is left to torch's, as fast there). It is
compiled with the machine's C++ compiler into the cache on first use and loaded with ctypes; where there
is no compiler, no AVX2 or the build fails, `library()` raises KernelUnavailable, `why_unavailable()` says
why, and bf16 runs on torch's kernel."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import torch
from torch.nn import functional as F

from ..records.files import CommandError, atomic_write
from .location import cache_dir
from .wrapped import WrappedLinear

FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")


class KernelUnavailable(CommandError):
    """Why the AVX2 bf16 kernel cannot run here (one sentence); bf16 then runs on torch's kernel."""


@functools.cache
def source() -> bytes:
    return resources.files("eagle.resources").joinpath("kernels/bf16_linear.cpp").read_bytes()


def library_path() -> Path:
    """The compiled kernel's path in the cache, named by its source, flags and compiler."""
    digest = hashlib.sha256(source() + " ".join((compiler() or "", *FLAGS)).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"bf16_linear-{digest}.so"


def compiler() -> str | None:
    """$CXX, else g++ or c++ on PATH."""
    named = os.environ.get("CXX")
    return shutil.which(named) if named else shutil.which("g++") or shutil.which("c++")


@functools.cache
def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.eagle_bf16_linear.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.eagle_bf16_linear.restype = None
    return lib


def library() -> ctypes.CDLL:
    """The kernel, compiled into the cache the first time (about 2 s); raises KernelUnavailable."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise KernelUnavailable(f"the bf16 kernel needs AVX2 (this CPU: {torch.backends.cpu.get_cpu_capability()})")
    cxx = compiler()
    if cxx is None:
        raise KernelUnavailable("the bf16 kernel needs a C++ compiler (g++ or $CXX) and none was found")
    path = library_path()
    if not path.exists():
        atomic_write(path, lambda tmp: _compile(cxx, tmp))
    return _load(str(path))


def _compile(cxx: str, out: Path) -> None:
    src = out.with_suffix(".cpp")
    src.write_bytes(source())
    try:
        done = subprocess.run([cxx, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:  # not runnable, or hung
        raise KernelUnavailable(f"compiling the bf16 kernel with {cxx} failed: {err}") from None
    finally:
        src.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise KernelUnavailable(f"compiling the bf16 kernel with {cxx} failed: {last}")


def why_unavailable() -> str | None:
    """None where the kernel builds and loads here, else the sentence saying why not."""
    try:
        library()
    except KernelUnavailable as err:
        return str(err)
    except OSError as err:  # an unwritable cache, or a library that does not load
        return f"the bf16 kernel could not be built or loaded: {err}"
    return None


def available() -> bool:
    return why_unavailable() is None


class Bf16Linear(WrappedLinear):
    """A bf16 CPU nn.Linear whose forward runs the AVX2 kernel on its own weight (no copy: a tied
    embedding stays shared) for two rows or more. One row runs torch's bf16 Linear: there it reads the
    weights as fast (a vanilla decode of 96 tokens, 3 prompts twice: 17.8 tok/s on torch's against 16.9
    on the kernel, likely the call's own overhead), so a decoding step and vanilla are torch's bits and
    torch's speed. After a cast off bf16 it runs as a plain nn.Linear."""

    def _prepare(self) -> None:
        if "library" not in self.__dict__:
            library()  # built (or refused) at wrapping, not in the first forward
            self.library = str(library_path())  # resolved once: forward runs per projection, per token
        self.active = runs_on_kernel(self.weight)  # known once per cast, not looked up per call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not self.active or (rows == 1 and x.dtype == torch.bfloat16):  # one row: torch's, as fast
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).float().contiguous()  # (..., in) -> (rows, in) fp32
        out = torch.empty(rows, self.out_features)
        _load(self.library).eagle_bf16_linear(flat.data_ptr(), self.weight.data_ptr(), out.data_ptr(), rows,
                                              self.in_features, self.out_features, torch.get_num_threads())
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def runs_on_kernel(weight: torch.Tensor) -> bool:
    """The kernel takes a contiguous bf16 CPU weight; anything else runs on torch's Linear."""
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.is_contiguous()
