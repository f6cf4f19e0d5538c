"""How far our softmax kernel is from the floor of its own arithmetic: the same algorithm
written by hand in C++, timed in the same process on the same rows, one thread each.

    python bench/softmax_floor.py [--rows 256 --cols 1024]

The hand-written kernel is what a careful programmer would write: GCC vector extensions as wide
as one register of the machine's widest vectors (16 lanes with AVX-512, 8 with AVX2), compiled
with ``-O2 -march=native``, ``fast_math.exp``'s own form and constants (read from it, so the
two stay the same), two independent sums. It is timed three ways: the exp pass alone (exp,
store, sum), the max and exp passes, and the whole softmax (max, exp into the output with the
sum, then the scale by 1 / sum). Ours is the compiled model's kernel alone
(``CompiledModel.benchmark``); the copy is numpy's copy of the same bytes, from the same level
of the cache. When the exp pass alone takes twice the copy, memory does not set the time: the
question left is whether our kernel wastes any of the arithmetic.

Needs a C++ compiler (``c++``); prints why and stops without one.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")  # one thread for both: before TVM's first parallel call
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import tvm_ext  # noqa: E402
from tvm_ext.target import cpu_target  # noqa: E402
from tvm_ext import fast_math  # noqa: E402

_SOURCE = r"""
#include <immintrin.h>
/* one register of the machine's widest vectors, and its max instruction */
#if defined(__AVX512F__)
#define L 16
#define MAXPS(a, b) (vf)_mm512_max_ps((__m512)(a), (__m512)(b))
#elif defined(__AVX__)
#define L 8
#define MAXPS(a, b) (vf)_mm256_max_ps((__m256)(a), (__m256)(b))
#else
#define L 4
#define MAXPS(a, b) (vf)_mm_max_ps((__m128)(a), (__m128)(b))
#endif
typedef float vf __attribute__((vector_size(4 * L)));
typedef int vi __attribute__((vector_size(4 * L)));
static inline vf splat(float c) { vf v = {0}; return v + c; }
static inline vf vmax(vf a, vf b) { return MAXPS(a, b); }
static inline float hsum(vf v) { float s = 0; for (int i = 0; i < L; i++) s += v[i]; return s; }
static inline float hmax(vf v) { float s = v[0]; for (int i = 1; i < L; i++) s = v[i] > s ? v[i] : s; return s; }
/* fast_math.exp for x <= 0: clamp at the floor, n = round(x log2 e) by the rounder, r by
   Cody-Waite, the doubled polynomial in Horner form, the scale 2^(n-1) from t's bits */
