"""Where the register tiles that the FMA bound leaves out of the search space would rank.

    python bench/tile_bound.py --models matmul_512,linear_relu,conv_bn_relu --sample 300
    python bench/tile_bound.py --models matmul_512 --mcpu znver3     # AVX2 code, run here

The tuner's space keeps only the register tiles that hold ``Machine.tile_accumulators()`` sums
(``RegisterTiledAnchor.candidates``). For each GEMM or convolution task of the models, this
enumerates the space with the bound off (``fma_units=0``), measures up to ``--sample`` of its
candidates drawn at random as the tuner measures them, and prints how many fall under the bound,
the fastest of those against the fastest of all, and how many come within 5% of it. Models are
bench/models.py's and tuner_quality.py's (``linear_relu``, ``linear_gelu``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import random
import statistics
import sys

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import tuner_quality  # noqa: E402
from models import workloads  # noqa: E402

import tvm_ext  # noqa: E402
from schedules.policies import RegisterTiledAnchor  # noqa: E402
from schedules.search_space import enumerate_space  # noqa: E402
from tvm_ext.frontends import from_torch  # noqa: E402
from tvm_ext.target import cpu_target  # noqa: E402
from tvm_ext.tuning import KernelMeasurer, tasks_of  # noqa: E402


def _module(name: str):
    if name in workloads(False):
        module, x = workloads(False)[name].make()
        return from_torch(module.eval(), (x,))
    return tuner_quality.workloads(False)[name]


def _tile_sums(candidate: list) -> int:
    """The register tile's sums in a candidate (0 if it has no register tile)."""
    return next((RegisterTiledAnchor.tile_sums(k) for label, k in candidate
                 if label.startswith(RegisterTiledAnchor.name)), 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="matmul_512,linear_relu,linear_gelu,mlp,conv_bn_relu")
    parser.add_argument("--sample", type=int, default=300, help="candidates measured per task, at most")
    parser.add_argument("--mcpu", default=None, help="build for this CPU (LLVM's name) instead of the host's")
    args = parser.parse_args()
    target = cpu_target(args.mcpu) if args.mcpu else tvm_ext.host_target()
    measurer = KernelMeasurer()
    try:
        for name in args.models.split(","):
            for task in tasks_of(_module(name), target=target):
                bound = task.machine.tile_accumulators()
                space = enumerate_space(task.func, dataclasses.replace(task.machine, fma_units=0), limit=2048)
                space = [c for c in space if _tile_sums(c[0])]
                if not space:
                    continue  # not a register-tiled kernel
                random.Random(0).shuffle(space)
                space = space[:args.sample]
                times = []
                for i in range(0, len(space), 16):
                    batch = space[i:i + 16]
                    for (candidate, _), (ms, error) in zip(batch, measurer(task, [r for _, r in batch])):
                        if error is None and ms:
                            times.append((statistics.median(ms), _tile_sums(candidate)))
                if not times:
                    continue
                best = min(t for t, _ in times)
                under = sorted(t for t, sums in times if sums < bound)
                near = sum(t <= 1.05 * best for t in under)
                fastest = f"{under[0] / best:.2f}x" if under else "-"
                print(f"{name:20s} {task.name[:44]:44s} bound {bound:4d} sums: {len(under)}/{len(times)} under it, "
                      f"the fastest of them {fastest} as slow as the best ({best:.4f} ms), {near} within 5%",
                      flush=True)
    finally:
        measurer.close()


if __name__ == "__main__":
    main()
