"""Quickstart: compile a PyTorch model, read its fusion report, check it, time it.

    python tutorials/01_quickstart.py          # full size
    python tutorials/01_quickstart.py --quick  # small and fast (what CI runs)

tvm_ext takes the model through ``torch.export`` into TVM's Relax IR, groups its ops into
fused kernels, builds each group as one TVM kernel with a parallel, vectorized schedule,
and runs the result on TVM's Relax VM.
"""
import argparse
import os
import time

# Pin the thread count before TVM or PyTorch start their thread pools, so the comparison
# below gives both the same cores.
THREADS = str(len(os.sched_getaffinity(0)))
os.environ.setdefault("TVM_NUM_THREADS", THREADS)
os.environ.setdefault("OMP_NUM_THREADS", THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import tvm_ext  # noqa: E402


class FeedForward(nn.Module):
    """A transformer's feed-forward block: LayerNorm, Linear, GELU, Linear, residual."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def main(quick: bool) -> None:
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    tokens, dim, hidden = (64, 64, 256) if quick else (512, 256, 1024)
    model = FeedForward(dim, hidden).eval()
    x = torch.randn(tokens, dim)

    # 1. Compile. The example input fixes the shapes; the weights become constants.
    t0 = time.perf_counter()
    compiled = tvm_ext.compile(model, (x,))
    print(f"compiled in {time.perf_counter() - t0:.1f} s")

    # 2. The fusion report: one line per kernel, with the ops it covers, its fuse pattern
    #    (NNVM's six kinds) and the bytes it reads and writes per call.
    print(compiled.report())

    # 3. Check against PyTorch.
    with torch.no_grad():
        expected = model(x).numpy()
    got = compiled(x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    print(f"matches PyTorch: max abs difference {np.abs(got - expected).max():.2e}")

    # 4. Compare the speed with PyTorch eager, each called as its users call it: numpy in and
    #    out for tvm_ext (no copy either way: DLPack), the module call for PyTorch. Medians of
    #    repeated runs. The kernels alone (arguments converted beforehand) are a diagnostic.
    repeat = 5 if quick else 20
    xn = x.numpy()
    ours = compiled.time_call(xn, number=10, repeat=repeat)
    kernels = compiled.benchmark(xn, number=10, repeat=repeat)
    with torch.no_grad():
        eager = tvm_ext.time_calls(lambda: model(x), number=10, repeat=repeat)
    print(f"tvm_ext {ours.median_ms:.3f} ms (kernels alone {kernels.median_ms:.3f} ms) | "
          f"PyTorch eager {eager.median_ms:.3f} ms | ratio {eager.median_ms / ours.median_ms:.2f}x "
          f"(above 1: tvm_ext is faster)")

    # 5. The memory plan (PlanMemory): intermediates' bytes against naive allocation, TVM's
    #    StaticPlanBlockMemory and the liveness lower bound.
    print(compiled.report().memory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    main(parser.parse_args().quick)