static inline vf vexp(vf x) {
  vf xc = vmax(x, splat(FLOOR));
  vf tf = xc * splat(LOG2E) + splat(ROUNDER);
  vf n = tf - splat(ROUNDER);
  vf r = xc - n * splat(C1) - n * splat(C2);
  vf p = splat(P0);
  p = p * r + splat(P1); p = p * r + splat(P2); p = p * r + splat(P3);
  p = p * r + splat(P4); p = p * r + splat(P5);
  return p * (vf)((vi)tf << 23);
}
/* mode 0: exp pass alone (from a given max); 1: max and exp passes; 2: the whole softmax */
extern "C" void softmax(const float *x, float *y, int rows, int cols, int mode) {
  for (int i = 0; i < rows; i++) {
    const vf *a = (const vf *)(x + (long)i * cols);
    vf *b = (vf *)(y + (long)i * cols);
    int n = cols / L;
    vf mx = splat(0.f);
    if (mode > 0) {
      vf m0 = a[0], m1 = a[1];
      for (int j = 2; j < n; j += 2) { m0 = vmax(m0, a[j]); m1 = vmax(m1, a[j + 1]); }
      mx = splat(hmax(vmax(m0, m1)));
    }
    vf s0 = splat(0.f), s1 = splat(0.f);
    for (int j = 0; j < n; j += 2) {
      vf e0 = vexp(a[j] - mx), e1 = vexp(a[j + 1] - mx);
      b[j] = e0; b[j + 1] = e1; s0 += e0; s1 += e1;
    }
    if (mode > 1) {
      vf inv = splat(1.f / hsum(s0 + s1));
      for (int j = 0; j < n; j++) b[j] *= inv;
    }
  }
}
"""


def _constants() -> dict[str, float]:
    fm = fast_math
    poly = dict(zip(("P0", "P1", "P2", "P3", "P4", "P5"), fm._EXP_POLY))
    return {"FLOOR": fm._EXP_FLOOR, "LOG2E": fm._LOG2E, "ROUNDER": fm._ROUNDER + 126.0, "C1": fm._C1,
            "C2": fm._C2, **poly}


def build_c(workdir: str, march: str = "native") -> ctypes.CDLL | None:
    """The hand-written kernel as a shared library for ``march`` (GCC's name of a CPU), or None
    without a C++ compiler."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    src, lib = os.path.join(workdir, "softmax.cc"), os.path.join(workdir, "softmax.so")
    with open(src, "w") as f:
        f.write("".join(f"#define {k} {v!r}f\n" for k, v in _constants().items()) + _SOURCE)
    subprocess.run([cxx, "-O2", f"-march={march}", "-shared", "-fPIC", src, "-o", lib], check=True)
    dll = ctypes.CDLL(lib)
    dll.softmax.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return dll


def _softmax_model(rows: int, cols: int) -> "tvm.IRModule":  # noqa: F821
    from tvm import relax
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def _aligned(shape: tuple[int, int]) -> np.ndarray:
    """A float32 array on a 64-byte boundary, as TVM's tensors are: an unaligned row would split
    every vector load across two cache lines, which ours never pays."""
    raw = np.empty(shape[0] * shape[1] + 16, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + shape[0] * shape[1]].reshape(shape)


def _timer(fn, number: int):
    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number * 1e3
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=1024, help="a multiple of 32")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--mcpu", help="build both for this CPU (e.g. znver3: AVX2 code), run here")
    args = parser.parse_args()
    if args.cols % 32:
        parser.error("--cols must be a multiple of 32 (two AVX-512 vectors: the kernel by hand's step)")
    with tempfile.TemporaryDirectory() as workdir:
        dll = build_c(workdir, args.mcpu or "native")
        if dll is None:
            print("no C++ compiler (c++) on this machine: nothing to compare with")
            return
        x = _aligned((args.rows, args.cols))
        x[...] = np.random.default_rng(0).standard_normal(x.shape, dtype=np.float32)
        y = _aligned(x.shape)
        px, py = x.ctypes.data, y.ctypes.data  # once: numpy's .ctypes costs microseconds a call
        target = cpu_target(args.mcpu) if args.mcpu else tvm_ext.host_target()
        compiled = tvm_ext.compile(_softmax_model(args.rows, args.cols), target=target)
        ref = compiled(x)
        dll.softmax(px, py, args.rows, args.cols, 2)
        assert np.allclose(y, ref, rtol=1e-5, atol=1e-7), "the softmax by hand disagrees with ours"
        number = max(1, 20000 // args.rows)
        timers = {f"by hand: {name}": _timer(lambda m=mode: dll.softmax(px, py, args.rows, args.cols, m), number)
                  for mode, name in enumerate(("exp pass alone", "max + exp passes", "whole softmax"))}
        timers["ours: kernel"] = lambda: compiled.benchmark(x, number=number, repeat=1).median_ms
        timers["copy (numpy)"] = _timer(lambda: np.copyto(y, x), number)
        times = {name: [] for name in timers}
        for r in range(args.repeat):  # rounds, each timing every kernel once, in turn
            for name in (list(timers) if r % 2 else list(timers)[::-1]):
                times[name].append(timers[name]())
        vectors = args.rows * args.cols / 16
        whole = statistics.median(times["by hand: whole softmax"])
        print(f"softmax ({args.rows}, {args.cols}), one thread, built for {args.mcpu or 'this CPU'}; "
              "ns per 16 elements")
        for name, values in times.items():
            ms = statistics.median(values)
            print(f"  {name:26s} {ms * 1e3:9.1f} us  {ms * 1e6 / vectors:6.2f} ns  "
                  f"{ms / whole:5.2f}x the whole softmax by hand")


if __name__ == "__main__":
    main()
